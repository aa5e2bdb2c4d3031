"""The rejoin machine (node/core/lifecycle_rejoin.py) driven directly, with a real NodeCore and
no IO: when a node told `need_rejoin` leaves the rows to a streaming upstream, when it
attempts, which donor it takes (the covers rule at its edges), the writes paused while a donor
receives its rows, the last look before a rebuild, every transition and the illegal ones
asserting."""
from __future__ import annotations

import pytest

from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.lifecycle_rejoin import RejoinMachine, RejoinState, anon_rejoin_id, member_snapshot
from node.core.lifecycle_rejoin_events import (Blocked, NoRebuild, ProbeDonor, Probed, Rebuild, RebuildFailed, Rebuilt,
                                               Status)
from node.core.replicaset import NodeCore
from node.core.vclock import VClock
from tests.unit.helpers import UUID_A, UUID_B, UUID_C

ADDR_B, ADDR_C, ADDR_D = "b.example:1", "c.example:1", "d.example:1"
UUID_D = "dddddddd-0000-4000-8000-000000000004"
RETRY, COVER_WAIT, POLL = 5.0, 10.0, 0.5        # s
WHY = "C collected rows this node needs"


class Host:
    """The node around the machine (A): B, C and D are its peers; `links` its appliers."""

    def __init__(self, vclock: dict[int, int], *, anon: bool = False, expelled_d: int | None = None) -> None:
        d_state = STATE_EXPELLED if expelled_d is not None else STATE_MEMBER
        table = ClusterTable([Member(UUID_A, 1, "a.example:1", STATE_ANON if anon else STATE_MEMBER),
                              Member(UUID_B, 2, ADDR_B, STATE_MEMBER), Member(UUID_C, 3, ADDR_C, STATE_MEMBER),
                              Member(UUID_D, 4, ADDR_D, d_state, expelled_lsn=expelled_d or 0)])
        self.the_core = NodeCore(UUID_A, table, VClock(vclock), spaces={"kv": False})
        self.running = True
        self.links: dict[str, tuple[bool, dict]] = {ADDR_B: (False, {}), ADDR_C: (False, {})}
        self.peer_list = [ADDR_B, ADDR_C, ADDR_D]
        self.pending = 0

    def core(self):
        return self.the_core

    def may_rejoin(self) -> bool:
        return self.running

    def upstreams(self):
        return dict(self.links)

    def peers(self):
        return list(self.peer_list)

    def journal_pending(self) -> int:
        return self.pending


def machine(vclock=None, **kw) -> tuple[RejoinMachine, Host]:
    host = Host(vclock if vclock is not None else {1: 4, 2: 7, 3: 2}, **kw)
    return RejoinMachine(host, retry_s=RETRY, cover_wait_s=COVER_WAIT, cover_poll_s=POLL), host


def take(mc: RejoinMachine) -> tuple[list, list]:
    rd = mc.ready()
    mc.advance(rd)
    return list(rd.apply), list(rd.effects)


def told(mc: RejoinMachine, collected=None) -> None:
    mc.note_need(ADDR_C, WHY, {UUID_B: 8} if collected is None else collected)


def by_uuid(a=4, b=8, c=2) -> dict:
    return {UUID_A: a, UUID_B: b, UUID_C: c}


# --- the watch: when an attempt starts ----------------------------------------------------------
def test_a_need_alone_starts_an_attempt_that_probes_the_refusing_upstream_first_then_every_peer():
    mc, _ = machine()
    told(mc)
    mc.tick(100.0)
    assert mc.state is RejoinState.PROBING and mc.attempts == 1
    assert take(mc) == ([], [ProbeDonor(ADDR_C)])
    mc.step(Probed(ADDR_C, None), 100.0)
    assert take(mc) == ([], [ProbeDonor(ADDR_B)])
    mc.step(Probed(ADDR_B, None), 100.0)
    assert take(mc) == ([], [ProbeDonor(ADDR_D)])


