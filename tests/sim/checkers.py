"""Invariants of a simulated replog cluster, checked after every tick, and the convergence
demanded once the network is healed and the cluster is quiet.

Safety (after every tick; each failure names the invariant, the node and the seed):
  1 rows agree: no two nodes ever hold different content for one (origin uuid, lsn) in
    their WALs (a txn's replica_id is resolved through the holder's own `_cluster`);
  2 vclocks only grow: each node's durable vclock, by uuid, never goes back (crashes
    included), the core's durable vclock equals the state's, and it covers exactly the
    rows the node holds;
  3 ids are stable: in each node's `_cluster` a uuid has one id, an id one uuid, for ever
    (no reuse after an expel); the core's table extends the durable one without changing it;
  4 no gaps: each origin's rows on a node are contiguous from where the node started
    having them (its snapshot's vclock, or 1);
  5 claimed >= durable, component-wise;
  6 own `_cluster` row first: a node holds a row of member X only after its own `_cluster`
    row for X (or a snapshot that listed X);
  7 maps are true: every entry "peer id k -> local id m" of a connected peer's map names
    the same uuid on both sides;
  8 origins are right: every live record's origin (resolved to a uuid) is the writer its
    value names;
  9 HLC: a local write's timestamp is above the timestamp of every record it overwrites
    in the writer's own state (hlc.py: "ordered after every write it could have observed");
    `Cluster.hlc_skips_snapshot_records` exempts records a joiner got in its snapshot (a
    known shell bug, pinned by its own xfail scenario);
  10 expelled means refused: after a node's own `_cluster` row (or snapshot) says X is
    expelled with bound L, no row of X above L follows in its WAL (X itself goes on
    writing locally).
Liveness (`check_converged`): vclocks by uuid equal (an expelled member's component too:
every node ends with the same accepted bound for it), the same set of (origin uuid, lsn)
everywhere with each row held once, the same `_cluster` membership, and every replicated
key with the same record on every node. An anonymous replica may keep an expelled member's
rows it applied before it heard of the expel (no member follows it to learn its bound), so
those are left out for it. An anonymous replica is compared too, without its own
component: it signs the `_cluster` rows it writes on learning members with its private id,
so it has a component that no master has until it registers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgpack

from node.cluster_space.table import STATE_ANON, STATE_EXPELLED
from node.core.rows import GROUP_CLUSTER, GROUP_LOCAL, OP_CLUSTER, Txn
from node.core.vclock import Order

if TYPE_CHECKING:
    from tests.sim.harness import Cluster, SimNode

LOCAL = ""   # the key of the local component (0) in per-uuid maps


def content(t: Txn) -> bytes:
    """A txn's identity-free content: what every holder must agree on."""
    return msgpack.packb([t.lsn, t.group, t.timestamp, [o.to_wire() for o in t.ops]], use_bin_type=True)


@dataclass
class Track:
    """What the checker remembers of one node since it got its base."""
    checked: int = 0                                   # durable WAL entries checked
    last: dict[str, int] = field(default_factory=dict)  # origin uuid -> last lsn held
    first: dict[str, int] = field(default_factory=dict)  # origin uuid -> lsn held from a snapshot
    declared: set = field(default_factory=set)         # uuids this node may hold rows of
    expelled: dict = field(default_factory=dict)       # uuid -> accepted bound, durably expelled here
    seen: dict[str, int] = field(default_factory=dict)  # highest durable vclock by uuid
    ids: dict[str, int] = field(default_factory=dict)   # uuid -> id, ever
    owner: dict[int, str] = field(default_factory=dict)  # id -> uuid, ever
    wal_count: dict[tuple[str, int], int] = field(default_factory=dict)  # rows held in the WAL


