"""node/cluster_space on its own: the uuid-keyed `_cluster` table, the per-peer id maps and the
`_cluster` resolver, with the rules each module's opening comment states."""
from __future__ import annotations

import pytest

from node import limits
from node.cluster_space.idmap import IdMap
from node.cluster_space.resolver import (DATA_RESOLVERS, apply_in_order, lww, register_resolver,
                                         resolve_cluster_replace)
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.vclock import VClock

A, B, C, D = "u-a", "u-b", "u-c", "u-d"


def table(*members: tuple[str, int, str]) -> ClusterTable:
    return ClusterTable([Member(u, i, f"h-{u}:1", s) for u, i, s in members])


# --- the table -----------------------------------------------------------------------------
def test_a_table_answers_by_uuid_and_by_id_and_lists_members_by_id():
    t = table((B, 3, STATE_MEMBER), (A, 1, STATE_MEMBER), (C, 2, STATE_EXPELLED))
    assert t.get(A).id == 1 and t.get(D) is None
    assert t.by_id(3).uuid == B and t.by_id(4) is None
    assert (t.id_of(C), t.id_of(D)) == (2, None)
    assert (t.uuid_of(2), t.uuid_of(9)) == (C, None)
    assert A in t and D not in t and len(t) == 3
    assert [m.uuid for m in t.members()] == [A, C, B]
    assert t.rows() == [[A, 1, "h-u-a:1", STATE_MEMBER, 0, 0], [C, 2, "h-u-c:1", STATE_EXPELLED, 0, 0],
                        [B, 3, "h-u-b:1", STATE_MEMBER, 0, 0]]
    assert t.uuid_to_id() == {A: 1, B: 3, C: 2}


def test_the_lowest_free_id_fills_holes_and_an_expelled_member_keeps_its_id():
    assert ClusterTable().lowest_free_id() == 1
    t = table((A, 1, STATE_MEMBER), (B, 2, STATE_EXPELLED), (C, 4, STATE_MEMBER))
    assert t.lowest_free_id() == 3
    t.upsert(Member(D, 3, "", STATE_MEMBER))
    assert t.lowest_free_id() == 5


def test_a_member_row_round_trips_and_old_short_rows_read_with_zero_lsns():
    m = Member(A, 4, "h:1", STATE_EXPELLED, lsn=9, expelled_lsn=17)
    assert Member.from_row(m.to_row()) == m
    assert Member.from_row((A, "4", None, STATE_MEMBER)) == Member(A, 4, "", STATE_MEMBER, 0, 0)
    assert Member.from_row([A, 4, "h:1", STATE_MEMBER, 6]) == Member(A, 4, "h:1", STATE_MEMBER, 6, 0)


def test_a_copy_is_independent_of_the_original():
    t = table((A, 1, STATE_MEMBER))
    t.get(A).lsn = 5
    c = t.copy()
    assert c.rows() == t.rows()
    c.get(A).address = "elsewhere"
    c.upsert(Member(B, 2, "", STATE_MEMBER))
    assert t.get(A).address == "h-u-a:1" and B not in t and c.get(A).lsn == 5


def test_upsert_keeps_one_id_per_uuid_and_one_uuid_per_id():
    t = table((A, 1, STATE_MEMBER), (B, 2, STATE_MEMBER))
    t.upsert(Member(A, 1, "new:1", STATE_EXPELLED))              # same id: a re-statement
    assert t.get(A).address == "new:1" and t.by_id(1).state == STATE_EXPELLED
    with pytest.raises(AssertionError):
        t.upsert(Member(A, 3, "", STATE_MEMBER))                 # a known uuid never changes id
    with pytest.raises(AssertionError):
        t.upsert(Member(C, 2, "", STATE_MEMBER))                 # an id is never given twice
    for bad in (Member(C, 0, "", STATE_MEMBER), Member(C, 3, "", "gone")):
        with pytest.raises(AssertionError):
            t.upsert(bad)
    assert t.rows() == [[A, 1, "new:1", STATE_EXPELLED, 0, 0], [B, 2, "h-u-b:1", STATE_MEMBER, 0, 0]]


def test_a_table_takes_members_max_members_and_refuses_one_more():
    t = ClusterTable(Member(f"u-{i}", i, "", STATE_MEMBER) for i in range(1, limits.members_max + 1))
    assert len(t) == limits.members_max
    t.upsert(Member("u-1", 1, "still:1", STATE_MEMBER))          # a known one may still change
    with pytest.raises(AssertionError):
        t.upsert(Member("u-new", limits.members_max + 1, "", STATE_MEMBER))


# --- the id map ----------------------------------------------------------------------------
def test_an_id_map_translates_both_ways_and_leaves_unknown_components_out():
    m = IdMap()
    m.learn(7, 2)
    m.learn(3, 3)
    assert m.as_dict() == {3: 3, 7: 2}
    assert m.vclock_to_local(VClock({7: 10, 3: 4, 9: 99})).to_dict() == {2: 10, 3: 4}
    assert m.vclock_to_peer(VClock({2: 10, 3: 4, 0: 5, 5: 1})).to_dict() == {7: 10, 3: 4}


