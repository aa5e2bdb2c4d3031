"""Seeded runs and scripted scenarios that showed the shell's membership bugs of the issue 16
work (each was pinned as a strict xfail, with a workaround in the simulation, until node/ was
fixed); node/ now keeps each rule, the simulation follows it with no workaround, and each run
must keep every invariant and converge. The seeds are the ones that showed each bug alone, under
the simulation's own copy of the link protocol; since the simulation runs the production link
machines (issue 18) the same seed makes another schedule, so a test that needs its bug's
situation to happen asserts that it did, with a seed that reaches it now.
"""
from __future__ import annotations

import pytest

from node.cluster_space.table import STATE_EXPELLED
from node.core import lifecycle_rejoin
from node.core.kinds import GROUP_LOCAL
from node.core.link import applier as link_applier
from tests.sim import liveness
from tests.sim.checkers import content
from tests.sim.harness import Cluster, SimFailure
from tests.sim.liveness import check_acknowledged, check_converged
from tests.sim.test_scenarios_expel import _old_row_on_expelled_b_new_row_on_c
from tests.sim.steps import flushed, form, own_lsn, ready
from tests.sim.workload import run_seed

# (behaviour kept, seed, REPLOG_SIM_MIX=full? ("anon": full+anon), the shell function that once broke it)
SEEDED = [
    ("a_power_fenced_node_replays_its_own_registrations", 0, False, "node/fence.py FenceKeeper.set (rebuilt)"),
    ("a_relay_holds_its_wal_from_what_a_subscriber_has_on_disk", 359, False, "node/core/holds.py Holds.on_subscribe"),
    ("a_subscriber_registered_elsewhere_is_held", 100, False, "node/core/holds.py Holds.may_hold"),
    ("a_node_that_lost_rows_waits_only_for_an_upstream_that_has_them", 62, False, "node/rejoin.py Rejoiner._fed"),
    ("a_rebuild_takes_only_a_donor_that_has_the_collected_rows", 706, False, "node/rejoin.py Rejoiner.attempt"),
    ("a_fenced_node_takes_the_row_expelling_it_after_its_fence", 70, True,
     "node/core/cluster_rows.py _fenced_cluster_change"),
    ("an_anonymous_replica_rebuilds_without_its_own_component", 358, True, "node/rejoin.py Rejoiner._mine"),
    ("a_peers_earlier_incarnation_rows_teach_no_ids", 681, True, "node/core/cluster_rows.py Peer.history_lsn"),
    ("a_fence_hears_every_member_any_greeting_lists", 1180, True, "node/core/membership.py OwnRowsFence.known"),
    ("a_member_gone_for_good_is_expelled_when_every_member_is_fenced", 96, True, "node/server.py expel (give_up)"),
    ("a_store_fenced_after_a_power_loss_keeps_its_registrations_across_a_restart", 31, False,
     "node/storage/store.py Store.__init__ (own_history_lsn)"),
    ("a_store_fenced_after_a_power_loss_keeps_its_registrations_across_a_restart", 248, False,
     "node/storage/store.py Store.__init__ (own_history_lsn)"),
    ("a_fence_keeps_the_word_of_a_member_some_peer_says_is_expelled", 259, True,
     "node/core/membership.py OwnRowsFence.target (given_up)"),
    # session 27: F's link from C, greeted while C's rebuilt store was fenced ("every own row is
    # history"), outlived the fence: C's restated table and new ids taught F nothing, and F's map
    # took C's id 4 for F itself from C's earlier incarnation's row (invariant 7)
    ("a_link_greeted_while_its_relay_was_fenced_greets_again_once_the_fence_lifts", 181, True,
     "node/core/link/relay.py RelayMachine.rows_may_go"),
    # session 27: C had D's row 1 on its way to disk for 14 ticks while D, which had lost its store,
    # rejoined fenced and heard C's applied vclock (no row of D's): D lifted its fence and wrote a
    # second row 1 (invariant 1). Greetings now say what a node holds or is writing, and a relay
    # heartbeats no subscriber whose own rows are still in flight here
    ("a_fenced_node_counts_its_rows_a_peer_is_still_writing", 1134, True,
     "node/lifecycle.py Lifecycle.greeting_fields (vclock_uuid), RelayMachine.tick"),
    # session 27: D held rows 1-3 of B, which C had expelled with bound 0; every peer told D to
    # rejoin, and D, which never heard of the expel, found no donor covering B's rows (a stall)
    ("a_rejoin_takes_a_donors_expel_bounds_for_members_it_never_heard_expelled", 2370, True,
     "node/core/lifecycle_rejoin.py RejoinMachine.uncovered (Probed.bounds)"),
    # session 27: the operator expelled E (down for good) through B while B was fenced and had no
    # row for E (a fenced node registers nobody): B lifted its fence and dropped the expel, and D
    # stayed fenced for ever waiting to hear from E (a stall)
    ("a_pending_expel_of_a_member_the_node_never_registered_is_written_at_the_lift", 5514, True,
     "node/core/lifecycle_fence.py expels_after_lift"),
    # session 28: B's last row reached only R, an anonymous replica subscribed to B; B lost its
    # store, rejoined fenced, heard every member (none had the row) and lifted, and wrote a second
    # row under that lsn, which R kept skipping as one it had (invariant 1, silent on R). The
    # fence now waits for the anonymous replicas that followed the node and counts what any says;
    # the operator adds R to B's peers, as B's status says, and the row comes back from R
    ("a_fence_counts_the_word_of_an_anonymous_replica_that_holds_the_nodes_last_rows", 5108, True,
     "node/core/lifecycle_fence.py hear_greeting"),
    ("a_fence_counts_the_word_of_an_anonymous_replica_that_holds_the_nodes_last_rows", 5782, True,
     "node/core/lifecycle_fence.py hear_greeting"),
    # session 30: E, fenced after a power loss, waited for F (down for good); the operator expelled
    # F on A while E's links stayed up. A's expel row and each member's own row following it reached
    # E past a gap in their origins' rows (a fenced node asks other components from where the peer
    # is), were not applied, and told the fence nothing: E stayed fenced (a stall, no greeting came)
    ("a_fence_hears_an_expel_row_that_comes_past_a_gap", 15104, True,
     "node/core/membership.py OwnRowsFence.hear_expels"),
    # session 30: C, expelled while it was down, started again not knowing it (every member
    # refused its links as expelled) and registered E: its own row past its expel bound, which no
    # member takes, so E held rows nobody else could have; every node told E to rejoin and no
    # snapshot covered it (a stall). A node refused as expelled now registers nobody (seed 15214
    # then; since session 35 a join asks no donor another polled peer lists as expelled, and
    # seed 40 reaches a JOIN refused as expelled: the stat below)
    ("a_node_refused_as_expelled_registers_nobody", 40, True, "node/core/replicaset.py told_expelled"),
    # session 31: C expelled A while A was cut off; A, not knowing, registered F, whose snapshot so
    # held A's rows past the bound (no member takes them, no relay can serve them). F told every
    # member that subscribed to it to rejoin for them, and they told F and each other in turn (a
    # stall). A relay now wants no row of an expelled member past the bound from a subscriber
    ("a_node_that_joined_through_a_member_expelled_meanwhile_replicates", 13943, True,
     "node/core/link/relay.py behind"),
    # session 31, found by the change above: B greeted E stating D's bound 0, took bound 2 before
    # its SUBSCRIBE went, and stayed on the link E served by bound 0, never getting D's rows up
    # to 2 (collected on E). A link now notes the bounds as of its greeting: grown, it resubscribes
    ("a_link_resubscribes_when_a_bound_grows_after_its_greeting", 832, True, "node/core/link/applier.py start"),
    # session 31, found by the bound oracle (tests/sim/liveness.py): D expelled B; B, not knowing,
    # registered F, whose snapshot came with B's table (B's bound 8) and B's rows to 9. Members
    # that rebuilt from F took bound 8 from its table, C kept its 7 (no row stated 8), and A held
    # B's row 9 past every bound. A greeting now raises bounds to what it states or what is held
    ("a_bound_that_came_in_a_snapshot_reaches_every_member", 3372, True, "node/core/replicaset.py _raise_bounds"),
    ("a_bound_that_came_in_a_snapshot_reaches_every_member", 5010, True, "node/core/replicaset.py _raise_bounds"),
    # session 33 (REPLOG_SIM_MIX=full+anon, "anon" below): R, an anonymous replica, registered and
    # crashed before its registration row was on disk; back anonymous, it registered again while
    # the members subscribed to it. Its relay cut its own rows from each link (an anonymous node
    # sends none), and the links outlived the registration: R's rows never reached the members
    # (vclocks differ after healing). Such a link now greets again once its relay is a member
    ("a_link_subscribed_while_its_relay_was_anonymous_greets_again_once_it_registers", 4088, "anon",
     "node/core/link/relay.py RelayMachine.rows_may_go (anon_cut)"),
    ("a_link_subscribed_while_its_relay_was_anonymous_greets_again_once_it_registers", 6200, "anon",
     "node/core/link/relay.py RelayMachine.rows_may_go (anon_cut)"),
    # session 33: B, fenced after a lost store, was rebuilding from E's snapshot when its fence
    # could lift; it lifted and restated its table under its own id in the store the swap then
    # replaced (invariant 2: its own vclock went back from 6 to 3; a relay still serving could
    # have sent those rows, and the next took their lsns). The fence now waits for the rebuild
    ("a_fence_does_not_lift_while_a_rebuild_is_under_way", 23372, True,
     "node/core/lifecycle_fence.py may_lift (rebuilding)"),
    # session 33: B first heard of E, expelled, in E's own greeting and took E's bound for itself,
    # 3, from it; E's row 3 reached no member (they refuse it), and every member ended with bound
    # 3 and E's rows to 2. An expelled peer's word about its own bound is not taken there either
    ("an_expelled_peers_own_greeting_states_no_bound_for_itself", 24624, True,
     "node/core/replicaset.py NodeCore.greeting"),
    # session 33 (fixed in 34): E had C's rows 3-4 claimed, not on disk, when D's expel of C
    # (bound 1) reached it; E raised the bound to 4, so as to take them, and F took 4 from E's
    # greeting and stated it in a row of its own. E was killed and lost rows 3-4; every member
    # ended with bound 4 and C's rows to 2, rows 3-4 on C alone. A greeting states a bound as far
    # as another node's word or the node's disk backs it (seed 16143 then; since session 35's
    # subscriptions to an expelled upstream, seed 16 reaches that greeting: the stat below)
    ("a_bound_raised_to_rows_not_on_disk_is_stated_only_as_far_as_backed", 16, True,
     "node/core/replicaset.py NodeCore.greeting_rows"),
]