class Checker:
    def __init__(self, cluster: "Cluster"):
        self.c = cluster
        self.rows: dict[tuple[str, int], tuple[bytes, str]] = {}   # (uuid, lsn) -> (content, first holder)
        self.tracks: dict[str, Track] = {}

    def fail(self, inv: str, n: "SimNode", detail: str):
        return self.c.fail(f"invariant {inv} broken on {n}: {detail}")

    # --- hooks --------------------------------------------------------------------------
    def on_install(self, n: "SimNode") -> None:
        t = Track()
        st = n.state
        for rid, lsn in st.vclock.items():
            u = st.table.uuid_of(rid) if rid else LOCAL
            if u is None:
                raise self.fail("2", n, f"snapshot vclock component {rid} names no member")
            t.last[u] = t.first[u] = lsn
        t.declared = {m.uuid for m in st.table.members()}
        t.expelled = {m.uuid: m.expelled_lsn for m in st.table.members() if m.state == STATE_EXPELLED}
        self.tracks[n.name] = t
        self._check_table(n, t)

    def on_restart(self, n: "SimNode") -> None:
        self.check_node(n)

    def on_local_txns(self, n: "SimNode", txns: list[Txn]) -> None:
        for t in txns:
            for o in t.ops:
                if o.space in n.state.spaces:
                    rec = n.state.get(o.space, o.key)
                    if rec is not None and self.c.hlc_skips_snapshot_records and \
                            n.base.data.get(o.space, {}).get(o.key) == rec:
                        continue
                    if rec is not None and rec[3] >= t.timestamp:
                        raise self.fail("9 (HLC)", n, f"local write {o.space}/{o.key} at hlc {t.timestamp} is not "
                                        f"after the record it overwrites (hlc {rec[3]}, origin id {rec[1]})")

    # --- after every tick ---------------------------------------------------------------------
    def check(self) -> None:
        for n in self.c.nodes.values():
            if n.base is not None:
                self.check_node(n)

    def check_node(self, n: "SimNode") -> None:
        t = self.tracks[n.name]
        if n.up and n.core is not None:
            self._check_table(n, t)
        self._check_new_rows(n, t)
        if n.up and n.core is not None:
            self._check_vclock(n, t)
            self._check_maps(n)
            self._check_origins(n)

    def _check_new_rows(self, n: "SimNode", t: Track) -> None:
        if t.checked > n.durable:
            raise self.fail("2", n, f"durable WAL shrank from {t.checked} to {n.durable} entries")
        table = n.state.table if n.state is not None else None
        for entry in n.wal[t.checked:n.durable]:
            for txn in entry:
                if txn.group == GROUP_LOCAL:
                    u = LOCAL
                else:
                    u = table.uuid_of(txn.replica_id)
                    if u is None:
                        raise self.fail("1", n, f"WAL txn {txn.replica_id}:{txn.lsn} is signed by an id "
                                        f"its _cluster does not have")
                    if u in t.expelled and u != n.uuid and txn.last_lsn > t.expelled[u]:
                        raise self.fail("10", n, f"holds row {txn.replica_id}:{txn.lsn} of {u[:8]} after its "
                                        f"own _cluster row expelled that member at lsn {t.expelled[u]}")
                    if u != n.uuid and u not in t.declared:
                        raise self.fail("6", n, f"holds row {txn.replica_id}:{txn.lsn} of {u[:8]} before its "
                                        f"own _cluster row for that member")
                    body = content(txn)
                    for lsn in range(txn.lsn, txn.last_lsn + 1):
                        k = (u, lsn)
                        t.wal_count[k] = t.wal_count.get(k, 0) + 1
                        have = self.rows.get(k)
                        if have is None:
                            self.rows[k] = (body, n.name)
                        elif have[0] != body:
                            raise self.fail("1", n, f"row ({u[:8]}, {lsn}) differs from {have[1]}'s: "
                                            f"{msgpack.unpackb(body)} vs {msgpack.unpackb(have[0])}")
                expected = t.last.get(u, 0) + 1
                if txn.lsn != expected:
                    raise self.fail("4", n, f"origin {u[:8] or 'local'} jumps to lsn {txn.lsn} after "
                                    f"{expected - 1} (txn {txn.replica_id}:{txn.lsn})")
                t.last[u] = txn.last_lsn
                if u == n.uuid and txn.group == GROUP_CLUSTER:
                    t.declared.update(o.key for o in txn.ops if o.kind == OP_CLUSTER)
                    for o in txn.ops:
                        if o.kind == OP_CLUSTER and o.value.get("state") == STATE_EXPELLED:
                            t.expelled[o.key] = max(t.expelled.get(o.key, 0), o.value.get("expelled_lsn", 0))
        t.checked = n.durable
        # Unsynced entries must not contradict anything durable anywhere either.
        for entry in n.wal[n.durable:]:
            for txn in entry:
                if txn.group == GROUP_LOCAL or table is None:
                    continue
                u = n.core.table.uuid_of(txn.replica_id) if n.core else None
                have = self.rows.get((u, txn.lsn))
                if u is not None and have is not None and have[0] != content(txn):
                    raise self.fail("1", n, f"unsynced row ({u[:8]}, {txn.lsn}) differs from {have[1]}'s")

    def _check_vclock(self, n: "SimNode", t: Track) -> None:
        st, core = n.state, n.core
        if core.vclock != st.vclock:
            raise self.fail("2", n, f"core vclock {core.vclock} != state vclock {st.vclock}")
        if core.claimed.compare(core.vclock) not in (Order.AFTER, Order.EQUAL):
            raise self.fail("5", n, f"claimed {core.claimed} is not >= durable {core.vclock}")
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

    def _check_maps(self, n: "SimNode") -> None:
        for pu, peer in n.core.peers.items():
            p = self.c.by_uuid[pu]
            if p.core is None:
                raise self.fail("7", n, f"keeps a map of {p}, which is down (the link should have dropped it)")
            for k, mid in peer.map.to_local.items():
                theirs, mine = p.core.table.uuid_of(k), n.core.table.uuid_of(mid)
                if theirs != mine:
                    raise self.fail("7", n, f"map of {p} says its id {k} is my id {mid}, but that is "
                                    f"{(theirs or '?')[:8]} there and {(mine or '?')[:8]} here")

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


