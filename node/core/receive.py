"""Rows from a peer, decided by the replication core: `receive` (one transaction, any
group), `receive_run` (a run of one origin's plain transactions) and `receive_scan` (a scanned
ROWS message, node.core.rowscan), three representations held to one set of rules. Part of
NodeCore (node/core/replicaset.py), which mixes `Receiving` in; pure like it.

Rules kept here:
- an lsn is checked and claimed in one call with no await in between, so two appliers
  receiving one origin's rows by two routes never both apply the same lsn; what a call
  claimed is in its output even when a later row of it is refused;
- each origin's rows are applied contiguously: a row past a gap is not applied (it will come
  again by a route that has the rows before it); a row already claimed is a duplicate; one
  overlapping what was claimed is a protocol error;
- a gap in the peer's own rows is logged, once per gap on a link (`_own_gap`), unless this
  node caused it: a fenced node asks a peer for its own rows from where the peer is
  (NodeCore.subscribe_vclock; rows of that link still in flight when the fence lifts are
  such rows too), and an expelled member's rows past its bound are not taken.
  Otherwise the origin skipped lsns of its own (its WAL lost rows it had, or it is broken or
  lying): not refused, since its rows past the gap may still come by another route;
  a `_cluster` row past a gap while fenced still tells the fence which members are expelled
  (OwnRowsFence.hear_expels);
- an expelled member's rows past its bound are not applied;
- a remote row is checked against this node's state before it is claimed (what its decoder
  could not know): its spaces exist here and are replicated ones, a new space fits the store's
  capacity, its timestamp is not ahead of this node's clock by more than hlc_offset_max_s, and
  a `_cluster` row passes node/core/cluster_rows.py's checks. A refused row is a
  RemoteProtocolError: nothing of it is claimed, the link stops, the node serves on;
- this node's own rows up to `own_history_lsn` (all of them while a rebuilt fence stands), and
  a peer's own `_cluster` rows of its earlier incarnation, are history: applied as data, never
  followed as `_cluster` changes."""
from __future__ import annotations

import logging
from bisect import bisect_right

from node import limits
from node.cluster_space.table import STATE_EXPELLED
from node.core.cluster_rows import ClusterRows, Peer
from node.core.hlc import HLC
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_DELETE, OP_PUT, OP_SPACE, Txn
from node.core.validate import timestamp_ahead_error
from node.errors import RemoteProtocolError

_OFFSET_MAX_US = int(limits.hlc_offset_max_s * 1e6)
log = logging.getLogger("replog.core")


