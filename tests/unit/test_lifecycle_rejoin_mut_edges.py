"""The rejoin machine (node/core/lifecycle_rejoin.py) at the edges mutation testing found
unpinned: what a need and a follow leave behind, the status a link shows, the first attempt of a
process young enough that its clock is below the retry interval, a blocked reason forgotten by a
rebuild, components collected up to lsn 0 or 1 and an upstream that lacks a component, the closest
donor kept when it is probed first (and the first of two as close), the reason of a rebuild from a
peer that never refused, and the transition table and the asserts that guard the driver."""
from __future__ import annotations

import pytest

from node.core.lifecycle_rejoin import _NEXT, RejoinState
from node.core.lifecycle_rejoin_events import ProbeDonor, Probed, Rebuild, RebuildFailed, Rebuilt, Status
from node.core.membership import describe_uncovered
from tests.unit.helpers import UUID_A, UUID_B, UUID_C
from tests.unit.test_lifecycle_rejoin import (ADDR_B, ADDR_C, ADDR_D, POLL, RETRY, UUID_D, WHY, _cover_wait,
                                              _rebuilding, by_uuid, machine, take, told)


def test_a_need_that_says_nothing_of_what_was_collected_is_kept_as_collected_nothing():
    mc, _ = machine()
    mc.note_need(ADDR_C, WHY, None)
    assert mc.need == {ADDR_C: WHY} and mc.needed == {ADDR_C: {}}
    assert not mc.caught_up()                   # nothing said: not known to be caught up


def test_a_follow_on_a_link_forgets_its_need_and_what_it_collected():
    mc, _ = machine()
    told(mc)
    mc.note_need(ADDR_B, "B too", {UUID_C: 9})
    mc.note_follow(ADDR_C)
    assert mc.need == {ADDR_B: "B too"} and mc.needed == {ADDR_B: {UUID_C: 9}}


def test_a_link_shows_its_need_alone_until_an_attempt_is_blocked_and_nothing_without_one():
    mc, _ = machine()
    told(mc)
    assert mc.status_of(ADDR_C) == WHY and mc.status_of(ADDR_B) == ""


def test_the_first_attempt_starts_at_once_though_the_clock_is_below_the_retry_interval():
    mc, _ = machine()
    told(mc)
    mc.tick(RETRY / 2)
    assert mc.state is RejoinState.PROBING and mc.attempts == 1 and mc.last_try == RETRY / 2


def test_a_rebuild_after_a_failed_one_forgets_why_that_failed():
    mc, _ = machine()
    _rebuilding(mc)
    mc.step(RebuildFailed(ADDR_C, "the link broke"), 101.0)
    assert mc.blocked
    take(mc)
    mc.tick(101.0 + RETRY)
    take(mc)
    mc.step(Probed(ADDR_C, by_uuid()), 101.0 + RETRY)
    assert mc.state is RejoinState.REBUILDING
    mc.step(Rebuilt(ADDR_C), 102.0 + RETRY)
    assert mc.blocked == "" and mc.status_of(ADDR_C) == ""


def test_a_component_collected_up_to_lsn_1_is_wanted_and_one_up_to_0_is_not():
    mc, _ = machine()                           # holds nothing of D's
    told(mc, {UUID_D: 1})
    assert mc.wanted() == {UUID_D: 1}
    told(mc, {UUID_D: 0})
    assert mc.wanted() == {}


def test_a_streaming_upstream_that_lacks_a_wanted_component_does_not_hold_the_attempt():
    mc, host = machine()
    told(mc, {UUID_D: 1})
    host.links[ADDR_B] = (True, {UUID_B: 8})     # follows, has nothing of D's
    assert not mc.fed(mc.wanted())
    mc.tick(100.0)
    assert mc.state is RejoinState.PROBING


def _blocked_after(mc, answers) -> str:
    mc.tick(100.0)
    take(mc)
    for address, vclock in answers:
        mc.step(Probed(address, vclock), 100.0)
        take(mc)
    assert mc.state is RejoinState.IDLE
    return mc.blocked


def test_the_closest_donor_is_kept_when_it_was_probed_first():
    mc, _ = machine({1: 4, 2: 8, 3: 6})
    told(mc, {UUID_B: 9})
    blocked = _blocked_after(mc, [(ADDR_C, by_uuid(a=4, b=9, c=5)),      # lacks C's 6 only: the closest
                                  (ADDR_B, by_uuid(a=1, b=9, c=1)),      # lacks A's and C's
                                  (ADDR_D, None)])
    assert f"({describe_uncovered({UUID_C: (6, 5)})})" in blocked


def test_of_two_donors_as_close_the_first_probed_is_named():
    mc, _ = machine({1: 4, 2: 8, 3: 6})
    told(mc, {UUID_B: 9})
    blocked = _blocked_after(mc, [(ADDR_C, by_uuid(a=4, b=9, c=5)),      # lacks C's 6
                                  (ADDR_B, by_uuid(a=3, b=9, c=6)),      # lacks A's 4
                                  (ADDR_D, None)])
    assert f"({describe_uncovered({UUID_C: (6, 5)})})" in blocked and UUID_A not in blocked


def test_a_rebuild_from_a_peer_that_never_refused_says_an_upstream_collected_rows():
    mc, _ = machine()
    told(mc)
    mc.tick(100.0)
    take(mc)
    mc.step(Probed(ADDR_C, None), 100.0)
    take(mc)
    mc.step(Probed(ADDR_B, by_uuid()), 100.0)
    reason = "an upstream collected rows this node needs"
    assert take(mc) == ([Status("rejoining", reason)], [Rebuild(ADDR_B, reason)])


def check_transitions(new_machine, src, table: dict, label: str) -> None:
    """From `src`, every state in `table[src]` is taken by _to() and every other one asserts,
    naming both (for any machine of node/core with a state enum and a transition table)."""
    for dst in type(src):
        mach = new_machine()
        mach.state = src
        if dst in table[src]:
            mach._to(dst)
            assert mach.state is dst
        else:
            with pytest.raises(AssertionError, match=f"{label}: {src.name} -> {dst.name}"):
                mach._to(dst)


@pytest.mark.parametrize("src", list(RejoinState))
def test_every_transition_outside_the_table_asserts_and_every_one_in_it_is_taken(src):
    check_transitions(lambda: machine()[0], src, _NEXT, "rejoin")


def test_an_event_of_no_kind_the_machine_knows_asserts_while_it_rebuilds():
    mc, _ = machine()
    _rebuilding(mc)
    with pytest.raises(AssertionError, match="unknown event"):
        mc.step("rebuilt", 101.0)


def test_a_probe_answer_from_another_address_in_a_cover_wait_asserts():
    mc, _ = machine()
    _cover_wait(mc, 100.0)
    take(mc)
    mc.tick(100.0 + POLL)
    assert mc.state is RejoinState.COVER_PROBING and take(mc) == ([], [ProbeDonor(ADDR_C)])
    with pytest.raises(AssertionError, match=f"Probed {ADDR_D}, asked {ADDR_C}"):
        mc.step(Probed(ADDR_D, by_uuid(a=4), receiving=True), 100.0 + POLL)
