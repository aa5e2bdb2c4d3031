"""The join machine (node/core/lifecycle_join.py) driven directly, with no IO: whom a member
with no store asks, when it founds the cluster instead, waits or stops, how a failed request
goes on to the next donor, what a received snapshot installs (the fenced-join rule, the
anonymous id, where the WAL starts), every transition and the illegal ones asserting; and the
start-up rules beside it (a fence taken up at open, an expel given up on while fenced, the
greeting's own_history_lsn)."""
from __future__ import annotations

import pytest

from node import limits
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core import messages as m
from node.core.lifecycle_fence import give_up, own_history_lsn, take_up_fence
from node.core.lifecycle_join import JoinMachine, JoinState
from node.core.lifecycle_join_rules import anon_id, join_fence, refusal_notes, requested_id, wrong_store
from node.core.lifecycle_join_events import (BROKEN, EXPELLED, IDENTITY_REJECTED, PENDING, REFUSED, WRONG_CLUSTER,
                                             Abort, Activated, Ask, AskFailed, BecomeMember, Bootstrap, Bootstrapped,
                                             CatchUp, CaughtUp, IdGranted, Install, Installed, PollPeers, Polled,
                                             SnapshotReceived, Status, WipePartial)
from node.core.membership import OwnRowsFence
from node.core.replicaset import NodeCore
from node.core.vclock import VClock
from node.errors import PeerRefused
from node.identity.signature import Decision, InitialSignature, MemberStatus, Outcome, StoreStatus, initial_to_wire
from tests.unit.helpers import UUID_A, UUID_B, UUID_C

ADDR_B, ADDR_C = "b.example:1", "c.example:1"
CLUSTER, OTHER = "c1c1c1c1-0000-4000-8000-000000000001", "o2o2o2o2-0000-4000-8000-000000000002"
UUID_0 = "00000000-0000-4000-8000-000000000000"       # lower than A's
MIN_S, MAX_S = 1.0, 4.0


class Host:
    """The joining node (A) as the machine reads it; its peers are B and C."""

    def __init__(self, *, peers=(ADDR_B, ADDR_C), wait_for: int = 0, cluster: str | None = None,
                 went_active: bool | None = False, decision: Decision | None = None, uuid: str = UUID_A):
        self.uuid = uuid
        self.wait_for = wait_for
        self.proposal = ("new-cluster", 100.0)
        self.data_dir = "/data/a"
        self.peer_list = list(peers)
        self.cluster = cluster
        self.active = went_active
        self.decision = decision

    def peers(self):
        return list(self.peer_list)

    def member_cluster_uuid(self):
        return self.cluster

    def went_active(self):
        return self.active

    def decide(self):
        assert self.decision is not None, "the machine asked for a Qpid decision it should not need"
        return self.decision

    def members_seen(self) -> int:
        return 3


def running(uuid: str = UUID_B, cluster: str = CLUSTER, rows=None) -> dict:
    rows = [[UUID_B, 1, ADDR_B, STATE_MEMBER, 0]] if rows is None else rows
    return {"uuid": uuid, "cluster_uuid": cluster, "status": "running", "cluster": rows}


def fresh(uuid: str) -> dict:
    return {"uuid": uuid, "cluster_uuid": None, "status": "joining", "cluster": []}


def machine(**kw) -> JoinMachine:
    return JoinMachine(Host(**kw), backoff_min_s=MIN_S, backoff_max_s=MAX_S)


def take(j: JoinMachine):
    rd = j.ready()
    j.advance(rd)
    return rd


def effects(j: JoinMachine) -> list:
    return list(take(j).effects)


def polled_with(j: JoinMachine, polled: dict, now: float = 0.0):
    j.start(now)
    assert effects(j) == [PollPeers()]
    j.step(Polled(polled), now)
    return take(j)


def snapshot_rows(with_a: bool = True, a_id: int = 2) -> list:
    rows = [[UUID_B, 1, ADDR_B, STATE_MEMBER, 0]]
    return rows + [[UUID_A, a_id, "a.example:1", STATE_MEMBER, 0]] if with_a else rows


