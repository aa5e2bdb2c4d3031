"""The WAL hold rules of node/core/holds.py, at their edges: who may leave a hold (a member
always, an expelled one never, anonymous and unknown subscribers at most anon_acks_max of them
with the one heard from longest ago going), what a JOIN, a SUBSCRIBE and an ACK do to a hold,
which holds are written at once and synced, the holds a checkpoint gives new members, and how
far the WAL may be collected."""
from __future__ import annotations

import pytest

from node import limits
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.holds import Hold, Holds, collectable_before, keep_vclock, lapsing

SELF, PEER, OTHER, GONE, ANON = (f"{c * 8}-0000-4000-8000-00000000000{i}" for i, c in enumerate("abcde", 1))


def _table() -> ClusterTable:
    return ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER), Member(PEER, 2, "b:1", STATE_MEMBER),
                         Member(OTHER, 3, "c:1", STATE_MEMBER), Member(GONE, 4, "", STATE_EXPELLED),
                         Member(ANON, 5, "", STATE_ANON)])


def _stranger(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-000000000000"


def _full(n: int) -> Holds:
    """n anonymous holds, the i-th seen at time i."""
    return Holds({_stranger(i): Hold({1: i}, float(i), True) for i in range(n)})


# --- who may hold ----------------------------------------------------------------------------
def test_a_member_may_hold_and_an_expelled_member_may_not():
    book = Holds()
    assert book.may_hold(PEER, False, _table())
    assert not book.may_hold(GONE, False, _table())
    assert book.hold_all(GONE, False, {1: 1}, _table(), 1.0) is None and GONE not in book.by_uuid


def test_the_bound_on_anonymous_holds_is_reached_without_dropping_any():
    book = _full(limits.anon_acks_max - 1)
    assert book.may_hold(_stranger(10_000), True, _table())
    assert len(book.by_uuid) == limits.anon_acks_max - 1


def test_one_past_the_bound_on_anonymous_holds_drops_the_one_heard_from_longest_ago():
    book = _full(limits.anon_acks_max)
    book.by_uuid[_stranger(0)], book.by_uuid[_stranger(1)] = Hold({}, 5.0, True), Hold({}, 0.5, True)
    assert book.may_hold(_stranger(10_000), True, _table())
    assert _stranger(1) not in book.by_uuid and _stranger(0) in book.by_uuid
    assert len(book.by_uuid) == limits.anon_acks_max - 1


def test_a_subscriber_already_held_takes_no_room_from_another():
    book = _full(limits.anon_acks_max)
    assert book.may_hold(_stranger(3), True, _table())
    assert len(book.by_uuid) == limits.anon_acks_max


def test_members_do_not_count_against_the_anonymous_bound_and_are_never_dropped_for_it():
    book = _full(limits.anon_acks_max - 1)
    book.by_uuid[PEER] = Hold({1: 0}, -1.0, False)      # heard from longest ago, but a member
    assert book.may_hold(_stranger(10_000), True, _table())
    assert PEER in book.by_uuid and len(book.by_uuid) == limits.anon_acks_max


def test_a_subscriber_not_known_here_yet_counts_against_the_bound_and_a_member_subscribing_anonymously_too():
    book = _full(limits.anon_acks_max - 2)
    book.by_uuid[_stranger(9_999)] = Hold({}, -2.0, False)   # not in the table: registered elsewhere
    book.by_uuid[PEER] = Hold({}, -1.0, True)                # a member's uuid, held as anonymous
    assert book.may_hold(_stranger(10_000), True, _table())
    assert _stranger(9_999) not in book.by_uuid and PEER in book.by_uuid


# --- JOIN, SUBSCRIBE, ACK --------------------------------------------------------------------
def test_a_joiner_holds_from_where_the_wal_starts_and_is_synced_at_once_unless_anonymous():
    book = Holds()
    h = book.hold_all(PEER, False, {1: 3, 2: 1}, _table(), 7.0)
    assert h == Hold({1: 3, 2: 1}, 7.0, False) and book.by_uuid[PEER] is h and h.sync_when_set
    a = book.hold_all(_stranger(1), True, {1: 3}, _table(), 8.0)
    assert a is not None and a.anon and not a.sync_when_set


def test_a_subscribe_sets_the_hold_back_as_well_as_forward():
    book = Holds({PEER: Hold({1: 9, 2: 4}, 1.0, False)})
    h = book.on_subscribe(PEER, {1: 5}, False, _table(), 2.0)
    assert h == Hold({1: 5}, 2.0, False) and book.by_uuid[PEER] == h


def test_a_subscribe_that_changes_nothing_writes_nothing():
    book = Holds({PEER: Hold({1: 9}, 1.0, False)})
    assert book.on_subscribe(PEER, {1: 9}, False, _table(), 2.0) is None
    assert book.by_uuid[PEER].seen_s == 1.0
    assert book.on_subscribe(PEER, {1: 9}, True, _table(), 3.0) == Hold({1: 9}, 3.0, True)


def test_an_expelled_member_subscribing_leaves_no_hold():
    book = Holds()
    assert book.on_subscribe(GONE, {1: 1}, False, _table(), 1.0) is None and not book.by_uuid


def test_an_ack_moves_a_hold_forward_only():
    book = Holds({PEER: Hold({1: 9, 2: 4}, 1.0, False)})
    book.on_ack(PEER, {1: 5, 2: 6}, False, _table(), 2.0)
    assert book.by_uuid[PEER] == Hold({1: 9, 2: 6}, 2.0, False)


def test_a_first_ack_creates_a_hold_but_not_for_an_expelled_member():
    book = Holds()
    book.on_ack(OTHER, {1: 2}, False, _table(), 1.0)
    book.on_ack(GONE, {1: 2}, False, _table(), 1.0)
    assert book.by_uuid == {OTHER: Hold({1: 2}, 1.0, False)}


# --- checkpoint --------------------------------------------------------------------------------
def test_every_member_without_a_hold_gets_one_from_the_start_of_the_wal_asked_for_once():
    asked = []

    def start() -> dict[int, int]:
        asked.append(1)
        return {1: 4}

    book = Holds({PEER: Hold({1: 8}, 1.0, False)})
    added, at = book.hold_for_new_members(SELF, _table(), start, 5.0)
    assert added == [OTHER] and at == {1: 4} and asked == [1]      # not itself, expelled, anonymous or held
    assert book.by_uuid[OTHER] == Hold({1: 4}, 5.0, False) and book.by_uuid[PEER].vclock == {1: 8}
    assert book.hold_for_new_members(SELF, _table(), start, 6.0) == ([], {}) and asked == [1]


def test_positions_keep_members_until_expelled_and_anonymous_replicas_exactly_their_ttl():
    book = Holds({PEER: Hold({1: 1}, 0.0, False), GONE: Hold({1: 2}, 0.0, False), ANON: Hold({1: 3}, 100.0, True)})
    assert book.positions(_table(), 130.0, 30.0) == [{1: 1}, {1: 3}]
    assert book.positions(_table(), 130.5, 30.0) == [{1: 1}]


@pytest.mark.parametrize("anon, own_lsn, lapse", [(True, 0, True), (True, 1, False), (False, 0, False)])
def test_holds_lapse_only_on_an_anonymous_node_with_no_row_of_its_own(anon, own_lsn, lapse):
    """Once an anonymous node has a private `_cluster` note under its own id, a member that
    registers it later asks for its rows from that note: members hold as on any node."""
    assert lapsing(anon, own_lsn) is lapse


def test_where_holds_lapse_members_get_none_unasked():
    """Members do not replicate from an anonymous replica: a hold for each would keep its WAL
    for ever."""
    asked = []
    book = Holds({PEER: Hold({1: 8}, 1.0, False)})
    assert book.hold_for_new_members(SELF, _table(), lambda: asked.append(1) or {1: 4}, 5.0, lapse=True) == ([], {})
    assert asked == [] and list(book.by_uuid) == [PEER]


def test_where_holds_lapse_a_members_hold_lasts_exactly_the_ttl_like_an_anonymous_replicas():
    book = Holds({PEER: Hold({1: 1}, 100.0, False), GONE: Hold({1: 2}, 100.0, False), ANON: Hold({1: 3}, 90.0, True)})
    assert book.positions(_table(), 130.0, 30.0, lapse=True) == [{1: 1}]      # (expelled: never)
    assert book.positions(_table(), 130.5, 30.0, lapse=True) == []
    assert book.positions(_table(), 130.5, 30.0) == [{1: 1}]                  # elsewhere its hold stands


@pytest.mark.parametrize("anon", [False, True])
def test_an_expelled_uuids_hold_never_keeps_the_wal_whoever_left_it(anon):
    book = Holds({GONE: Hold({1: 2}, 100.0, anon), PEER: Hold({1: 5}, 100.0, False)})
    assert book.positions(_table(), 100.0, 30.0) == [{1: 5}]


def test_the_wal_kept_is_the_least_of_the_store_and_every_hold_and_local_rows_are_the_stores_alone():
    assert keep_vclock({0: 50, 1: 10, 2: 7}, [{1: 4, 2: 9}, {2: 6}]) == {0: 50, 1: 0, 2: 6}
    assert keep_vclock({1: 10}, []) == {1: 10}


@pytest.mark.parametrize("start,may", [({1: 5, 2: 3}, True), ({1: 6, 2: 3}, False), ({1: 5, 3: 1}, False),
                                       ({1: 5, 3: 0}, True), ({}, True)])
def test_a_segment_goes_only_when_the_next_starts_at_or_below_what_is_kept(start, may):
    assert collectable_before(start, {1: 5, 2: 3}) is may