def test_a_node_leaves_the_collected_rows_to_an_upstream_that_streams_and_has_them():
    mc, host = machine()
    told(mc)
    host.links[ADDR_B] = (True, {UUID_B: 8})          # B follows and has B's rows to lsn 8
    mc.tick(100.0)
    assert mc.state is RejoinState.IDLE and take(mc) == ([], [])


def test_a_streaming_upstream_one_row_short_of_the_collected_rows_does_not_hold_the_attempt():
    mc, host = machine()
    told(mc)
    host.links[ADDR_B] = (True, {UUID_B: 7})
    mc.tick(100.0)
    assert mc.state is RejoinState.PROBING


def test_an_upstream_that_did_not_say_what_it_collected_is_given_time_while_another_streams():
    mc, host = machine()
    told(mc, collected={})
    host.links[ADDR_B] = (True, {})
    mc.tick(100.0)
    assert mc.state is RejoinState.IDLE
    host.links[ADDR_B] = (False, {})                  # nobody streams: it must attempt
    mc.tick(100.0)
    assert mc.state is RejoinState.PROBING


@pytest.mark.parametrize("b_lsn,attempts", [(7, True), (8, False), (9, False)])
def test_a_node_that_has_the_collected_rows_is_caught_up_and_attempts_nothing(b_lsn, attempts):
    mc, _ = machine({1: 4, 2: b_lsn, 3: 2})
    told(mc)
    assert mc.caught_up() is not attempts
    mc.tick(100.0)
    assert (mc.state is RejoinState.PROBING) is attempts


def test_a_need_from_a_link_no_longer_in_effect_is_forgotten():
    mc, host = machine()
    told(mc)
    del host.links[ADDR_C]
    mc.tick(100.0)
    assert mc.need == {} and mc.needed == {} and mc.state is RejoinState.IDLE


def test_a_node_that_is_not_running_attempts_nothing():
    mc, host = machine()
    told(mc)
    host.running = False
    mc.tick(100.0)
    assert mc.state is RejoinState.IDLE and mc.attempts == 0


def test_a_follow_on_the_refusing_link_ends_its_need():
    mc, _ = machine()
    told(mc)
    mc.note_follow(ADDR_C)
    mc.tick(100.0)
    assert mc.need == {} and mc.state is RejoinState.IDLE


def _blocked_attempt(mc: RejoinMachine, now: float) -> None:
    mc.tick(now)
    for addr in (ADDR_C, ADDR_B, ADDR_D):
        take(mc)
        mc.step(Probed(addr, None), now)
    assert mc.state is RejoinState.IDLE


def test_a_need_from_an_address_refused_as_a_second_address_of_a_followed_member_is_over():
    """C's member is followed through another address (the link at C was refused as a
    duplicate): that link says whether it serves; the need from C no longer starts attempts."""
    mc, _ = machine()
    told(mc)
    mc.note_duplicate(ADDR_C)
    assert mc.need == {} and mc.needed == {}
    mc.tick(100.0)
    assert mc.state is RejoinState.IDLE and mc.attempts == 0


def test_a_blocked_node_asks_again_only_after_the_retry_interval():
    mc, _ = machine()
    told(mc)
    _blocked_attempt(mc, 100.0)
    apply, _ = take(mc)
    assert apply == [Blocked("no reachable peer has the collected rows this node lacks, to give a snapshot of")]
    mc.tick(100.0 + RETRY - 0.001)
    assert mc.state is RejoinState.IDLE and mc.attempts == 1
    mc.tick(100.0 + RETRY)
    assert mc.state is RejoinState.PROBING and mc.attempts == 2


# --- the donor: it has what was collected and covers this node ---------------------------------
def test_a_donor_that_lacks_the_collected_rows_too_is_passed_over():
    mc, _ = machine()
    told(mc)
    mc.tick(100.0)
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid(b=7)), 100.0)
    assert take(mc) == ([], [ProbeDonor(ADDR_B)])


