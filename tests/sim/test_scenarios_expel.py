"""Scripted simulation scenarios: members that first hear of a member after it was expelled,
from a greeting or only through a third node's `_cluster` row, while the member itself stays
out of their reach. Whichever road brings the news, every node ends with the expelled member
under the same bound, holding exactly its rows up to that bound.

At this level a bound first learned too low is raised again by the next `_cluster` row that
states it (the bound converges on the maximum), so the rule for a member first seen expelled
is pinned where it lives, in tests/unit/test_replicaset.py and test_cluster_space.py."""
from __future__ import annotations

from node.cluster_space.table import STATE_EXPELLED
from tests.sim.liveness import check_converged
from tests.sim.harness import Cluster
from tests.sim.steps import flushed, own_lsn, ready
from tests.sim.test_scenarios import form, form_chain, id_of, rows_of


def _expelled_everywhere(c: Cluster, name: str, holders: str) -> bool:
    u = c.nodes[name].uuid
    for h in holders:
        m = c.nodes[h].core.table.get(u) if c.nodes[h].core else None
        if m is None or m.state != STATE_EXPELLED:
            return False
    return True


def _c_joins_behind_a_partition_writes_and_is_expelled(c: Cluster) -> None:
    """A, B, S form; with A cut off from B and S, C joins through A and writes; cut off from A
    too, C is expelled on A and writes on, not knowing (rows past the bound, refused
    everywhere). Only A knows C at all."""
    form(c, "A", "B", "S")
    c.add_node("C")
    c.partition(["A", "C"], ["B", "S"])
    c.join("C", via="A")
    c.run_until(lambda: c.nodes["C"].ready and not c.nodes["C"].proc, what="C joined")
    for i in range(4):
        assert c.put("C", f"c{i}")
        c.run(1)
    c.run_until(lambda: len(rows_of(c, "A", "C")) >= 4, what="A has C's rows")
    c.cut("A", "C")             # C does not hear of its expel: it writes on
    c.expel("C", via="A")
    c.run(20)                   # (no "quiet" behind a partition: the cut links never catch up)
    for i in range(4, 7):
        assert c.put("C", f"c{i}")
        c.run(1)
    c.run(20)


def _bound(c: Cluster, holder: str, name: str) -> int:
    return c.nodes[holder].core.table.get(c.nodes[name].uuid).expelled_lsn


def test_members_that_learn_of_an_expelled_member_after_the_fact_keep_its_bound_and_its_rows(make_cluster):
    c = make_cluster(31)
    _c_joins_behind_a_partition_writes_and_is_expelled(c)
    assert id_of(c, "B", "C") is None and id_of(c, "S", "C") is None
    bound = _bound(c, "A", "C")
    assert bound >= 4
    # C stays cut off from B and S: they can learn of C only from A, already expelled
    c.heal()
    c.partition(["A", "B", "S"], ["C"])
    c.run_until(lambda: _expelled_everywhere(c, "C", "ABS") and all(
        len(rows_of(c, h, "C")) >= bound for h in "BS"), what="B and S learn C and its rows")
    c.run(50)
    for h in "BS":
        assert _bound(c, h, "C") == bound, h
        assert rows_of(c, h, "C") == list(range(1, bound + 1)), h
    assert len(rows_of(c, "C", "C")) > bound                  # C wrote past it: nobody took those
    check_converged(c)


def test_a_member_that_learns_of_an_expel_only_through_a_third_node_keeps_the_bound(make_cluster):
    """S follows only B: it first hears of C in B's own `_cluster` row, already expelled."""
    c = make_cluster(32)
    form_chain(c)
    c.add_node("C")
    c.nodes["C"].peers = ["A"]
    c.nodes["A"].peers = ["B", "C"]
    c.partition(["A", "C"], ["B", "S"])
    c.join("C", via="A")
    c.run_until(lambda: c.nodes["C"].ready and not c.nodes["C"].proc, what="C joined")
    for i in range(3):
        assert c.put("C", f"c{i}")
        c.run(1)
    c.run_until(lambda: len(rows_of(c, "A", "C")) >= 3, what="A has C's rows")
    c.cut("A", "C")
    c.expel("C", via="A")
    c.run(20)
    assert c.put("C", "late")                 # C has not heard of its expel
    c.run(20)
    bound = _bound(c, "A", "C")
    c.heal()
    c.partition(["A", "B", "S"], ["C"])
    c.run_until(lambda: _expelled_everywhere(c, "C", "ABS") and len(rows_of(c, "S", "C")) >= bound,
                what="B and S learn C and its rows")
    c.run(50)
    assert _bound(c, "S", "C") == _bound(c, "B", "C") == bound
    assert rows_of(c, "S", "C") == rows_of(c, "A", "C") == list(range(1, bound + 1))
    check_converged(c)