@pytest.mark.parametrize("behaviour,seed,full,where", SEEDED, ids=[f"{s[0]}-seed{s[1]}" for s in SEEDED])
def test_a_seeded_run_that_showed_a_membership_bug_keeps_every_invariant(behaviour, seed, full, where):
    c = run_seed(seed, full=bool(full), anon_crash=full == "anon")
    if behaviour.startswith("a_member_gone_for_good"):
        assert c.stats["expels_pending_fence"] > 0      # the expel went through a fenced node
    if behaviour.startswith("a_node_refused_as_expelled"):
        assert c.stats["refused_donor_expelled"] > 0    # a JOIN went to a donor refused as expelled
    if behaviour.startswith("a_link_greeted_while"):
        assert c.stats["refused_greet_again"] > 0       # a relay's greeting outlived its fence
    if behaviour.startswith("a_fence_counts_the_word_of_an_anonymous"):
        assert c.stats["peers_added_for_fence"] > 0     # only an anonymous replica held the rows
    if behaviour.startswith("a_link_subscribed_while_its_relay_was_anonymous"):
        assert c.stats["links greeted again: their relay registered"] > 0
    if behaviour.startswith("a_fence_does_not_lift_while"):
        assert c.stats["fence lifts deferred by a rebuild"] > 0
    if behaviour.startswith("a_bound_raised_to_rows_not_on_disk"):
        assert c.stats["greetings stating a bound as far as on disk"] > 0


