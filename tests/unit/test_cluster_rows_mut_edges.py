"""node/core/cluster_rows.py at the edges mutation testing found unpinned with unit tests alone
(the simulation reaches them): a `_cluster` row teaches the connected peer's map only when the
peer is its origin and the row is not its earlier incarnation's, from the first lsn on; another
member's row about this node does not end the txn's other rows; a row stating no address makes
an empty one; knowledge of the peer's ids teaches its map only of a member in the table; and a
fenced node lets through a member's own row that changes nothing, and stops one that does."""
from __future__ import annotations

import pytest

from node import limits
from node.cluster_space.table import STATE_MEMBER, Member
from node.core.cluster_rows import Peer
from node.core.membership import OwnRowsFence
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, OP_CLUSTER, OP_PUT, Op, Txn
from node.core.vclock import VClock
from node.errors import RemoteProtocolError
from tests.unit.test_receive_run import OTHER, PEER, SELF, WALL, _core

NEW = "u-new"


def _row(member: str, their_id: int, **value) -> Op:
    return Op(OP_CLUSTER, "_cluster", member, {"id": their_id, "address": "", "state": STATE_MEMBER, **value})


def _txn(their_rid: int, lsn: int, *ops: Op) -> Txn:
    return Txn(their_rid, lsn, GROUP_CLUSTER, WALL, ops)


def test_the_peers_own_row_about_a_new_member_teaches_its_map():
    core = _core(None)
    core.receive(PEER, _txn(7, 6, _row(NEW, 11)), WALL)
    assert core.peers[PEER].map.to_local.get(11) == core.table.id_of(NEW)


def test_another_origins_row_about_a_new_member_teaches_the_peers_map_nothing():
    core = _core(None)
    core.receive(PEER, _txn(3, 6, _row(NEW, 11)), WALL)
    assert core.table.get(NEW) is not None and core.peers[PEER].map.to_local.get(11) is None
    assert core.knowledge[(OTHER, NEW)] == 11


def test_the_peers_earlier_incarnations_row_teaches_its_map_nothing():
    core = _core(None)
    core.peers[PEER].history_lsn = 6
    core.receive(PEER, _txn(7, 6, _row(NEW, 11)), WALL)
    assert core.peers[PEER].map.to_local.get(11) is None


def test_a_peer_that_said_nothing_of_its_history_has_none_its_row_at_lsn_1_teaches():
    core = _core(None)
    core.claimed = VClock({3: 5})
    assert Peer(PEER).history_lsn == 0
    core.receive(PEER, _txn(7, 1, _row(NEW, 11)), WALL)
    assert core.peers[PEER].map.to_local.get(11) == core.table.id_of(NEW)


def test_another_members_row_about_this_node_does_not_end_the_txns_other_rows():
    core = _core(None)
    core.receive(PEER, _txn(7, 6, _row(SELF, 9), _row(NEW, 11)), WALL)
    assert core.table.get(NEW) is not None and core.peers[PEER].map.to_local.get(9) == core.self_id


def test_a_row_stating_no_address_makes_a_member_with_an_empty_one():
    core = _core(None)
    core.receive(PEER, _txn(7, 6, _row(NEW, 11, address=None)), WALL)
    assert core.table.get(NEW).address == ""


def test_the_peers_ids_known_from_its_rows_elsewhere_teach_its_map_of_a_member_in_the_table():
    core = _core(None)
    core.table.upsert(Member(NEW, 4, "", STATE_MEMBER))
    core.knowledge[(PEER, NEW)] = 12
    out: list = []
    core.receive_run(PEER, [Txn(12, 1, GROUP_DEFAULT, WALL, (Op(OP_PUT, "s", "k", 1),))], 0, out, WALL)
    assert out[0].replica_id == 4 and core.peers[PEER].map.to_local.get(12) == 4
    assert core.peers[PEER].map.to_peer.get(4) == 12


