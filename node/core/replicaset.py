"""The replication core of one node: lsn claims, id translation, `_cluster` handling,
relay filtering. Pure: no asyncio, no sockets, no LMDB, no clock (time is an argument).

The shell calls it in this order for every transaction it will persist:
    txns = core.local_txn(...) | core.receive(peer, txn) | core.greeting(...)   # decide + claim
    persist txns to the WAL, then LMDB, in the order they were returned
    core.commit(txns)                                                            # durable vclock
Rules kept here:
- an lsn is checked and claimed in one call with no await in between, so two appliers
  receiving one origin's rows by two routes never both apply the same lsn;
- a row whose replica id the peer's map cannot translate is refused, never guessed;
- each origin's rows are applied contiguously: a row past a gap is not applied (it will
  come again by a route that has the rows before it);
- on learning a member this node writes its own `_cluster` row for it, in the same WAL
  frame, before any row of that member, so a downstream always learns this node's id for
  an origin before that origin's rows;
- a `_cluster` row states its *origin's* ids: it teaches the map of a directly connected
  peer only when that peer is the origin;
- a remote row is checked against this node's state before it is claimed (what its decoder
  could not know): its spaces exist here and are replicated ones, a new space fits the store's
  capacity, its timestamp is not ahead of this node's clock by more than hlc_offset_max_s, and a
  `_cluster` row contradicts neither this node's table nor the peer's map. A refused row is a
  RemoteProtocolError: nothing of it is claimed, the link stops, the node serves on."""
from __future__ import annotations

import logging
from bisect import bisect_right
from dataclasses import dataclass, field

from node import limits
from node.cluster_space.idmap import IdMap
from node.cluster_space.resolver import resolve_cluster_replace
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.hlc import HLC
from node.core.membership import OwnRowsFence
from node.core.rows import (CLUSTER_SPACE, GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_CLUSTER, OP_DELETE, OP_PUT,
                            OP_SPACE, Op, Txn)
from node.core.validate import timestamp_ahead_error
from node.core.vclock import VClock
from node.errors import RemoteProtocolError

log = logging.getLogger("replog.core")


@dataclass
class ReceiveStats:
    applied: int = 0
    duplicates: int = 0
    gaps: int = 0
    expelled: int = 0


@dataclass
class Peer:
    """What the core knows of one directly connected upstream."""
    uuid: str
    map: IdMap = field(default_factory=IdMap)
    stats: ReceiveStats = field(default_factory=ReceiveStats)
    # the peer's own `_cluster` rows up to this lsn are its earlier incarnation's (its greeting
    # says so: NodeCore.own_history_lsn there): they state ids it no longer uses
    history_lsn: int = 0


def cluster_op(m: Member) -> Op:
    v = {"id": m.id, "address": m.address, "state": m.state}
    if m.state == STATE_EXPELLED:
        v["expelled_lsn"] = m.expelled_lsn
    return Op(OP_CLUSTER, CLUSTER_SPACE, m.uuid, v)


_OFFSET_MAX_US = int(limits.hlc_offset_max_s * 1e6)