def finish(c: Cluster) -> None:
    c.settle()
    check_converged(c)
    check_acknowledged(c)


def rebuild_of_a_fenced_node(c: Cluster) -> None:
    """D writes rows 4-5 that reach B and C, then row 6 that reaches only C. D loses its store
    and joins again through A, which has only D's rows 1-3: fenced, it waits for C (down).
    Meanwhile A takes 4-5 from B and B collects them (every hold is past them), so B tells D to
    rejoin; D rebuilds from B (B covers D). The rebuild keeps the fence (D's row 6 is on C, and
    the fence once dropped here, so D wrote a second row 6); D, fenced, follows only B, and its
    row 6 reaches B from C after D subscribed: B's relay sends it on, past the own-rows cut
    that once held it back for ever."""
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
    c.heal()
    c.partition(["A", "D"], ["B"])            # D joins through A before A has D's rows 4-5 (C is down)
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


def test_a_rebuilt_fenced_node_keeps_its_fence_and_gets_its_own_rows_back_from_its_upstream():
    c = Cluster(41)
    rebuild_of_a_fenced_node(c)
    finish(c)
    d = c.nodes["D"]
    assert d.core.fence is None and c.stats["fences_lifted"] >= 1
    assert own_lsn(c, "D", "D") == own_lsn(c, "C", "D")


def lost_store_joins_again(c: Cluster) -> int:
    """X joins through D while D is cut off from A, B, C: only D's store knows X, and X's
    snapshot holds D's rows. D writes two more rows (X takes them), then loses its store, and X
    is cut off from everyone. D joins again through A, whose snapshot has neither X nor those
    rows. Returns the last lsn of D's that X holds."""
    form(c, "A", "B", "C", "D")
    c.add_node("X")
    c.partition(["A", "B", "C"], ["D", "X"])
    c.join("X", via="D")
    c.run_until(lambda: c.nodes["X"].ready and not c.nodes["X"].proc, what="X joined through D")
    for i in range(2):
        assert c.put("D", f"d{i}")
        c.run(1)
    top = flushed(c, "D")
    c.run_until(lambda: own_lsn(c, "X", "D") == top, what="X holds D's rows")
    c.lose_disk("D")
    c.heal()
    c.partition(["X"], ["A", "B", "C", "D"])
    c.restart("D")
    c.run_until(lambda: c.nodes["D"].ready and not c.nodes["D"].proc, what="D joined again")
    return top


def test_a_lost_store_still_waits_for_a_member_only_it_had_registered():
    """D joins again (lost_store_joins_again): its table (A's) has no X, yet D noted beside its
    identity that it registered X (node/fence.py registered_members): the fence waits for X, D
    refuses writes meanwhile, and once X is heard D's rows come back and D writes past them."""
    c = Cluster(42)
    top = lost_store_joins_again(c)
    c.run(100)
    d = c.nodes["D"]
    assert d.core.fence is not None and c.nodes["X"].uuid in d.core.fence.waiting_for(d.core.table, d.uuid)
    assert c.put("D", "refused") is None
    c.heal()
    c.run_until(lambda: c.nodes["D"].core.fence is None, what="D's fence lifted")
    assert own_lsn(c, "D", "D") >= top
    assert c.put("D", "past-the-lost-rows")
    finish(c)


def test_the_simulation_catches_a_join_that_does_not_fence_a_member_that_wrote_before(monkeypatch):
    """The fenced-join rule lives in the production join machine (node.core.lifecycle_join
    join_fence, which node/join.py and the simulation both step): turned back there (a store
    joined under an identity that went active is never fenced), D writes at once under lsns
    whose rows X holds, and the run says so when X's rows meet D's."""
    from node.core import lifecycle_join
    monkeypatch.setattr(lifecycle_join, "join_fence", lambda *args: None)
    c = Cluster(42)
    lost_store_joins_again(c)
    assert c.nodes["D"].core.fence is None
    with pytest.raises(SimFailure, match=r"invariant 1 broken .*differs"):
        for i in range(3):
            assert c.put("D", f"second-d{i}")
            c.run(1)
        c.heal()
        c.settle()


