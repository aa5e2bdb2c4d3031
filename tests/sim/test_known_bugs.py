"""Shell bugs the simulation finds, pinned as strict xfails (those of the issue 16 work that
node/ fixed since are regression tests in tests/sim/test_fixed_bugs.py).

Each seeded run here is the workload of tests/sim/workload.py with the one workaround named
left out (every other one on, so only this bug shows): it fails today, in the way the test
names. The workaround is the rule the fix presumably brings (its code in tests/sim/shell.py,
protocol.py or simnode.py says which shell function it departs from). When a fix lands, the run
passes, the strict xfail turns into a failure, and the workaround goes from
workload.WORKAROUNDS and from the simulation (its seed then joins tests/sim/test_fixed_bugs.py).

A failure with another message than the one expected is a real failure, not an xfail.
"""
from __future__ import annotations

import pytest

from tests.sim.harness import Cluster, SimFailure
from tests.sim.steps import flushed, form, own_lsn, ready
from tests.sim.workload import WORKAROUNDS, run_seed


def fails_with(what: str, run) -> None:
    """Run; a SimFailure whose message holds `what` is the expected failure (re-raised as
    such), anything else is an error of this test."""
    try:
        run()
    except SimFailure as e:
        if what not in str(e):
            raise AssertionError(f"failed otherwise than expected ({what!r}):\n{e}") from None
        raise


# (workaround, seed, REPLOG_SIM_MIX=full?, expected failure, the bug)
REOPEN = ("node/storage/store.py Store.__init__: a store whose meta holds an own-rows fence opens with "
          "own_history_lsn = lsn_max whether the fence is `rebuilt` or not. A wal_mode write node fenced after "
          "a power loss (FenceKeeper.set(rebuilt=False)) that starts again before its fence lifts replays its "
          "own `_cluster` rows since the last checkpoint as history: members it registered vanish from its "
          "table while their rows are applied (a vclock component naming no member), and peers' maps still "
          "say its id k is that member (once the fence lifts it may give id k to another). FenceKeeper.restore "
          "leaves the bound at lsn_max while it runs, so its own `_cluster` rows coming back from peers change "
          "the core's table and not the store's. The fix: lsn_max only for a fence with `rebuilt` true")
EXPELLED_CLAIM = (
    "node/core/membership.py OwnRowsFence.target (b33fe11): the most of a fenced node's rows any member "
    "holds leaves out what members some peer says are expelled said, and waiting_for skips them. An expelled "
    "member that still runs is still followed (node/applier/applier.py takes every other origin's rows from "
    "it) and passes on the fenced node's rows it holds. Seed 259 (full mix): C loses its store and joins "
    "again fenced; A, expelled through B, said it holds C's row 2; C hears B, D and E (row 1 each), lifts, "
    "writes a second row 2, and B takes A's row 2. The fix: keep an expelled member's word unless the "
    "operator gave it up on this node (the workaround), or stop following an expelled upstream")
SEEDED = [
    ("fence_counts_expelled", 259, True, "invariant 1", EXPELLED_CLAIM),
    ("reopen_power_fence", 31, False, "names no member", REOPEN),
    ("reopen_power_fence", 248, False, "invariant 7", REOPEN),
]
IDS = [f"{s[0]}-seed{s[1]}" for s in SEEDED]


@pytest.mark.parametrize("workaround,seed,full,what,bug", SEEDED, ids=IDS)
@pytest.mark.xfail(strict=True, raises=SimFailure, reason="a shell bug (see the test's parameters)")
def test_seeded_run_without_the_workaround_fails(workaround, seed, full, what, bug):
    fails_with(what, lambda: run_seed(seed, without=frozenset([workaround]), full=full))


@pytest.mark.parametrize("workaround,seed,full,what,bug", SEEDED, ids=IDS)
def test_the_same_run_with_every_workaround_passes(workaround, seed, full, what, bug):
    run_seed(seed, full=full)