# --- start: alone, or poll ------------------------------------------------------------------
def test_a_node_alone_that_never_registered_founds_the_cluster_with_itself_as_founder():
    j = machine(peers=())
    j.start(0.0)
    rd = take(j)
    assert j.state is JoinState.BOOTSTRAPPING
    assert rd.effects == (Bootstrap(InitialSignature("new-cluster", 100.0, (UUID_A,))),)
    j.step(Bootstrapped(), 0.0)
    assert j.state is JoinState.DONE and j.done


def test_a_node_alone_that_belongs_to_a_cluster_stops_rather_than_found_another():
    j = machine(peers=(), cluster=CLUSTER)
    j.start(0.0)
    (e,) = effects(j)
    assert j.state is JoinState.FAILED and j.done
    assert type(e) is Abort and CLUSTER in e.message and "/data/a" in e.message and "--peers" in e.hint


def test_a_node_alone_that_waits_for_others_polls_them():
    j = machine(peers=(), wait_for=2)
    j.start(0.0)
    assert effects(j) == [PollPeers()] and j.state is JoinState.POLLING


def test_a_node_with_peers_shows_it_joins_and_polls_them():
    j = machine()
    j.start(0.0)
    rd = take(j)
    assert rd.apply == (Status("joining", "looking for a booted peer"),) and rd.effects == (PollPeers(),)


# --- whom to ask -------------------------------------------------------------------------------
def test_a_running_peer_is_asked_to_join_with_the_lowest_id_free_in_its_cluster():
    rd = polled_with(j := machine(), {ADDR_B: running(), ADDR_C: fresh(UUID_C)})
    assert j.state is JoinState.ASKING and j.asking == ADDR_B
    assert rd.effects == (Ask(ADDR_B, m.JOIN, running(), 2),)


@pytest.mark.parametrize("greeting", [
    {"uuid": UUID_B, "cluster_uuid": CLUSTER, "status": "catching_up", "cluster": []},
    {"uuid": UUID_B, "cluster_uuid": None, "status": "running", "cluster": []},
])
def test_a_peer_that_is_not_a_running_member_is_not_asked(greeting):
    rd = polled_with(j := machine(), {ADDR_B: greeting, ADDR_C: PeerRefused("secret", "no")})
    assert j.state is JoinState.WAITING and not any(type(e) is Ask for e in rd.effects)


def test_a_running_peer_that_another_polled_peer_lists_as_expelled_is_not_asked():
    """It may not know of its expel yet and serve: a member's row that reached it alone may
    since have been written again by that member (whose fence waits for no expelled member)."""
    c_says_b_expelled = running(UUID_C, rows=[[UUID_B, 1, ADDR_B, STATE_EXPELLED, 0, 3],
                                              [UUID_C, 2, ADDR_C, STATE_MEMBER, 0]])
    rd = polled_with(j := machine(), {ADDR_B: running(), ADDR_C: c_says_b_expelled})
    assert j.state is JoinState.ASKING and rd.effects == (Ask(ADDR_C, m.JOIN, c_says_b_expelled, 3),)
    rd = polled_with(j := machine(), {ADDR_B: running(), ADDR_C: c_says_b_expelled | {"status": "catching_up"}})
    assert j.state is JoinState.WAITING and not any(type(e) is Ask for e in rd.effects)   # B alone serves


def test_a_running_peer_of_another_cluster_than_this_nodes_identity_stops_the_join():
    rd = polled_with(j := machine(cluster=CLUSTER), {ADDR_B: running(cluster=OTHER)})
    assert j.state is JoinState.FAILED
    (e,) = rd.effects
    assert type(e) is Abort and e.message.startswith("wrong store") and OTHER in e.message


def test_a_running_peer_of_this_nodes_own_cluster_is_asked():
    polled_with(j := machine(cluster=CLUSTER), {ADDR_B: running()})
    assert j.state is JoinState.ASKING


def test_a_failed_request_goes_on_to_the_next_running_peer():
    polled_with(j := machine(), {ADDR_B: running(), ADDR_C: running(UUID_C)})
    j.step(AskFailed(ADDR_B, "registration pending", PENDING), 0.0)
    rd = take(j)
    assert rd.effects == (Ask(ADDR_C, m.JOIN, running(UUID_C), 2),) and j.asking == ADDR_C


def test_a_broken_link_wipes_what_it_left_before_the_next_peer_is_asked():
    polled_with(j := machine(), {ADDR_B: running(), ADDR_C: running(UUID_C)})
    j.step(AskFailed(ADDR_B, "connection reset"), 0.0)
    assert [type(e) for e in effects(j)] == [WipePartial, Ask]


