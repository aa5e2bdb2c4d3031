"""Edges of the membership rules (node/core/membership.py) and of the fence in NodeCore that
mutation testing found unpinned (issue 18): bounds at exactly their value, the "and N more" of
long lists, an expelled member the fence was told to wait for, holds that change kind, and a
history row that would register a member if it were followed."""
from __future__ import annotations

import pytest

from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.holds import Hold, advance_hold, hold_positions
from node.core.membership import OwnRowsFence, describe_uncovered, greeting_vclock, uncovered
from node.core.replicaset import NodeCore
from node.core.rows import CLUSTER_SPACE, GROUP_CLUSTER, OP_CLUSTER, Op, Txn
from node.core.vclock import VClock
from tests.unit.test_membership import NEW, OTHER, PEER, SELF, WALL, _core, _greet, _table


def test_a_greetings_component_of_one_row_is_kept():
    assert greeting_vclock({"vclock_uuid": {PEER: 1, OTHER: 0}}) == {PEER: 1}


def test_rows_of_an_expelled_member_with_bound_zero_are_nothing_a_donor_must_cover():
    assert uncovered({PEER: 5, OTHER: 2}, {OTHER: 2}, bounds={PEER: 0}) == {}


@pytest.mark.parametrize("n, tail", [(4, ""), (5, " and 1 more"), (6, " and 2 more")])
def test_a_long_list_of_uncovered_members_names_four_and_counts_the_rest(n, tail):
    missing = {f"u{i}": (9, 1) for i in range(n)}
    text = describe_uncovered(missing)
    assert text.count("up to lsn 9") == 4 and text.endswith("(it has 1)" + tail)


@pytest.mark.parametrize("n, tail", [(4, ""), (5, " and 1 more"), (6, " and 2 more")])
def test_a_fence_waiting_for_many_members_names_four_and_counts_the_rest(n, tail):
    table = ClusterTable([Member(SELF, 1, "", STATE_MEMBER)] +
                         [Member(f"m{i}", i + 2, "", STATE_MEMBER) for i in range(n)])
    text = OwnRowsFence("lost").explain(table, SELF, 0)
    shown = ", ".join(f"m{i}" for i in range(4))
    assert f"not heard from {shown}{tail} (start it" in text


def test_a_fence_with_nobody_to_hear_and_no_own_rows_clears_at_lsn_zero():
    table = ClusterTable([Member(SELF, 1, "", STATE_MEMBER)])
    fence = OwnRowsFence("lost")
    assert fence.target() == 0 and fence.can_clear(table, SELF, 0)
    assert fence.explain(table, SELF, 0).endswith("rows up to lsn 0 are coming back from its peers (it has 0)")


def test_a_member_a_greeting_named_is_not_waited_for_once_this_node_knows_it_is_expelled():
    table = _table(Member(NEW, 4, "", STATE_EXPELLED, 0, 3))
    fence = OwnRowsFence("lost", known={NEW})
    for u in (PEER, OTHER):
        fence.hear(u, 0, [NEW])
    assert fence.waiting_for(table, SELF) == [] and fence.can_clear(table, SELF, 0)


def test_an_anonymous_hold_lasts_exactly_its_ttl():
    holds = {"anon": Hold({1: 4}, 100.0, True)}
    assert hold_positions(holds, ClusterTable(), 130.0, 30.0) == [{1: 4}]
    assert hold_positions(holds, ClusterTable(), 130.5, 30.0) == []


def test_a_hold_that_changes_kind_starts_again_from_what_was_said():
    old = Hold({1: 9, 2: 4}, 1.0, True)
    h = advance_hold(old, {1: 3}, 2.0, False)
    assert (h.vclock, h.anon) == ({1: 3}, False)


def test_a_hold_keeps_a_zero_component_the_subscriber_reports_for_the_first_time():
    h = advance_hold(Hold({2: 4}, 1.0, False), {1: 0, 2: 5}, 2.0, False)
    assert h.vclock == {1: 0, 2: 5}