def test_a_donor_that_is_not_a_running_member_is_passed_over():
    mc, _ = machine()
    told(mc)
    mc.tick(100.0)
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid(), serving=False), 100.0)
    assert take(mc) == ([], [ProbeDonor(ADDR_B)])


def test_a_member_rebuilds_from_an_anonymous_replica_by_asking_for_its_snapshot():
    """It registers nobody, so the rebuild is no JOIN through it (Rebuild.donor_anon): it may
    be the only peer still holding rows of this node's own (its WAL collected past them)."""
    mc, _ = machine()
    told(mc)
    mc.tick(100.0)
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid(), anon=True), 100.0)
    assert mc.state is RejoinState.REBUILDING
    assert take(mc) == ([Status("rejoining", WHY)], [Rebuild(ADDR_C, WHY, donor_anon=True)])


def test_a_donor_passed_over_leaves_no_mark_on_the_next():
    """The donor's kind is the one probed last: an anonymous replica passed over (it lacks the
    collected rows) does not make the member after it one."""
    mc, _ = machine()
    told(mc)
    mc.tick(100.0)
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid(b=7), anon=True), 100.0)
    take(mc)
    mc.step(Probed(ADDR_B, by_uuid()), 100.0)
    assert take(mc)[1] == [Rebuild(ADDR_B, "an upstream collected rows this node needs", donor_anon=False)]


def test_an_anonymous_donor_that_covers_this_node_only_after_a_cover_wait_is_still_one():
    mc, host = machine()
    told(mc)
    mc.tick(100.0)
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid(a=3), receiving=True, anon=True), 100.0)
    assert mc.state is RejoinState.COVER_WAIT
    take(mc)
    mc.tick(100.0 + POLL)
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid(a=4), anon=True), 100.0 + POLL)
    assert mc.state is RejoinState.REBUILDING and take(mc)[1] == [Rebuild(ADDR_C, WHY, donor_anon=True)]


def test_an_anonymous_replica_rebuilds_from_another_anonymous_replica():
    mc, _ = machine({1: 3, 2: 7, 3: 2}, anon=True)
    told(mc)
    mc.tick(100.0)
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid(a=0), anon=True), 100.0)
    assert mc.state is RejoinState.REBUILDING and take(mc)[1] == [Rebuild(ADDR_C, WHY, donor_anon=True)]


def test_a_member_keeps_none_of_an_anonymous_donors_private_entries():
    cluster = [[UUID_A, 1, "a.example:1", STATE_MEMBER, 3, 0], [UUID_B, 2, ADDR_B, STATE_ANON, 0, 0],
               [UUID_C, 3, ADDR_C, STATE_EXPELLED, 1, 5], [UUID_D, 4, ADDR_D, STATE_ANON, 0, 0]]
    rows, vclock = member_snapshot(cluster, {1: 9, 2: 4, 3: 5, 4: 1})
    assert rows == [cluster[0], cluster[2]] and vclock == {1: 9, 3: 5}


@pytest.mark.parametrize("a_lsn,covers", [(4, True), (5, True), (3, False)])
def test_a_donor_is_taken_only_if_it_has_every_row_this_node_has(a_lsn, covers):
    mc, _ = machine()
    told(mc)
    mc.tick(100.0)
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid(a=a_lsn)), 100.0)
    if covers:
        assert mc.state is RejoinState.REBUILDING
        assert take(mc) == ([Status("rejoining", WHY)], [Rebuild(ADDR_C, WHY)])
    else:
        assert mc.state is RejoinState.PROBING and take(mc) == ([], [ProbeDonor(ADDR_B)])