def test_a_round_whose_every_running_peer_failed_says_why_and_waits_its_backoff():
    polled_with(j := machine(), {ADDR_B: running(), ADDR_C: running(UUID_C)}, now=10.0)
    j.step(AskFailed(ADDR_B, "pending", PENDING), 10.0)
    take(j)
    j.step(AskFailed(ADDR_C, "no secret", REFUSED), 10.0)
    rd = take(j)
    assert rd.apply == (Status("joining", f"join failed, retrying: {ADDR_B}: pending; {ADDR_C} refused: no secret"),)
    assert rd.effects == () and j.state is JoinState.WAITING and j.retry_at == 10.0 + MIN_S


def test_the_wait_between_rounds_doubles_up_to_its_bound_and_the_next_round_polls_again():
    j = machine(peers=(ADDR_B,))
    polled_with(j, {ADDR_B: fresh(UUID_0)})
    waits = []
    for now in (1.0, 10.0, 20.0, 30.0):
        j.tick(j.retry_at - 0.01)
        assert j.state is JoinState.WAITING and not j.ready()       # not before its time
        start = j.retry_at
        j.tick(start)
        assert effects(j) == [PollPeers()] and j.state is JoinState.POLLING
        j.step(Polled({ADDR_B: fresh(UUID_0)}), start)
        take(j)
        waits.append(j.retry_at - start)
    assert waits == [2 * MIN_S, 4.0, 4.0, 4.0]


def test_a_donor_that_says_this_node_was_expelled_stops_the_join():
    polled_with(j := machine(), {ADDR_B: running(), ADDR_C: running(UUID_C)})
    j.step(AskFailed(ADDR_B, "A was expelled", EXPELLED), 0.0)
    (e,) = effects(j)
    assert j.state is JoinState.FAILED and type(e) is Abort
    assert e.message == f"this node ({UUID_A}) was expelled from cluster {CLUSTER}: A was expelled"


def test_a_donor_that_refuses_this_nodes_final_registration_stops_the_join():
    polled_with(j := machine(), {ADDR_B: running()})
    j.step(AskFailed(ADDR_B, "code differs", IDENTITY_REJECTED), 0.0)
    (e,) = effects(j)
    assert j.state is JoinState.FAILED and "code differs" in e.message and "copy of this data dir" in e.hint


# --- found, wait or stop -------------------------------------------------------------------
def test_the_lowest_uuid_among_fresh_peers_founds_the_cluster_with_all_of_them():
    rd = polled_with(j := machine(), {ADDR_B: fresh(UUID_B), ADDR_C: fresh(UUID_C)})
    assert j.state is JoinState.BOOTSTRAPPING
    (e,) = rd.effects
    assert e.initial == InitialSignature("new-cluster", 100.0, (UUID_A, UUID_B, UUID_C)) and "lowest uuid" in e.why


def test_a_fresh_node_that_is_not_the_lowest_waits_for_a_booted_peer():
    rd = polled_with(j := machine(), {ADDR_B: fresh(UUID_0), ADDR_C: fresh(UUID_C)})
    assert j.state is JoinState.WAITING
    assert rd.apply[-1] == Status(None, "waiting for a booted peer (2 of 2 peers fresh)")


def test_a_fresh_node_founds_nothing_while_a_peer_has_not_answered():
    rd = polled_with(j := machine(), {ADDR_B: fresh(UUID_B), ADDR_C: ConnectionError("refused")})
    assert j.state is JoinState.WAITING and rd.apply[-1] == Status(None, "waiting for a booted peer (1 of 2 peers fresh)")


def test_a_node_that_registered_somewhere_waits_for_a_running_member_of_its_cluster_naming_refusals():
    rd = polled_with(j := machine(cluster=CLUSTER), {ADDR_B: fresh(UUID_B), ADDR_C: PeerRefused("secret", "bad")})
    assert j.state is JoinState.WAITING
    assert rd.apply[-1] == Status(None, f"waiting for a running member of cluster {CLUSTER}; {ADDR_C} refused: secret: bad")


INITIAL = InitialSignature("formed", 5.0, (UUID_A, UUID_B))