def test_an_anonymous_replica_of_a_wal_mode_write_node_gets_only_rows_on_disk():
    """D (wal_mode write) writes a row while its peers are cut off and only the anonymous
    replica R follows it, then loses power before the row is on disk. R never gets the row
    (Relay: anonymous subscribers in wal_mode write read only synced frames), so D, fenced
    after the loss, waits to hear A, B, C and R (an anonymous replica that followed it is
    waited for like a member: node/fence.py anonymous_followers) and then may write under that
    lsn again: nobody holds the first."""
    c = Cluster(43)
    c.add_node("D", wal_mode="write")
    form(c, "A", "B", "C", "D")
    c.add_node("R", anon=True)
    c.fetch_anon("R", via="D")
    c.run_until(lambda: c.nodes["R"].ready and not c.nodes["R"].proc, what="R fetched")
    c.run_until_quiet()
    c.nodes["D"].sync_p = 0.0
    c.partition(["A", "B", "C"], ["D", "R"])
    assert c.put("D", "only-in-D's-page-cache")
    claimed = c.nodes["D"].core.claimed.get(c.nodes["D"].core.self_id)
    c.run_until(lambda: c.nodes["D"].applied_pos == len(c.nodes["D"].wal) and not c.nodes["D"].queue, what="D wrote it")
    c.run(30)
    assert own_lsn(c, "R", "D") < claimed
    c.crash("D", power=True)
    c.nodes["D"].sync_p = None
    c.heal()
    c.partition(["R"], ["A", "B", "C", "D"])
    c.restart("D")
    c.run(50)
    assert c.nodes["D"].core.fence is not None      # it has not heard R, which followed it
    assert c.nodes["D"].core.fence.waiting_for(c.nodes["D"].core.table, c.nodes["D"].uuid) == [c.nodes["R"].uuid]
    c.heal()
    c.run_until(lambda: c.nodes["D"].core.fence is None, what="D's fence lifted")
    assert c.put("D", "same-lsn")
    c.run(10)
    finish(c)


def test_an_upstream_that_claimed_a_fenced_nodes_rows_and_lost_them_does_not_hold_its_fence():
    """A and B run in wal_mode write; A writes two rows B takes, neither syncs, and A loses
    power: fenced, it hears B say it holds them. Then B loses power too, and the rows are
    nowhere. B's relay catches A up and heartbeats without them: the claim was false
    (ApplierMachine's claim check, node.core.lifecycle_fence.disprove_claim), so it holds neither A's fence (its heard
    falls to what came) nor A's writes, and A writes again (6852e81; before it, for ever
    fenced)."""
    c = Cluster(45)
    c.add_node("A", wal_mode="write")
    c.add_node("B", wal_mode="write")
    form(c, "A", "B", "C")
    a, b = c.nodes["A"], c.nodes["B"]
    c.partition(["C"], ["A", "B"])
    a.sync_p = b.sync_p = 0.0
    for i in range(2):
        assert c.put("A", f"a{i}")
        c.run(1)
    top = a.core.claimed.get(a.core.self_id)
    c.run_until(lambda: own_lsn(c, "B", "A") == top, what="B holds A's rows (written, not on disk)")
    c.crash("A", power=True)
    c.restart("A")
    assert a.core.fence is not None
    c.run_until(lambda: a.core.fence.heard.get(b.uuid, 0) == top, what="A hears B claim its rows")
    c.crash("B", power=True)
    a.sync_p = b.sync_p = None
    c.restart("B")
    c.heal()
    c.run_until(lambda: a.core.fence is None, max_ticks=300, what="A's fence lifted")
    assert c.stats["claims_disproved"] >= 1
    assert c.put("A", "again")
    finish(c)


def fenced_node_that_does_not_know_a_member(c: Cluster) -> None:
    """A (wal_mode write) is cut off while D joins through B and writes. Healed, A learns of D
    from a greeting and registers it, and writes a row; B and C take both rows, A syncs
    neither and loses power: it restarts fenced, without D in its table and without its last
    rows, which it must get back before it writes again. Fenced, it registers nobody; its
    own-rows-only SUBSCRIBE (NodeCore.subscribe_vclock, with the relay's `_cluster` rows) asks
    for D, whom only the relay knows, from where the relay is, so no row of D's comes before
    A's own (once, D's rows came first, A could not translate them, every link dropped before
    A's rows came, and the fence never lifted: 7a6dd38)."""
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


def test_a_fenced_node_gets_its_own_rows_back_though_it_does_not_know_a_member_of_its_upstream():
    c = Cluster(44)
    fenced_node_that_does_not_know_a_member(c)
    top = own_lsn(c, "B", "A")
    c.run_until(lambda: c.nodes["A"].core.fence is None, max_ticks=600, what="A's fence lifted")
    assert c.stats["fences_lifted"] >= 1 and own_lsn(c, "A", "A") >= top
    assert c.put("A", "past-the-lost-row")
    finish(c)


def test_a_node_that_catches_up_while_its_rejoin_attempt_runs_does_not_rebuild():
    """The reference's case (a) (tests/sim/test_scenarios.py): C joins through A and D through
    B while A and B are cut apart. Healed, B subscribes to C, whose WAL starts at its snapshot
    (a row of A's that B lacks): C tells B to rejoin. B's link to A is still in its handshake,
    so no upstream feeds B (Rejoiner.watch) and the attempt starts; A's link then streams and B
    catches up past what C collected while the attempt probes and waits for cover. The attempt
    looks again before it rebuilds (Rejoiner._rebuild, _caught_up: 89d2ce4): B keeps its store
    (once, it rebuilt from a snapshot it no longer needed: its WAL emptied, its subscribers
    told to rejoin, its ids now the donor's)."""
    from tests.sim.test_scenarios import case_a
    c = Cluster(6)
    case_a(c)
    for i in range(3):
        c.put("C", f"c{i}")
        c.put("D", f"d{i}")
        c.run(1)
    c.heal()
    c.run_until_quiet()
    assert c.stats["rejoins"] == 0, "a node rebuilt though it had caught up"
    assert c.stats["refused_need_rejoin"] > 0 and c.stats["rebuilds_skipped_caught_up"] > 0
    finish(c)