def test_with_no_covering_donor_the_node_keeps_its_store_and_says_what_the_closest_donor_lacks():
    mc, _ = machine({1: 4, 2: 8, 3: 6})
    told(mc, {UUID_B: 9})
    mc.tick(100.0)
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid(a=1, b=9, c=1)), 100.0)     # lacks A's and C's rows
    take(mc)
    mc.step(Probed(ADDR_B, by_uuid(a=4, b=9, c=5)), 100.0)     # lacks C's 6 only: the closest
    take(mc)
    mc.step(Probed(ADDR_D, None), 100.0)
    apply, effects = take(mc)
    assert effects == [] and mc.state is RejoinState.IDLE
    assert mc.blocked.startswith(f"a snapshot would discard rows no reachable peer has ({UUID_C} up to lsn 6 (it has 5))")
    assert apply == [Blocked(mc.blocked)]
    assert mc.status_of(ADDR_C) == f"{WHY}; {mc.blocked}" and mc.status_of(ADDR_B) == ""


def test_what_the_closest_donor_lacked_is_said_only_once_an_attempt_found_none():
    """(What the simulation's operator reads before it lets rows go: Cluster._let_go.)"""
    mc, _ = machine({1: 4, 2: 8, 3: 6})
    told(mc, {UUID_B: 9})
    mc.tick(100.0)
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid(a=4, b=9, c=5)), 100.0)     # lacks C's 6: the closest so far
    assert mc.state is RejoinState.PROBING and mc.closest_lacked == {}
    take(mc)
    mc.step(Probed(ADDR_B, None), 100.0)
    take(mc)
    mc.step(Probed(ADDR_D, None), 100.0)
    assert mc.state is RejoinState.IDLE and mc.closest_lacked == {UUID_C: (6, 5)}
    mc.tick(100.0 + RETRY)                                        # the next attempt, which rebuilds
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid(a=4, b=9, c=5)), 100.0 + RETRY)
    assert mc.state is RejoinState.PROBING and mc.blocked and mc.closest_lacked == {}   # (the last attempt's text stands)
    take(mc)
    mc.step(Probed(ADDR_B, by_uuid(a=4, b=9, c=6)), 100.0 + RETRY)
    take(mc)
    mc.step(Rebuilt(ADDR_B), 101.0 + RETRY)
    assert mc.state is RejoinState.IDLE and not mc.blocked and mc.closest_lacked == {}


def test_an_expelled_members_rows_past_its_bound_need_no_cover():
    mc, _ = machine({1: 4, 2: 8, 3: 2, 4: 9}, expelled_d=6)
    assert mc.mine()[UUID_D] == 6
    told(mc, {UUID_B: 9})
    mc.tick(100.0)
    take(mc)
    mc.step(Probed(ADDR_C, {**by_uuid(b=9), UUID_D: 6}), 100.0)
    assert mc.state is RejoinState.REBUILDING


def test_an_anonymous_replicas_own_component_needs_no_cover():
    mc, _ = machine({1: 3, 2: 8}, anon=True)
    assert UUID_A not in mc.mine() and mc.mine()[UUID_B] == 8


# --- writes paused while a donor receives this node's rows --------------------------------------
def _cover_wait(mc: RejoinMachine, now: float) -> None:
    told(mc)
    mc.tick(now)
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid(a=3), receiving=True), now)
    assert mc.state is RejoinState.COVER_WAIT


def test_a_donor_receiving_this_nodes_rows_gets_them_with_writes_paused_then_is_taken():
    mc, _ = machine()
    _cover_wait(mc, 100.0)
    assert take(mc) == ([Status("rejoining", f"waiting for {ADDR_C} to receive this node's rows")], [])
    mc.tick(100.0 + POLL - 0.001)
    assert take(mc) == ([], [])
    mc.tick(100.0 + POLL)
    assert mc.state is RejoinState.COVER_PROBING and take(mc) == ([], [ProbeDonor(ADDR_C)])
    mc.step(Probed(ADDR_C, by_uuid(a=4), receiving=True), 100.0 + POLL)
    assert mc.state is RejoinState.REBUILDING and take(mc) == ([Status("rejoining", WHY)], [Rebuild(ADDR_C, WHY)])


