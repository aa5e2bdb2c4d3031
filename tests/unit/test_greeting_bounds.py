"""What a greeting states of an expelled member's bound (NodeCore.greeting_rows).

A node raises an expelled member's bound to the rows of that member it has claimed, so as to take
the ones in flight; a peer takes a greeting's bound as its own. Stated before those rows are on
disk, a crash would lose them and leave every member a bound naming rows no member has (the
simulation's full mix, seed 16143). So a greeting states the bound as far as another node's word
or this node's disk backs it, and never less than that (a relay takes the subscriber's stated
bound as what it needs). On the real core: SELF is 1, PEER 2, OTHER 3 here; the peer calls OTHER 5."""
from __future__ import annotations

from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.replicaset import NodeCore
from node.core.vclock import VClock
from tests.unit.test_replicaset import OTHER, PEER, PEER_ROWS, SELF, WALL, _core, cluster, put


def _stated(core: NodeCore, uuid: str = OTHER) -> int:
    return {r[0]: r for r in core.greeting_rows()}[uuid][5]


def _in_flight(core: NodeCore, *lsns: int) -> None:
    """OTHER's rows at these lsns come from PEER: claimed here, not on disk yet."""
    for lsn in lsns:
        assert core.receive(PEER, put(5, lsn), WALL)


def test_a_bound_raised_to_rows_not_on_disk_is_stated_as_far_as_they_are_on_disk():
    core = _core({1: 4, 2: 5, 3: 2})
    _in_flight(core, 3, 4)
    got = core.receive(PEER, cluster(1, 6, (OTHER, 5, "c:1", STATE_EXPELLED, 1)), WALL)
    own = got[-1].ops[0].value
    assert (own["state"], own["expelled_lsn"]) == (STATE_EXPELLED, 4)     # the row of our own: after rows 3-4
    assert core.table.get(OTHER).expelled_lsn == 4
    assert _stated(core) == 2
    core.mark_synced(VClock({3: 3}))
    assert _stated(core) == 3
    core.mark_synced(VClock({3: 4}))
    assert _stated(core) == 4 and core.bounds_ahead == {}


def test_a_bound_another_node_stated_is_stated_whole_though_its_rows_are_not_here_yet():
    core = _core({1: 4, 2: 5, 3: 2})
    core.receive(PEER, cluster(1, 6, (OTHER, 5, "c:1", STATE_EXPELLED, 9)), WALL)
    assert core.table.get(OTHER).expelled_lsn == 9
    assert _stated(core) == 9 and core.bounds_ahead == {}


def test_a_larger_word_learned_later_backs_more_of_a_raised_bound():
    core = _core({1: 4, 2: 5, 3: 2})
    _in_flight(core, 3, 4, 5)
    core.receive(PEER, cluster(1, 6, (OTHER, 5, "c:1", STATE_EXPELLED, 1)), WALL)
    assert _stated(core) == 2
    core.receive(PEER, cluster(1, 7, (OTHER, 5, "c:1", STATE_EXPELLED, 4)), WALL)   # below the bound: no change
    assert core.table.get(OTHER).expelled_lsn == 5 and _stated(core) == 4
    core.receive(PEER, cluster(1, 8, (OTHER, 5, "c:1", STATE_EXPELLED, 3)), WALL)   # a smaller word takes nothing back
    assert _stated(core) == 4


def test_a_greeting_that_states_the_whole_bound_backs_it():
    core = _core({1: 4, 2: 5, 3: 2})
    _in_flight(core, 3, 4)
    core.receive(PEER, cluster(1, 6, (OTHER, 5, "c:1", STATE_EXPELLED, 1)), WALL)
    rows = [r if r[0] != OTHER else [OTHER, 5, "c:1", STATE_EXPELLED, 0, 4] for r in PEER_ROWS]
    assert core.greeting(PEER, rows, WALL) == []        # no raise: 4 is the bound already
    assert _stated(core) == 4 and core.bounds_ahead == {}


def test_an_expel_made_here_states_the_rows_of_the_member_on_disk_here():
    core = _core({1: 4, 2: 5, 3: 2})
    _in_flight(core, 3)
    _, txn = core.register_member(OTHER, "c:1", WALL, state=STATE_EXPELLED)
    assert txn is not None and txn.ops[0].value["expelled_lsn"] == 3
    assert _stated(core) == 2


def test_a_greeting_raising_a_bound_to_rows_in_flight_states_what_is_on_disk():
    core = _core({1: 4, 2: 5, 3: 2})
    _in_flight(core, 3)
    core.table.upsert(Member(OTHER, 3, "c:1", STATE_EXPELLED, 0, 2))     # as a snapshot would bring it
    assert core.greeting(PEER, PEER_ROWS, WALL)           # raised to 3 by a row of our own
    assert core.table.get(OTHER).expelled_lsn == 3 and _stated(core) == 2


def test_a_bound_read_from_disk_is_stated_whole():
    table = ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER), Member(OTHER, 3, "c:1", STATE_EXPELLED, 2, 6)])
    core = NodeCore(SELF, table, VClock({1: 4, 3: 1}))
    assert _stated(core) == 6


def test_only_the_expelled_members_bound_is_stated_differently():
    core = _core({1: 4, 2: 5, 3: 2})
    _in_flight(core, 3, 4)
    core.receive(PEER, cluster(1, 6, (OTHER, 5, "c:1", STATE_EXPELLED, 1)), WALL)
    rows, table = core.greeting_rows(), core.table.rows()
    assert [r[:5] for r in rows] == [r[:5] for r in table]
    assert [r for r in rows if r[0] != OTHER] == [r for r in table if r[0] != OTHER]


def test_an_expel_made_here_of_a_member_with_no_row_on_disk_here_states_bound_0():
    core = _core({1: 4, 2: 5})
    _in_flight(core, 1)
    _, txn = core.register_member(OTHER, "c:1", WALL, state=STATE_EXPELLED)
    assert txn is not None and txn.ops[0].value["expelled_lsn"] == 1
    assert _stated(core) == 0