@pytest.mark.parametrize("decision,state,status", [
    (Decision(Outcome.WAIT, message="2 of 3 members"), JoinState.WAITING, "waiting"),
    (Decision(Outcome.ABORT, "no_clean_store", "Cannot recover"), JoinState.WAITING, "waiting"),
    (Decision(Outcome.ABORT, "different_shutdowns", "shutdowns differ"), JoinState.WAITING, "waiting"),
    (Decision(Outcome.ACTIVATE, initial=INITIAL, active=(UUID_A, UUID_B)), JoinState.BOOTSTRAPPING, None),
])
def test_with_cluster_wait_for_the_qpid_decision_says_whether_to_wait_or_found(decision, state, status):
    j = machine(wait_for=2, decision=decision)
    rd = polled_with(j, {ADDR_B: fresh(UUID_B), ADDR_C: fresh(UUID_C)})
    assert j.state is state
    if status is not None:
        assert rd.apply[-1].status == status
    else:
        assert rd.effects == (Bootstrap(INITIAL, rd.effects[0].why),)


def test_with_cluster_wait_for_a_node_that_is_not_the_lowest_does_not_found_an_activated_formation():
    j = machine(wait_for=2, decision=Decision(Outcome.ACTIVATE, initial=INITIAL, active=(UUID_A, UUID_B)))
    rd = polled_with(j, {ADDR_B: fresh(UUID_0)})
    assert j.state is JoinState.WAITING
    assert rd.apply[-1] == Status("joining", "2 initial members exchanged status; waiting for a running member to join")


def test_with_cluster_wait_for_a_qpid_abort_stops_the_join():
    j = machine(wait_for=2, decision=Decision(Outcome.ABORT, "different_clusters", "two clusters", "look"))
    rd = polled_with(j, {ADDR_B: fresh(UUID_B)})
    assert j.state is JoinState.FAILED and rd.effects == (Abort("two clusters", "look"),)


# --- what a snapshot installs ------------------------------------------------------------------
def asked(**kw) -> JoinMachine:
    j = machine(**kw)
    polled_with(j, {ADDR_B: running()})
    return j


def test_a_snapshot_that_registers_a_new_member_is_installed_unfenced_with_its_wal_starting_there():
    j = asked()
    j.step(IdGranted(ADDR_B, 2), 0.0)
    assert j.state is JoinState.ASKING and not j.ready()      # the id comes with the snapshot
    j.step(SnapshotReceived(ADDR_B, snapshot_rows(), {1: 7}, rows=3), 0.0)
    assert effects(j) == [Install(ADDR_B, None, None, {1: 7}, 3)] and j.state is JoinState.INSTALLING
    j.step(Installed(ADDR_B), 0.0)
    assert j.state is JoinState.DONE


def test_a_snapshot_that_does_not_register_the_joiner_is_not_installed_and_the_round_goes_on():
    j = asked()
    j.step(SnapshotReceived(ADDR_B, snapshot_rows(with_a=False), {1: 7}), 0.0)
    rd = take(j)
    assert rd.effects == (WipePartial(),) and j.state is JoinState.WAITING
    assert "does not register this node" in rd.apply[0].reason


@pytest.mark.parametrize("went_active,rows_list_a,own_rows,fenced", [
    (False, False, 0, False),
    (True, False, 0, True),             # its identity file says it went active before
    (False, False, 4, True),            # the snapshot holds rows of its own origin
    (None, True, 0, True),              # no identity files: the donor's _cluster lists it
    (None, False, 0, False),
])
def test_a_joined_store_is_fenced_when_this_uuid_may_have_written_before(went_active, rows_list_a, own_rows, fenced):
    rows = snapshot_rows() if rows_list_a else None
    j = machine(went_active=went_active)
    polled_with(j, {ADDR_B: running(rows=rows)})
    j.step(SnapshotReceived(ADDR_B, snapshot_rows(), {1: 7, 2: own_rows}), 0.0)
    (e,) = effects(j)
    assert (e.fence is not None) == fenced
    if fenced:
        assert UUID_A in e.fence and "rejoined with an empty store" in e.fence


def test_an_anonymous_replica_takes_the_lowest_id_free_in_the_snapshot_it_fetched():
    j = machine()
    j.ask(ADDR_B, m.FETCH_SNAPSHOT, running())
    assert effects(j) == [Ask(ADDR_B, m.FETCH_SNAPSHOT, running(), None)]
    j.step(SnapshotReceived(ADDR_B, [[UUID_B, 1, ADDR_B, STATE_MEMBER, 0], [UUID_C, 3, ADDR_C, STATE_MEMBER, 0]],
                            {0: 2, 1: 9, 3: 1}), 0.0)
    assert effects(j) == [Install(ADDR_B, None, 2, {1: 9, 3: 1}, 0)]