def test_knowledge_of_a_member_not_in_the_table_teaches_nothing_and_the_row_is_refused():
    core = _core(None)
    core.knowledge[(PEER, NEW)] = 12
    with pytest.raises(RemoteProtocolError, match="id 12 is unknown"):
        core.receive_run(PEER, [Txn(12, 1, GROUP_DEFAULT, WALL, (Op(OP_PUT, "s", "k", 1),))], 0, [], WALL)
    assert 12 not in core.peers[PEER].map.to_local


def _fenced_with(address: str):
    core = _core(None)
    core.table.upsert(Member(OTHER, 3, address, STATE_MEMBER))
    core.fence = OwnRowsFence("a test loss")
    return core


@pytest.mark.parametrize("stored, stated", [("", None), ("", ""), ("h:1", "h:1")])
def test_while_fenced_a_members_own_row_that_changes_nothing_is_taken(stored, stated):
    core = _fenced_with(stored)
    out = core.receive(PEER, _txn(3, 6, _row(OTHER, 3, address=stated)), WALL)
    assert out and core.claimed.get(3) == 6


def test_while_fenced_a_members_own_row_that_moves_it_waits_for_the_fence():
    core = _fenced_with("h:1")
    with pytest.raises(RemoteProtocolError, match="taken after the fence"):
        core.receive(PEER, _txn(3, 6, _row(OTHER, 3, address="h:2")), WALL)
    assert core.claimed.get(3) == 5


def test_while_fenced_a_row_past_a_gap_is_not_applied_but_tells_the_fence_who_is_expelled():
    core = _fenced_with("")
    core.fence.known |= {NEW, "u-gone"}
    assert core.fence.waiting_for(core.table, SELF) == sorted([NEW, OTHER, PEER, "u-gone"])
    row = _txn(3, 8, _row(NEW, 11, state="expelled"), _row(SELF, 1, state="expelled"), _row("u-gone", 12))
    assert core.receive(PEER, row, WALL) == []              # OTHER's rows are claimed up to 5: a gap
    assert core.claimed.get(3) == 5 and core.table.get(NEW) is None
    assert NEW in core.fence.expelled and "u-gone" not in core.fence.expelled   # a member row says nothing
    assert core.fence.waiting_for(core.table, SELF) == sorted([OTHER, PEER, "u-gone"])


def test_expels_heard_past_gaps_grow_the_fence_no_further_than_members_max(monkeypatch):
    core = _fenced_with("")
    monkeypatch.setattr(limits, "members_max", 2)
    for i, uuid in enumerate(["u-a", "u-b", "u-c", "u-a"]):
        core.receive(PEER, _txn(3, 8 + i, _row(uuid, 20 + i, state="expelled")), WALL)
    assert core.fence.expelled == {"u-a", "u-b"}


def test_a_row_past_a_gap_tells_a_node_that_is_not_fenced_nothing():
    core = _core(None)
    assert core.receive(PEER, _txn(3, 8, _row(NEW, 11, state="expelled")), WALL) == []
    assert core.table.get(NEW) is None and core.fence is None


def test_a_row_about_this_node_teaches_the_peers_map_only_from_the_peer_itself_and_not_its_history():
    core = _core(None)
    core.receive(PEER, _txn(3, 6, _row(SELF, 9)), WALL)                 # OTHER's row, relayed
    assert 9 not in core.peers[PEER].map.to_local
    core.peers[PEER].history_lsn = 6
    core.receive(PEER, _txn(7, 6, _row(SELF, 9)), WALL)                 # the peer's earlier incarnation's
    assert 9 not in core.peers[PEER].map.to_local


@pytest.mark.parametrize("stated, bound", [(None, 0), (4, 4)])
def test_a_member_first_learned_expelled_keeps_the_bound_its_row_states_or_0(stated, bound):
    core = _core(None)
    core.receive(PEER, _txn(7, 6, _row(NEW, 11, state="expelled", expelled_lsn=stated)), WALL)
    assert (core.table.get(NEW).state, core.table.get(NEW).expelled_lsn) == ("expelled", bound)