def test_an_id_map_learns_an_entry_again_but_never_a_second_meaning():
    m = IdMap()
    m.learn(7, 2)
    m.learn(7, 2)
    with pytest.raises(AssertionError):
        m.learn(7, 3)            # the peer's id 7 is one member for ever
    with pytest.raises(AssertionError):
        m.learn(8, 2)            # and our id 2 is the peer's 7, not also its 8
    assert m.to_local == {7: 2} and m.to_peer == {2: 7}


def test_an_id_map_learns_from_a_peer_table_only_the_uuids_both_know():
    local = table((A, 1, STATE_MEMBER), (B, 2, STATE_MEMBER))
    m = IdMap()
    m.learn_table({A: 5, B: 1, C: 2}, local)
    assert m.to_local == {5: 1, 1: 2} and m.to_peer == {1: 5, 2: 1}


# --- the _cluster resolver ----------------------------------------------------------------------
def test_an_unknown_uuid_takes_its_proposed_id_when_free_else_the_lowest_free():
    t = table((A, 1, STATE_MEMBER), (B, 3, STATE_MEMBER))
    r = resolve_cluster_replace(t, C, 2, "c:1", STATE_MEMBER, from_self=False)
    assert (r.local_id, r.changed, r.reason) == (2, True, "insert") and r.member == Member(C, 2, "c:1", STATE_MEMBER)
    r = resolve_cluster_replace(t, C, 3, "c:1", STATE_MEMBER, from_self=False)
    assert (r.local_id, r.reason) == (2, "insert-remapped")
    r = resolve_cluster_replace(t, C, 0, "c:1", STATE_MEMBER, from_self=False)
    assert (r.local_id, r.reason) == (2, "insert-remapped")
    assert len(t) == 2, "the resolver decides; it does not store"


def test_a_member_first_learned_as_expelled_is_stored_expelled_with_its_bound():
    t = table((A, 1, STATE_MEMBER))
    r = resolve_cluster_replace(t, C, 4, "c:1", STATE_EXPELLED, from_self=False, expelled_lsn=12, have_lsn=30)
    assert r.member.state == STATE_EXPELLED and r.member.expelled_lsn == 12 and r.changed and r.local_id == 4
    # a live member carries no bound, whatever the row says
    r = resolve_cluster_replace(t, C, 4, "c:1", STATE_MEMBER, from_self=False, expelled_lsn=12)
    assert r.member.state == STATE_MEMBER and r.member.expelled_lsn == 0


def test_an_unknown_uuid_proposing_id_1_takes_id_1_when_it_is_free():
    t = ClusterTable([Member(A, 2, "", STATE_MEMBER)])
    r = resolve_cluster_replace(t, C, 1, "c:1", STATE_MEMBER, from_self=False)
    assert (r.local_id, r.reason) == (1, "insert")


def test_a_live_members_row_that_carries_an_expelled_bound_changes_nothing():
    """Only an expel row's bound counts: a member or anonymous row with an `expelled_lsn` field
    (a peer's bug, or a crafted row) neither gives a live member a bound nor stops a registration."""
    t = ClusterTable([Member(A, 1, "", STATE_MEMBER), Member(B, 2, "b:1", STATE_ANON)])
    r = resolve_cluster_replace(t, A, 1, "", STATE_MEMBER, from_self=False, expelled_lsn=9)
    assert (r.member.state, r.member.expelled_lsn, r.changed, r.reason) == (STATE_MEMBER, 0, False, "known")
    r = resolve_cluster_replace(t, B, 2, "", STATE_MEMBER, from_self=True, expelled_lsn=9)
    assert (r.member.state, r.member.expelled_lsn, r.reason) == (STATE_MEMBER, 0, "register")


def test_an_expel_that_states_no_bound_takes_the_rows_held_and_nothing_more():
    t = table((A, 1, STATE_MEMBER), (B, 2, STATE_MEMBER))
    r = resolve_cluster_replace(t, B, 2, "", STATE_EXPELLED, from_self=True)
    assert (r.member.state, r.member.expelled_lsn) == (STATE_EXPELLED, 0)
    r = resolve_cluster_replace(t, B, 2, "", STATE_EXPELLED, from_self=True, expelled_lsn=0)
    assert r.member.expelled_lsn == 0
    r = resolve_cluster_replace(t, C, 3, "", STATE_EXPELLED, from_self=False)
    assert (r.member.state, r.member.expelled_lsn) == (STATE_EXPELLED, 0)


def test_another_nodes_anonymous_entry_is_stored_as_a_member():
    r = resolve_cluster_replace(table((A, 1, STATE_MEMBER)), C, 2, "", STATE_ANON, from_self=False)
    assert r.member.state == STATE_MEMBER