@pytest.mark.parametrize("without, waits", [((), True), ((UUID_C,), True), ((UUID_D,), False)])
def test_no_writes_pause_for_a_donor_whose_link_from_this_node_goes_without_rows_it_lacks(without, waits):
    """It lacks expelled D's rows 4-6, which A holds; a link that goes without D's rows (its
    SUBSCRIBE `without`) never takes them from A, and the pause came back every retry interval
    (full+replace seed 204848); going without another member's rows is no matter."""
    mc, _ = machine({1: 4, 2: 7, 3: 2, 4: 6}, expelled_d=9)
    told(mc)
    mc.tick(100.0)
    take(mc)
    mc.step(Probed(ADDR_C, {**by_uuid(), UUID_D: 3}, receiving=True, receiving_without=without), 100.0)
    assert (mc.state is RejoinState.COVER_WAIT) is waits
    if not waits:
        assert take(mc) == ([], [ProbeDonor(ADDR_B)])


def test_the_cover_is_looked_at_only_once_the_journal_is_drained():
    mc, host = machine()
    host.pending = 1
    _cover_wait(mc, 100.0)
    host.the_core.vclock = VClock({1: 3, 2: 7, 3: 2})    # what was in flight did not reach the store
    mc.tick(101.0)
    assert mc.state is RejoinState.COVER_WAIT and take(mc)[1] == []
    host.pending = 0
    mc.tick(101.0)
    assert mc.state is RejoinState.REBUILDING        # A's 3 rows are all on the donor


def test_a_donor_that_does_not_catch_up_in_the_cover_wait_is_given_up_and_writes_resume():
    mc, _ = machine()
    _cover_wait(mc, 100.0)
    take(mc)
    now = 100.0
    while now <= 100.0 + COVER_WAIT:
        now += POLL
        mc.tick(now)
        if mc.state is RejoinState.COVER_PROBING:
            take(mc)
            mc.step(Probed(ADDR_C, by_uuid(a=3), receiving=True), now)
        if mc.state is not RejoinState.COVER_WAIT:
            break
    assert now > 100.0 + COVER_WAIT                  # at the deadline itself it still waited
    assert mc.state is RejoinState.PROBING
    assert take(mc) == ([Status("running")], [ProbeDonor(ADDR_B)])


def test_a_donor_that_stops_answering_in_the_cover_wait_is_given_up():
    mc, _ = machine()
    _cover_wait(mc, 100.0)
    take(mc)
    mc.tick(100.0 + POLL)
    take(mc)
    mc.step(Probed(ADDR_C, None), 100.0 + POLL)
    assert mc.state is RejoinState.PROBING and take(mc) == ([Status("running")], [ProbeDonor(ADDR_B)])


# --- the last look, and how a rebuild ends -----------------------------------------------------
def test_a_node_that_caught_up_while_its_attempt_waited_rebuilds_nothing():
    mc, host = machine()
    _cover_wait(mc, 100.0)
    take(mc)
    host.the_core.vclock = VClock({1: 4, 2: 8, 3: 2})    # B's rows came from another upstream
    mc.tick(100.0 + POLL)
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid(a=4), receiving=True), 100.0 + POLL)
    assert mc.state is RejoinState.IDLE and take(mc) == ([Status("running"), NoRebuild()], [])


def _rebuilding(mc: RejoinMachine) -> None:
    told(mc)
    mc.tick(100.0)
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid()), 100.0)
    take(mc)
    assert mc.state is RejoinState.REBUILDING and mc.running


def test_a_rebuilt_node_forgets_every_need():
    mc, _ = machine()
    _rebuilding(mc)
    mc.step(Rebuilt(ADDR_C), 101.0)
    assert mc.state is RejoinState.IDLE and mc.need == {} and mc.blocked == "" and not mc.running


def test_a_failed_rebuild_resumes_writes_and_says_why():
    mc, _ = machine()
    _rebuilding(mc)
    mc.step(RebuildFailed(ADDR_C, "the link broke"), 101.0)
    assert mc.state is RejoinState.IDLE and mc.need == {ADDR_C: WHY}
    assert take(mc) == ([Status("running"), Blocked(f"rebuilding from {ADDR_C} failed: the link broke", on_links=False)], [])


