"""The membership data-safety rules (node/core/membership.py) and how NodeCore keeps them: a
snapshot may replace a store only if it covers it; a fenced node writes nothing under its own
id, registers nobody, asks only for its own rows, takes its own earlier rows back as history;
holds are created at once and only move forward; ACKs say what is on disk."""
from __future__ import annotations

import pytest

from node import limits
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.apply import apply_txn
from node.core.holds import Hold, advance_hold, hold_positions
from node.core.membership import OwnRowsFence, describe_uncovered, greeting_vclock, uncovered
from node.core.replicaset import NodeCore, cluster_op
from node.core.rows import CLUSTER_SPACE, GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_CLUSTER, OP_PUT, Op, Txn
from node.core.vclock import VClock
from node.errors import RemoteProtocolError

SELF, PEER, OTHER, NEW = (f"{c * 8}-0000-4000-8000-00000000000{i}" for i, c in enumerate("abcd", 1))
WALL = 1_700_000_000_000_000


def _table(*extra: Member) -> ClusterTable:
    return ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER), Member(PEER, 2, "b:1", STATE_MEMBER),
                         Member(OTHER, 3, "c:1", STATE_MEMBER), *extra])


def _core(vclock: dict[int, int] | None = None, fenced: bool = False, rebuilt: bool = False) -> NodeCore:
    core = NodeCore(SELF, _table(), VClock(vclock or {1: 10, 2: 5, 3: 7}), spaces={"kv": False, "loc": True})
    if fenced:
        core.fence = OwnRowsFence("a test loss", rebuilt=rebuilt)
    return core


def _greet(core: NodeCore, peer_rows: list[list] | None = None) -> list[Txn]:
    rows = peer_rows if peer_rows is not None else [m.to_row() for m in _table().members()]
    return core.greeting(PEER, rows, WALL)


# --- uncovered ---------------------------------------------------------------------------------
def test_a_donor_covers_a_node_only_if_it_has_every_component_at_least_as_far():
    assert uncovered({SELF: 10, PEER: 5}, {SELF: 10, PEER: 9, OTHER: 3}) == {}
    assert uncovered({SELF: 10, PEER: 5}, {SELF: 9, PEER: 5}) == {SELF: (10, 9)}
    assert uncovered({NEW: 1}, {}) == {NEW: (1, 0)}
    assert "up to lsn 10 (it has 9)" in describe_uncovered({SELF: (10, 9)})


def test_a_greetings_vclock_keeps_positive_integer_components_only():
    assert greeting_vclock({"vclock_uuid": {SELF: 3, PEER: 0, OTHER: True, NEW: "7"}}) == {SELF: 3}
    assert greeting_vclock({"vclock_uuid": [1, 2]}) == {}
    assert greeting_vclock({}) == {}


# --- the fence -----------------------------------------------------------------------------------
def test_a_fence_waits_for_every_live_member_and_for_the_most_any_of_them_holds():
    table = _table(Member(NEW, 4, "d:1", STATE_EXPELLED), Member("e" * 8 + "-0000-4000-8000-000000000005", 5, "",
                                                                STATE_ANON))
    f = OwnRowsFence("lost")
    assert f.waiting_for(table, SELF) == [PEER, OTHER]        # not itself, not expelled, not anonymous
    f.hear(PEER, 12, [NEW])                                   # each knows NEW is expelled (OwnRowsFence.unaware)
    f.hear(PEER, 11)                                          # an older greeting does not lower it
    assert not f.can_clear(table, SELF, 12)
    assert OTHER in f.explain(table, SELF, 12)
    f.hear(OTHER, 3, [NEW])
    assert f.target() == 12
    assert not f.can_clear(table, SELF, 11)
    assert "up to lsn 12" in f.explain(table, SELF, 11)
    assert f.can_clear(table, SELF, 12)


def test_rows_past_an_expelled_members_bound_are_nothing_a_snapshot_must_cover():
    assert uncovered({NEW: 9, PEER: 3}, {NEW: 4, PEER: 3}, {NEW: 4}) == {}
    assert uncovered({NEW: 9}, {NEW: 3}, {NEW: 4}) == {NEW: (4, 3)}


def test_a_member_some_peer_says_is_expelled_is_not_waited_for():
    f = OwnRowsFence("lost")
    f.expelled.add(OTHER)
    f.hear(PEER, 0, [OTHER])
    assert f.can_clear(_table(), SELF, 0)


