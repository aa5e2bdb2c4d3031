"""Invariants of a simulated replog cluster, checked after every tick (the end-of-run checks,
convergence and acknowledged writes, are in tests/sim/liveness.py).

A node "holds" a row once it is on disk there (wal_mode fsync) or written (wal_mode write:
applied, and relayed from there); a power loss may take a wal_mode write node's written tail.

Safety (after every tick; each failure names the invariant, the node and the seed):
  1 one history: no (origin uuid, lsn) ever maps to two different rows, across all nodes
    and all time. The history remembers every row any node held, whatever happened to it
    since (crashes, lost stores, rebuilds, WAL collection), and a snapshot's records must be
    those rows' ops. A row leaves the history only when the last member holding it lost it
    to a fault that may lose it (a lost store, a power loss of its written tail in wal_mode
    write, the expel of the last member holding it): then no member holds it, and its lsn
    may be written again. Unwritten WAL entries must not contradict it either. A member the
    operator expelled is outside: a fence waits for no expelled member, so a row that reached
    it alone may be written again, differently, by an origin that lost it
    (docs/replication.md); the rows of other origins it takes from then on are neither
    compared with the history nor put in it (full-mix seed 27742). Its own rows are, and
    every row a member holds is, wherever it came from;
  2 vclocks only grow: each node's vclock, by uuid, never goes back (crashes and rebuilds
    from a snapshot included, except a rebuild's for an expelled member's rows past the bound;
    a lost store and a power loss in wal_mode write start again),
    the core's applied vclock equals the state's, and it covers exactly the rows the node
    holds;
  3 ids are stable: in each node's `_cluster` a uuid has one id, an id one uuid, for ever
    (no reuse after an expel); the core's table extends the durable one without changing it
    (a rebuilt or re-joined store has the donor's ids: it starts again);
  4 no gaps: each origin's rows on a node are contiguous from where the node started
    having them (its base's vclock, or 1);
  5 claimed >= applied, and synced (what ACKs report) <= what is on disk;
  6 own `_cluster` row first: a node holds a row of member X only after its own `_cluster`
    row for X (or a snapshot that listed X);
  7 maps are true: every entry "peer id k -> local id m" of a connected peer's map names
    the same uuid on both sides;
  8 origins are right: every live record's origin (resolved to a uuid) is the writer its
    value names;
  9 HLC: a local write's timestamp is above the timestamp of every record it overwrites
    in the writer's own state (hlc.py: "ordered after every write it could have observed"),
    records a joiner got in its snapshot included;
  10 expelled means refused: after a node's own `_cluster` row (or snapshot) says X is
    expelled with bound L, no row of X above L follows in its WAL (X itself goes on
    writing locally);
  11 one link per member: a node has at most one streaming link to each member, none to
    itself, and none through an address that is not in effect (PUT /v1/admin/peers);
  12 WAL holds: a member that joined through a node, or subscribed to it, is never told
    `need_rejoin` by it for rows the node collected: its hold keeps every row it has not on
    disk. Exempt: rows the node's WAL never had (its store began at a snapshot past them),
    the member lost its store (the hold stays where its old store was), the node's store was
    replaced (a rebuild or a lost store), or the member was expelled.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgpack

from node.cluster_space.table import STATE_EXPELLED, ClusterTable, Member
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_CLUSTER, OP_DELETE, OP_PUT, Txn
from node.core.vclock import Order, VClock

if TYPE_CHECKING:
    from tests.sim.harness import Cluster, SimNode

LOCAL = ""   # the key of the local component (0) in per-uuid maps


def content(t: Txn) -> bytes:
    """A txn's identity-free content: what every holder must agree on."""
    return msgpack.packb([t.lsn, t.group, t.timestamp, [o.to_wire() for o in t.ops]], use_bin_type=True)


@dataclass
class Track:
    """What the checker remembers of one node since it got its base."""
    checked: int = 0                                   # WAL entries checked (held)
    last: dict[str, int] = field(default_factory=dict)  # origin uuid -> last lsn held
    first: dict[str, int] = field(default_factory=dict)  # origin uuid -> lsn held from the base
    declared: set = field(default_factory=set)         # uuids this node may hold rows of
    expelled: dict = field(default_factory=dict)       # uuid -> accepted bound, durably expelled here
    seen: dict[str, int] = field(default_factory=dict)  # highest vclock by uuid
    ids: dict[str, int] = field(default_factory=dict)   # uuid -> id, ever
    owner: dict[int, str] = field(default_factory=dict)  # id -> uuid, ever
    wal_count: dict[tuple[str, int], int] = field(default_factory=dict)  # rows held in the WAL
    retrack: bool = False                               # rebuild from the base at the next start
    # what the per-tick checks last saw: they run again only when it changed (vclocks only grow,
    # a table's ids never change in place: see the fingerprints in check_node)
    seen_state: tuple = ()
    maps_read: list = field(default_factory=list)       # what invariant 7 read when it last passed
    # peer uuid -> (its map, our core, its core, the peer ids whose entry was found true with them)
    maps_true: dict = field(default_factory=dict)