class NodeCore:
    def __init__(self, uuid: str, table: ClusterTable, vclock: VClock, *, hlc_last: int = 0,
                 spaces: dict[str, bool] | None = None, own_history_lsn: int = 0):
        me = table.get(uuid)
        assert me is not None, "a node's own uuid is always in its _cluster"
        self.uuid = uuid
        self.table = table
        self.vclock = vclock.copy()      # applied: what the WAL and the store hold (written)
        self.claimed = vclock.copy()     # applied + in flight to the WAL
        self.synced = vclock.copy()      # on disk (fsync'd WAL, or a synced store): what ACKs hold WAL by
        self.hlc = HLC(hlc_last)
        # space name -> local?, for every space created here or claimed (durable or in flight)
        self.spaces: dict[str, bool] = dict(spaces or {})
        self.peers: dict[str, Peer] = {}
        # (origin uuid, member uuid) -> the origin's id for the member, from its _cluster rows
        self.knowledge: dict[tuple[str, str], int] = {}
        # grows when an expelled member's accepted bound grows: appliers resubscribe then,
        # so rows they refused under the smaller bound come again
        self.expel_epoch = 0
        # set after a loss: this node may hold fewer of its own rows than a member does, so it
        # writes nothing under its own id (node.core.membership) until the fence is cleared
        self.fence: OwnRowsFence | None = None
        # our own `_cluster` rows up to this lsn were written by an earlier incarnation of this
        # node (before a loss): they come back as history, and our table (the donor's ids since
        # the rebuild) is not theirs to change. While fenced, every own row received is history.
        self.own_history_lsn = own_history_lsn

    # --- identity ----------------------------------------------------------------
    @property
    def self_id(self) -> int:
        return self.table.id_of(self.uuid)  # type: ignore[return-value]

    @property
    def anon(self) -> bool:
        return self.table.get(self.uuid).state == STATE_ANON  # type: ignore[union-attr]

    def vclock_by_uuid(self, vclock: VClock | None = None) -> dict[str, int]:
        v = vclock if vclock is not None else self.vclock
        out = {}
        for rid, lsn in v.items():
            if rid == 0:
                continue
            u = self.table.uuid_of(rid)
            if u is not None:
                out[u] = lsn
        return out

    # --- local writes ------------------------------------------------------------
    def local_txn(self, ops: list[Op], group: int, wall_us: int) -> Txn:
        """Claim the next lsns for a transaction written on this node."""
        assert ops, "a transaction has at least one row"
        assert self.fence is None or group == GROUP_LOCAL, "no row under this node's own id while it is fenced"
        component = 0 if group == GROUP_LOCAL else self.self_id
        lsn = self.claimed.get(component) + 1
        txn = Txn(self.self_id, lsn, group, self.hlc.now(wall_us), tuple(ops))
        self.claimed.follow(component, txn.last_lsn)
        for op in ops:
            if op.kind == OP_SPACE and op.space not in self.spaces:
                self.spaces[op.space] = bool(op.value.get("local"))
        return txn

    def register_member(self, uuid: str, address: str, wall_us: int,
                        proposed_id: int = 0, state: str = STATE_MEMBER) -> tuple[int, Txn | None]:
        """Register (or re-state) a member on this node: JOIN, REGISTER, expel, a new
        address. Returns its local id and the own `_cluster` txn to write, if any."""
        known = self.table.get(uuid)
        if known is None and len(self.table) >= limits.members_max:
            raise RemoteProtocolError(f"_cluster holds {limits.members_max} members (members_max): "
                                      f"cannot register {uuid}")
        have = self.claimed.get(known.id) if known else 0
        res = resolve_cluster_replace(self.table, uuid, proposed_id, address, state, from_self=True,
                                      have_lsn=have)
        if not res.changed:
            return res.local_id, None
        self.table.upsert(res.member)
        txn = self.local_txn([cluster_op(res.member)], GROUP_CLUSTER, wall_us)
        res.member.lsn = txn.lsn
        log.info("_cluster: %s %s as id %d", res.reason, uuid, res.local_id)
        return res.local_id, txn

    # --- handshake ---------------------------------------------------------------
    def greeting(self, peer_uuid: str, peer_rows: list[list], wall_us: int, history_lsn: int = 0) -> list[Txn]:
        """An upstream's greeting carried its whole `_cluster`; build its id map before
        SUBSCRIBE is sent (the answer to the reference's open question) and register
        every member it knows that we do not, before any of its rows is applied."""
        old = self.peers.get(peer_uuid)   # a map lives as long as one session: rebuilt from each greeting
        peer = Peer(peer_uuid, stats=old.stats) if old is not None else Peer(peer_uuid)
        peer.history_lsn = history_lsn
        out: list[Txn] = []
        own_ops: list[Op] = []
        new = 0 if self.fence is not None else \
            sum(1 for r in peer_rows if r[0] not in self.table and (r[3] != STATE_ANON or r[0] == peer_uuid))
        if new and len(self.table) + new > limits.members_max:
            raise RemoteProtocolError(f"{peer_uuid}'s greeting would grow _cluster past members_max "
                                      f"({limits.members_max})")
        for row in peer_rows:
            m = Member.from_row(row)
            if m.state == STATE_ANON and m.uuid != peer_uuid:
                continue            # the peer's private entry for someone else: not ours
            local = self.table.get(m.uuid)
            if local is None and self.fence is not None:
                # Registering writes a row under our own id: not while fenced. Its rows cannot be
                # translated on this link, and the fenced subscription asks for none of them.
                continue
            if local is None:
                res = resolve_cluster_replace(self.table, m.uuid, m.id, m.address, m.state, from_self=False,
                                              expelled_lsn=m.expelled_lsn)
                self.table.upsert(res.member)
                own_ops.append(cluster_op(res.member))
                log.info("_cluster: %s %s as id %d (from %s's greeting)", res.reason, m.uuid, res.local_id, peer_uuid)
                local = res.member
            self.knowledge[(peer_uuid, m.uuid)] = m.id
            peer.map.learn(m.id, local.id)
        self.peers[peer_uuid] = peer
        if own_ops:
            txn = self.local_txn(own_ops, GROUP_CLUSTER, wall_us)
            for op in own_ops:
                self.table.get(op.key).lsn = txn.lsn  # type: ignore[union-attr]
            out.append(txn)
        return out

    def subscribe_vclock(self, peer_uuid: str, peer_vclock: dict[str, int] | None = None,
                         peer_rows: list[list] | None = None) -> VClock:
        """What we ask the peer for, in the peer's ids (unknown components left out). While
        fenced, with the peer's vclock by uuid and `_cluster` rows (its greeting's), only our own
        rows: every other component is asked from where the peer is, so the rows before it are
        not sent now (they come once the fence is cleared and the applier subscribes again).
        That includes members the peer has and this node does not (a fenced node registers
        nobody): their rows could not be translated here, and would stop the link before our
        own rows came."""
        peer = self.peers[peer_uuid]
        if self.fence is None or peer_vclock is None:
            return peer.map.vclock_to_peer(self.claimed)
        want = self.claimed.copy()
        for rid, _ in list(want.items()) + [(m.id, 0) for m in self.table.members()]:
            u = self.table.uuid_of(rid)
            theirs = peer_vclock.get(u, 0) if u is not None and u != self.uuid else 0
            if theirs > want.get(rid):
                want.follow(rid, theirs)
        out = peer.map.vclock_to_peer(want)
        for row in peer_rows or ():
            u, their_id = str(row[0]), int(row[1])
            if u != self.uuid and self.table.get(u) is None and peer_vclock.get(u, 0) > out.get(their_id):
                out.follow(their_id, peer_vclock[u])
        return out

    def ack_vclock(self, peer_uuid: str) -> VClock:
        """What we have applied, in the peer's ids (its lag, its relay's progress)."""
        return self.peers[peer_uuid].map.vclock_to_peer(self.vclock)

    def ack_durable(self, peer_uuid: str) -> VClock:
        """What we have on disk, in the peer's ids: what its WAL may be collected up to."""
        return self.peers[peer_uuid].map.vclock_to_peer(self.synced)

    def mark_synced(self, vclock: VClock) -> None:
        """Everything up to `vclock` (a vclock this node had applied) is on disk now."""
        for rid, lsn in vclock.items():
            if lsn > self.synced.get(rid):
                self.synced.follow(rid, lsn)

    # --- the own-rows fence (node.core.membership) -------------------------------------
    def observe_peer(self, peer_uuid: str, vclock_by_uuid: dict[str, int], cluster_rows: list[list]) -> None:
        """A member's greeting (either direction; the shell passes members' only): while fenced,
        how many of our rows it holds, which members it knows (each must be heard from too) and
        which it knows to be expelled (those are not waited for)."""
        fence = self.fence
        if fence is None:
            return
        fence.hear(peer_uuid, int(vclock_by_uuid.get(self.uuid, 0)))
        for row in cluster_rows:
            if len(row) > 3 and row[3] == STATE_EXPELLED:
                fence.expelled.add(str(row[0]))
            elif len(row) > 3 and row[3] == STATE_MEMBER:
                fence.known.add(str(row[0]))     # a member we must hear from too, if we do not know it

    def clear_fence(self, wall_us: int) -> Txn | None:
        """Every member has been heard and our own rows are back: we may write under our own id
        again. After a rebuild, own rows received while fenced stay history (own_history_lsn
        rises to them), and this node states its whole table again in its own ids (returned, to
        persist): peers that took its earlier incarnation's rows learn its ids now."""
        fence = self.fence
        assert fence is not None
        self.fence = None
        if not fence.rebuilt:
            return None
        self.own_history_lsn = max(self.own_history_lsn, self.claimed.get(self.self_id))
        ops = [cluster_op(m) for m in self.table.members() if m.state != STATE_ANON]
        txn = self.local_txn(ops, GROUP_CLUSTER, wall_us)
        for op in ops:
            self.table.get(op.key).lsn = txn.lsn  # type: ignore[union-attr]
        return txn

    def fence_state(self) -> tuple[bool, str]:
        """(may clear now, why not / what it waited for)."""
        fence = self.fence
        assert fence is not None
        own = self.vclock.get(self.self_id)
        return fence.can_clear(self.table, self.uuid, own), fence.explain(self.table, self.uuid, own)

    def drop_peer(self, peer_uuid: str, peer: Peer | None = None) -> None:
        """Forget a peer's map when its link ends; with `peer`, only if it is still that link's
        (a newer link to the same member may have greeted since)."""
        if peer is None or self.peers.get(peer_uuid) is peer:
            self.peers.pop(peer_uuid, None)

    # --- remote rows ---------------------------------------------------------------
    def receive(self, peer_uuid: str, raw: Txn, wall_us: int) -> list[Txn]:
        """Decide one transaction from an upstream. Returns what to persist, in order:
        [] (already have it, or refused), or [translated txn] plus, for `_cluster` rows,
        this node's own `_cluster` txn. Claims lsns before returning (no await inside)."""
        if raw.group == GROUP_DEFAULT:
            out: list[Txn] = []
            self.receive_run(peer_uuid, (raw,), 0, out, wall_us)
            return out
        peer = self.peers[peer_uuid]
        origin = self._translate(peer, raw.replica_id, raw.lsn)
        if raw.group == GROUP_LOCAL:
            raise RemoteProtocolError(f"peer {peer_uuid} sent a row of a local space")
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

    def _cluster_rows_refusal(self, peer: Peer, origin: Member, ops, peer_history: bool = False) -> str | None:
        """Why `_cluster` rows of `origin` (arriving from `peer`) cannot be followed, checked
        before anything changes: they would give one uuid two ids or one id two uuids in this
        node's table (its own rows, coming back) or in the peer's map, or grow `_cluster` past
        members_max."""
        mine = origin.uuid == self.uuid
        by_uuid: dict[str, int] = {}
        by_id: dict[int, str] = {}
        new = 0
        for op in ops:
            uuid, their_id = op.key, op.value["id"]
            if by_uuid.setdefault(uuid, their_id) != their_id or by_id.setdefault(their_id, uuid) != uuid:
                return f"the transaction gives {uuid} or id {their_id} two meanings"
            known = self.table.get(uuid)
            if known is None:
                new += 1
            if mine:
                holder = self.table.by_id(their_id)
                if (known is not None and known.id != their_id) or (known is None and holder is not None):
                    return (f"a row of this node's own says {uuid} is id {their_id}, but this node's _cluster "
                            f"has {'it as id ' + str(known.id) if known else 'that id for ' + holder.uuid}")
            if origin.uuid == peer.uuid and not peer_history:
                mapped = peer.map.to_local.get(their_id)
                if mapped is not None and (known is None or mapped != known.id):
                    return (f"{peer.uuid} says its id {their_id} is {uuid}, but it said before that it is "
                            f"{self.table.uuid_of(mapped)}")
                before = peer.map.to_peer.get(known.id) if known is not None else None
                if before is not None and before != their_id:
                    return f"{peer.uuid} says {uuid} is its id {their_id}, but it said before {before}"
        if new and len(self.table) + new > limits.members_max:
            return f"_cluster would grow past members_max ({limits.members_max})"
        return None

    def _fenced_cluster_change(self, origin: Member, ops) -> str | None:
        """While fenced, a `_cluster` row of another member that would change our table (and so
        need a row of our own) waits: it is refused now and comes again after the fence."""
        for op in ops:
            v = op.value
            known = self.table.get(op.key)
            if op.key == self.uuid and v.get("state") != STATE_EXPELLED:
                continue             # another member's row about this node changes nothing here but an expel
            res = resolve_cluster_replace(self.table, op.key, int(v["id"]), str(v.get("address") or ""),
                                          str(v.get("state") or STATE_MEMBER), from_self=(op.key == origin.uuid),
                                          expelled_lsn=int(v.get("expelled_lsn") or 0),
                                          have_lsn=self.claimed.get(known.id) if known else 0)
            if res.changed:
                if res.member.state == STATE_EXPELLED:
                    self.fence.expelled.add(op.key)          # type: ignore[union-attr]
                return (f"it changes {op.key} here ({res.reason}), which needs a row under this node's own id, "
                        "and this node's own rows are not confirmed yet: it is taken after the fence")
        return None

    def _translate(self, peer: Peer, replica_id: int, lsn: int) -> int:
        """This node's id for a row's origin, through the peer's map; never guessed."""
        origin = peer.map.to_local.get(replica_id)
        if origin is None:
            origin = self._learn_from_knowledge(peer, replica_id)
        if origin is None:
            raise RemoteProtocolError(
                f"row {replica_id}:{lsn} from {peer.uuid}: id {replica_id} is unknown "
                "to this node's map of that peer; refusing to guess")
        return origin

    def _learn_peer_ids(self, peer: Peer, ops: tuple) -> None:
        for op in ops:
            if op.kind == OP_CLUSTER:
                local_id = self.table.id_of(op.key)
                if local_id is not None:
                    peer.map.learn(int(op.value["id"]), local_id)

    def _learn_from_knowledge(self, peer: Peer, peer_id: int) -> int | None:
        """The peer's id for a member, known from its `_cluster` rows however they came."""
        for (origin, member), their_id in self.knowledge.items():
            if origin == peer.uuid and their_id == peer_id:
                local_id = self.table.id_of(member)
                if local_id is not None:
                    peer.map.learn(peer_id, local_id)
                    return local_id
        return None

    def _follow_cluster_rows(self, peer: Peer, origin: Member, txn: Txn, wall_us: int,
                             learn: bool = True) -> Txn | None:
        """`learn`: the row states its origin's ids now (not a row of the connected peer's earlier
        incarnation, Peer.history_lsn): maps and knowledge take them."""
        own_ops: list[Op] = []
        for op in txn.ops:
            if op.kind != OP_CLUSTER:
                continue
            v = op.value
            their_id, address, state = int(v["id"]), str(v.get("address") or ""), str(v.get("state") or STATE_MEMBER)
            if learn:
                self.knowledge[(origin.uuid, op.key)] = their_id
            if op.key == self.uuid and origin.uuid != self.uuid:
                # Another member's row about this node changes nothing here but an expel (an
                # administrator's act, done on any member): this node's entry is its own rows'.
                if state != STATE_EXPELLED:
                    if origin.uuid == peer.uuid and learn:
                        peer.map.learn(their_id, self.self_id)
                    continue
                log.error("_cluster: %s says this node is expelled", origin.uuid)
            known = self.table.get(op.key)
            res = resolve_cluster_replace(self.table, op.key, their_id, address, state,
                                          from_self=(op.key == origin.uuid),
                                          expelled_lsn=int(v.get("expelled_lsn") or 0),
                                          have_lsn=self.claimed.get(known.id) if known else 0)
            if res.reason == "expel-lsn":
                self.expel_epoch += 1
            if res.changed:
                self.table.upsert(res.member)
                if origin.uuid != self.uuid:      # a row of our own coming back is our row already
                    own_ops.append(cluster_op(res.member))
                log.info("_cluster: %s %s as id %d (row of %s)", res.reason, op.key, res.local_id, origin.uuid)
            if origin.uuid == peer.uuid and learn:
                peer.map.learn(their_id, res.local_id)
        if not own_ops:
            return None
        own = self.local_txn(own_ops, GROUP_CLUSTER, wall_us)
        for op in own_ops:
            self.table.get(op.key).lsn = own.lsn  # type: ignore[union-attr]
        return own

    # --- after persistence -----------------------------------------------------------
    def commit(self, txns: list[Txn]) -> None:
        """The txns are durable: each component advances once, to the highest last lsn."""
        top: dict[int, int] = {}
        get = top.get
        for t in txns:
            c = 0 if t[2] == GROUP_LOCAL else t[0]            # group, replica_id
            last = t[1] + len(t[4]) - 1                       # lsn, ops
            if last > get(c, 0):
                top[c] = last
        self.commit_tops(top)

    def commit_tops(self, top: dict[int, int], on_disk: bool = False) -> None:
        """commit() given what the store's apply computed: component -> highest last lsn.
        `on_disk`: the batch was fsync'd (wal_mode fsync), so it is synced too."""
        v = self.vclock
        for c, last in top.items():
            if last > v.get(c):
                v.follow(c, last)
        if on_disk:
            s = self.synced
            for c, last in top.items():
                if last > s.get(c):
                    s.follow(c, last)


# --- relay side ----------------------------------------------------------------------
def relay_wants(txn_wire: list, sub_vclock: dict[int, int], own: tuple[int, int] | None = None) -> bool:
    """Should a relay send this WAL txn (wire form, relay's ids) to a subscriber whose
    vclock (in the relay's ids) is sub_vclock? Local rows never leave the node.

    `own` = (the subscriber's id, the relay's durable lsn of it when it subscribed): the
    subscriber's own rows go back to it only up to that cut (after Tarantool's relay). Those
    are what it may have lost and what its greeting told it to wait for (the relay's greeting
    came on the same link, before the cut); a row of it past the cut was written by the
    subscriber that is alive and subscribed now, so sending it back would be an echo."""
    rid, lsn, group = txn_wire[0], txn_wire[1], txn_wire[2]
    if group == GROUP_LOCAL:
        return False
    if own is not None and rid == own[0] and lsn > own[1]:
        return False
    return lsn + len(txn_wire[4]) - 1 > sub_vclock.get(rid, 0)
