"""Shell bugs the simulation found in the issue 16 implementation, pinned as strict xfails.

Each seeded run here is the workload of tests/sim/workload.py with the one workaround named
left out (every other one on, so only this bug shows): it fails today, in the way the test
names. The workaround is the rule the fix presumably brings (its code in tests/sim/shell.py,
protocol.py or simnode.py says which shell function it departs from). When a fix lands, the run
passes, the strict xfail turns into a failure, and the workaround goes from
workload.WORKAROUNDS and from the simulation. Scripted scenarios below show the bugs whose
effect is a forked row in a few steps; each says what it shows.

A failure with another message than the one expected is a real failure, not an xfail.
"""
from __future__ import annotations

import pytest

from tests.sim.harness import Cluster, SimFailure
from tests.sim.steps import flushed, form, own_lsn
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
SEEDED = [
    ("replay_own_rows", 0, False, "names no member",
     "node/fence.py + storage: a wal_mode write node fenced after a power loss replays its own WAL with "
     "own_history_lsn = lsn_max (FenceKeeper.set before _open_bootstrapped), so its own `_cluster` rows "
     "since the last checkpoint are skipped: members it registered vanish from its table while their "
     "rows are applied (a vclock component naming no member). Related: clear_fence after such a fence "
     "raises own_history_lsn to the node's own lsn, so every later start skips the store's own "
     "registrations; and while power-fenced, its own `_cluster` rows coming back from peers are "
     "history, so registrations in the lost tail are not restored"),
    ("hold_at_durable", 359, False, "invariant 12",
     "node/applier/relay.py: a subscriber's first hold is created at its SUBSCRIBE vclock (claimed, not "
     "on disk; while it is fenced, raised to the relay's own position in every other component), and "
     "a JOIN's hold at the snapshot's vclock stays when the joiner takes its snapshot elsewhere or a "
     "rebuild does not complete: the relay collects rows the member does not have"),
    ("hold_unknown_subscriber", 100, False, "invariant 12",
     "node/retention.py _may_hold: a subscriber not (yet) in this node's `_cluster` (registered "
     "through another member) gets no hold, yet the relay serves it; _hold_for_new_members covers "
     "only members this node knows, which a node that follows nobody may never learn"),
    ("join_sets_gc_vclock", 192, False, "vclocks differ",
     "node/server.py _fetch_snapshot: a node that joined from a snapshot (a member re-joining after a "
     "lost store too) sets no gc_vclock, so its relay serves a subscriber behind the snapshot from the "
     "WAL start with a gap it can never fill from it (the rows are dropped as gaps); when every "
     "upstream is like that, the subscriber never converges (a rebuild sets gc_vclock, a JOIN does not)"),
    ("rejoin_unless_fed", 62, False, "quiet",
     "node/rejoin.py Rejoiner.watch: a node told need_rejoin waits while any upstream streams, even one "
     "that lacks the collected rows and can never send them: it waits for ever"),
    ("donor_has_needed", 706, False, "quiet",
     "node/rejoin.py Rejoiner.attempt: it rebuilds from any donor that covers it, even one that lacks "
     "the rows the refusing upstream collected: the rebuild gains nothing, empties its WAL (its "
     "subscribers are then told to rejoin) and repeats"),
    ("fenced_donor_for_known", 100, False, "quiet",
     "node/applier/relay.py serve_link: a fenced node refuses every JOIN, even of a member it has (no "
     "row of its own is needed): when every running member is fenced (a power loss of a wal_mode "
     "write cluster) a member that lost its store cannot join again, and the fences wait for it"),
    ("fenced_self_expel", 70, True, "no row under this node's own id while it is fenced",
     "node/core/replicaset.py: a fenced node receiving the row that expels it: _fenced_cluster_change "
     "skips rows about this node, _follow_cluster_rows then writes an own row and trips local_txn's "
     "assertion (in the shell the applier fails and the link stops for good)"),
    ("anon_own_not_uncovered", 358, True, "quiet",
     "node/rejoin.py: an anonymous replica's private component (its own `_cluster` rows) counts in "
     "`uncovered`, which no donor ever has: one told need_rejoin (its TTL lapsed) never rebuilds"),
    ("peer_history_ids", 681, True, "maps to",
     "node/core/replicaset.py _learn_peer_ids / _follow_cluster_rows: a member that joined again after "
     "a lost store relays its earlier incarnation's `_cluster` rows (history to it, in other ids); a "
     "peer takes them as the member's ids now: IdMap.learn's assertion fails (the link stops for "
     "good), or the map is silently wrong"),
    ("fenced_skip_unknown", 57, False, "quiet",
     "node/core/replicaset.py subscribe_vclock: a fenced node registers nobody, and its own-rows-only "
     "SUBSCRIBE leaves out the members it does not know (registered in its lost tail, or new): the "
     "relay sends their rows from the first, the node cannot translate them ('refusing to guess'), "
     "the link drops before its own rows come, every time: the fence never lifts"),
    ("fence_hears_all", 1180, True, "invariant 1",
     "node/core/membership.py OwnRowsFence: the fence waits only for members in the fenced node's own "
     "table (its donor's, after a lost store) and observe_peer hears only those: a member registered "
     "by its earlier incarnation, unknown to the donor, may hold its rows; the fence lifts without it "
     "and the node writes a second row under a used lsn"),
]