def test_the_simulation_catches_a_rebuild_without_its_last_look(monkeypatch):
    """The rule above lives in the production rejoin machine (RejoinMachine.rebuild_gains):
    turned back there, the same run rebuilds B though it had caught up, and the run says so."""
    from node.core.lifecycle_rejoin import RejoinMachine
    monkeypatch.setattr(RejoinMachine, "rebuild_gains", lambda self: True)
    with pytest.raises(AssertionError, match="a node rebuilt though it had caught up"):
        test_a_node_that_catches_up_while_its_rejoin_attempt_runs_does_not_rebuild()


def test_the_simulation_catches_a_fresh_node_that_founds_without_hearing_every_peer(monkeypatch):
    """The founding rule of the join machine's rounds (node.core.lifecycle_join founders, which
    node/join.py and the simulation both step): a fresh node founds the cluster only once every
    peer answered its poll, fresh, and it has the lowest uuid. Turned back there (a peer that
    did not answer is not waited for), a seeded run founds a second cluster, and says so."""
    from tests.sim.test_scenarios_membership import founders_of_whoever_answered
    run_seed(1)                               # passes with the rule as it is
    founders_of_whoever_answered(monkeypatch)
    with pytest.raises(SimFailure, match="two clusters"):
        run_seed(1)


def test_the_simulation_catches_a_newcomer_that_takes_a_member_without_its_store_for_a_fresh_node(monkeypatch):
    """A member whose store was lost greets `member_of` its cluster (node/lifecycle.py
    greeting_fields), and node.core.lifecycle_join_rules is_fresh does not count it fresh. Turned
    back (a peer without a store is fresh, whatever its identity) where it lives and where the
    machine calls it, a newcomer whose only peer it is founds a second cluster, and the scenario
    that guards the rule fails saying so."""
    from node.core import lifecycle_join, lifecycle_join_rules
    from tests.sim.test_scenarios_membership import \
        test_a_new_node_whose_only_peer_lost_its_store_does_not_found_a_second_cluster as guarded
    for module in (lifecycle_join_rules, lifecycle_join):
        monkeypatch.setattr(module, "is_fresh", lambda g: isinstance(g, dict) and not g.get("cluster_uuid"))
    with pytest.raises(SimFailure, match="two clusters"):
        guarded(lambda seed: Cluster(seed))


# --- by design: an expelled member may keep rows that differ (docs/replication.md, "Exactly once") ---
def _rows_only_an_expelled_member_kept(c: Cluster) -> list[tuple[str, str, int]]:
    """(expelled node, origin node, lsn) of each row of another origin that an expelled node
    holds and that differs from the origin's own row under that lsn."""
    own: dict[str, dict[int, bytes]] = {}        # origin uuid -> lsn -> content, of its own WAL
    for o in c.nodes.values():
        if o.core is not None:
            own[o.uuid] = {s.lsn: content(s) for e in o.wal for s in e
                           if s.replica_id == o.core.self_id and s.group != GROUP_LOCAL}
    out = []
    for u in c.expelled:
        x = c.by_uuid[u]
        if x.core is None:
            continue
        for entry in x.wal:
            for t in entry:
                origin = x.core.table.uuid_of(t.replica_id)
                theirs = own.get(origin, {}).get(t.lsn) if origin != u else None
                if theirs is not None and theirs != content(t):
                    out.append((x.name, c.by_uuid[origin].name, t.lsn))
    return out


def test_a_fenced_node_may_write_again_a_row_only_an_expelled_member_holds(make_cluster):
    """REPLOG_SIM_MIX=full, seed 27742 (a strict xfail in session 33), now scripted, since the
    seed no longer reaches it: C's row n reached B alone; A expelled B; C lost its store,
    joined again fenced, heard every member (B, expelled, is not waited for: expelling a member
    is how an operator lifts a fence that waits for it), lifted, and wrote other rows from lsn
    n. The old row n is on B alone, which every member refuses, and from which no member takes
    a member's row (test_scenarios_expel.py): B keeps a row that differs and must be rebuilt,
    as the docs say of an expelled node. The run keeps every invariant (no member holds two
    rows for one lsn; invariant 1 leaves the expelled node's copies of others' rows out), and
    the situation is real: B's row differs from C's."""
    c = make_cluster(34)
    n = _old_row_on_expelled_b_new_row_on_c(c)
    assert _rows_only_an_expelled_member_kept(c) == [("B", "C", n)]
    c.heal()
    finish(c)


def _bounds_past_what_members_hold(c: Cluster) -> list[tuple[str, str, int, int]]:
    """(member, expelled node, rows held, bound) of each member that holds an expelled member's
    rows short of the bound every member accepted."""
    out = []
    for n in c.members():
        if n.core is None or n.core.anon:
            continue
        have = n.core.vclock_by_uuid()
        for m in n.core.table.members():
            if m.state == STATE_EXPELLED and have.get(m.uuid, 0) < m.expelled_lsn:
                out.append((n.name, c.by_uuid[m.uuid].name, have.get(m.uuid, 0), m.expelled_lsn))
    return out


