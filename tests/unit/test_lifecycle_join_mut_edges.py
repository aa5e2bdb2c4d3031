"""Edges of the join machine (node/core/lifecycle_join.py) that its mutation score showed unpinned:
whom it asks first and when it says it is asking, the bounds of `cluster_wait_for` (1 is a node
alone, 0 a store that waits for nobody), which peers count as fresh when founding, what a failed
or refused snapshot says, a store's catch-up partner and the formation check it skips when either
side has no initial signature, and the asserts that guard the transition table."""
from __future__ import annotations

import pytest

from node import limits
from node.cluster_space.table import STATE_MEMBER, ClusterTable, Member
from node.core import messages as m
from node.core.lifecycle_join import JoinMachine, JoinState
from node.core.lifecycle_join_rules import join_fence
from node.core.lifecycle_join_events import (Ask, AskFailed, BecomeMember, Bootstrap, CatchUp, Install, PollPeers, Polled,
                                             SnapshotReceived, Status)
from node.identity.signature import Decision, InitialSignature, MemberStatus, Outcome, StoreStatus
from tests.unit.helpers import UUID_A, UUID_B, UUID_C
from tests.unit.test_lifecycle_join import (ADDR_B, ADDR_C, CLUSTER, INITIAL, MAX_S, MIN_S, UUID_0, StoreHost, effects,
                                            fresh, machine, polled_with, running, snapshot_rows, store_machine,
                                            store_polled, take, with_initial)


# --- whom it asks, and when it says so ---------------------------------------------------------
def test_of_two_running_peers_the_first_polled_is_asked_first_and_named_as_the_one_asked():
    j = machine()
    assert j.asking is None                              # nothing asked before a start
    rd = polled_with(j, {ADDR_B: running(), ADDR_C: running(UUID_C)})
    assert rd.effects == (Ask(ADDR_B, m.JOIN, running(), 2),) and j.asking == ADDR_B


def test_a_machine_waiting_between_rounds_names_no_peer_as_asked():
    polled_with(j := machine(), {ADDR_B: running()})
    j.step(AskFailed(ADDR_B, "pending"), 0.0)
    take(j)
    assert j.state is JoinState.WAITING and j.asking is None


# --- cluster_wait_for's bounds ------------------------------------------------------------------
def test_a_node_alone_waiting_for_one_member_founds_the_cluster_at_once():
    j = machine(peers=(), wait_for=1)
    j.start(0.0)
    assert effects(j) == [Bootstrap(InitialSignature("new-cluster", 100.0, (UUID_A,)))]
    assert j.state is JoinState.BOOTSTRAPPING


def test_a_store_with_no_peers_that_waits_for_initial_members_polls_rather_than_going_active():
    j = store_machine(peers=(), wait_for=2)
    j.start_with_store(0.0)
    assert effects(j) == [PollPeers(limits.peer_poll_timeout_s)] and j.state is JoinState.POLLING


def test_a_fresh_node_with_peers_waiting_for_one_member_asks_the_qpid_decision_rather_than_founding():
    j = machine(wait_for=1, decision=Decision(Outcome.WAIT, message="1 of 1 members, options pending"))
    rd = polled_with(j, {ADDR_B: fresh(UUID_B), ADDR_C: fresh(UUID_C)})
    assert j.state is JoinState.WAITING and rd.effects == ()
    assert rd.apply == (Status("waiting", "1 of 1 members, options pending"),)


def test_with_cluster_wait_for_only_an_activated_formation_is_founded_even_by_the_lowest_uuid():
    decision = Decision(Outcome.CATCH_UP, initial=INITIAL, active=(UUID_B,), catch_up=((UUID_A, UUID_B),))
    rd = polled_with(j := machine(wait_for=2, decision=decision), {ADDR_B: fresh(UUID_B), ADDR_C: fresh(UUID_C)})
    assert j.state is JoinState.WAITING and rd.effects == ()
    assert rd.apply == (Status("joining", "1 initial members exchanged status; waiting for a running member to join"),)


# --- who counts as fresh when founding ---------------------------------------------------------
def test_a_peer_that_belongs_to_a_cluster_but_is_not_running_keeps_the_lowest_fresh_node_from_founding():
    catching_up = {"uuid": UUID_B, "cluster_uuid": CLUSTER, "status": "catching_up", "cluster": []}
    rd = polled_with(j := machine(), {ADDR_B: catching_up, ADDR_C: fresh(UUID_C)})
    assert j.state is JoinState.WAITING and rd.effects == ()
    assert rd.apply == (Status(None, "waiting for a booted peer (1 of 2 peers fresh)"),)


def test_a_fresh_peer_claiming_this_nodes_own_uuid_is_not_outranked_and_nobody_founds():
    rd = polled_with(j := machine(), {ADDR_B: fresh(UUID_A), ADDR_C: fresh(UUID_C)})
    assert j.state is JoinState.WAITING and rd.effects == ()