def test_an_anonymous_replica_whose_identity_is_of_another_cluster_stops_with_wrong_store_before_fetching():
    j = machine(cluster=CLUSTER)
    j.ask(ADDR_B, m.FETCH_SNAPSHOT, running(cluster=OTHER))
    assert j.state is JoinState.FAILED and j.done
    (e,) = effects(j)
    assert type(e) is Abort and e.message.startswith("wrong store") and CLUSTER in e.message and OTHER in e.message
    assert ADDR_B in e.message and "--peers" in e.hint


@pytest.mark.parametrize("cluster", [None, CLUSTER])
def test_an_anonymous_replica_with_no_identity_or_one_of_the_donors_cluster_fetches_its_snapshot(cluster):
    j = machine(cluster=cluster)
    j.ask(ADDR_B, m.FETCH_SNAPSHOT, running())
    assert effects(j) == [Ask(ADDR_B, m.FETCH_SNAPSHOT, running(), None)] and j.state is JoinState.ASKING


@pytest.mark.parametrize("cluster", [None, CLUSTER])
def test_a_register_that_goes_through_makes_the_anonymous_replica_a_member(cluster):
    j = machine(cluster=cluster)           # its store's cluster: REGISTER carries no greeting to check
    j.ask(ADDR_B, m.REGISTER, {})
    assert effects(j) == [Ask(ADDR_B, m.REGISTER, {}, None)]
    j.step(IdGranted(ADDR_B, 4), 0.0)
    assert effects(j) == [BecomeMember(ADDR_B)] and j.state is JoinState.DONE


def test_a_register_refused_as_another_cluster_stops_with_wrong_store_instead_of_asking_again():
    j = machine(cluster=CLUSTER)
    j.ask(ADDR_B, m.REGISTER, {})
    take(j)
    j.step(AskFailed(ADDR_B, "b.example:1 belongs to cluster other, this node to c (wrong store)", WRONG_CLUSTER), 0.0)
    (e,) = effects(j)
    assert j.state is JoinState.FAILED and type(e) is Abort
    assert e.message.startswith("wrong store: b.example:1 belongs to cluster other") and CLUSTER in e.hint


@pytest.mark.parametrize("code,wipes", [(BROKEN, True), (REFUSED, False), (PENDING, False)])
def test_a_lone_request_that_fails_leaves_the_machine_idle_for_its_driver_to_ask_again(code, wipes):
    j = machine()
    j.ask(ADDR_B, m.JOIN, running())
    take(j)
    j.step(AskFailed(ADDR_B, "no", code), 0.0)
    assert effects(j) == ([WipePartial()] if wipes else []) and j.state is JoinState.IDLE and not j.done
    j.ask(ADDR_C, m.JOIN, running(UUID_C))
    assert j.asking == ADDR_C


# --- illegal steps assert ---------------------------------------------------------------------
@pytest.mark.parametrize("event", [Polled({}), Installed(ADDR_B), Bootstrapped(), IdGranted(ADDR_B, 1),
                                   SnapshotReceived(ADDR_B, [], {}), AskFailed(ADDR_B, "x")])
def test_an_answer_to_nothing_asked_asserts(event):
    with pytest.raises(AssertionError):
        machine().step(event, 0.0)


def test_an_answer_from_another_donor_than_the_one_asked_asserts():
    j = asked()
    with pytest.raises(AssertionError, match="asked"):
        j.step(AskFailed(ADDR_C, "x"), 0.0)


def test_a_snapshot_for_a_register_and_a_registration_for_a_fetch_assert():
    j = machine()
    j.ask(ADDR_B, m.REGISTER, {})
    with pytest.raises(AssertionError):
        j.step(SnapshotReceived(ADDR_B, [], {}), 0.0)
    j = machine()
    j.ask(ADDR_B, m.FETCH_SNAPSHOT, running())
    with pytest.raises(AssertionError):
        j.step(IdGranted(ADDR_B, 1), 0.0)