def test_rows_up_to_a_bound_that_a_lost_disk_alone_held_live_on_the_expelled_member_alone(monkeypatch):
    """REPLOG_SIM_MIX=full, seed 242: E expelled A with bound 1. D, which had taken A's rows to
    7, raised the bound to 7 from its disk, and every member took it; D then lost its store, and
    the operator's final peer lists leave A out. A's row 7 is on A alone: every member ends with
    A's rows to 6 under bound 7 (docs/replication.md, "A bound is only as safe as the disk that
    backs it"). The run keeps every invariant: the bound oracle excuses the rows that left the
    history with a member's disk (liveness._lost_with_a_disk), and fails without that."""
    c = run_seed(242, full=True)
    short = _bounds_past_what_members_hold(c)
    assert short, "the run no longer reaches the situation it pins"
    for _, x, have, bound in short:
        why = {c.checker.gone.get((c.nodes[x].uuid, lsn), "") for lsn in range(have + 1, bound + 1)}
        assert all(w.startswith("lost store of ") for w in why), why
    monkeypatch.setattr(liveness, "_lost_with_a_disk", lambda *a: False)
    with pytest.raises(SimFailure, match="holds an expelled member's rows other than up to the bound"):
        run_seed(242, full=True)


def test_rows_in_two_snapshots_only_do_not_stall_the_members():
    """REPLOG_SIM_MIX=full+anon, seed 16768 (found in session 35, since members take no member's
    rows from an expelled upstream): F joined through B, expelled meanwhile, and its snapshot
    holds B's row 5; E joined through C, down for good since and expelled, and its snapshot holds
    C's row 12. No WAL that a member reaches holds either row. E tells F to rejoin (F lacks C's
    row 12) and F tells E to (E lacks B's row 5); neither snapshot covers the other, and A and D
    lack both. The links stayed in need_rejoin for ever, so the rows E and F wrote since reached
    neither each other nor A and D. Now each node's rejoin, finding no donor, goes without the
    expelled members' rows it lacks (RejoinMachine.going_without), its SUBSCRIBE says so, and
    the relays serve the rest (docs/replication.md, "A rejoin discards nothing"): the run
    converges but for those two rows, which live in one snapshot each. A and D, which lack
    both, rebuild from E's snapshot: it lacks only B's row 5, which they go without anyway
    (RejoinMachine._has_wanted), and gives them C's row 12 (before, a donor had to hold the
    rows gone without too, and they went without both)."""
    c = run_seed(16768, full=True, anon_crash=True)
    b, cc = c.nodes["B"].uuid, c.nodes["C"].uuid
    gone = {x.name: set(x.rejoiner.machine.going_without()) for x in c.nodes.values()
            if x.core is not None and not x.core.table.expelled(x.uuid)}
    assert gone == {"A": {b}, "D": {b}, "E": {b}, "F": {cc}, "R": {b}}, gone
    for x in "AD":
        assert c.nodes[x].core.vclock_by_uuid()[cc] == c.nodes["E"].core.vclock_by_uuid()[cc], x
    with pytest.MonkeyPatch.context() as mp:     # a donor had to hold the rows gone without too
        mp.setattr(lifecycle_rejoin.RejoinMachine, "_has_wanted", lambda self, theirs: not self.uncovered(self._wanted, theirs))
        c = run_seed(16768, full=True, anon_crash=True)
        assert set(c.nodes["A"].rejoiner.machine.going_without()) == {b, cc}
    e, f = c.nodes["E"], c.nodes["F"]
    for x in c.nodes.values():
        if x.name != "B" and x.core is not None:
            have = x.core.vclock_by_uuid()
            assert have[e.uuid] == own_lsn(c, "E", "E") and have[f.uuid] == own_lsn(c, "F", "F"), x


def test_members_told_to_rejoin_for_a_members_rows_find_a_donor_that_lacks_only_rows_gone_without():
    """REPLOG_SIM_MIX=full+replace, seed 200350 (found in session 49): E joined through A (down
    for good since, and expelled), and its snapshot alone holds A's rows 1-2; F joined through
    B, then expelled it, and its snapshot alone holds B's rows 3-6 (B runs on, in nobody's
    peers). F's WAL collected B's rows, and G's (rebuilt from F) F's own rows too. C, D and E
    never heard of B's expel: it is F's row, and F told them to rejoin. So B's rows were a
    member's to them, never gone without, and every link to F and G said need_rejoin for ever:
    C and D went without A's rows, and a donor had to hold those too (none did); E held A's
    rows, which no donor had. Now a donor may lack the rows a node goes without
    (RejoinMachine._has_wanted: shown by seed 16768's pin above), and a member that the
    attempt's donors say is expelled is gone without like one this node knows is
    (`_heard_expelled`), so its upstreams serve the rest.
    The run converges (run_seed fails otherwise) with each set of rows in one snapshot.
    (Found before writes stopped pausing for a donor whose link goes without the rows this node
    lacks: with that rule the run finds another way, so it runs under the rule it was found
    with, `cover_links`, and fails without either change.)"""
    full = dict(full=True, anon_crash=True, anon_replace=True, rules={"cover_links": False})
    c = run_seed(200350, **full)
    assert not c.stats["rows let go by the operator"]
    a, b = c.nodes["A"].uuid, c.nodes["B"].uuid
    gone = {x.name: set(x.rejoiner.machine.going_without()) for x in c.nodes.values()
            if x.core is not None and not x.core.table.expelled(x.uuid)}
    assert gone == {"C": {b}, "D": {b}, "E": {b}, "F": {a}, "G": {b}}, gone
    members = [x for x in c.nodes.values() if x.name in "CDEFG"]
    for x in members:
        have = x.core.vclock_by_uuid()
        assert all(have[y.uuid] == own_lsn(c, y.name, y.name) for y in members), x
    probed = lifecycle_rejoin.RejoinMachine._probed

    def forgetful(self, ev, now):          # a donor's word of an expel not kept
        probed(self, ev, now)
        self._heard_expelled = set()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lifecycle_rejoin.RejoinMachine, "_probed", forgetful)
        try:               # it stalls, or converges only once the operator lets rows go (Cluster._let_go)
            assert run_seed(200350, **full).stats["rows let go by the operator"]
        except SimFailure as e:
            assert "quiet" in str(e), e


