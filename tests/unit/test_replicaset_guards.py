"""NodeCore's guards and bookkeeping that mutation testing of the core found unpinned (issue 18):
the members_max bound on every road that registers, a plain row decided by the exact path's
space checks too, what a `_cluster` row of this node's says (and records) about a member, the
callers' contracts that are asserted. Same table and peer map as tests/unit/test_replicaset.py."""
from __future__ import annotations

import pytest

from node import limits
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.membership import OwnRowsFence
from node.core.replicaset import NodeCore, cluster_op
from node.core.rows import GROUP_DEFAULT, OP_PUT, OP_SPACE, Op, Txn
from node.core.vclock import VClock
from node.errors import RemoteProtocolError
from tests.unit.test_replicaset import OTHER, PEER, PEER_ROWS, SELF, THIRD, WALL, _core, cluster, put


# --- members_max on every road that registers ------------------------------------------------------
def test_registering_one_member_past_members_max_is_refused_as_a_protocol_error(monkeypatch):
    core = _core()
    monkeypatch.setattr(limits, "members_max", 4)
    core.register_member(THIRD, "t:1", WALL)
    with pytest.raises(RemoteProtocolError, match="members_max"):
        core.register_member("f" * 8 + "-0000-4000-8000-000000000006", "f:1", WALL)
    assert len(core.table) == 4
    # a member already known is re-stated, not counted again
    assert core.register_member(THIRD, "t:2", WALL)[1] is not None


def test_a_greeting_that_would_grow_the_table_past_members_max_is_refused_and_registers_nobody(monkeypatch):
    core = _core()
    monkeypatch.setattr(limits, "members_max", 4)
    rows = PEER_ROWS + [[THIRD, 6, "t:1", STATE_MEMBER], ["f" * 8 + "-0000-4000-8000-000000000006", 7, "", STATE_MEMBER]]
    with pytest.raises(RemoteProtocolError, match="members_max"):
        core.greeting(PEER, rows, WALL)
    assert THIRD not in core.table and len(core.table) == 3
    assert core.greeting(PEER, rows[:4], WALL) and THIRD in core.table      # one more fits


# --- register_member writes a row only for a change, and records its lsn ------------------------------
def test_re_registering_a_member_as_it_is_writes_no_row():
    core = _core()
    local_id, txn = core.register_member(THIRD, "t:1", WALL)
    assert txn is not None and core.claimed.get(1) == 5
    assert core.register_member(THIRD, "t:1", WALL) == (local_id, None)
    assert core.claimed.get(1) == 5, "no lsn claimed for a row not written"


def test_the_stored_cluster_entry_names_the_lsn_of_this_nodes_row_that_wrote_it():
    core = _core()
    _, txn = core.register_member(THIRD, "t:1", WALL)
    assert core.table.get(THIRD).lsn == txn.lsn == 5
    got = core.greeting(PEER, PEER_ROWS + [["f" * 8 + "-0000-4000-8000-000000000006", 8, "", STATE_MEMBER]], WALL)
    assert core.table.get("f" * 8 + "-0000-4000-8000-000000000006").lsn == got[0].lsn == 6


def test_a_live_members_cluster_row_carries_no_expelled_bound_and_an_expelled_ones_does():
    assert "expelled_lsn" not in cluster_op(Member(OTHER, 3, "c:1", STATE_MEMBER, 0, 9)).value
    assert cluster_op(Member(OTHER, 3, "c:1", STATE_EXPELLED, 0, 9)).value["expelled_lsn"] == 9


# --- a plain row by the exact path gets the space checks too ------------------------------------------
def test_a_plain_row_for_a_space_this_node_lacks_is_refused_by_receive_and_claims_nothing():
    core = _core()
    with pytest.raises(RemoteProtocolError, match="does not exist"):
        core.receive(PEER, Txn(1, 6, GROUP_DEFAULT, WALL, (Op(OP_PUT, "nope", "k", 1),)), WALL)
    assert core.claimed.get(2) == 5


def test_an_applied_cluster_txn_counts_as_applied_in_the_peers_stats():
    core = _core()
    core.receive(PEER, cluster(1, 6, (THIRD, 6, "t:1")), WALL)
    assert core.peers[PEER].stats.applied == 1


# --- the callers' contracts, asserted ----------------------------------------------------------
def test_a_core_without_its_own_uuid_in_its_table_is_refused():
    with pytest.raises(AssertionError, match="own uuid"):
        NodeCore(SELF, ClusterTable([Member(PEER, 2, "b:1", STATE_MEMBER)]), VClock({}))


def test_a_run_that_begins_with_a_cluster_txn_is_a_callers_bug_and_is_refused_before_any_claim():
    core = _core()
    with pytest.raises(AssertionError):
        core.receive_run(PEER, [cluster(1, 6, (THIRD, 6, "t:1"))], 0, [], WALL)
    assert core.claimed.get(2) == 5 and THIRD not in core.table


def test_an_expelled_members_bound_is_what_its_row_here_says():
    core = _core()
    core.receive(PEER, cluster(1, 6, (OTHER, 5, "c:1", STATE_EXPELLED, 9)), WALL)
    assert core.table.get(OTHER).state == STATE_EXPELLED and core.table.get(OTHER).expelled_lsn == 9


def test_a_local_transaction_without_rows_is_a_callers_bug_and_claims_no_lsn():
    core = _core()
    with pytest.raises(AssertionError, match="at least one row"):
        core.local_txn([], GROUP_DEFAULT, WALL)
    assert core.claimed.get(1) == 4