def test_a_second_start_or_a_request_while_one_is_under_way_asserts():
    j = asked()
    with pytest.raises(AssertionError):
        j.start(0.0)
    with pytest.raises(AssertionError):
        j.ask(ADDR_C, m.JOIN, running())


def test_nothing_follows_a_finished_join():
    j = machine(peers=())
    j.start(0.0)
    take(j)
    j.step(Bootstrapped(), 0.0)
    for event in (Bootstrapped(), Installed(ADDR_B), Polled({})):
        with pytest.raises(AssertionError):
            j.step(event, 0.0)
    j.tick(1e9)
    assert j.state is JoinState.DONE


def test_a_ready_advanced_twice_asserts():
    j = machine()
    j.start(0.0)
    rd = j.ready()
    j.advance(rd)
    with pytest.raises(AssertionError):
        j.advance(rd)


def test_every_transition_in_the_table_is_taken_by_some_path_through_the_machine(monkeypatch):
    """The paths above, run again with every transition recorded: each edge of the table is
    taken by one of them (a transition no path takes would be dead, or untested)."""
    from node.core import lifecycle_join as lj
    taken = set()
    to = JoinMachine._to

    def record(self, state):
        taken.add((self.state, state))
        to(self, state)

    monkeypatch.setattr(JoinMachine, "_to", record)
    test_a_node_alone_that_never_registered_founds_the_cluster_with_itself_as_founder()
    test_a_node_alone_that_belongs_to_a_cluster_stops_rather_than_found_another()
    test_a_running_peer_of_another_cluster_than_this_nodes_identity_stops_the_join()
    test_a_failed_request_goes_on_to_the_next_running_peer()
    test_a_round_whose_every_running_peer_failed_says_why_and_waits_its_backoff()
    test_the_wait_between_rounds_doubles_up_to_its_bound_and_the_next_round_polls_again()
    test_a_donor_that_says_this_node_was_expelled_stops_the_join()
    test_the_lowest_uuid_among_fresh_peers_founds_the_cluster_with_all_of_them()
    test_with_cluster_wait_for_a_qpid_abort_stops_the_join()
    test_a_snapshot_that_registers_a_new_member_is_installed_unfenced_with_its_wal_starting_there()
    test_a_register_that_goes_through_makes_the_anonymous_replica_a_member(None)
    test_a_lone_request_that_fails_leaves_the_machine_idle_for_its_driver_to_ask_again(BROKEN, True)
    test_a_store_with_no_peers_that_waits_for_nobody_goes_active_at_once()
    test_a_store_that_does_not_wait_for_its_peers_polls_them_quickly_and_goes_active_among_running_ones()
    test_a_store_waiting_for_the_initial_members_waits_its_backoff_then_polls_again()
    test_a_store_that_waits_for_its_peers_catches_up_with_a_running_member_before_going_active()
    table = {(a, b) for a, nexts in lj._NEXT.items() for b in nexts}
    assert taken == table, f"not taken: {table - taken}; not in the table: {taken - table}"


# --- the rules beside the machine -------------------------------------------------------------
def test_join_fence_reads_the_snapshot_s_own_rows_by_the_joiner_s_id_there():
    table = ClusterTable([Member(UUID_B, 1, ADDR_B, STATE_MEMBER), Member(UUID_A, 2, "a", STATE_MEMBER)])
    assert join_fence(UUID_A, False, [], table, {1: 5}) is None
    assert join_fence(UUID_A, False, [], table, {1: 5, 2: 1}) is not None
    assert join_fence(UUID_A, None, [[UUID_A]], table, {}) is not None
    assert join_fence(UUID_A, False, [[UUID_A]], table, {}) is None     # the identity file is believed


def test_anon_id_and_requested_id_are_the_lowest_free_ids():
    table = ClusterTable([Member(UUID_B, 1, ADDR_B, STATE_MEMBER), Member(UUID_C, 2, ADDR_C, STATE_ANON)])
    assert anon_id(table) == 3
    assert requested_id({"cluster": [[UUID_B, 2, ADDR_B, STATE_MEMBER, 0]]}) == 1
    assert requested_id({"cluster": [["not a row"]]}) is None and requested_id({}) is None


