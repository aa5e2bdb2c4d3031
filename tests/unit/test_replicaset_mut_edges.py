"""NodeCore rules a whole-module mutation run of node/core/replicaset.py (session 28) found
unpinned: a vclock by uuid leaves out ids the table does not know, forgetting a peer's map
without naming the link forgets it, a commit advances a local txn's component 0 only, and a
fenced node with none of its own rows yet asks a peer for its rows from the first. Same table
and peer map as tests/unit/test_replicaset.py."""
from __future__ import annotations

from node.core.membership import OwnRowsFence
from node.core.rows import GROUP_LOCAL, OP_PUT, Op, Txn
from node.core.vclock import VClock
from tests.unit.test_replicaset import PEER, PEER_ROWS, SELF, WALL, _core


def test_a_vclock_by_uuid_leaves_out_component_zero_and_ids_the_table_does_not_know():
    core = _core({0: 9, 1: 4, 2: 5, 3: 7, 8: 2})
    assert core.vclock_by_uuid() == {SELF: 4, PEER: 5, core.table.uuid_of(3): 7}


def test_forgetting_a_peer_without_naming_its_link_forgets_its_map():
    core = _core()
    assert PEER in core.peers
    core.drop_peer(PEER)
    assert PEER not in core.peers


def test_forgetting_a_peer_for_a_link_it_no_longer_has_keeps_the_newer_map():
    core = _core()
    old = core.peers[PEER]
    core.greeting(PEER, PEER_ROWS, WALL)                # a newer link greeted since
    core.drop_peer(PEER, old)
    assert PEER in core.peers and core.peers[PEER] is not old


def test_a_commit_advances_a_local_txns_component_zero_and_no_member_component():
    core = _core({1: 4, 2: 5, 3: 7})
    local = Txn(1, 6, GROUP_LOCAL, WALL, (Op(OP_PUT, "loc", "k", 1), Op(OP_PUT, "loc", "j", 2)))
    core.claimed.follow(0, 7)
    core.commit([local])
    assert core.vclock.get(0) == 7 and core.vclock.get(1) == 4


def test_a_fenced_node_with_none_of_its_own_rows_asks_a_peer_for_them_from_the_first():
    core = _core({2: 5})                                # its own component is empty: a rebuilt store
    core.fence = OwnRowsFence("lost", rebuilt=True)
    want = core.subscribe_vclock(PEER, {SELF: 3, PEER: 5}, PEER_ROWS)
    assert want.get(2) == 0                             # the peer calls us 2: rows 1-3 of ours come
    assert want.get(1) == 5                             # the peer's own: from where it is
    assert want.get(5) == 0                             # OTHER, whose rows neither has: from the first