class Checker:
    def __init__(self, cluster: "Cluster"):
        self.c = cluster
        # the history: (uuid, lsn) -> (content of its txn, first holder, its op)
        self.rows: dict[tuple[str, int], tuple[bytes, str, list]] = {}
        self.tracks: dict[str, Track] = {}
        self.acked: set[tuple[str, int]] = set()             # acknowledged replicated writes
        self.local_acked: dict[str, dict[int, list]] = {}    # node -> local lsn -> ops acknowledged
        self.lost_ok: dict[tuple[str, int], str] = {}        # acknowledged, lost to a fault that may
        self.gone: dict[tuple[str, int], str] = {}           # left the history (held by no member), why
        self.held: set[tuple[str, str]] = set()              # (relay name, member uuid): invariant 12
        self.stale: set[tuple[str, str]] = set()             # ... whose hold predates the member's lost store
        self._disk_vc: dict[str, tuple] = {}                 # node -> what _on_disk last read and found

    def fail(self, inv: str, n: "SimNode", detail: str):
        return self.c.fail(f"invariant {inv} broken on {n}: {detail}")

    # --- hooks --------------------------------------------------------------------------
    def on_install(self, n: "SimNode", seen: dict[str, int] | None = None) -> None:
        """A node's base was set (bootstrap, snapshot, rebuild), or must be read again."""
        t = Track(checked=n.base_pos, seen=dict(seen or {}))
        base = n.base
        table = ClusterTable(Member.from_row(r) for r in base.table_rows)
        for rid, lsn in base.vclock.items():
            u = table.uuid_of(rid) if rid else LOCAL
            if u is None:
                raise self.fail("2", n, f"base vclock component {rid} names no member")
            t.last[u] = t.first[u] = lsn
        t.declared = {m.uuid for m in table.members()}
        t.expelled = {m.uuid: m.expelled_lsn for m in table.members() if m.state == STATE_EXPELLED}
        self.tracks[n.name] = t
        self._check_records(n, base, table)
        self.check_node(n)

    def on_rebuild(self, n: "SimNode", was_anon: bool = False, discarded=frozenset()) -> None:
        """A rejoin swapped in a new store: nothing may go back (invariant 2), but the rows of
        expelled members the operator let it discard (`discarded`), and its WAL starts again, so
        nobody's earlier hold on it stands."""
        old = self.tracks[n.name]
        seen = dict(old.seen)
        have = n.core.vclock_by_uuid()
        for u in discarded:
            self._vanish(n, u, have.get(u, 0) + 1, old.last.get(u, 0), f"discard at {n.name} by the operator")
            if u in seen:
                seen[u] = min(seen[u], have.get(u, 0))
        if was_anon and n.uuid in seen:      # an anonymous replica's private rows: nobody else has them
            del seen[n.uuid]
            self.tracks[n.name] = Track()
            self._vanish(n, n.uuid, 1, old.last.get(n.uuid, 0), f"rebuild of anonymous {n.name}")
        for m in n.core.table.members():     # an expelled member's rows past the bound may go
            if m.state == STATE_EXPELLED and m.uuid in seen:
                seen[m.uuid] = min(seen[m.uuid], m.expelled_lsn)
        self.on_install(n, seen=seen)
        self.held = {h for h in self.held if h[0] != n.name}
        self.stale = {h for h in self.stale if h[0] != n.name}

    def on_restart(self, n: "SimNode") -> None:
        if self.tracks[n.name].retrack:
            self.on_install(n)
        else:
            self.check_node(n)

    def on_power_loss(self, n: "SimNode") -> None:
        """Before a power loss: the written tail it held (wal_mode write) goes."""
        t = self.tracks.get(n.name)
        if t is None or t.checked <= n.durable:
            return
        lost: dict[str, tuple[int, int]] = {}
        for entry in n.wal[n.durable:t.checked]:
            for txn in entry:
                u = LOCAL if txn.group == GROUP_LOCAL else n.state.table.uuid_of(txn.replica_id)
                lo, hi = lost.get(u, (txn.lsn, txn.last_lsn))
                lost[u] = (min(lo, txn.lsn), max(hi, txn.last_lsn))
                for lsn in range(txn.lsn, txn.last_lsn + 1) if u != LOCAL else ():
                    t.wal_count[(u, lsn)] -= 1
        t.checked, t.retrack = n.durable, True
        for u, (lo, hi) in lost.items():
            t.last[u] = lo - 1
            self._vanish(n, u, lo, hi, f"power loss of {n.name} (wal_mode write)")

    def on_disk_loss(self, n: "SimNode") -> None:
        t = self.tracks.pop(n.name)
        for u, last in t.last.items():
            self._vanish(n, u, 1, last, f"lost store of {n.name}")
        # the relays it subscribed to keep their holds at its old position, which may be past
        # its new one: they may tell it to rejoin (it is fenced, and others stream to it)
        self.stale |= {h for h in self.held if h[1] == n.uuid}
        self.stale |= {(r.name, n.uuid) for r in self.c.nodes.values() if n.uuid in r.holds or n.uuid in r.holds_disk}
        self.held = {h for h in self.held if n.name != h[0] and n.uuid != h[1]}
        self.stale = {h for h in self.stale if n.name != h[0]}

    def on_expel(self, x: "SimNode") -> None:
        t = self.tracks.get(x.name)
        for u, last in (t.last.items() if t else ()):
            if u != LOCAL:
                self._vanish(x, u, 1, last, f"expel of {x.name}")
        self.held = {h for h in self.held if h[1] != x.uuid}

    def _vanish(self, n: "SimNode", u: str, lo: int, hi: int, reason: str) -> None:
        """Rows (u, lo..hi) that `n` no longer holds: those nobody else holds leave the history."""
        if u == LOCAL:
            local = self.local_acked.get(n.name, {})
            for lsn in [x for x in local if lo <= x <= hi]:
                del local[lsn]
            return
        others = [self.tracks[o.name] for o in self.c.nodes.values() if o is not n and o.name in self.tracks
                  and o.uuid not in self.c.expelled]
        lo = max(lo, max((o.last.get(u, 0) for o in others), default=0) + 1)
        for lsn in range(lo, hi + 1):
            if self.rows.pop((u, lsn), None) is not None:
                self.c.stats["rows_gone_everywhere"] += 1
                self.gone[(u, lsn)] = reason
            if (u, lsn) in self.acked:
                self.lost_ok.setdefault((u, lsn), reason)

    def on_held(self, relay: "SimNode", member: "SimNode") -> None:
        if (relay.name, member.uuid) not in self.stale and member.uuid not in self.c.expelled:
            self.held.add((relay.name, member.uuid))

    def on_need_rejoin(self, relay: "SimNode", member: "SimNode", sub: dict, missing: list[int]) -> None:
        # rows its WAL never had (its store began at a snapshot past them) were not collected
        collected = [rid for rid in missing if sub.get(rid, 0) >= relay.wal_start.get(rid, 0)]
        if collected and (relay.name, member.uuid) in self.held:
            raise self.fail("12 (WAL holds)", relay, f"tells {member}, which joined through it or subscribed to "
                            f"it, to rejoin: its SUBSCRIBE {sub} is behind gc_vclock {relay.gc_vclock} in "
                            f"components {missing}, which its hold should have kept")

    def on_local_txns(self, n: "SimNode", txns: list[Txn]) -> None:
        for t in txns:
            for o in t.ops:
                if o.space in n.state.spaces:
                    rec = n.state.get(o.space, o.key)
                    if rec is not None and rec[3] >= t.timestamp:
                        raise self.fail("9 (HLC)", n, f"local write {o.space}/{o.key} at hlc {t.timestamp} is not "
                                        f"after the record it overwrites (hlc {rec[3]}, origin id {rec[1]})")

    # --- after every tick ---------------------------------------------------------------------
    def check(self) -> None:
        check_node = self.check_node
        for n in self.c.nodes.values():
            if n.base is not None:
                check_node(n)
        self._check_links()

    def check_node(self, n: "SimNode") -> None:
        t = self.tracks[n.name]
        wal = n.wal
        held = n.durable if n.wal_mode == "fsync" else len(wal)      # (n.applied_pos)
        if t.checked != held or held != len(wal):    # (else nothing newly held or unheld to check)
            self._check_new_rows(n, t)
        core = n.core
        if not n.up or core is None:
            return
        st = n.state
        # Each check runs again only when what it reads changed: vclocks only grow (a change
        # changes a signature), a table's ids never change in place (ClusterTable.upsert), a map
        # changes only at a greeting or with a claim, and a new core or state is a new object
        # (the objects themselves are kept, not their ids: an id may be reused once one is freed).
        # One flat tuple, compared whole: most ticks change nothing here.
        seen = (core, st, len(st.table), len(core.table),                        # [:4] the tables
                st.vclock.signature, core.vclock.signature, core.claimed.signature,  # [4:9] the clocks
                core.synced.signature, t.checked,
                n.greetings)                                                       # [9] the maps
        old = t.seen_state
        if seen == old:
            return
        tables = not old or seen[:4] != old[:4]
        if tables:
            self._check_table(n, t)
        if tables or seen[4:6] != old[4:6] or seen[8] != old[8]:
            self._check_vclock(n, t)
            self._check_origins(n)
        else:
            # Only what the core claimed or synced moved (rows received, not applied; an fsync):
            # the state, its table, the applied vclock and the rows held are what the rest of
            # invariants 2, 5 and 8 passed with, so only the comparisons that read them again.
            if seen[6] != old[6]:
                self._check_claimed(n)
            if seen[7] != old[7]:
                self._check_synced(n)
        self._check_maps(n, t)          # (the greetings changed if nothing else did)
        t.seen_state = seen

    def _check_new_rows(self, n: "SimNode", t: Track) -> None:
        held = n.applied_pos
        if t.checked > held:
            raise self.fail("2", n, f"WAL held shrank from {t.checked} to {held} entries")
        if t.checked == held == len(n.wal):
            return                # nothing newly held, nothing written and not held (the loops below are empty)
        table = n.state.table if n.state is not None else None
        history = n.state.own_history_lsn if n.state is not None else 0     # (history: not applied)
        me, rows, wal_count, last, expelled, declared = n.uuid, self.rows, t.wal_count, t.last, t.expelled, t.declared
        outside = me in self.c.expelled      # its copies of others' rows are its own (module docstring, 1)
        for entry in n.wal[t.checked:held]:
            for txn in entry:
                top = txn.last_lsn
                if txn.group == GROUP_LOCAL:
                    u = LOCAL     # a local write (only this node writes its local rows): acknowledged now
                    self.local_acked.setdefault(n.name, {})[txn.lsn] = [o.to_wire() for o in txn.ops]
                else:
                    u = table.uuid_of(txn.replica_id)
                    if u is None:
                        raise self.fail("1", n, f"WAL txn {txn.replica_id}:{txn.lsn} is signed by an id "
                                        f"its _cluster does not have")
                    if u in expelled and u != me and top > expelled[u]:
                        raise self.fail("10", n, f"holds row {txn.replica_id}:{txn.lsn} of {u[:8]} after its "
                                        f"own _cluster row expelled that member at lsn {expelled[u]}")
                    if u != me and u not in declared:
                        raise self.fail("6", n, f"holds row {txn.replica_id}:{txn.lsn} of {u[:8]} before its "
                                        f"own _cluster row for that member")
                    body = content(txn)
                    acked = u == me and txn.group == GROUP_DEFAULT      # a client's write, acknowledged now
                    for i, lsn in enumerate(range(txn.lsn, top + 1)):
                        k = (u, lsn)
                        wal_count[k] = wal_count.get(k, 0) + 1
                        if outside and u != me:
                            continue
                        have = rows.get(k)
                        if have is None:
                            rows[k] = (body, n.name, txn.ops[i].to_wire())
                        elif have[0] != body:
                            raise self.fail("1", n, f"row ({u[:8]}, {lsn}) differs from {have[1]}'s: "
                                            f"{msgpack.unpackb(body)} vs {msgpack.unpackb(have[0])}")
                        if acked:
                            self.acked.add(k)
                expected = last.get(u, 0) + 1
                if txn.lsn != expected:
                    raise self.fail("4", n, f"origin {u[:8] or 'local'} jumps to lsn {txn.lsn} after "
                                    f"{expected - 1} (txn {txn.replica_id}:{txn.lsn})")
                last[u] = top
                if u == me and txn.group == GROUP_CLUSTER and txn.lsn > history:
                    declared.update(o.key for o in txn.ops if o.kind == OP_CLUSTER)
                    for o in txn.ops:
                        if o.kind == OP_CLUSTER and o.value.get("state") == STATE_EXPELLED:
                            expelled[o.key] = max(expelled.get(o.key, 0), o.value.get("expelled_lsn", 0))
        t.checked = held
        # Entries not held yet must not contradict the history either.
        for entry in n.wal[held:]:
            for txn in entry:
                if txn.group == GROUP_LOCAL or table is None:
                    continue
                u = n.core.table.uuid_of(txn.replica_id) if n.core else None
                if outside and u != me:
                    continue
                have = self.rows.get((u, txn.lsn))
                if u is not None and have is not None and have[0] != content(txn):
                    raise self.fail("1", n, f"unsynced row ({u[:8]}, {txn.lsn}) differs from {have[1]}'s")

    def _check_records(self, n: "SimNode", base, table: ClusterTable) -> None:
        """Invariant 1 for a snapshot: each replicated record is the op of the row it names."""
        for space, recs in base.data.items():
            if base.spaces[space][0]:
                continue                     # a local space: its lsns are component 0's
            for key, rec in recs.items():
                if not rec[1]:
                    continue
                u = table.uuid_of(rec[1])
                have = self.rows.get((u, rec[2]))
                if have is None:
                    continue
                kind, op_space, op_key, value = have[2]
                same = op_space == space and op_key == key and (
                    (kind == OP_PUT and not rec[4] and value == rec[0]) or (kind == OP_DELETE and rec[4]))
                if not same:
                    raise self.fail("1", n, f"record {space}/{key} = {rec} names row ({(u or '?')[:8]}, {rec[2]}), "
                                    f"which is {have[2]} (held first by {have[1]})")

    def _check_vclock(self, n: "SimNode", t: Track) -> None:
        st, core = n.state, n.core
        if core.vclock != st.vclock:
            raise self.fail("2", n, f"core vclock {core.vclock} != state vclock {st.vclock}")
        self._check_claimed(n)
        self._check_synced(n)
        by_uuid = {}
        for rid, lsn in st.vclock.items():
            u = st.table.uuid_of(rid) if rid else LOCAL
            if u is None:
                raise self.fail("2", n, f"vclock component {rid} names no member")
            by_uuid[u] = lsn
        for u, lsn in t.seen.items():
            if by_uuid.get(u, 0) < lsn:
                raise self.fail("2", n, f"vclock[{u[:8] or 'local'}] went back from {lsn} to {by_uuid.get(u, 0)}")
        t.seen = by_uuid
        held = {u: l for u, l in t.last.items() if l}
        if held != by_uuid:
            raise self.fail("2", n, f"vclock by uuid {by_uuid} does not match the rows held {held}")

    def _check_claimed(self, n: "SimNode") -> None:
        """Invariant 5: claimed >= applied."""
        core = n.core
        if core.claimed.compare(core.vclock) not in (Order.AFTER, Order.EQUAL):
            raise self.fail("5", n, f"claimed {core.claimed} is not >= applied {core.vclock}")

    def _check_synced(self, n: "SimNode") -> None:
        """Invariant 5: synced (what ACKs report) <= what is on disk."""
        core = n.core
        on_disk = n.state.vclock if n.wal_mode == "fsync" else self._on_disk(n)
        if core.synced.compare(on_disk) not in (Order.BEFORE, Order.EQUAL):
            raise self.fail("5", n, f"synced {core.synced} (what ACKs report) is not <= on disk {on_disk}")

    def _on_disk(self, n: "SimNode"):
        """The vclock of the base and the WAL on disk after it. Kept per node and extended while
        its base, its WAL list and base_pos stay and `durable` only grows: entries up to
        `durable` never change (a power loss cuts only what follows, a checkpoint makes a new
        base, a rebuilt or lost store a new WAL list)."""
        key = (n.base, n.wal, n.base_pos)
        kept = self._disk_vc.get(n.name)
        if kept is not None and kept[0][0] is n.base and kept[0][1] is n.wal and kept[0][2] == n.base_pos \
                and kept[1] <= n.durable:
            start, v = kept[1], dict(kept[2])
        else:
            start, v = n.base_pos, dict(n.base.vclock)
        for entry in n.wal[start:n.durable]:
            for t in entry:
                c = 0 if t.group == GROUP_LOCAL else t.replica_id
                v[c] = max(v.get(c, 0), t.last_lsn)
        self._disk_vc[n.name] = (key, n.durable, v)
        return VClock(v)

    def _check_table(self, n: "SimNode", t: Track) -> None:
        for m in n.state.table.members():
            if t.ids.setdefault(m.uuid, m.id) != m.id:
                raise self.fail("3", n, f"{m.uuid[:8]} changed id {t.ids[m.uuid]} -> {m.id}")
            if t.owner.setdefault(m.id, m.uuid) != m.uuid:
                raise self.fail("3", n, f"id {m.id} reused: was {t.owner[m.id][:8]}, now {m.uuid[:8]}")
        ids = [m.id for m in n.core.table.members()]
        if len(set(ids)) != len(ids) or len(ids) != len(n.core.table):
            raise self.fail("3", n, f"core _cluster ids are not distinct: {ids}")
        for m in n.core.table.members():
            if t.ids.get(m.uuid, m.id) != m.id or t.owner.get(m.id, m.uuid) != m.uuid:
                raise self.fail("3", n, f"core _cluster gives {m.uuid[:8]} id {m.id}, durable history says "
                                f"{t.ids.get(m.uuid)} / id {m.id} belonged to {t.owner.get(m.id, '?')[:8]}")

    def _check_maps(self, n: "SimNode", t: Track) -> None:
        """Invariant 7. Skipped when nothing it reads changed since it last passed (`maps_read`):
        ids are stable on every node (a table never changes or drops an id, and only grows), a
        map only learns entries (IdMap.learn) and a greeting makes a new one, so the same
        cores, tables of the same sizes and the same maps of the same sizes give the same
        answer. (The objects themselves are kept, not their ids: no id is reused meanwhile.)"""
        core, by_uuid = n.core, self.c.by_uuid
        read = [core, len(core.table)]
        for pu, peer in core.peers.items():
            pc = by_uuid[pu].core
            read += (pu, peer.map, len(peer.map.to_local), pc, len(pc.table) if pc is not None else -1)
        if read == t.maps_read:
            return
        mine_of = core.table.uuid_of
        for pu, peer in core.peers.items():
            p = by_uuid[pu]
            if p.core is None:
                raise self.fail("7", n, f"keeps a map of {p}, which is down (the link should have dropped it)")
            theirs_of = p.core.table.uuid_of
            # An entry found true (both ids known, one uuid) stays true while the map and both
            # cores are the same objects, by the same reasons: it is not looked up again.
            known = t.maps_true.get(pu)
            if known is None or known[0] is not peer.map or known[1] is not core or known[2] is not p.core:
                known = t.maps_true[pu] = (peer.map, core, p.core, set())
            true = known[3]
            for k, mid in peer.map.to_local.items():
                if k in true:
                    continue
                theirs, mine = theirs_of(k), mine_of(mid)
                if theirs != mine:
                    raise self.fail("7", n, f"map of {p} says its id {k} is my id {mid}, but that is "
                                    f"{(theirs or '?')[:8]} there and {(mine or '?')[:8]} here")
                if theirs is not None:
                    true.add(k)
        t.maps_read = read

    def _check_origins(self, n: "SimNode") -> None:
        st = n.state
        for space, recs in st.data.items():
            for key, rec in recs.items():
                if rec[4] or not isinstance(rec[0], dict) or "by" not in rec[0]:
                    continue
                origin = st.table.uuid_of(rec[1]) if rec[1] else n.uuid
                if origin != rec[0]["by"]:
                    raise self.fail("8", n, f"{space}/{key} = {rec[0]} is attributed to "
                                    f"{(origin or '?')[:8]} (id {rec[1]})")

    def _check_links(self) -> None:
        """Invariant 11. (A pair already streaming leaves `pairs` as large as it was.)"""
        pairs: set[tuple[str, str]] = set()
        nodes = self.c.nodes
        for conn in self.c.conns.values():
            if conn.kind != "sub":
                continue
            client = conn.client
            s = nodes[client]
            if conn.addr not in (s.peers if s.in_effect is None else s.in_effect):     # (s.links())
                raise self.fail("11", s, f"a link through {conn.addr!r} is open, which is not in effect {s.links()}")
            if not conn.streaming:
                continue
            if client == conn.server:
                raise self.fail("11", s, "streams from itself")
            k = len(pairs)
            pairs.add((client, conn.server))
            if len(pairs) == k:
                raise self.fail("11", s, f"streams from {conn.server} over two links")