def test_a_member_heard_before_it_knew_of_an_expel_the_fence_relies_on_is_heard_again():
    """PEER spoke before it knew OTHER is expelled: it may take this node's rows from OTHER
    after its word, so the fence waits for a word of PEER's that knows (the explain says so)."""
    table = _table()
    f = OwnRowsFence("lost")
    f.expelled.add(OTHER)
    f.hear(PEER, 4)
    assert f.unaware(table, SELF) == {PEER: [OTHER]}
    assert f.waiting_for(table, SELF) == [PEER] and not f.can_clear(table, SELF, 4)
    assert "before knowing that" in f.explain(table, SELF, 4) and OTHER in f.explain(table, SELF, 4)
    f.hear(PEER, 4, [OTHER])
    assert f.unaware(table, SELF) == {} and f.can_clear(table, SELF, 4)


def test_an_expelled_member_whose_word_was_heard_or_given_up_needs_no_one_to_know():
    table = _table()
    f = OwnRowsFence("lost")
    f.expelled.add(OTHER)
    f.hear(OTHER, 2)                 # its word counts: this node waits for its rows instead
    f.hear(PEER, 4)
    assert f.unaware(table, SELF) == {} and f.disregarded(table, SELF) == set()
    g = OwnRowsFence("lost", given_up={OTHER})
    g.hear(PEER, 4)
    assert g.unaware(table, SELF) == {}


def test_a_fenced_core_refuses_any_row_under_its_own_id():
    core = _core(fenced=True)
    with pytest.raises(AssertionError, match="fenced"):
        core.local_txn([Op(OP_PUT, "kv", "k", 1)], GROUP_DEFAULT, WALL)
    with pytest.raises(AssertionError, match="fenced"):
        core.register_member(NEW, "d:1", WALL)
    t = core.local_txn([Op(OP_PUT, "loc", "k", 1)], GROUP_LOCAL, WALL)   # local rows never leave the node
    assert t.replica_id == 1 and core.claimed.get(0) == 1


def test_a_fenced_core_registers_nobody_from_a_greeting_and_maps_whom_it_knows():
    core = _core(fenced=True)
    rows = [m.to_row() for m in _table().members()] + [[NEW, 4, "d:1", STATE_MEMBER, 0, 0]]
    assert _greet(core, rows) == []
    assert NEW not in core.table
    assert core.peers[PEER].map.to_local == {1: 1, 2: 2, 3: 3}
    unfenced = _core()
    regs = _greet(unfenced, rows)
    assert [o.key for t in regs for o in t.ops] == [NEW]


def test_a_fenced_subscription_asks_only_for_this_nodes_own_rows():
    core = _core({1: 10, 2: 5, 3: 7}, fenced=True)
    _greet(core)
    v = core.subscribe_vclock(PEER, {SELF: 20, PEER: 9, OTHER: 4})
    assert v.to_dict() == {1: 10, 2: 9, 3: 7}        # own from where we are; others from where the peer is
    assert core.subscribe_vclock(PEER).to_dict() == {1: 10, 2: 5, 3: 7}
    core.fence = None
    assert core.subscribe_vclock(PEER, {SELF: 20, PEER: 9}).to_dict() == {1: 10, 2: 5, 3: 7}


def test_a_subscription_to_an_expelled_peer_asks_only_for_expelled_members_rows():
    """A fence waits for no expelled member, so a member's row that reached an expelled one alone
    may have been written again, differently, by that member since (seed 27742): from an expelled
    upstream only expelled members' rows are taken (its own up to the bound), every other
    component from where it is. Our own rows too: ours that only it holds may differ from ours."""
    table = ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER), Member(PEER, 2, "b:1", STATE_EXPELLED, 0, 9),
                          Member(OTHER, 3, "c:1", STATE_MEMBER), Member(NEW, 4, "d:1", STATE_EXPELLED, 0, 6)])
    core = NodeCore(SELF, table, VClock({1: 10, 2: 5, 3: 7, 4: 2}), spaces={"kv": False})
    core.greeting(PEER, [m.to_row() for m in table.members()], WALL)
    theirs = {SELF: 20, PEER: 9, OTHER: 12, NEW: 6}
    assert core.subscribe_vclock(PEER, theirs).to_dict() == {1: 20, 2: 5, 3: 12, 4: 2}
    assert core.subscribe_vclock(PEER, {SELF: 3, OTHER: 1}).to_dict() == {1: 10, 2: 5, 3: 7, 4: 2}
    assert core.subscribe_vclock(PEER).to_dict() == {1: 10, 2: 5, 3: 7, 4: 2}     # its vclock unknown
    core.fence = OwnRowsFence("a test loss")          # fenced: our own rows back, from anyone
    assert core.subscribe_vclock(PEER, theirs).to_dict() == {1: 10, 2: 9, 3: 12, 4: 6}
    # a member we hold none of, which the expelled peer's vclock lacks: asked from 0 (it has none)
    core = NodeCore(SELF, table, VClock({1: 10, 2: 5}), spaces={"kv": False})
    core.greeting(PEER, [m.to_row() for m in table.members()], WALL)
    assert core.subscribe_vclock(PEER, {SELF: 3}).to_dict() == {1: 10, 2: 5}