def test_wrong_store_only_when_every_peer_that_answered_is_of_another_cluster():
    assert wrong_store(None, {ADDR_B: running(cluster=OTHER)}) is None
    assert wrong_store(CLUSTER, {ADDR_B: running(cluster=OTHER)}) == f"{ADDR_B}: {OTHER}"
    assert wrong_store(CLUSTER, {ADDR_B: running(cluster=OTHER), ADDR_C: running()}) is None
    assert wrong_store(CLUSTER, {ADDR_B: running(cluster=OTHER), ADDR_C: fresh(UUID_C)}) is None
    refused = PeerRefused("wrong_cluster", "not ours")
    assert wrong_store(CLUSTER, {ADDR_B: refused}) == f"{ADDR_B}: {refused}"
    assert wrong_store(CLUSTER, {ADDR_B: PeerRefused("secret", "x")}) is None


def test_refusal_notes_name_each_refusing_peer_and_nothing_else():
    assert refusal_notes({ADDR_B: running(), ADDR_C: ConnectionError("x")}) == ""
    assert refusal_notes({ADDR_C: PeerRefused("secret", "bad secret")}) == f"; {ADDR_C} refused: secret: bad secret"


def core_a(anon: bool = False, history: int = 0) -> NodeCore:
    table = ClusterTable([Member(UUID_A, 1, "a", STATE_ANON if anon else STATE_MEMBER),
                          Member(UUID_B, 2, ADDR_B, STATE_MEMBER)])
    return NodeCore(UUID_A, table, VClock({1: 3}), spaces={"kv": False}, own_history_lsn=history)


def test_own_history_lsn_is_every_own_row_while_a_rebuilt_store_is_fenced():
    assert own_history_lsn(None) == 0
    core = core_a(history=4)
    assert own_history_lsn(core) == 4
    core.fence = OwnRowsFence("lost", rebuilt=False)
    assert own_history_lsn(core) == 4
    core.fence = OwnRowsFence("rebuilt", rebuilt=True)
    assert own_history_lsn(core) == limits.lsn_max


def test_a_fence_in_the_meta_stands_again_at_open_with_the_members_registered_and_given_up():
    core = core_a()
    assert take_up_fence(core, {"reason": "lost", "rebuilt": True, "given_up": [UUID_C]}, {UUID_B}) is True
    assert core.fence.reason == "lost" and core.fence.rebuilt
    assert UUID_B in core.fence.known and UUID_C in core.fence.given_up
    core = core_a()
    assert take_up_fence(core, {"reason": "lost", "rebuilt": False}, set()) is False and core.fence is not None
    core = core_a()
    assert take_up_fence(core, None, {UUID_B}) is False and core.fence is None
    anon = core_a(anon=True)
    assert take_up_fence(anon, {"reason": "lost", "rebuilt": True}, set()) is False and anon.fence is None


def test_giving_up_on_a_member_stops_the_fence_waiting_and_lists_it_once():
    fence = OwnRowsFence("lost")
    assert give_up(fence, None, UUID_C) == [UUID_C]
    assert give_up(fence, [UUID_C, UUID_B], UUID_C) == sorted([UUID_B, UUID_C])
    assert fence.given_up == {UUID_C}


# --- a store: the Qpid exchange before going active -------------------------------------------
class StoreHost(Host):
    """A with a store: its status and initial signature, and the greetings it has seen."""

    def __init__(self, *, initial: InitialSignature | None = INITIAL, **kw):
        super().__init__(**kw)
        self.initial = initial
        self.greetings = {UUID_B: running()}

    def my_status(self):
        return MemberStatus(UUID_A, StoreStatus.DIRTY, self.initial, None, "digest")

    def seen(self, uuid: str) -> dict:
        return self.greetings[uuid]


def store_machine(**kw) -> JoinMachine:
    return JoinMachine(StoreHost(**kw), backoff_min_s=MIN_S, backoff_max_s=MAX_S)


def store_polled(j: JoinMachine, polled: dict, now: float = 0.0):
    j.start_with_store(now)
    rd = take(j)
    assert rd.apply == (Status("waiting", "exchanging status with the peers"),)
    (poll,) = rd.effects
    j.step(Polled(polled), now)
    return poll, take(j)


def with_initial(g: dict, initial: InitialSignature) -> dict:
    return dict(g, store={"initial": initial_to_wire(initial)})


def test_a_store_with_no_peers_that_waits_for_nobody_goes_active_at_once():
    j = store_machine(peers=())
    j.start_with_store(0.0)
    assert j.state is JoinState.DONE and not j.ready()