# --- liveness --------------------------------------------------------------------------------
def record_of(n: "SimNode", rec: list) -> tuple:
    origin = n.state.table.uuid_of(rec[1]) if rec[1] else n.uuid
    return (msgpack.packb(rec[0]), rec[4], origin, rec[2], rec[3])


def check_converged(c: "Cluster") -> None:
    """After settle(): every member and anonymous replica holds the same history and data."""
    expelled = set(c.expelled)
    nodes = [n for n in c.nodes.values() if n.core is not None and n.uuid not in expelled]
    if len(nodes) < 2:
        raise c.fail("fewer than two live nodes to compare")
    ref = nodes[0]
    ck = c.checker

    def own(n: "SimNode") -> set[str]:
        # An anonymous replica's own component is private (module docstring). An expelled
        # member's rows are compared too: members end with the same accepted bound. Only an
        # anonymous replica may keep rows it applied before it heard of the expel, since no
        # member follows it to learn its larger bound.
        # Known limitation, the same for a node that joined (or fetched its snapshot) through a
        # member expelled meanwhile: that member's rows above the final bound reached it inside
        # the snapshot, which no relay can serve to the others.
        if n.core.anon:
            return {n.uuid} | expelled
        return set(expelled) if via_expelled(n) else set()

    by_uuid = {x.uuid: x for x in c.nodes.values()}

    def via_expelled(n: "SimNode") -> bool:
        """Its snapshot came, directly or through other joiners, from a member already
        expelled (by some node) when the snapshot was taken."""
        seen = set()
        while getattr(n, "donor_uuid", None) and n.uuid not in seen:
            seen.add(n.uuid)
            at = c.expelled_at.get(n.donor_uuid)
            if at is not None and at <= n.installed_at:
                return True
            n = by_uuid[n.donor_uuid]
        return False

    def vc(n: "SimNode", skip: set[str]) -> dict[str, int]:
        return {u: l for u, l in n.core.vclock_by_uuid().items() if u not in skip}

    def rows(n: "SimNode", skip: set[str]) -> set[tuple[str, int]]:
        t = ck.tracks[n.name]
        out = set()
        for u, last in t.last.items():
            if u != LOCAL and u not in skip:
                out.update((u, l) for l in range(1, last + 1))
        return out

    def members(n: "SimNode") -> dict[str, str]:
        return {m.uuid: m.state for m in n.core.table.members() if m.state != STATE_ANON}

    for n in nodes:
        t = ck.tracks[n.name]
        dup = [k for k, cnt in t.wal_count.items() if cnt > 1]
        if dup:
            raise c.fail(f"{n} holds rows more than once: {dup[:5]}")
        for (u, lsn) in t.wal_count:
            if lsn <= t.first.get(u, 0):
                raise c.fail(f"{n} holds row ({u[:8]}, {lsn}) in its WAL and in its snapshot")
        skip = own(n) | own(ref)
        if vc(n, skip) != vc(ref, skip):
            raise c.fail(f"vclocks differ: {ref} {_short(vc(ref, skip))} vs {n} {_short(vc(n, skip))}\n{c.describe()}")
        if rows(n, skip) != rows(ref, skip):
            diff = sorted(rows(n, skip) ^ rows(ref, skip))[:8]
            raise c.fail(f"row sets differ between {ref} and {n}: {diff}")
        if members(n) != members(ref):
            raise c.fail(f"_cluster membership differs: {ref} {_short(members(ref))} vs {n} {_short(members(n))}")
    spaces = [s for s, d in ref.state.spaces.items() if not d[0]]
    for n in nodes:
        if sorted(s for s, d in n.state.spaces.items() if not d[0]) != sorted(spaces):
            raise c.fail(f"replicated spaces differ: {ref} {spaces} vs {n} {list(n.state.spaces)}")
    for s in spaces:
        keys = sorted(set().union(*(n.state.data.get(s, {}).keys() for n in nodes)))
        for k in keys:
            recs = [(n, n.state.data.get(s, {}).get(k)) for n in nodes]
            if any(r is not None and own(n) & expelled and record_of(n, r)[2] in expelled for n, r in recs):
                recs = [(n, r) for n, r in recs if not own(n) & expelled]   # see own() above
                if not recs:
                    continue
            first = record_of(recs[0][0], recs[0][1]) if recs[0][1] is not None else None
            for n, r in recs[1:]:
                got = record_of(n, r) if r is not None else None
                if got != first:
                    raise c.fail(f"{s}/{k} differs: {recs[0][0]} {_rec(first)} vs {n} {_rec(got)}")


def _short(d: dict) -> dict:
    return {(k[:8] if isinstance(k, str) else k): v for k, v in d.items()}


def _rec(r: tuple | None) -> str:
    if r is None:
        return "(absent)"
    return f"value={msgpack.unpackb(r[0])} deleted={r[1]} origin={r[2][:8]} lsn={r[3]} hlc={r[4]}"