def test_a_fenced_subscription_asks_for_a_member_it_does_not_know_from_where_the_peer_is():
    """A fenced node registers nobody: rows of a member only the peer has could not be translated
    here and would stop the link before this node's own rows come back."""
    core = _core({1: 10, 2: 5, 3: 7}, fenced=True)
    rows = [m.to_row() for m in _table().members()] + [[NEW, 4, "d:1", STATE_MEMBER, 0, 0]]
    _greet(core, rows)
    assert NEW not in core.table
    v = core.subscribe_vclock(PEER, {SELF: 20, PEER: 9, OTHER: 4, NEW: 6}, rows)
    assert v.to_dict() == {1: 10, 2: 9, 3: 7, 4: 6}
    core.fence = None                                # unfenced, it registers NEW and asks for all of it
    assert 4 not in core.subscribe_vclock(PEER, {NEW: 6}, rows).to_dict()


def _cluster_row(origin_id: int, lsn: int, uuid: str, their_id: int, state: str = STATE_MEMBER,
                 address: str = "") -> Txn:
    v = {"id": their_id, "address": address, "state": state}
    if state == STATE_EXPELLED:
        v["expelled_lsn"] = 1
    return Txn(origin_id, lsn, GROUP_CLUSTER, WALL - 1000, (Op(OP_CLUSTER, CLUSTER_SPACE, uuid, v),))


def test_a_fenced_core_refuses_a_cluster_change_that_would_need_a_row_of_its_own_and_claims_nothing():
    core = _core(fenced=True)
    _greet(core)
    with pytest.raises(RemoteProtocolError, match="after the fence"):
        core.receive(PEER, _cluster_row(2, 6, NEW, 4), WALL)
    assert core.claimed.get(2) == 5 and NEW not in core.table
    with pytest.raises(RemoteProtocolError, match="after the fence"):
        core.receive(PEER, _cluster_row(2, 6, OTHER, 3, STATE_EXPELLED), WALL)
    assert OTHER in core.fence.expelled           # ... but it is no longer waited for
    assert core.receive(PEER, _cluster_row(2, 6, OTHER, 3), WALL)   # no change: followed as usual


def test_own_cluster_rows_of_an_earlier_incarnation_come_back_as_history_and_change_nothing():
    """After a rebuild this node's ids are its donor's; its own rows from before the loss state
    other ids (here it called PEER 3, and OTHER 2) and must not touch its table."""
    core = _core({1: 10, 2: 5, 3: 7}, fenced=True, rebuilt=True)
    _greet(core)
    old = Txn(1, 11, GROUP_CLUSTER, WALL - 1000, (
        Op(OP_CLUSTER, CLUSTER_SPACE, PEER, {"id": 3, "address": "", "state": STATE_MEMBER}),
        Op(OP_CLUSTER, CLUSTER_SPACE, OTHER, {"id": 2, "address": "", "state": STATE_MEMBER})))
    out = core.receive(PEER, old, WALL)
    assert out == [old] and core.claimed.get(1) == 12
    assert core.table.id_of(PEER) == 2 and core.table.id_of(OTHER) == 3

    class View:
        def __init__(self, table, history):
            self.table, self.vclock, self.own_history_lsn = table, VClock({1: 10}), history

        def space(self, name):
            return None

        def put(self, *a):
            raise AssertionError("no data rows here")

        def put_member(self, m):
            raise AssertionError("history changed the table")

        def put_knowledge(self, *a):
            raise AssertionError("history is not another origin's knowledge")

    apply_txn(View(core.table.copy(), limits.lsn_max), old, SELF)       # recovery while fenced
    core.fence = None
    core.own_history_lsn = 12
    apply_txn(View(core.table.copy(), 12), old, SELF)                   # recovery after the fence
    with pytest.raises(AssertionError, match="would change id|changed the table"):
        apply_txn(View(core.table.copy(), 0), old, SELF)                # without the bound it would