@pytest.mark.parametrize("workaround,seed,full,what,bug", SEEDED, ids=[s[0] for s in SEEDED])
@pytest.mark.xfail(strict=True, raises=SimFailure, reason="a shell bug (see the test's parameters)")
def test_seeded_run_without_the_workaround_fails(workaround, seed, full, what, bug):
    fails_with(what, lambda: run_seed(seed, without=frozenset([workaround]), full=full))


@pytest.mark.parametrize("workaround,seed,full,what,bug", SEEDED, ids=[s[0] for s in SEEDED])
def test_the_same_run_with_every_workaround_passes(workaround, seed, full, what, bug):
    run_seed(seed, full=full)


# Seen in soaks, no run that shows them alone found since the simulation last changed:
# "expelled_not_uncovered" (node/core/membership.py uncovered and the relay's need_rejoin count
# an expelled member's rows past the bound a node accepts, so no donor covers a node that
# applied them before it heard of the expel), "anon_rebuild_known" (node/rejoin.py _rebuild: an
# anonymous replica whose REGISTER went through at a master but whose answer was lost rebuilds
# from a snapshot that lists it as a member and adds itself again with another id:
# ClusterTable.upsert's assertion, for ever).
UNPINNED = {"expelled_not_uncovered", "anon_rebuild_known"}


def test_every_workaround_is_pinned_by_a_failing_run_or_named_unpinned():
    scripted = {"rebuild_keeps_fence", "fenced_no_own_cut"}     # SCRIPTED, and the last test but one
    assert {s[0] for s in SEEDED} | scripted | UNPINNED == set(WORKAROUNDS)


# --- scripted --------------------------------------------------------------------------------------
def cluster(seed: int, without: str) -> Cluster:
    c = Cluster(seed)
    c.workarounds = set(WORKAROUNDS - {without})
    return c


def rebuild_of_a_fenced_node(c: Cluster) -> None:
    """D writes rows 4-5 that reach B and C, then row 6 that reaches only C. D loses its store
    and joins again through A, which has only D's rows 1-3: fenced, it waits for C (down).
    Meanwhile A takes 4-5 from B and B collects them (every hold is past them), so B tells D to
    rejoin; D rebuilds from B (B covers D). The rebuild must keep the fence: D's row 6 is on C.
    Today it drops it, D writes a second row 6, and C comes back with the first."""
    form(c, "A", "B", "C", "D")
    for i in range(3):
        c.put("D", f"d{i}")
        c.run(1)
    c.run_until_quiet()
    c.partition(["A"], ["B", "C", "D"])
    for i in range(3, 5):
        assert c.put("D", f"d{i}")
        c.run(1)
    flushed(c, "D")
    c.run_until(lambda: own_lsn(c, "B", "D") == own_lsn(c, "D", "D") == own_lsn(c, "C", "D"), what="B and C hold D's rows")
    c.run(10)                                 # D's ACKs reach B: B's hold for D is past them
    c.heal()
    c.partition(["A"], ["B"], ["C", "D"])
    assert c.put("D", "d-only-on-C")
    flushed(c, "D")
    c.run_until(lambda: own_lsn(c, "C", "D") == own_lsn(c, "D", "D"), what="C holds D's last row")
    c.crash("C")                              # C, the only other holder of D's last row, is down
    c.lose_disk("D")
    c.configure_peers("D", [])
    c.heal()
    c.partition(["A", "D"], ["B"])            # D joins through A before A has D's rows 4-5
    c.restart("D")
    c.run_until(lambda: c.nodes["D"].ready and not c.nodes["D"].proc, what="D joined through A")
    assert c.nodes["D"].core.fence is not None
    c.configure_peers("D", [])
    c.heal()
    c.run_until(lambda: own_lsn(c, "A", "D") == own_lsn(c, "B", "D"), what="A has D's rows 4-5 from B")
    c.put("B", "later")                       # (the WAL's last entry always stays)
    c.run(20)
    assert c.checkpoint(c.nodes["B"]) > 0
    c.configure_peers("D", ["B"])             # B collected D's rows 4-5: it tells D to rejoin
    c.run_until(lambda: c.stats["rejoins"] >= 1, max_ticks=300, what="D rebuilt from B")
    early = c.put("D", "second-row-6")        # fenced, D refuses; unfenced, it forks (D, 6)
    c.run(10)
    assert early is None
    c.restart("C")
    c.run(60)