# --- what failures say --------------------------------------------------------------------------
def test_a_snapshot_that_does_not_register_the_joiner_is_reported_against_its_donor():
    polled_with(j := machine(), {ADDR_B: running()}, now=5.0)
    j.step(SnapshotReceived(ADDR_B, snapshot_rows(with_a=False), {1: 7}), 5.0)
    rd = take(j)
    assert rd.apply == (Status("joining", f"join failed, retrying: {ADDR_B}: the donor's snapshot does not register "
                                          "this node"),)
    assert j.state is JoinState.WAITING and j.retry_at == 5.0 + MIN_S


def test_a_lone_join_through_a_greeting_without_a_cluster_list_installs_unfenced():
    j = machine(went_active=None)
    j.ask(ADDR_B, m.JOIN, {"uuid": UUID_B, "cluster_uuid": CLUSTER, "status": "running"})
    assert effects(j) == [Ask(ADDR_B, m.JOIN, {"uuid": UUID_B, "cluster_uuid": CLUSTER, "status": "running"}, None)]
    j.step(SnapshotReceived(ADDR_B, snapshot_rows(), {1: 7}), 0.0)
    assert effects(j) == [Install(ADDR_B, None, None, {1: 7}, 0)]


def test_join_fence_of_a_snapshot_that_does_not_list_the_joiner_is_none_unless_it_went_active():
    table = ClusterTable([Member(UUID_B, 1, ADDR_B, STATE_MEMBER)])
    assert join_fence(UUID_A, False, [], table, {1: 5}) is None
    assert join_fence(UUID_A, True, [], table, {1: 5}) is not None


# --- a store: whom it catches up with, and the formation check ----------------------------------
def test_a_store_that_waits_catches_up_with_the_first_running_member_polled():
    c = with_initial(running(UUID_C), INITIAL)
    _, rd = store_polled(j := store_machine(wait_for=2), {ADDR_B: with_initial(running(), INITIAL), ADDR_C: c})
    assert rd.effects == (CatchUp(with_initial(running(), INITIAL)),) and j.state is JoinState.CATCHING_UP


@pytest.mark.parametrize("greeting", [
    {"uuid": UUID_B, "cluster_uuid": None, "status": "running", "cluster": []},
    {"uuid": UUID_B, "cluster_uuid": CLUSTER, "status": "catching_up", "cluster": []},
])
def test_a_store_does_not_catch_up_with_a_peer_that_is_not_a_running_member(greeting):
    j = store_machine(wait_for=2, decision=Decision(Outcome.WAIT, message="1 of 2 initial members"))
    _, rd = store_polled(j, {ADDR_B: greeting})
    assert j.state is JoinState.WAITING and rd.effects == ()
    assert rd.apply == (Status("waiting", "1 of 2 initial members"),)


def test_a_store_goes_active_beside_a_running_member_whose_greeting_carries_no_store_status():
    _, rd = store_polled(j := store_machine(), {ADDR_B: running()})
    assert j.state is JoinState.DONE and rd.effects == ()


class TransientHost(StoreHost):
    """A with a transient store: it carries no initial signature to compare."""

    def my_status(self):
        return MemberStatus(UUID_A, StoreStatus.TRANSIENT, None, None, "digest")


def test_a_store_without_an_initial_signature_goes_active_beside_a_running_member_of_any_formation():
    other = InitialSignature("another", 7.0, (UUID_B,))
    j = JoinMachine(TransientHost(initial=None), backoff_min_s=MIN_S, backoff_max_s=MAX_S)
    _, rd = store_polled(j, {ADDR_B: with_initial(running(), other)})
    assert j.state is JoinState.DONE and rd.effects == ()


# --- the asserts guarding the transition table ---------------------------------------------------
def waiting():
    j = machine()
    polled_with(j, {ADDR_B: fresh(UUID_0)})
    assert j.state is JoinState.WAITING
    return j


def test_a_start_while_waiting_between_rounds_asserts():
    with pytest.raises(AssertionError, match="start in state WAITING"):
        waiting().start(MAX_S)
    with pytest.raises(AssertionError, match="start_with_store in state WAITING"):
        waiting().start_with_store(MAX_S)


def test_a_request_of_a_kind_the_machine_does_not_make_asserts():
    with pytest.raises(AssertionError):
        machine().ask(ADDR_B, m.HELLO, running())


def test_a_poll_answer_with_a_running_peer_while_nothing_was_polled_asserts():
    with pytest.raises(AssertionError, match="Polled in state IDLE"):
        machine().step(Polled({ADDR_B: running()}), 0.0)


def test_an_effect_handed_back_as_an_event_while_asking_asserts():
    polled_with(j := machine(), {ADDR_B: running()})
    with pytest.raises(AssertionError, match="unknown event"):
        j.step(BecomeMember(ADDR_B), 0.0)


def test_a_transition_the_table_does_not_list_asserts():
    j = machine()
    with pytest.raises(AssertionError, match="IDLE -> INSTALLING"):
        j._to(JoinState.INSTALLING)
    assert j.state is JoinState.IDLE