def test_expel_takes_the_larger_of_the_incoming_bound_and_the_rows_already_held():
    t = table((A, 1, STATE_MEMBER), (B, 2, STATE_MEMBER))
    r = resolve_cluster_replace(t, B, 9, "", STATE_EXPELLED, from_self=False, expelled_lsn=5, have_lsn=8)
    assert (r.member.state, r.member.expelled_lsn, r.local_id, r.reason) == (STATE_EXPELLED, 8, 2, "expel")
    r = resolve_cluster_replace(t, B, 9, "", STATE_EXPELLED, from_self=False, expelled_lsn=11, have_lsn=8)
    assert r.member.expelled_lsn == 11 and r.changed
    assert t.get(B).state == STATE_MEMBER, "the stored member is not changed in place"


def test_an_expelled_bound_only_grows_and_expel_is_final():
    t = ClusterTable([Member(A, 1, "", STATE_MEMBER), Member(B, 2, "b:1", STATE_EXPELLED, 3, 10)])
    r = resolve_cluster_replace(t, B, 2, "", STATE_EXPELLED, from_self=False, expelled_lsn=14)
    assert (r.member.expelled_lsn, r.changed, r.reason) == (14, True, "expel-lsn")
    for lsn in (10, 9):
        r = resolve_cluster_replace(t, B, 2, "", STATE_EXPELLED, from_self=False, expelled_lsn=lsn)
        assert (r.member.expelled_lsn, r.changed, r.reason) == (10, False, "known")
    for state in (STATE_MEMBER, STATE_ANON):
        r = resolve_cluster_replace(t, B, 2, "new:1", state, from_self=True)
        assert (r.member.state, r.member.address, r.changed) == (STATE_EXPELLED, "b:1", False)
    assert r.member.lsn == 3, "what this node wrote about the member stays"


def test_an_anonymous_entry_becomes_a_member_when_it_registers():
    t = ClusterTable([Member(A, 1, "", STATE_ANON)])
    r = resolve_cluster_replace(t, A, 1, "", STATE_MEMBER, from_self=True)
    assert (r.member.state, r.changed, r.reason) == (STATE_MEMBER, True, "register")
    r = resolve_cluster_replace(t, A, 1, "", STATE_ANON, from_self=True)
    assert (r.member.state, r.changed) == (STATE_ANON, False)


def test_only_a_members_own_row_changes_its_address():
    t = table((A, 1, STATE_MEMBER), (B, 2, STATE_MEMBER))
    r = resolve_cluster_replace(t, B, 2, "moved:1", STATE_MEMBER, from_self=False)
    assert (r.member.address, r.changed, r.reason) == ("h-u-b:1", False, "known")
    r = resolve_cluster_replace(t, B, 2, "moved:1", STATE_MEMBER, from_self=True)
    assert (r.member.address, r.changed, r.reason) == ("moved:1", True, "address")
    r = resolve_cluster_replace(t, B, 2, "", STATE_MEMBER, from_self=True)
    assert (r.member.address, r.changed) == ("h-u-b:1", False), "an empty address changes nothing"
    r = resolve_cluster_replace(t, B, 2, "h-u-b:1", STATE_MEMBER, from_self=True)
    assert r.changed is False


def test_an_expel_with_a_new_address_keeps_the_old_address_and_says_expel():
    t = table((A, 1, STATE_MEMBER), (B, 2, STATE_MEMBER))
    r = resolve_cluster_replace(t, B, 2, "moved:1", STATE_EXPELLED, from_self=True, expelled_lsn=4)
    assert (r.member.address, r.reason) == ("h-u-b:1", "expel")
    t2 = ClusterTable([Member(A, 1, "a:1", STATE_ANON)])
    r = resolve_cluster_replace(t2, A, 1, "a:2", STATE_MEMBER, from_self=True)
    assert (r.member.address, r.reason, r.changed) == ("a:2", "register", True)


# --- data resolvers --------------------------------------------------------------------------------
def test_last_writer_wins_by_clock_then_origin_then_lsn():
    old = ("v", "u-b", 5, 100, False)
    assert lww(None, old)
    assert lww(old, ("w", "u-a", 1, 101, False))          # a later clock wins whatever the origin
    assert not lww(old, ("w", "u-c", 9, 99, True))
    assert lww(old, ("w", "u-c", 1, 100, False))          # same clock: the larger origin
    assert not lww(old, ("w", "u-a", 9, 100, False))
    assert lww(old, ("w", "u-b", 6, 100, False))          # same clock and origin: the later op
    assert not lww(old, ("w", "u-b", 5, 100, False))


def test_arrival_order_always_replaces_and_a_resolver_name_is_registered_once():
    assert apply_in_order(("v", "u", 9, 9, False), ("w", "u", 1, 1, False))
    assert DATA_RESOLVERS["lww"] is lww and DATA_RESOLVERS["apply"] is apply_in_order
    with pytest.raises(ValueError):
        register_resolver("lww", apply_in_order)
    register_resolver("test-newest-lsn", lambda old, new: old is None or new[2] > old[2])
    try:
        assert DATA_RESOLVERS["test-newest-lsn"](None, ("v", "u", 1, 1, False))
    finally:
        del DATA_RESOLVERS["test-newest-lsn"]