class _Stated(set):
    """greeting_expels as before session 49's greet-again rule: as if every greeting of ours had
    stated every expel (ApplierMachine._on_greeting then never greets again unasked)."""
    def issuperset(self, other) -> bool:
        return True


def test_a_need_from_a_second_address_of_a_followed_member_ends():
    """REPLOG_SIM_MIX=full+replace, seed 203435 (session 49): F, which collected B's rows
    (expelled), told A and C to rejoin at F's first address; they went without B's rows, and
    their links to F's second address F' streamed, so the link at F was refused as a duplicate
    for ever. The need noted from it never ended: every attempt paused A's and C's writes to wait
    for F (fenced, so it took no row of theirs), the joiner D saw them "rejoining" and could not
    join through them, and F's fence waited for D. Now a duplicate refusal ends the need
    (RejoinMachine.note_duplicate); without that the run never goes quiet. The two other changes
    of that session each also spare this run the stall (no pause for a donor whose link takes
    none of the rows, `cover_links`; a link greets again after it took an expel from a fenced
    upstream's greeting), and so does session 50's (a joiner takes new peers: D joins through
    them), so it runs with all three turned back, as it was found."""
    full = dict(full=True, anon_crash=True, anon_replace=True, rules={"cover_links": False})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(link_applier, "greeting_expels", lambda greeting: _Stated())
        joiners_keep_their_peers(mp)
        c = run_seed(203435, **full)
        assert c.stats["refused_duplicate"] and all(not n.rejoiner.machine.need for n in c.members() if n.core)
        mp.setattr(lifecycle_rejoin.RejoinMachine, "note_duplicate", lambda self, address: None)
        with pytest.raises(SimFailure, match="quiet"):
            run_seed(203435, **full)


def test_rows_up_to_a_bound_that_a_member_down_for_good_alone_held_live_on_the_expelled_member_alone():
    """REPLOG_SIM_MIX=full+replace, seed 203045 (session 49): E expelled C; B, which had taken
    C's rows 8-9 from C before it heard, raised the bound to 9 from its disk, then went down
    for good and was expelled before any member took them from it. C (expelled, in nobody's
    peers) holds them alone: every member ends with C's rows to 7 under bound 9, as after a lost
    disk (seed 242). The bound oracle excuses rows that left the history with a member down for
    good and expelled (liveness._lost_with_a_disk), and not with one that still runs."""
    full = dict(full=True, anon_crash=True, anon_replace=True)
    c = run_seed(203045, **full)
    short = _bounds_past_what_members_hold(c)
    assert short, "the run no longer reaches the situation it pins"
    for _, x, have, bound in short:
        why = {c.checker.gone.get((c.nodes[x].uuid, lsn), "") for lsn in range(have + 1, bound + 1)}
        assert why == {"expel of B"} and c.nodes["B"].retired, why
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(c.nodes["B"], "retired", False)
        assert not liveness._lost_with_a_disk(c, c.nodes[short[0][1]].uuid, short[0][2], short[0][3])


def test_an_expelled_members_rows_after_a_gap_that_lives_in_snapshots_only_are_gone_without_too():
    """REPLOG_SIM_MIX=full+replace, seed 204099 (session 49): F goes without B's rows 5-9
    (expelled B; they live in snapshots only, on nodes that lack C's row 8, which F holds). B's
    rows 10-12 are still in WALs, but a node takes an origin's rows in order: they cannot come
    either. The oracle of rows gone without (liveness._gone_without) looks for the first row
    missing in a WAL, not for any of them."""
    c = run_seed(204099, full=True, anon_crash=True, anon_replace=True)
    f, b = c.nodes["F"], c.nodes["B"].uuid
    have, bound = f.core.vclock_by_uuid()[b], f.core.table.get(b).expelled_lsn
    assert have < f.rejoiner.machine.going_without()[b] < bound, (have, bound)

    def in_a_wal(lsn: int) -> bool:
        return any(x.state.table.uuid_of(t.replica_id) == b and t.lsn <= lsn <= t.last_lsn
                   for x in c.nodes.values() if x.core is not None and x.uuid not in c.expelled
                   for e in x.wal[x.wal_gc:] for t in e if t.group != GROUP_LOCAL)
    assert not in_a_wal(have + 1) and in_a_wal(bound)
    assert liveness._gone_without(c, f, b, have, bound)


def test_a_node_that_alone_holds_an_expelled_members_rows_rejoins_once_the_operator_lets_them_go():
    """REPLOG_SIM_MIX=full+replace, seed 204848 (session 49): F joined through C during a
    partition; C went down for good, expelled, and its rows 9-13 (up to the bound) live in F's
    snapshot alone. Every other member had collected its WAL before it heard of F, so every
    upstream tells F to rejoin, and no snapshot covers F (none has C's rows): F took nothing
    from anyone, for good, while each attempt paused its writes for cover waits on donors that
    go without C's rows. No rule may let rows go by itself: the operator does (POST
    /v1/admin/rejoin, Cluster._let_go), F rebuilds, discarding C's rows 9-13, and the run
    converges. (The cover waits are gone too: a donor's link that goes without a member's
    rows never takes them, RejoinMachine._probed.)"""
    full = dict(full=True, anon_crash=True, anon_replace=True)
    c = run_seed(204848, **full)
    assert c.stats["rows let go by the operator"] == 1
    cu = c.nodes["C"].uuid
    assert {c.checker.gone.get((cu, lsn)) for lsn in range(9, 14)} == {"discard at F by the operator"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Cluster, "_let_go", lambda self: False)
        with pytest.raises(SimFailure, match="quiet"):
            run_seed(204848, **full)


