"""node/core/holds.py at the edges mutation testing found unpinned: a subscriber that says it is
anonymous is held by the anonymous rule whatever the table says of its uuid; a subscriber already
held has its hold moved by an ACK even while the table does not call it a member (an anonymous
replica promoted, its row still on its way); the start of the WAL is asked for once however many
members a checkpoint finds without a hold."""
from __future__ import annotations

import pytest

from node import limits
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.holds import Hold, Holds

SELF, PEER, GONE, PROMOTED, NEW1, NEW2 = (f"{c * 8}-0000-4000-8000-00000000000{i}" for i, c in enumerate("abcdef", 1))


def _table() -> ClusterTable:
    return ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER), Member(PEER, 2, "b:1", STATE_MEMBER),
                         Member(GONE, 3, "", STATE_EXPELLED), Member(PROMOTED, 4, "", STATE_ANON)])


def _stranger(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-000000000000"


def test_an_expelled_members_uuid_subscribing_anonymously_is_held_as_an_anonymous_replica_within_the_bound():
    book = Holds({_stranger(i): Hold({1: i}, float(i), True) for i in range(limits.anon_acks_max)})
    hold = book.on_subscribe(GONE, {1: 7}, True, _table(), 100.0)
    assert hold == Hold({1: 7}, 100.0, True)
    assert book.by_uuid[GONE] == hold
    assert _stranger(0) not in book.by_uuid and len(book.by_uuid) == limits.anon_acks_max


def test_an_ack_moves_a_held_subscribers_hold_though_the_table_does_not_call_it_a_member_yet():
    book = Holds({PROMOTED: Hold({1: 3}, 1.0, True)})           # held while it was anonymous
    book.on_ack(PROMOTED, {1: 5}, False, _table(), 2.0)          # now a member; its row is on its way
    assert book.by_uuid[PROMOTED] == Hold({1: 5}, 2.0, False)


def test_a_checkpoint_asks_for_the_start_of_the_wal_once_for_several_new_members():
    asked = []

    def start() -> dict[int, int]:
        asked.append(1)
        return {1: len(asked)}

    table = _table()
    table.upsert(Member(NEW1, 5, "e:1", STATE_MEMBER))
    table.upsert(Member(NEW2, 6, "f:1", STATE_MEMBER))
    book = Holds({PEER: Hold({1: 8}, 1.0, False)})
    added, at = book.hold_for_new_members(SELF, table, start, 5.0)
    assert sorted(added) == [NEW1, NEW2] and at == {1: 1} and asked == [1]
    assert book.by_uuid[NEW1] == book.by_uuid[NEW2] == Hold({1: 1}, 5.0, False)


def test_a_hold_handed_out_is_a_value_that_cannot_change_on_the_way():
    book = Holds()
    hold = book.on_subscribe(PEER, {1: 3}, False, _table(), 1.0)
    with pytest.raises(AttributeError):
        hold.vclock = {}