def test_a_rebuild_stopped_by_the_node_itself_resumes_writes_and_blames_nobody():
    mc, _ = machine()
    _rebuilding(mc)
    mc.step(RebuildFailed(ADDR_C, None), 101.0)
    assert take(mc) == ([Status("running")], []) and mc.blocked == ""


@pytest.mark.parametrize("theirs,why", [
    (by_uuid(), None),
    (by_uuid(a=5, b=9, c=3), None),
    (by_uuid(a=3), f"does not cover this node ({UUID_A} up to lsn 4 (it has 3))"),
    ({UUID_A: 4}, f"does not cover this node ({UUID_B} up to lsn 7 (it has 0), {UUID_C} up to lsn 2 (it has 0))"),
])
def test_a_received_snapshot_must_cover_what_this_node_held(theirs, why):
    mc, _ = machine()
    mine = {UUID_A: 4, UUID_B: 7, UUID_C: 2}
    assert mc.snapshot_uncovered(mine, theirs) == why


def test_an_anonymous_replica_keeps_its_registration_then_its_old_id_then_takes_the_lowest_free():
    table = ClusterTable([Member(UUID_B, 1, ADDR_B, STATE_MEMBER), Member(UUID_C, 3, ADDR_C, STATE_MEMBER)])
    assert anon_rejoin_id(table, UUID_A, 5) == 5
    assert anon_rejoin_id(table, UUID_A, 3) == 2
    registered = ClusterTable([*table.members(), Member(UUID_A, 7, "a.example:1", STATE_ANON)])
    assert anon_rejoin_id(registered, UUID_A, 5) == 7


# --- transitions the driver should never ask for -----------------------------------------------
def test_a_probe_answer_with_no_probe_asked_asserts():
    mc, _ = machine()
    with pytest.raises(AssertionError, match="Probed in state IDLE"):
        mc.step(Probed(ADDR_C, by_uuid()), 100.0)


def test_a_probe_answer_for_another_address_asserts():
    mc, _ = machine()
    told(mc)
    mc.tick(100.0)
    with pytest.raises(AssertionError, match="asked"):
        mc.step(Probed(ADDR_B, by_uuid()), 100.0)


@pytest.mark.parametrize("event", [Rebuilt(ADDR_C), RebuildFailed(ADDR_C, "x")])
def test_a_rebuild_outcome_with_no_rebuild_under_way_asserts(event):
    mc, _ = machine()
    told(mc)
    mc.tick(100.0)
    with pytest.raises(AssertionError, match="in state PROBING"):
        mc.step(event, 100.0)


def test_a_ready_advanced_twice_asserts():
    mc, _ = machine()
    told(mc)
    mc.tick(100.0)
    rd = mc.ready()
    mc.advance(rd)
    with pytest.raises(AssertionError):
        mc.advance(rd)


def test_the_watch_starts_no_second_attempt_while_one_is_under_way():
    mc, _ = machine()
    _rebuilding(mc)
    mc.tick(200.0)
    assert mc.state is RejoinState.REBUILDING and mc.attempts == 1 and take(mc) == ([], [])


def test_an_attempt_aborted_in_a_cover_wait_resumes_writes_and_may_start_again_later():
    mc, _ = machine()
    _cover_wait(mc, 100.0)
    mc.tick(100.0 + POLL)                            # a probe handed out, its answer never comes
    mc.abort()
    assert mc.state is RejoinState.IDLE and not mc.running
    assert take(mc) == ([Status("running")], [])
    mc.tick(100.0 + RETRY)
    assert mc.state is RejoinState.PROBING and mc.attempts == 2


def test_an_attempt_aborted_while_probing_leaves_the_status_alone():
    mc, _ = machine()
    told(mc)
    mc.tick(100.0)
    mc.abort()
    assert mc.state is RejoinState.IDLE and take(mc) == ([], [])