def test_clearing_a_rebuilt_fence_makes_own_rows_received_so_far_history_and_restates_the_table():
    core = _core({1: 10}, fenced=True, rebuilt=True)
    core.claimed.follow(1, 14)
    restate = core.clear_fence(WALL)
    assert core.fence is None and core.own_history_lsn == 14
    assert (restate.replica_id, restate.lsn, restate.group) == (1, 15, GROUP_CLUSTER)
    assert {o.key: o.value["id"] for o in restate.ops} == {SELF: 1, PEER: 2, OTHER: 3}
    t = core.local_txn([Op(OP_PUT, "kv", "k", 1)], GROUP_DEFAULT, WALL)
    assert t.lsn == restate.last_lsn + 1 == 18


def test_clearing_a_fence_over_the_nodes_own_store_changes_no_history_and_writes_nothing():
    core = _core({1: 10}, fenced=True)
    core.claimed.follow(1, 14)
    assert core.clear_fence(WALL) is None
    assert core.fence is None and core.own_history_lsn == 0


def test_a_fence_over_the_nodes_own_store_takes_its_own_cluster_rows_back_as_they_are():
    """A lost WAL tail (same store, same ids): the node's own registration coming back from a
    peer is its own statement, applied to its table, with no second own row."""
    core = _core({1: 10, 2: 5}, fenced=True)
    _greet(core)
    out = core.receive(PEER, _cluster_row(1, 11, NEW, 4), WALL)
    assert len(out) == 1 and core.table.id_of(NEW) == 4 and core.claimed.get(1) == 11


def test_a_peers_earlier_incarnation_rows_teach_neither_its_map_nor_the_knowledge():
    """PEER lost its store and joined again: its greeting says its own rows up to 6 are history;
    one of them (it called NEW 9 then) must not enter the map (the greeting's ids stand) nor be
    refused for contradicting it."""
    core = _core({1: 10, 2: 5})
    rows = [m.to_row() for m in _table().members()] + [[NEW, 4, "d:1", STATE_MEMBER, 0, 0]]
    core.greeting(PEER, rows, WALL, history_lsn=6)
    core.receive(PEER, _cluster_row(2, 6, NEW, 9), WALL)
    assert core.peers[PEER].map.to_local.get(9) is None and core.peers[PEER].map.to_local[4] == 4
    assert core.knowledge[(PEER, NEW)] == 4                              # as its greeting says
    with pytest.raises(RemoteProtocolError, match="said before"):        # past the history: it counts
        core.receive(PEER, _cluster_row(2, 7, NEW, 9), WALL)


def test_a_fenced_node_refuses_the_row_that_expels_it_and_claims_nothing():
    core = _core(fenced=True)
    _greet(core)
    with pytest.raises(RemoteProtocolError, match="after the fence"):
        core.receive(PEER, _cluster_row(2, 6, SELF, 1, STATE_EXPELLED), WALL)
    assert core.claimed.get(2) == 5


def test_a_cluster_row_of_our_own_coming_back_unfenced_writes_no_second_own_row():
    core = _core({1: 10, 2: 5})
    _greet(core)
    out = core.receive(PEER, _cluster_row(1, 11, NEW, 4), WALL)
    assert len(out) == 1 and core.table.id_of(NEW) == 4


def test_a_member_some_peer_says_is_expelled_is_not_waited_for_but_what_it_said_it_holds_still_counts():
    """An expelled member that still runs may still be followed and pass this node's rows on: its
    word keeps the fence until the rows come back, or the operator gives it up here."""
    core = _core({1: 5}, fenced=True)
    core.observe_peer(OTHER, {SELF: 12}, [])
    core.observe_peer(PEER, {SELF: 9}, [[OTHER, 3, "", STATE_EXPELLED, 0, 1]])
    assert core.fence.waiting_for(core.table, SELF) == [] and core.fence.target() == 12
    core.claimed.follow(1, 9)
    core.vclock.follow(1, 9)
    ok, why = core.fence_state()
    assert not ok and "up to lsn 12" in why
    core.fence.given_up.add(OTHER)
    assert core.fence_state()[0]