def test_a_store_that_does_not_wait_for_its_peers_polls_them_quickly_and_goes_active_among_running_ones():
    poll, rd = store_polled(j := store_machine(), {ADDR_B: with_initial(running(), INITIAL)})
    assert poll == PollPeers(limits.peer_poll_quick_timeout_s)
    assert j.state is JoinState.DONE and rd.effects == ()


def test_a_store_that_does_not_wait_goes_active_when_no_peer_runs():
    _, rd = store_polled(j := store_machine(), {ADDR_B: fresh(UUID_B), ADDR_C: ConnectionError("x")})
    assert j.state is JoinState.DONE and rd.effects == ()


def test_a_store_of_another_formation_than_the_running_cluster_stops_with_wrong_store():
    other = InitialSignature("another", 7.0, (UUID_B,))
    _, rd = store_polled(j := store_machine(), {ADDR_B: with_initial(running(), other)})
    (e,) = rd.effects
    assert j.state is JoinState.FAILED and type(e) is Abort and e.message.startswith("wrong store")


def test_a_store_that_waits_for_its_peers_catches_up_with_a_running_member_before_going_active():
    poll, rd = store_polled(j := store_machine(wait_for=2), {ADDR_B: with_initial(running(), INITIAL)})
    assert poll == PollPeers(limits.peer_poll_timeout_s)
    assert rd.effects == (CatchUp(with_initial(running(), INITIAL)),) and j.state is JoinState.CATCHING_UP
    j.step(CaughtUp(), 0.0)
    assert j.state is JoinState.DONE and not j.ready()


def test_a_store_waiting_for_the_initial_members_waits_its_backoff_then_polls_again():
    j = store_machine(wait_for=3, decision=Decision(Outcome.WAIT, message="2 of 3 initial members"))
    _, rd = store_polled(j, {ADDR_B: fresh(UUID_B), ADDR_C: PeerRefused("secret", "bad")})
    assert rd.apply == (Status("waiting", f"2 of 3 initial members; {ADDR_C} refused: secret: bad"),)
    assert j.state is JoinState.WAITING and j.retry_at == MIN_S
    j.tick(MIN_S)
    assert effects(j) == [PollPeers(limits.peer_poll_timeout_s)]


def test_a_store_whose_qpid_decision_aborts_stops():
    j = store_machine(wait_for=2, decision=Decision(Outcome.ABORT, "no_clean_store", "Cannot recover", "compare"))
    _, rd = store_polled(j, {ADDR_B: fresh(UUID_B)})
    assert j.state is JoinState.FAILED and rd.effects == (Abort("Cannot recover", "compare"),)


def test_an_activated_formation_goes_active_at_once_and_says_so():
    j = store_machine(wait_for=2, decision=Decision(Outcome.ACTIVATE, initial=INITIAL, active=(UUID_A, UUID_B)))
    _, rd = store_polled(j, {ADDR_B: fresh(UUID_B)})
    assert j.state is JoinState.DONE
    assert rd.effects == (Activated("initialization: activate; 2 initial members; this node goes active"),)


def test_a_member_without_a_clean_store_takes_the_update_of_its_source_then_goes_active():
    decision = Decision(Outcome.CATCH_UP, initial=INITIAL, active=(UUID_B,), catch_up=((UUID_A, UUID_B),))
    j = store_machine(wait_for=2, decision=decision)
    _, rd = store_polled(j, {ADDR_B: fresh(UUID_B)})
    assert rd.effects == (CatchUp(running()),) and j.state is JoinState.CATCHING_UP
    j.step(CaughtUp(), 0.0)
    assert effects(j) == [Activated("initialization: catch_up; 2 initial members; this node goes active")]


def test_a_clean_store_member_of_a_catch_up_goes_active_without_catching_up():
    decision = Decision(Outcome.CATCH_UP, initial=INITIAL, active=(UUID_A,), catch_up=((UUID_B, UUID_A),))
    _, rd = store_polled(j := store_machine(wait_for=2, decision=decision), {ADDR_B: fresh(UUID_B)})
    assert j.state is JoinState.DONE and [type(e) for e in rd.effects] == [Activated]


def test_a_catch_up_answer_with_no_catch_up_under_way_asserts():
    with pytest.raises(AssertionError):
        store_machine().step(CaughtUp(), 0.0)