def test_a_link_that_took_an_expel_from_a_fenced_upstreams_greeting_greets_it_again():
    """REPLOG_SIM_MIX=full+replace, seed 208588 (session 49): E, fenced after a power loss,
    waited for a greeting of R (an anonymous replica that follows it) that knows C is expelled.
    E's relay asks a subscriber to greet again once per news; R took the expel from E's greeting
    the first time, lost it in a crash, and took it again from E's greeting on its next link,
    after its own greeting had gone: E never asked again, and the fence stood for good. Now a
    link that takes from a fenced upstream's greeting an expel its own greeting did not state
    greets again at once (ApplierMachine._on_greeting); without that the run never goes quiet."""
    full = dict(full=True, anon_crash=True, anon_replace=True)
    run_seed(208588, **full)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(link_applier, "greeting_expels", lambda greeting: _Stated())
        with pytest.raises(SimFailure, match="quiet"):
            run_seed(208588, **full)


def joiners_keep_their_peers(mp) -> None:
    """The peers rule before session 50 turned back: a peers change reaches a node only once it
    runs (PUT /v1/admin/peers answered 503 while it joined); its join keeps the peers it was
    started with."""
    from tests.sim.faults import Faults
    configure = Faults.configure_peers

    def keeping_join_peers(self, name: str, peers: list[str]) -> None:
        n = self.node(name)
        kept = n.join_peers
        configure(self, name, peers)
        n.join_peers = kept
    mp.setattr(Faults, "configure_peers", keeping_join_peers)


@pytest.mark.parametrize("seed", [216015, 221128])
def test_a_joiner_the_fences_wait_for_joins_through_the_member_its_new_peers_name(seed):
    """REPLOG_SIM_MIX=full+replace, seeds 216015 (session 49) and 221128 (session 50). The
    fenced members lost, in power losses under wal_mode write, the rows that registered a joiner;
    the joiner, started with peers that are now down or fenced (a fenced member registers nobody
    new), polled them before it knew of an expel, so the fences do not count its word (an expelled
    member might still give it their rows), and with no store it cannot take the expel from their
    greetings: it never joined, and the fences waited for it for good. The operator then gives
    the joiner other peers, among them a member that has it registered and serves its JOIN while
    fenced (registering it again writes nothing); that change used to reach only a running node
    (503 while joining: the simulation's operator was never refused, but its joiner kept the peers
    it was started with). Now a joining node polls its new peers from its next round."""
    c = run_seed(seed, full=True, anon_crash=True, anon_replace=True)
    assert c.stats["peer_changes"] > 0
    assert all(n.core is not None and n.core.fence is None for n in c.nodes.values() if n.up and not n.proc)


def test_the_simulation_catches_a_joiner_that_keeps_the_peers_it_was_started_with(monkeypatch):
    """Turned back (a peers change does not reach a joining node's join), seed 221128 stalls."""
    joiners_keep_their_peers(monkeypatch)
    with pytest.raises(SimFailure, match="quiet .* not reached"):
        run_seed(221128, full=True, anon_crash=True, anon_replace=True)


def test_a_node_going_without_rows_rebuilds_once_a_peer_covers_it():
    """REPLOG_SIM_MIX=full, seed 11470: E went without C's rows 2-3 (expelled C), which lived
    in snapshots only; the bound later rose to 8 and every other node took C's rows to 8 in
    snapshots, and came to cover E. E's links served it without C, so no upstream told it to
    rejoin again: only the attempt it keeps up every retry interval while it goes without rows
    (RejoinMachine.going_without) finds such a donor. (The simulation once ticked no rejoin
    machine without a need, and called the cluster quiet before that attempt came: it now
    waits for one after the last change, Cluster._without_looked_again.)"""
    c = run_seed(11470, full=True)
    e = c.nodes["E"]
    assert e.rejoiner.machine.going_without() == {} and e.rejoiner.machine.without == {}
    assert own_lsn(c, "E", "C") == own_lsn(c, "A", "C") == 8


def test_the_simulation_catches_a_node_that_stops_asking_once_it_goes_without(monkeypatch):
    """Turned back (the rejoin machine attempts only while a link says need_rejoin), E never
    looks for a donor again, and the run never becomes quiet (it waits for that look)."""
    from node.core.lifecycle_rejoin import RejoinMachine
    tick = RejoinMachine.tick
    monkeypatch.setattr(RejoinMachine, "tick", lambda self, now: tick(self, now) if self.need else None)
    with pytest.raises(SimFailure, match="quiet .* not reached"):
        run_seed(11470, full=True)


def test_the_simulation_catches_links_that_never_go_without_a_snapshot_only_row(monkeypatch):
    """Turned back (no rejoin goes without anything), the same run never becomes quiet."""
    from node.core.lifecycle_rejoin import RejoinMachine
    monkeypatch.setattr(RejoinMachine, "going_without", lambda self: {})
    with pytest.raises(SimFailure, match="quiet .* not reached"):
        run_seed(16768, full=True, anon_crash=True)