def test_a_peers_cluster_row_that_would_grow_the_table_past_members_max_is_refused_and_claims_nothing(monkeypatch):
    core = _core()
    monkeypatch.setattr(limits, "members_max", 3)
    with pytest.raises(RemoteProtocolError, match="members_max"):
        core.receive(PEER, cluster(1, 6, (THIRD, 6, "t:1")), WALL)
    assert core.claimed.get(2) == 5 and THIRD not in core.table


def test_a_member_learned_from_a_peers_row_records_the_lsn_of_this_nodes_row_for_it():
    core = _core()
    got = core.receive(PEER, cluster(1, 6, (THIRD, 6, "t:1")), WALL)
    assert core.table.get(THIRD).lsn == got[1].lsn == 5


def test_a_space_a_peers_txn_creates_takes_the_rows_of_its_next_txn():
    core = _core()
    out: list[Txn] = []
    core.receive_run(PEER, [Txn(1, 6, GROUP_DEFAULT, WALL, (Op(OP_SPACE, "fresh", "", {"local": False}),))],
                     0, out, WALL)
    assert core.spaces["fresh"] is False
    got = core.receive(PEER, Txn(1, 7, GROUP_DEFAULT, WALL, (Op(OP_PUT, "fresh", "k", 1),)), WALL)
    assert [t.lsn for t in got] == [7]


def test_the_exact_path_counts_duplicates_and_gaps_in_the_peers_stats():
    core = _core()
    assert core.receive(PEER, cluster(1, 5, (OTHER, 5, "c:1")), WALL) == []          # have 5 of the peer's
    assert core.receive(PEER, cluster(1, 8, (THIRD, 6, "t:1")), WALL) == []          # 6 and 7 missing
    stats = core.peers[PEER].stats
    assert (stats.duplicates, stats.gaps, stats.applied) == (1, 1, 0)


def test_another_members_row_below_this_nodes_own_history_lsn_is_still_followed():
    """own_history_lsn is about this node's own rows only: a peer's `_cluster` row with a
    smaller lsn registers its member as any other."""
    table = ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER), Member(PEER, 2, "b:1", STATE_MEMBER),
                          Member(OTHER, 3, "c:1", STATE_MEMBER)])
    core = NodeCore(SELF, table, VClock({1: 40, 2: 5, 3: 7}), spaces={"kv": False}, own_history_lsn=40)
    core.greeting(PEER, PEER_ROWS, WALL)
    got = core.receive(PEER, cluster(1, 6, (THIRD, 6, "t:1")), WALL)
    assert THIRD in core.table and len(got) == 2


# --- _cluster rows: what is counted, checked and followed -------------------------------------------
def test_a_peers_cluster_row_that_fills_the_table_to_exactly_members_max_is_taken(monkeypatch):
    core = _core()
    monkeypatch.setattr(limits, "members_max", 4)
    core.receive(PEER, cluster(1, 6, (THIRD, 6, "t:1"), (OTHER, 5, "c:1")), WALL)   # one new, one known
    assert THIRD in core.table and len(core.table) == 4
    core.receive(PEER, cluster(1, 8, (OTHER, 5, "c:1"), (THIRD, 6, "t:1")), WALL)   # a full table re-stated
    assert core.claimed.get(2) == 9


def test_an_own_row_coming_back_that_gives_a_member_another_id_than_this_nodes_table_is_refused():
    """This node's own `_cluster` rows state its own ids: one that comes back (a WAL tail it lost,
    held by a peer) and disagrees with its table is not followed."""
    core = _core({1: 4, 2: 5, 3: 7})
    with pytest.raises(RemoteProtocolError, match="a row of this node's own says"):
        core.receive(PEER, cluster(2, 5, (OTHER, 7, "c:1")), WALL)
    with pytest.raises(RemoteProtocolError, match="a row of this node's own says"):
        core.receive(PEER, cluster(2, 5, (THIRD, 3, "t:1")), WALL)
    assert core.claimed.get(1) == 4
    assert len(core.receive(PEER, cluster(2, 5, (OTHER, 3, "c:1")), WALL)) == 1     # agreeing: taken, no row of ours


def test_a_peers_row_calling_this_anonymous_node_a_member_changes_nothing_here():
    """This node's entry is its own rows' (an expel aside): a peer cannot register it, fenced or not."""
    table = ClusterTable([Member(SELF, 1, "", STATE_ANON), Member(PEER, 2, "b:1", STATE_MEMBER),
                          Member(OTHER, 3, "c:1", STATE_MEMBER)])
    for fenced in (False, True):
        core = NodeCore(SELF, table.copy(), VClock({2: 5}), spaces={"kv": False})
        core.greeting(PEER, PEER_ROWS, WALL)
        if fenced:
            core.fence = OwnRowsFence("a test loss")
        got = core.receive(PEER, cluster(1, 6, (SELF, 2, "a:9", STATE_MEMBER)), WALL)
        assert len(got) == 1 and core.table.get(SELF).state == STATE_ANON, fenced


def test_only_a_grown_expel_bound_moves_the_expel_epoch():
    core = _core()
    core.receive(PEER, cluster(1, 6, (THIRD, 6, "t:1")), WALL)
    core.receive(PEER, cluster(1, 7, (OTHER, 5, "c:1", STATE_EXPELLED, 3)), WALL)
    assert core.expel_epoch == 0, "a registration and a first expel resubscribe nobody"
    core.receive(PEER, cluster(1, 8, (OTHER, 5, "c:1", STATE_EXPELLED, 9)), WALL)
    assert core.expel_epoch == 1
