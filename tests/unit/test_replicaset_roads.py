"""More of NodeCore's rules that mutation testing found unpinned (issue 18): what a greeting
registers and maps (another node's anonymous entry, a fenced greeting that names a stranger
first, a full table while fenced), what the exact path refuses (an overlap, a row from the
clock's future, fenced or not), whose history a peer's history lsn is, and that a `_cluster`
row of this node's claims no data space. Same table and peer map as tests/unit/test_replicaset.py."""
from __future__ import annotations

import pytest

from node import limits
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.membership import OwnRowsFence
from node.core.replicaset import NodeCore
from node.core.rows import CLUSTER_SPACE, GROUP_DEFAULT, OP_DELETE, OP_PUT, OP_SPACE, Op, Txn
from node.core.vclock import VClock
from node.errors import RemoteProtocolError
from tests.unit.test_replicaset import GONE, OTHER, PEER, PEER_ROWS, SELF, THIRD, WALL, _core, cluster, put

HOUR_US = 3600 * 1_000_000


def test_a_core_made_without_spaces_knows_none_and_refuses_rows_for_any():
    core = NodeCore(SELF, ClusterTable([Member(SELF, 1, "", STATE_MEMBER), Member(PEER, 2, "", STATE_MEMBER)]),
                    VClock({}))
    assert core.spaces == {}
    core.greeting(PEER, [[PEER, 1, "", STATE_MEMBER]], WALL)
    with pytest.raises(RemoteProtocolError, match="does not exist"):
        core.receive(PEER, put(1, 1), WALL)


def test_registering_a_member_claims_no_data_space_so_peers_cannot_write_into_cluster_as_data():
    core = _core()
    core.register_member(THIRD, "t:1", WALL)
    assert CLUSTER_SPACE not in core.spaces
    with pytest.raises(RemoteProtocolError, match="does not exist"):
        core.receive(PEER, Txn(1, 6, GROUP_DEFAULT, WALL, (Op(OP_PUT, CLUSTER_SPACE, "k", 1),)), WALL)


# --- greetings -----------------------------------------------------------------------------------
def test_another_nodes_anonymous_entry_in_a_greeting_registers_nobody():
    core = _core()
    assert core.greeting(PEER, PEER_ROWS + [[THIRD, 6, "", STATE_ANON]], WALL) == []
    assert THIRD not in core.table and 6 not in core.peers[PEER].map.to_local


def test_a_fenced_greeting_that_names_a_stranger_first_still_maps_the_members_after_it():
    core = _core()
    core.fence = OwnRowsFence("a test loss")
    core.greeting(PEER, [[THIRD, 6, "t:1", STATE_MEMBER]] + PEER_ROWS, WALL)
    assert THIRD not in core.table
    assert core.peers[PEER].map.as_dict() == {1: 2, 2: 1, 5: 3}


def test_a_fenced_core_with_a_full_table_still_greets(monkeypatch):
    core = _core()
    core.fence = OwnRowsFence("a test loss")
    monkeypatch.setattr(limits, "members_max", 3)
    assert core.greeting(PEER, PEER_ROWS + [[THIRD, 6, "t:1", STATE_MEMBER]], WALL) == []
    assert core.peers[PEER].map.as_dict() == {1: 2, 2: 1, 5: 3}


# --- the exact path's refusals -------------------------------------------------------------------
def test_a_cluster_txn_that_overlaps_what_is_claimed_is_a_protocol_error():
    core = _core()
    with pytest.raises(RemoteProtocolError, match="overlaps claimed 5"):
        core.receive(PEER, cluster(1, 5, (THIRD, 6, "t:1"), (GONE, 7, "g:1")), WALL)   # lsns 5..6, have 5
    assert THIRD not in core.table


@pytest.mark.parametrize("fenced", [False, True])
def test_a_cluster_row_an_hour_old_is_taken_and_one_from_past_the_clock_offset_is_refused(fenced):
    core = _core()
    if fenced:
        core.fence = OwnRowsFence("a test loss")
    assert core.receive(PEER, cluster(1, 6, (OTHER, 5, "c:1"), ts=WALL - HOUR_US), WALL)
    ahead = WALL + int(limits.hlc_offset_max_s * 1e6) + 1_000_000
    with pytest.raises(RemoteProtocolError, match="ahead of this node's clock"):
        core.receive(PEER, cluster(1, 7, (OTHER, 5, "c:1"), ts=ahead), WALL)
    assert core.claimed.get(2) == 6


def test_a_peers_history_lsn_is_about_its_own_rows_and_not_those_it_relays():
    """The peer's greeting says its own `_cluster` rows up to lsn 10 are an earlier incarnation's.
    OTHER's row (lsn 8) relayed by it is not history: it teaches what OTHER calls THIRD, so
    THIRD's rows from OTHER translate later."""
    core = _core({1: 4, 2: 5, 3: 7})
    core.greeting(PEER, PEER_ROWS, WALL, history_lsn=10)
    core.receive(PEER, cluster(5, 8, (THIRD, 4, "t:1")), WALL)
    core.greeting(OTHER, [[OTHER, 1, "c:1", STATE_MEMBER], [SELF, 3, "a:1", STATE_MEMBER]], WALL)
    got = core.receive(OTHER, put(4, 1), WALL)
    assert [t.replica_id for t in got] == [core.table.id_of(THIRD)]


# --- plain rows' spaces, own rows back, commits ----------------------------------------------------
def test_a_peers_delete_in_a_local_or_unknown_space_is_refused_like_a_put():
    core = _core()
    for space, why in (("loc", "is local here"), ("nope", "does not exist")):
        with pytest.raises(RemoteProtocolError, match=why):
            core.receive(PEER, Txn(1, 6, GROUP_DEFAULT, WALL, (Op(OP_DELETE, space, "k", None),)), WALL)
    assert core.claimed.get(2) == 5