def fenced_node_that_does_not_know_a_member(c: Cluster) -> None:
    """A (wal_mode write) is cut off while D joins through B and writes. Healed, A learns of D
    from a greeting and registers it, and writes a row; B and C take both rows, A syncs
    neither and loses power: it restarts fenced, without D in its table and without its last
    rows, which it must get back before it writes again. Fenced, it registers nobody, and its
    own-rows-only SUBSCRIBE (NodeCore.subscribe_vclock) asks from where the relay is only for
    the members it has: D's component is left out, so the relay sends D's rows from the first,
    before A's own, and A cannot translate them ('refusing to guess'): every link drops before
    A's rows come, every time, and the fence never lifts. (The workaround "fenced_skip_unknown"
    asks for every member the relay's greeting lists from where the relay is.)"""
    c.add_node("A", wal_mode="write")
    form(c, "A", "B", "C")
    c.add_node("D")
    c.partition(["A"], ["B", "C", "D"])
    c.join("D", via="B")
    c.run_until(lambda: ready(c, "D"), what="D joined through B")
    for i in range(3):
        assert c.put("D", f"d{i}")
        c.run(1)
    flushed(c, "D")
    c.run_until(lambda: own_lsn(c, "B", "D") == own_lsn(c, "D", "D"), what="B holds D's rows")
    a = c.nodes["A"]
    a.sync_p = 0.0
    c.heal()
    c.run_until(lambda: a.core.table.get(c.nodes["D"].uuid) is not None, what="A learns of D")
    assert c.put("A", "lost-at-A")
    top = a.core.claimed.get(a.core.self_id)
    c.run_until(lambda: own_lsn(c, "B", "A") == top == own_lsn(c, "C", "A"), what="B and C hold A's rows")
    c.crash("A", power=True)
    a.sync_p = None
    c.restart("A")
    assert a.core.fence is not None and a.core.table.get(c.nodes["D"].uuid) is None
    c.settle(max_ticks=600)


@pytest.mark.xfail(strict=True, raises=SimFailure, reason="node/core/replicaset.py subscribe_vclock leaves out "
                   "members a fenced node does not know; their rows cannot be translated (docstring)")
def test_a_fenced_node_gets_its_own_rows_back_though_it_does_not_know_a_member_of_its_upstream():
    c = Cluster(44)
    fails_with("quiet", lambda: fenced_node_that_does_not_know_a_member(c))


def test_with_the_workaround_a_fenced_node_that_does_not_know_a_member_lifts_its_fence():
    c = Cluster(44)
    c.workarounds = {"fenced_skip_unknown"}
    fenced_node_that_does_not_know_a_member(c)
    assert c.stats["fences_lifted"] >= 1


def catch_up_while_told_to_rejoin(c: Cluster) -> None:
    """The reference's case (a) (tests/sim/test_scenarios.py): C joins through A and D through
    B while A and B are cut apart. Healed, B subscribes to C, whose WAL starts at its snapshot
    (a row of A's that B lacks): C tells B to rejoin. B's link to A is still in its handshake,
    so no upstream feeds B (Rejoiner.watch) and the attempt starts; A's link then streams and B
    catches up past what C collected while the attempt probes and waits for cover. The attempt
    (node/rejoin.py Rejoiner.attempt, _rebuild) never looks again: B rebuilds from a snapshot it
    no longer needs (its WAL emptied, its subscribers told to rejoin, its ids now the donor's).
    Nothing is lost; the workaround "rebuild_only_if_lacking" checks again before the rebuild."""
    from tests.sim.test_scenarios import case_a
    case_a(c)
    for i in range(3):
        c.put("C", f"c{i}")
        c.put("D", f"d{i}")
        c.run(1)
    c.heal()
    c.run_until_quiet()
    assert c.stats["refused_need_rejoin"] > 0
    assert c.stats["rejoins"] == 0, "a node rebuilt though it had caught up"


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="node/rejoin.py Rejoiner.attempt rebuilds without "
                   "looking again whether the collected rows are still lacking (docstring)")
def test_a_node_that_catches_up_while_its_rejoin_attempt_runs_does_not_rebuild():
    catch_up_while_told_to_rejoin(Cluster(11))


def test_with_the_workaround_a_node_that_caught_up_does_not_rebuild():
    c = Cluster(11)
    c.workarounds = {"rebuild_only_if_lacking"}
    catch_up_while_told_to_rejoin(c)


# workarounds only scripted scenarios take (the seeded runs keep the shell's rule: a needless
# rebuild loses nothing, and the runs exercise rebuilds more with it)
SCRIPTED_ONLY = {"rebuild_only_if_lacking"}


def test_every_workaround_is_pinned_by_a_failing_run():
    assert {s[0] for s in SEEDED} | {"fenced_skip_unknown"} == set(WORKAROUNDS)
    assert not SCRIPTED_ONLY & set(WORKAROUNDS)