def test_observe_peer_hears_a_member_and_learns_from_its_table_whom_else_to_wait_for():
    core = _core({1: 5}, fenced=True)
    core.observe_peer(PEER, {SELF: 9}, [[OTHER, 3, "", STATE_EXPELLED, 0, 1], [NEW, 4, "", STATE_MEMBER, 0, 0]])
    assert core.fence.heard == {PEER: 9} and core.fence.expelled == {OTHER} and NEW in core.fence.known
    assert core.fence.waiting_for(core.table, SELF) == [NEW]      # unknown here, but PEER knows it
    core.observe_peer(NEW, {SELF: 99}, [])
    assert core.fence.target() == 99
    core.fence.given_up.add(NEW)                                  # the operator gave up on it: its word too
    ok, why = core.fence_state()
    assert not ok and "up to lsn 9" in why
    core.claimed.follow(1, 9)
    core.vclock.follow(1, 9)
    assert core.fence_state()[0]
    unfenced = _core()
    unfenced.observe_peer(PEER, {SELF: 9}, [])             # no fence: nothing to hear
    assert unfenced.fence is None


# --- durable ACKs and holds ------------------------------------------------------------------------
def test_acks_say_applied_and_on_disk_apart():
    core = _core({1: 10, 2: 5})
    _greet(core)
    core.commit_tops({2: 8})                               # written, not fsync'd
    assert core.ack_vclock(PEER).get(2) == 8 and core.ack_durable(PEER).get(2) == 5
    core.commit_tops({2: 9}, on_disk=True)                 # fsync mode
    assert core.ack_durable(PEER).get(2) == 9
    core.mark_synced(VClock({2: 9, 1: 10}))
    assert core.ack_durable(PEER).to_dict() == {1: 10, 2: 9}


def test_a_hold_only_moves_forward_and_keeps_what_a_later_ack_leaves_out():
    h = advance_hold(None, {1: 5, 2: 5}, 1.0, anon=False)
    h = advance_hold(h, {1: 3, 2: 9}, 2.0, anon=False)
    assert h.vclock == {1: 5, 2: 9} and h.seen_s == 2.0
    h = advance_hold(h, {2: 10}, 3.0, anon=False)
    assert h.vclock == {1: 5, 2: 10}


def test_members_hold_until_expelled_and_anonymous_replicas_within_their_ttl():
    table = _table(Member(NEW, 4, "", STATE_EXPELLED))
    holds = {PEER: Hold({1: 1}, 0.0, False), NEW: Hold({1: 2}, 0.0, False),
             OTHER: Hold({1: 3}, 50.0, True), "f" * 8 + "-0000-4000-8000-000000000006": Hold({1: 4}, 0.0, False)}
    got = hold_positions(holds, table, now_s=100.0, anon_ttl_s=60.0)
    assert got == [{1: 1}, {1: 3}, {1: 4}]                 # expelled NEW gone; an unknown uuid holds too
    assert hold_positions(holds, table, now_s=200.0, anon_ttl_s=60.0) == [{1: 1}, {1: 4}]


def test_cluster_op_of_an_expelled_member_carries_its_bound():
    m = Member(NEW, 4, "", STATE_EXPELLED, expelled_lsn=9)
    assert cluster_op(m).value["expelled_lsn"] == 9


@pytest.mark.parametrize("rebuilt,expected", [(True, limits.lsn_max), (False, 7)])
def test_a_fenced_store_reopens_with_its_own_history_bound_only_when_it_was_rebuilt_from_a_snapshot(
        tmp_path, rebuilt, expected):
    """A fence over the node's own store (a power loss, a restore) keeps its own `_cluster` rows
    above the bound as they are on every start: members it registered stay in its table."""
    from node.storage.store import Store
    s = Store(str(tmp_path / "s"))
    s.set_meta(own_history_lsn=7, own_fence={"reason": "a power loss", "rebuilt": rebuilt})
    s.close()
    s = Store(str(tmp_path / "s"))
    assert s.own_history_lsn == expected
    s.close()


def test_what_a_member_is_heard_to_know_is_capped_at_members_max(monkeypatch):
    """A peer with the secret that lists made-up expels grows the fence's memory no further."""
    monkeypatch.setattr("node.limits.members_max", 3)
    f = OwnRowsFence("lost")
    f.hear(PEER, 1, [f"{i:08x}-0000-4000-8000-000000000000" for i in range(5)])
    f.hear(PEER, 1, ["ffffffff-0000-4000-8000-000000000000"])
    assert len(f.knows[PEER]) == 3