def test_a_peers_space_row_for_a_space_this_node_has_changes_nothing_here():
    core = _core()
    core.receive(PEER, Txn(1, 6, GROUP_DEFAULT, WALL, (Op(OP_SPACE, "kv", "", {"local": True}),)), WALL)
    assert core.spaces["kv"] is False


def test_an_own_row_coming_back_restores_this_nodes_address_it_states():
    """A row of this node's own that it lost (a peer held it) and gets back says what this node
    said of itself: its address is taken again (it is the node's own row, not another's word)."""
    core = _core({1: 4, 2: 5, 3: 7})
    assert len(core.receive(PEER, cluster(2, 5, (SELF, 1, "a:2")), WALL)) == 1
    assert core.table.get(SELF).address == "a:2"


def test_committing_the_same_batch_twice_moves_nothing_the_second_time():
    core = _core()
    core.receive(PEER, put(1, 6), WALL)
    for _ in range(2):
        core.commit_tops({2: 6}, on_disk=True)
    assert core.vclock.get(2) == core.synced.get(2) == 6


# --- runs: every txn of a run is decided, and counted ------------------------------------------------
def test_a_run_goes_on_past_its_duplicates_and_counts_every_txn_past_a_gap():
    core = _core()
    out: list[Txn] = []
    assert core.receive_run(PEER, [put(1, 5), put(1, 6)], 0, out, WALL) == (2, 1)
    assert [t.lsn for t in out] == [6]
    out = []
    assert core.receive_run(PEER, [put(1, 9), put(1, 10)], 0, out, WALL) == (2, 0)
    assert core.peers[PEER].stats.gaps == 2 and core.peers[PEER].stats.duplicates == 1


def test_a_run_decides_every_txn_past_an_expelled_members_bound():
    core = _core()
    core.receive(PEER, cluster(1, 6, (OTHER, 5, "c:1", STATE_EXPELLED, 8)), WALL)
    out: list[Txn] = []
    assert core.receive_run(PEER, [put(5, 8), put(5, 9), put(5, 10)], 0, out, WALL) == (3, 1)
    assert (core.peers[PEER].stats.expelled, core.peers[PEER].stats.gaps) == (1, 1)   # 10 follows the refused 9


def test_a_peers_txn_may_create_spaces_up_to_store_spaces_max_and_not_one_more(monkeypatch):
    core = _core()
    monkeypatch.setattr(limits, "store_spaces_max", 4)       # kv and loc exist
    two = Txn(1, 6, GROUP_DEFAULT, WALL, (Op(OP_SPACE, "s3", "", {}), Op(OP_SPACE, "s4", "", {})))
    assert core.receive(PEER, two, WALL) and set(core.spaces) == {"kv", "loc", "s3", "s4"}
    with pytest.raises(RemoteProtocolError, match="store_spaces_max"):
        core.receive(PEER, Txn(1, 8, GROUP_DEFAULT, WALL, (Op(OP_SPACE, "s5", "", {}),)), WALL)


# --- _cluster rows that contradict -------------------------------------------------------------------
def test_a_cluster_txn_giving_one_uuid_two_ids_is_refused():
    core = _core()
    with pytest.raises(RemoteProtocolError, match="two meanings"):
        core.receive(PEER, cluster(1, 6, (THIRD, 8, "t:1"), (THIRD, 9, "t:1")), WALL)


def test_a_peer_naming_a_member_it_never_mapped_by_an_id_it_gave_another_is_refused():
    core = _core()
    core.register_member(GONE, "g:1", WALL)              # known here, not in the peer's map
    with pytest.raises(RemoteProtocolError, match="said before"):
        core.receive(PEER, cluster(1, 6, (GONE, 5, "g:1")), WALL)     # 5 is OTHER on the peer
    assert core.claimed.get(2) == 5


def test_a_fenced_core_checks_every_row_of_a_txn_after_one_about_itself():
    core = _core()
    core.fence = OwnRowsFence("a test loss")
    with pytest.raises(RemoteProtocolError, match="after the fence"):
        core.receive(PEER, cluster(1, 6, (SELF, 2, "a:1"), (THIRD, 6, "t:1")), WALL)
    assert THIRD not in core.table and THIRD not in core.fence.expelled, "a registration is no expel"


def test_an_own_row_at_exactly_the_history_lsn_is_history():
    table = ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER), Member(PEER, 2, "b:1", STATE_MEMBER),
                          Member(OTHER, 3, "c:1", STATE_MEMBER)])
    core = NodeCore(SELF, table, VClock({1: 4, 2: 5, 3: 7}), spaces={"kv": False}, own_history_lsn=5)
    core.greeting(PEER, PEER_ROWS, WALL)
    assert len(core.receive(PEER, cluster(2, 5, (THIRD, 3, "t:1")), WALL)) == 1      # says id 3: not followed
    assert THIRD not in core.table


# --- what a member's greeting tells a fence ------------------------------------------------------------
def test_a_fence_reads_four_field_rows_and_waits_for_no_anonymous_replica():
    core = _core()
    core.fence = OwnRowsFence("a test loss")
    core.observe_peer(PEER, {}, [[GONE, 4, "", STATE_EXPELLED], [THIRD, 6, "", STATE_MEMBER], ["anon-1", 7, "", STATE_ANON]])
    assert core.fence.expelled == {GONE} and core.fence.known == {THIRD}
    assert core.fence.heard == {PEER: 0}