class Receiving(ClusterRows):
    """NodeCore's side of a peer's rows (node/core/replicaset.py keeps the state named here)."""
    peers: dict[str, Peer]
    hlc: HLC
    spaces: dict[str, bool]
    own_history_lsn: int

    def receive(self, peer_uuid: str, raw: Txn, wall_us: int) -> list[Txn]:
        """Decide one transaction from an upstream. Returns what to persist, in order:
        [] (already have it, or refused), or [translated txn] plus, for `_cluster` rows,
        this node's own `_cluster` txn. Claims lsns before returning (no await inside)."""
        if raw.group == GROUP_DEFAULT:
            out: list[Txn] = []
            self.receive_run(peer_uuid, (raw,), 0, out, wall_us)
            return out
        peer = self.peers[peer_uuid]
        if raw.group == GROUP_LOCAL:
            raise RemoteProtocolError(f"peer {peer_uuid} sent a row of a local space")
        origin = self._translate(peer, raw.replica_id, raw.lsn)
        if origin is None:                       # a member this fenced subscription could not register
            peer.stats.gaps += 1
            if self.fence is not None:           # (a `_cluster` txn) it still tells the fence of expels
                self.fence.hear_expels(raw.ops)
            return []
        member = self.table.by_id(origin)
        assert member is not None
        have = self.claimed.get(origin)
        if raw.last_lsn <= have:
            peer.stats.duplicates += 1
            if raw.group == GROUP_CLUSTER and member.uuid == peer_uuid and raw.last_lsn > peer.history_lsn:
                # The peer's own `_cluster` row came first through a third node: it is
                # not applied again, but it still states this peer's ids.
                self._learn_peer_ids(peer, raw.ops)
            return []
        if raw.lsn != have + 1:
            if raw.lsn <= have:
                raise RemoteProtocolError(f"row {origin}:{raw.lsn}..{raw.last_lsn} overlaps claimed {have}")
            peer.stats.gaps += 1
            if member.uuid == peer_uuid:
                self._own_gap(peer, member, have, raw.lsn)
            if self.fence is not None:           # (a `_cluster` txn: plain ones went above, local ones raised)
                self.fence.hear_expels(raw.ops)
            return []
        if member.state == STATE_EXPELLED and raw.last_lsn > member.expelled_lsn:
            peer.stats.expelled += 1
            return []
        history = member.uuid == self.uuid and (
            (self.fence is not None and self.fence.rebuilt) or raw.last_lsn <= self.own_history_lsn)
        peer_history = member.uuid == peer_uuid and raw.last_lsn <= peer.history_lsn
        why = timestamp_ahead_error(raw.timestamp, wall_us)
        if why is None and raw.group == GROUP_CLUSTER and not history:
            why = self._cluster_rows_refusal(peer, member, raw.ops, peer_history)
        if why is None and raw.group == GROUP_CLUSTER and self.fence is not None and member.uuid != self.uuid:
            why = self._fenced_cluster_change(member, raw.ops)
        if why is not None:
            raise RemoteProtocolError(f"row {member.uuid}:{raw.lsn} from {peer_uuid} refused: {why}")
        self.claimed.follow(origin, raw.last_lsn)
        self.hlc.observe(raw.timestamp)
        peer.stats.applied += 1
        txn = raw if origin == raw.replica_id else raw.with_replica_id(origin)
        out = [txn]
        if raw.group == GROUP_CLUSTER and not history:
            own = self._follow_cluster_rows(peer, member, txn, wall_us, learn=not peer_history)
            if own is not None:
                out.append(own)
        return out

    def receive_run(self, peer_uuid: str, raws, start: int, out: list[Txn], wall_us: int) -> tuple[int, int]:
        """Decide the run of plain (GROUP_DEFAULT) transactions of one origin that begins
        at raws[start], by exactly the rules of `receive`, with one map lookup, one member
        check and one claim for the run. Accepted txns (translated) are appended to `out`
        as they are claimed, so what was claimed is there even when a later txn of the run
        raises. Returns (index after the run, rows accepted)."""
        peer = self.peers[peer_uuid]
        first = raws[start]
        assert first.group == GROUP_DEFAULT
        rid = first.replica_id
        origin = self._translate(peer, rid, first.lsn)
        if origin is None:                       # a member this fenced subscription could not register
            i, n = start + 1, len(raws)
            while i < n and raws[i][0] == rid and raws[i][2] == GROUP_DEFAULT:
                i += 1
            peer.stats.gaps += i - start
            return i, 0
        member = self.table.by_id(origin)
        assert member is not None
        bound = member.expelled_lsn if member.state == STATE_EXPELLED else -1
        translate = origin != rid
        claimed = have = self.claimed.get(origin)
        stats = peer.stats
        ts_max = rows = applied = 0
        ts_limit = wall_us + _OFFSET_MAX_US
        err: RemoteProtocolError | None = None
        i, n = start, len(raws)
        while i < n:
            raw = raws[i]
            if raw[0] != rid or raw[2] != GROUP_DEFAULT:   # replica_id, group: the run ends
                break
            i += 1
            lsn, nops = raw[1], len(raw[4])
            last = lsn + nops - 1
            if last <= have:
                stats.duplicates += 1
                continue
            if lsn != have + 1:
                if lsn <= have:
                    err = RemoteProtocolError(f"row {origin}:{lsn}..{last} overlaps claimed {have}")
                    break
                stats.gaps += 1
                if member.uuid == peer_uuid:
                    self._own_gap(peer, member, have, lsn)
                continue
            if bound >= 0 and last > bound:
                stats.expelled += 1
                continue
            why = timestamp_ahead_error(raw[3], wall_us) if raw[3] > ts_limit else self._rows_refusal(raw[4])
            if why is not None:
                err = RemoteProtocolError(f"row {member.uuid}:{lsn} from {peer_uuid} refused: {why}")
                break
            have = last
            if raw[3] > ts_max:
                ts_max = raw[3]
            applied += 1
            rows += nops
            out.append(raw.with_replica_id(origin) if translate else raw)
        if have > claimed:
            self.claimed.follow(origin, have)
            self.hlc.observe(ts_max)
            stats.applied += applied
        if err is not None:
            raise err
        return i, rows

    def receive_scan(self, peer_uuid: str, scan, out: list[tuple[int, int, int]], wall_us: int) -> int | None:
        """Decide a scanned ROWS message (node.core.rowscan: plain txns only, each origin's
        txns contiguous) by exactly the rules of `receive_run`, a whole run of one origin at
        a time: one bisect over the txns' last lsns finds the duplicates, one the expel
        bound. Accepted ranges (first txn, end txn, this node's id for their origin) are
        appended to `out` as they are claimed, so what was claimed is there even when a
        later run raises. Returns the rows accepted, or None, claiming nothing, when a row
        of the message would be refused by the checks that need this node's state (a space
        unknown here or local, a timestamp too far ahead): the caller decides the message by
        the exact path, which refuses exactly that row."""
        if scan.ntxn and scan.ts_max(0, scan.ntxn) > wall_us + _OFFSET_MAX_US:
            return None
        spaces = self.spaces
        for name in scan.spaces():
            if spaces.get(name) is not False:
                return None
        peer = self.peers[peer_uuid]
        stats = peer.stats
        lasts = memoryview(scan.lasts()).cast("q")
        rows = 0
        for rid, a, b in scan.runs():
            origin = self._translate(peer, rid, scan.lsn(a))
            if origin is None:                   # a member this fenced subscription could not register
                stats.gaps += b - a
                continue
            member = self.table.by_id(origin)
            assert member is not None
            have = self.claimed.get(origin)
            s = bisect_right(lasts, have, a, b)          # [a, s): already have them
            stats.duplicates += s - a
            if s == b:
                continue
            lsn = scan.lsn(s)
            if lsn != have + 1:
                if lsn <= have:
                    raise RemoteProtocolError(f"row {origin}:{lsn}..{lasts[s]} overlaps claimed {have}")
                stats.gaps += b - s                      # none of the run can follow a gap
                if member.uuid == peer_uuid:
                    self._own_gap(peer, member, have, lsn)
                continue
            e = b
            if member.state == STATE_EXPELLED:
                e = bisect_right(lasts, member.expelled_lsn, s, b)   # [s, e): within the bound
                if e < b:
                    stats.expelled += 1                  # txn e; those after it follow a gap
                    stats.gaps += b - e - 1
                if e == s:
                    continue
            last = lasts[e - 1]
            self.claimed.follow(origin, last)
            self.hlc.observe(scan.ts_max(s, e))
            stats.applied += e - s
            rows += last - lsn + 1
            out.append((s, e, origin))
        return rows

    def _own_gap(self, peer: Peer, member, have: int, lsn: int) -> None:
        """The peer sent a row of its own origin at `lsn` while this node holds its rows up to
        `have` (< lsn - 1): a warning, once per gap on a link, unless this node caused it (fenced,
        or subscribed on this link while fenced, the fence since lifted: it asked the peer's own
        rows from where the peer is; an expelled member: its rows past the bound were not taken)."""
        if self.fence is not None or peer.fenced_subscription or member.state == STATE_EXPELLED \
                or peer.own_gap_at == have:
            return
        peer.own_gap_at = have
        log.warning("replication: %s sent its own row %d while this node holds its rows up to %d: it skipped "
                    "lsns %d..%d of its own (its WAL lost rows it had, or it is broken or lying); its rows past "
                    "the gap wait for a route that has those (docs/replication.md)",
                    peer.uuid, lsn, have, have + 1, lsn - 1)

    def _rows_refusal(self, ops) -> str | None:
        """Why a plain txn's rows cannot be applied here (None: they can). Data rows go to
        replicated spaces this node has (or has claimed); a new space must fit the store's
        capacity. Accepting the txn claims its new spaces."""
        spaces = self.spaces
        new: dict[str, bool] | None = None
        for kind, space, _, value in ops:
            if kind == OP_PUT or kind == OP_DELETE:
                local = spaces.get(space, new.get(space) if new else None)
                if local is None:
                    return f"space {space!r} does not exist here"
                if local:
                    return f"space {space!r} is local here: its rows never come from a peer"
            elif kind == OP_SPACE and space not in spaces and (new is None or space not in new):
                if len(spaces) + (len(new) if new else 0) >= limits.store_spaces_max:
                    return (f"space {space!r} would be this node's space number {limits.store_spaces_max + 1}, "
                            f"past the store's capacity (store_spaces_max)")
                if new is None:
                    new = {}
                new[space] = bool(value.get("local"))
        if new:
            spaces.update(new)
        return None