def _c_row_on_b_alone(c: Cluster) -> int:
    """A, B, C, D form; C's next row (lsn n, returned) reaches B alone (A and D are cut off)."""
    form(c, "A", "B", "C", "D")
    for i in range(2):
        assert c.put("C", f"c{i}")
        c.run(1)
    c.run_until_quiet()
    n = flushed(c, "C") + 1
    c.partition(["B", "C"], ["A", "D"])
    assert c.put("C", "c2-old")
    assert flushed(c, "C") == n
    c.run_until(lambda: own_lsn(c, "B", "C") == n, what="B holds C's row n")
    assert own_lsn(c, "D", "C") == n - 1
    return n


def _old_row_on_expelled_b_new_row_on_c(c: Cluster) -> int:
    """C's next row (lsn n, returned) reaches B alone; A expels B; C loses its store, joins
    again, hears every member (B, expelled, is not waited for), lifts its fence and writes
    rows from lsn n again (its table restated, a put). D, cut
    off from A and C, can reach only B, which still runs and serves subscribers."""
    n = _c_row_on_b_alone(c)
    assert c.expel("B", via="A")
    c.run_until(lambda: _expelled_everywhere(c, "B", "AD"), what="D hears of B's expel")
    c.lose_disk("C")
    c.heal()
    c.partition(["B"], ["A", "C", "D"])
    c.restart("C")
    c.run_until(lambda: ready(c, "C") and c.nodes["C"].core.fence is None, what="C joined again, unfenced")
    c.heal()
    c.partition(["A", "C"], ["B", "D"])
    assert c.put("C", "c2-new")
    assert flushed(c, "C") >= n                      # rows under lsn n again: the lift's, then this
    c.run(60)
    return n


def test_a_member_takes_from_an_expelled_upstream_no_row_of_a_member(make_cluster):
    """Seed 27742's case seen from a member: C's old row n is on B alone, expelled. D follows
    B and takes B's own rows up to the bound from it, but no member's row: taken, C's old row n
    would make (C, n) name two rows (invariant 1). D takes C's rows from C once it can."""
    c = make_cluster(34)
    n = _old_row_on_expelled_b_new_row_on_c(c)
    assert own_lsn(c, "D", "C") == n - 1             # nothing of C's from B
    assert c.nodes["D"].appliers["B"].status == "follow"
    c.heal()
    c.run_until(lambda: own_lsn(c, "D", "C") == own_lsn(c, "C", "C"), what="D takes C's rows from C")
    c.run_until_quiet()
    check_converged(c)


def test_a_fence_lifts_only_once_the_members_it_heard_know_of_the_expel_it_relies_on(make_cluster):
    """C's row n reached B alone. C loses its store and joins again through A while D is cut
    off from A and B; then A expels B, and C (fenced, taking no row of A's) hears of it past a
    gap. C waits for no expelled member. D, which can reach only B and C, speaks to C before it
    knows of the expel: were its word enough, C would lift and write lsn n again, while D
    followed B, which still serves, and took C's old row n (two rows under (C, n), silent;
    7 of seeds 30-49 did so). C's greeting states the expel it heard (`expels_heard`), D expels
    B too and greets C again, and only that word counts."""
    c = make_cluster(30)
    _c_row_on_b_alone(c)
    c.heal()
    c.partition(["A", "C"], ["B"], ["D"])
    c.lose_disk("C")
    c.restart("C")
    cc = c.nodes["C"]
    c.run_until(lambda: ready(c, "C") and cc.core.fence is not None and c.nodes["A"].uuid in cc.core.fence.heard,
                what="C joined again and heard A")
    assert c.expel("B", via="A")
    b = c.nodes["B"].uuid
    c.run_until(lambda: cc.core.fence.is_expelled(cc.core.table, b), what="C hears of B's expel")
    assert not _expelled_everywhere(c, "B", "CD")        # C heard it (no row of its own says it); D did not
    c.heal()
    c.partition(["A"], ["B", "C", "D"])
    c.run_until(lambda: cc.core.fence is None, what="C lifts its fence")
    assert _expelled_everywhere(c, "B", "CD")            # D knew before its word counted; C wrote it at the lift
    c.run(60)
    assert own_lsn(c, "D", "C") == own_lsn(c, "C", "C")  # D has C's rows, from C
    c.heal()
    c.run_until_quiet()
    check_converged(c)