def member_only_the_lost_store_knew(c: Cluster) -> None:
    """X joins through D while D is cut off from A, B, C: only D's store knows X, and X's
    snapshot holds D's rows. D writes two more rows (X takes them), then loses its store, and X
    is cut off from everyone. D joins again through A: its table (A's) has no X, the fence hears
    A, B and C and lifts, and D writes under lsns whose rows X holds. No workaround helps: no
    greeting ever names X. The fence needs a way to know of every member a lost store knew."""
    form(c, "A", "B", "C", "D")
    c.add_node("X")
    c.partition(["A", "B", "C"], ["D", "X"])
    c.join("X", via="D")
    c.run_until(lambda: c.nodes["X"].ready and not c.nodes["X"].proc, what="X joined through D")
    for i in range(2):
        assert c.put("D", f"d{i}")
        c.run(1)
    flushed(c, "D")
    c.run_until(lambda: own_lsn(c, "X", "D") == own_lsn(c, "D", "D"), what="X holds D's rows")
    c.lose_disk("D")
    c.heal()
    c.partition(["X"], ["A", "B", "C", "D"])
    c.restart("D")
    c.run_until(lambda: c.nodes["D"].ready and not c.nodes["D"].proc, what="D joined again")
    c.run_until(lambda: c.nodes["D"].core.fence is None, what="D's fence lifted")
    assert c.put("D", "reused-lsn")
    c.run(10)
    c.heal()
    c.run(60)


def anonymous_replica_holds_the_row(c: Cluster) -> None:
    """D (wal_mode write) writes a row that only the anonymous replica R takes (D's peers are
    cut off), then loses power before the row is on disk. D restarts fenced, hears A, B and C
    (none has the row), lifts, and writes a second row under that lsn; R holds the first.
    Anonymous replicas are never waited for (OwnRowsFence.waiting_for) nor heard
    (FenceKeeper.on_greeting), yet one may be the only other holder of a row."""
    c.add_node("D", wal_mode="write")
    form(c, "A", "B", "C", "D")
    c.add_node("R", anon=True)
    c.fetch_anon("R", via="D")
    c.run_until(lambda: c.nodes["R"].ready and not c.nodes["R"].proc, what="R fetched")
    c.run_until_quiet()
    c.nodes["D"].sync_p = 0.0
    c.partition(["A", "B", "C"], ["D", "R"])
    assert c.put("D", "only-on-R")
    c.run_until(lambda: own_lsn(c, "R", "D") == c.nodes["D"].core.claimed.get(c.nodes["D"].core.self_id),
                what="R holds D's row")
    c.crash("D", power=True)
    c.nodes["D"].sync_p = None
    c.heal()
    c.partition(["R"], ["A", "B", "C", "D"])
    c.restart("D")
    c.run_until(lambda: c.nodes["D"].core.fence is None, what="D's fence lifted")
    assert c.put("D", "same-lsn")
    c.run(10)
    c.heal()
    c.run(60)


# (scenario, seed, the workaround that presumes its fix, or None where none does)
SCRIPTED = [
    (rebuild_of_a_fenced_node, 41, "rebuild_keeps_fence"),
    (member_only_the_lost_store_knew, 42, None),
    (anonymous_replica_holds_the_row, 43, None),
]


@pytest.mark.parametrize("scenario,seed,workaround", SCRIPTED, ids=[s[0].__name__ for s in SCRIPTED])
@pytest.mark.xfail(strict=True, raises=SimFailure, reason="an own-rows fence bug: the scenario's docstring says which")
def test_a_node_that_lost_rows_never_writes_a_second_row_under_one_of_their_lsns(scenario, seed, workaround):
    fails_with("invariant 1", lambda: scenario(cluster(seed, without=workaround or "")))


@pytest.mark.parametrize("scenario,seed,workaround", [s for s in SCRIPTED if s[2]],
                         ids=[s[0].__name__ for s in SCRIPTED if s[2]])
def test_with_the_workaround_the_scenario_keeps_every_row(scenario, seed, workaround):
    c = cluster(seed, without="")
    scenario(c)
    c.settle()


@pytest.mark.xfail(strict=True, raises=SimFailure, reason="relay_wants' own-rows cut holds back a fenced node's own rows")
def test_a_fenced_node_gets_back_its_own_rows_that_reach_its_upstream_after_it_subscribed():
    """The rebuild scenario above with the fence kept: D, fenced, follows only B; its row 6
    reaches B from C after D subscribed. The relay's own-rows cut (relay.py: a subscriber's own
    rows past what the relay held when it subscribed are not echoed back) keeps row 6 from D on
    that link, so the fence waits until the link happens to break (here: for ever)."""
    def run():
        c = cluster(41, without="fenced_no_own_cut")
        rebuild_of_a_fenced_node(c)
        c.settle()
    fails_with("quiet", run)


@pytest.mark.xfail(strict=True, raises=SimFailure, reason="an expel needs an unfenced member; the fences wait for the expel")
def test_a_member_gone_for_good_can_be_expelled_when_every_member_is_fenced():
    """Seed 450 (REPLOG_SIM_MIX=full; the soak found it in the default mix before that left out
    members down for good beside wal_mode write): B goes down for good; the others are
    fenced (power losses under wal_mode write, a lost store), each waiting to hear from B.
    server.expel refuses on a fenced node ("expel through another member"), and there is no
    other: the fences can never lift. A fenced node could take an expel of a member it waits
    for (the expel row is a row of its own, the one thing a fence forbids), or the operator
    needs an offline tool."""
    fails_with("no member could expel", lambda: run_seed(450, full=True))
