"""End-of-run checks of a simulated cluster, once `settle()` healed everything and it is
quiet: convergence, and every acknowledged write kept.

Convergence (`check_converged`): vclocks by uuid equal (an expelled member's component too:
every node ends with the same accepted bound for it), the same set of (origin uuid, lsn)
everywhere with each row held once, the same `_cluster` membership and, on every member, the
same accepted bound for each expelled member (compared as numbers, so it holds even where that
member's rows live in snapshots only and their component is left out), and every replicated
key with the same record on every node. An anonymous replica may keep an expelled member's
rows it applied before it heard of the expel (no member follows it to learn its bound), so
those are left out for it. An anonymous replica is compared too, without its own
component: it signs the `_cluster` rows it writes on learning members with its private id,
so it has a component that no master has until it registers.

Acknowledged writes (`check_acknowledged`): a write is acknowledged when its writer holds it
(journal.py answers the client after the batch: in wal_mode fsync once it is on disk, in
wal_mode write once it is written). Every acknowledged write to a replicated space must, after
settle, be held by every live node (members and anonymous replicas), with the content it was
acknowledged with (the history, invariant 1 of tests/sim/checkers.py, sees to the content);
every acknowledged write to a local space must be in its writer's local space, in order.
Exempt is only what a fault may lose, and only when nothing else held it at that moment
(tests/sim/checkers.py `_vanish`):
- a lost store (store and WAL gone, identity kept) loses the writes only that node held: an
  acknowledged write survives a lost store exactly when some other node held it by then. So
  does a power loss of a wal_mode write node, for its written tail (that mode promises to
  survive a process crash, not a power loss); in wal_mode fsync an acknowledged write is on
  disk and no power loss takes it;
- expelling the last member that held a write is the operator giving it up (the way out of a
  fence waiting for a member gone for good); rows of an expelled member above the bound the
  members accepted are refused by design (and once rows may live in snapshots only, an expelled
  member's rows are not checked at all: see check_converged).
A rejoin (a rebuild from a snapshot), WAL collection, a restart, a peer change, a partition
are no excuse: they must lose nothing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import msgpack

from node.cluster_space.table import STATE_ANON, STATE_EXPELLED
from node.core.rows import GROUP_LOCAL, OP_DELETE, OP_PUT
from tests.sim.checkers import LOCAL
from tests.sim.harness import LOC

if TYPE_CHECKING:
    from tests.sim.harness import Cluster, SimNode


def snapshots_only(c: "Cluster") -> bool:
    """Whether rows may have ended up in snapshots only (no WAL holds them any more)."""
    return bool(c.stats["wal_entries_collected"] or c.stats["rejoins"] or c.stats["disks_lost"])


def _lost_with_a_disk(c: "Cluster", u: str, have: int, bound: int) -> bool:
    """Whether rows (u, have+1..bound) all left the history when a member's disk lost them, or
    went with a member down for good that the operator then expelled (its disk is out of reach
    for good: full+replace seed 203045, where B took C's rows 8-9, raised C's bound to 9 from its
    disk and went down before any member took them from it), or were discarded where the
    operator let a rebuild lose them (Cluster._let_go: seed 204848)."""
    ck = c.checker

    def lost(reason: str) -> bool:
        if reason.startswith(("lost store", "power loss", "discard at ")):
            return True
        x = c.nodes.get(reason[len("expel of "):]) if reason.startswith("expel of ") else None
        return x is not None and x.retired

    return have < bound and all((u, lsn) not in ck.rows and lost(ck.gone.get((u, lsn), ""))
                                for lsn in range(have + 1, bound + 1))


def _gone_without(c: "Cluster", n: "SimNode", u: str, have: int, bound: int) -> bool:
    """Whether rows (u, have+1..bound) of an expelled member cannot reach `n`: the first of them
    lives in snapshots only, as far as `n` can reach (no WAL of a live node, nor of an expelled
    one among its peers, holds it, so no relay can serve it: an expelled member that nobody
    follows is seed 242's case), and `n` says it goes without it (its rejoin found no donor:
    RejoinMachine.going_without): rows of an expelled member in one snapshot, on a node that
    holds rows `n` lacks too (full+anon seed 16768). A node takes an origin's rows in order, so
    the rest cannot come either, even where a WAL holds them (full+replace seed 204099: rows
    5-9 in snapshots only, 10-12 in WALs)."""
    if have >= bound or n.rejoiner is None or n.rejoiner.machine.going_without().get(u, 0) <= have:
        return False
    first = have + 1
    for x in c.nodes.values():
        if x.core is None or (x.uuid in c.expelled and x.name not in n.peers):
            continue
        of = x.state.table.uuid_of
        for entry in x.wal[x.wal_gc:]:
            for txn in entry:
                if txn.group != GROUP_LOCAL and txn.lsn <= first <= txn.last_lsn and of(txn.replica_id) == u:
                    return False
    return True


def check_acknowledged(c: "Cluster") -> None:
    ck = c.checker
    expelled = set(c.expelled)
    live = [n for n in c.nodes.values() if n.core is not None and n.uuid not in expelled]
    vcs = {n.name: n.core.vclock_by_uuid() for n in live}
    for (u, lsn) in sorted(ck.acked):
        if (u, lsn) in ck.lost_ok:
            continue
        nodes = live
        if u in expelled and snapshots_only(c):
            continue                         # see check_converged's own()
        if u in expelled:
            nodes = [n for n in live if not n.core.anon]
            if not any(vcs[n.name].get(u, 0) >= lsn for n in nodes):
                continue                     # above the bound the members accepted
        missing = [n for n in nodes if vcs[n.name].get(u, 0) < lsn]
        if missing:
            writer = c.by_uuid.get(u)
            raise c.fail(f"acknowledged write ({u[:8]}, {lsn}) of {writer} is lost: {missing} lack it "
                         f"(vclocks {[_short(vcs[n.name]) for n in missing]})\n{c.describe()}")
    for n in live:
        acked = ck.local_acked.get(n.name, {})
        want: dict[str, object] = {}
        for lsn in sorted(acked):
            for kind, space, key, value in acked[lsn]:
                if space == LOC and kind == OP_PUT:
                    want[key] = value
                elif space == LOC and kind == OP_DELETE:
                    want.pop(key, None)
        have = {k: r[0] for k, r in n.state.data.get(LOC, {}).items() if not r[4]}
        if have != want or n.core.vclock.get(0) < max(acked, default=0):
            raise c.fail(f"{n}'s acknowledged local writes are not all there: has {have} at local lsn "
                         f"{n.core.vclock.get(0)}, acknowledged {want} up to {max(acked, default=0)}")
    ck.c.stats["acked_writes_checked"] += len(ck.acked)
    ck.c.stats["acked_writes_lost_to_faults"] += len(ck.lost_ok)


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
        # The same once rows may live in snapshots only (a WAL collected, a store rebuilt or
        # joined again): rows of an expelled member between two members' bounds then reach the
        # members of the lower bound only if a WAL still holds them (a limitation the report
        # names; tests/sim/test_scenarios_membership.py pins what is a bug of it).
        if n.core.anon:
            return {n.uuid} | expelled
        return set(expelled) if via_expelled(n) or snapshots_only(c) else set()

    by_uuid = {x.uuid: x for x in c.nodes.values()}

    def via_expelled(n: "SimNode") -> bool:
        """Its snapshot came, directly or through other joiners, from a member expelled (by
        some node) before or after: a member gone for good may have given its joiner rows of
        its own that reached nobody else before its expel fixed the bound below them."""
        seen = set()
        while getattr(n, "donor_uuid", None) and n.uuid not in seen:
            seen.add(n.uuid)
            if n.donor_uuid in c.expelled_at:
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
    # Every member ends with the same accepted bound for each expelled member (the bound converges
    # on the most any node held: node/cluster_space/resolver.py), whatever lives in snapshots only.
    # (An anonymous replica may keep a larger one: no member follows it to learn it.)
    bounds = {n.name: {m.uuid: m.expelled_lsn for m in n.core.table.members() if m.state == STATE_EXPELLED}
              for n in nodes if not n.core.anon}
    if len({tuple(sorted(b.items())) for b in bounds.values()}) > 1:
        raise c.fail(f"expel bounds differ: { {k: _short(v) for k, v in bounds.items()} }")
    # Rows up to the bound that no member holds any more, lost with a member's disk (a lost store,
    # a power loss under wal_mode write, a member down for good and expelled) after it took them,
    # live on the expelled member alone:
    # the members take them from it while it runs and they follow it, else they are gone with it
    # (docs/replication.md, "A bound is backed..."; full-mix seed 242).
    for n in nodes:
        if n.core.anon:
            continue
        have = n.core.vclock_by_uuid()
        short = {u[:8]: (have.get(u, 0), b) for u, b in bounds[n.name].items()
                 if have.get(u, 0) != b and not _lost_with_a_disk(c, u, have.get(u, 0), b)
                 and not _gone_without(c, n, u, have.get(u, 0), b)}
        if short:
            raise c.fail(f"{n} holds an expelled member's rows other than up to the bound (has, bound): {short}")
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