def test_an_own_history_row_is_not_followed_even_when_it_would_register_a_member():
    """After a rebuild, an own `_cluster` row of the earlier incarnation that names a member this
    node does not know must not register it (the ids it states are not this node's now)."""
    core = _core({1: 10, 2: 5, 3: 7}, fenced=True, rebuilt=True)
    _greet(core)
    old = Txn(1, 11, GROUP_CLUSTER, WALL - 1000, (
        Op(OP_CLUSTER, CLUSTER_SPACE, NEW, {"id": 2, "address": "", "state": STATE_MEMBER}),))
    assert core.receive(PEER, old, WALL) == [old]
    assert NEW not in core.table and core.claimed.get(1) == 11


def test_clearing_a_rebuilt_fence_records_the_lsn_of_the_restated_rows():
    core = _core({1: 10, 2: 5, 3: 7}, fenced=True, rebuilt=True)
    txn = core.clear_fence(WALL)
    assert txn is not None and all(m.lsn == txn.lsn == 11 for m in core.table.members())


def test_asking_about_or_clearing_a_fence_that_is_not_there_is_a_callers_bug():
    core = _core()
    with pytest.raises(AssertionError):
        core.clear_fence(WALL)
    with pytest.raises(AssertionError):
        core.fence_state()


def test_a_links_end_forgets_the_peers_map_only_if_no_newer_link_greeted_since():
    core = _core()
    _greet(core)
    old = core.peers[PEER]
    _greet(core)
    newer = core.peers[PEER]
    core.drop_peer(PEER, old)
    assert core.peers[PEER] is newer
    core.drop_peer(PEER, newer)
    assert PEER not in core.peers


def test_a_cluster_txns_timestamp_moves_this_nodes_clock():
    core = NodeCore(SELF, _table(), VClock({1: 1, 2: 5}), spaces={"kv": False})
    _greet(core)
    ahead = WALL + 500_000
    core.receive(PEER, Txn(2, 6, GROUP_CLUSTER, ahead, (
        Op(OP_CLUSTER, CLUSTER_SPACE, PEER, {"id": 2, "address": "b:1", "state": STATE_MEMBER}),)), WALL)
    assert core.hlc.now(WALL) > ahead


def test_a_fence_waiting_for_rows_names_the_members_that_said_they_hold_them():
    table = _table()
    fence = OwnRowsFence("lost")
    fence.hear(PEER, 8)
    fence.hear(OTHER, 5)
    text = fence.explain(table, SELF, 5)
    assert text.endswith(f"up to lsn 8 are coming back from its peers (it has 5; {PEER} said it holds them)")


def test_a_fence_whose_rows_only_an_expelled_member_holds_says_the_ways_out():
    # an expelled member that still runs counts (it gives the rows back if this node follows
    # it: no member takes a member's rows from an expelled one); unfollowed, the wait is for
    # ever, so the status says how the operator ends it, with the address to follow
    table = _table()
    fence = OwnRowsFence("lost")
    fence.hear(PEER, 3)
    fence.hear(OTHER, 8)
    fence.expelled.add(OTHER)
    text = fence.explain(table, SELF, 3)
    assert f"({'it has 3'}; {OTHER} said it holds them); {OTHER} at c:1 is expelled: its rows come back only if " \
           "this node replicates from it (add its address to this node's peers" in text
    assert text.endswith("expelling it on this node too stops the wait (they are then given up)")
    only_table = OwnRowsFence("lost")               # the expel known from this node's table alone
    only_table.hear(PEER, 3)
    only_table.hear(OTHER, 8)
    assert "expelled" not in only_table.explain(table, SELF, 3)
    expelled_here = _table()
    expelled_here.upsert(Member(OTHER, 3, "c:1", STATE_EXPELLED, 0, 8))
    assert only_table.explain(expelled_here, SELF, 3) == text
    expelled_here.upsert(Member(OTHER, 3, "", STATE_EXPELLED, 0, 8))      # its address unknown here
    assert f"; {OTHER} is expelled: its rows come back" in only_table.explain(expelled_here, SELF, 3)
    fence.given_up.add(OTHER)                       # the operator expelled it here: its word is gone
    assert fence.target() == 3 and "expelled" not in fence.explain(table, SELF, 3)
