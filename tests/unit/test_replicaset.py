"""NodeCore's `_cluster` handling, id translation and acknowledgements, one rule per test, on
the real core with a table and a peer map where the peer's ids differ from this node's, so a
row translated wrongly or a map learned wrongly shows. The cases are the ones mutation testing
of the core found unguarded (issue 18): an expelled member learned first as live, a `_cluster`
transaction decided as plain data, a row of one origin changing another member's address."""
from __future__ import annotations

import pytest

from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.replicaset import NodeCore, relay_wants
from node.core.rows import CLUSTER_SPACE, GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_CLUSTER, OP_PUT, Op, Txn
from node.core.vclock import VClock
from node.errors import RemoteProtocolError

SELF, PEER, OTHER, GONE, THIRD = (f"{c * 8}-0000-4000-8000-00000000000{i}" for i, c in enumerate("abcde", 1))
WALL = 1_700_000_000_000_000


def _core(vclock: dict[int, int] | None = None) -> NodeCore:
    """SELF is 1, PEER 2, OTHER 3 here; the peer calls SELF 2, itself 1 and OTHER 5."""
    table = ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER), Member(PEER, 2, "b:1", STATE_MEMBER),
                          Member(OTHER, 3, "c:1", STATE_MEMBER)])
    core = NodeCore(SELF, table, VClock(vclock or {1: 4, 2: 5, 3: 7}), spaces={"kv": False, "loc": True})
    core.greeting(PEER, PEER_ROWS, WALL)
    return core


PEER_ROWS = [[PEER, 1, "b:1", STATE_MEMBER], [SELF, 2, "a:1", STATE_MEMBER], [OTHER, 5, "c:1", STATE_MEMBER]]


def put(rid: int, lsn: int, key: str = "k", ts: int = WALL) -> Txn:
    return Txn(rid, lsn, GROUP_DEFAULT, ts, (Op(OP_PUT, "kv", key, lsn),))


def cluster(rid: int, lsn: int, *members: tuple, ts: int = WALL) -> Txn:
    ops = []
    for uuid, their_id, *rest in members:
        v = {"id": their_id, "address": rest[0] if rest else "", "state": rest[1] if len(rest) > 1 else STATE_MEMBER}
        if len(rest) > 2:
            v["expelled_lsn"] = rest[2]
        ops.append(Op(OP_CLUSTER, CLUSTER_SPACE, uuid, v))
    return Txn(rid, lsn, GROUP_CLUSTER, ts, tuple(ops))


# --- learning a member that is already expelled ---------------------------------------------------
def _with_expelled(bound: int, held: int) -> NodeCore:
    """OTHER (id 3 here, 5 to the peer) expelled here at `bound`, with `held` of its rows."""
    core = _core({1: 4, 2: 5, 3: held})
    core.table.upsert(Member(OTHER, 3, "c:1", STATE_EXPELLED, 0, bound))
    return core


@pytest.mark.parametrize("held, stated, peer_itself, fenced, raised", [
    (7, None, False, False, 7),     # rows it holds past the bound (they came in a snapshot): raised to them
    (4, 9, False, False, 9),        # a greeting states a larger bound: taken
    (7, 9, False, False, 9),
    (4, 3, False, False, None),     # a smaller one: nothing
    (4, 9, True, False, None),      # the expelled member's own word about itself: not taken
    (7, 9, False, True, None),      # fenced: no row of its own, so nothing yet (the lift greets again)
])
def test_a_greeting_raises_an_expelled_members_bound_to_what_it_states_or_this_node_holds_and_says_so(
        held, stated, peer_itself, fenced, raised):
    """A bound that came in a snapshot was stated in no row of this node's, so a member that
    never rebuilds from it would keep a smaller one (full-mix seed 3372)."""
    core = _with_expelled(4, held)
    if fenced:
        from node.core.membership import OwnRowsFence
        core.fence = OwnRowsFence("a test loss")
    rows = list(PEER_ROWS)
    if stated is not None:
        rows[2] = [OTHER, 5, "c:1", STATE_EXPELLED, 0, stated]
    epoch = core.expel_epoch
    own = core.greeting(OTHER if peer_itself else PEER, rows, WALL)
    if raised is None:
        assert own == [] and core.table.get(OTHER).expelled_lsn == 4 and core.expel_epoch == epoch
        return
    [txn] = own
    [op] = txn.ops
    assert (op.key, op.value["state"], op.value["expelled_lsn"]) == (OTHER, STATE_EXPELLED, raised)
    assert core.table.get(OTHER).expelled_lsn == raised and core.expel_epoch == epoch + 1


@pytest.mark.parametrize("row", [
    [OTHER, 5, "c:1", STATE_EXPELLED],            # an expelled row that states no bound: 0
    [OTHER, 5, "c:1", STATE_EXPELLED, 0],
    [OTHER, 5, "c:1", STATE_MEMBER, 0, 9],        # a member's row: its bound field means nothing
])
def test_a_greeting_row_that_states_no_bound_raises_none(row):
    core = _with_expelled(4, 4)
    rows = list(PEER_ROWS)
    rows[2] = row
    assert core.greeting(PEER, rows, WALL) == [] and core.table.get(OTHER).expelled_lsn == 4


def test_a_greeting_raises_no_bound_of_this_node_itself():
    """A node that learned it was expelled holds all its own rows: its bound is the members'."""
    core = _core({1: 9, 2: 5, 3: 7})
    core.table.upsert(Member(SELF, 1, "a:1", STATE_EXPELLED, 0, 4))
    rows = list(PEER_ROWS)
    rows[1] = [SELF, 2, "a:1", STATE_EXPELLED, 0, 6]
    assert core.greeting(PEER, rows, WALL) == [] and core.table.get(SELF).expelled_lsn == 4


def test_an_expelled_peer_first_seen_in_its_own_greeting_is_stored_expelled_without_its_word_on_its_bound():
    """Full-mix seed 24624: a node that first heard of an expelled member in that member's own
    greeting took its bound for itself from it (3: rows no member took) and every member ended
    with it; the members' rows and greetings raise the bound to theirs."""
    table = ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER), Member(PEER, 2, "b:1", STATE_MEMBER)])
    core = NodeCore(SELF, table, VClock({1: 4, 2: 5}), spaces={"kv": False})
    rows = [[GONE, 1, "g:1", STATE_EXPELLED, 3, 3], [SELF, 2, "a:1", STATE_MEMBER], [PEER, 3, "b:1", STATE_MEMBER]]
    [own] = core.greeting(GONE, rows, WALL)
    gone = core.table.get(GONE)
    assert (gone.state, gone.expelled_lsn) == (STATE_EXPELLED, 0)
    [op] = own.ops
    assert (op.key, op.value["expelled_lsn"]) == (GONE, 0)
    core.greeting(PEER, PEER_ROWS + [[GONE, 7, "g:1", STATE_EXPELLED, 3, 2]], WALL)   # a member's word: taken
    assert core.table.get(GONE).expelled_lsn == 2


def test_a_member_first_seen_expelled_in_a_greeting_is_stored_expelled_with_its_bound():
    core = _core()
    rows = PEER_ROWS + [[GONE, 7, "g:1", STATE_EXPELLED, 3, 6]]
    [own] = core.greeting(PEER, rows, WALL)
    gone = core.table.get(GONE)
    assert (gone.state, gone.expelled_lsn) == (STATE_EXPELLED, 6)
    # our own _cluster row for it says so too, so our downstreams learn the bound
    [op] = own.ops
    assert op.value["state"] == STATE_EXPELLED and op.value["expelled_lsn"] == 6
    # its rows up to the bound come through the peer; the one past it is refused
    accepted = core.receive(PEER, put(7, 1), WALL) + core.receive(PEER, Txn(7, 2, GROUP_DEFAULT, WALL, (
        Op(OP_PUT, "kv", "a", 1),) * 5), WALL)
    assert [t.last_lsn for t in accepted] == [1, 6]
    assert core.receive(PEER, put(7, 7), WALL) == []
    assert core.claimed.get(gone.id) == 6 and core.peers[PEER].stats.expelled == 1


def test_a_member_first_seen_expelled_in_a_peers_cluster_row_is_stored_expelled_with_its_bound():
    core = _core()
    got = core.receive(PEER, cluster(1, 6, (GONE, 7, "g:1", STATE_EXPELLED, 4)), WALL)
    assert len(got) == 2 and got[0].replica_id == 2        # the peer's row, in our id for the peer
    gone = core.table.get(GONE)
    assert (gone.state, gone.expelled_lsn) == (STATE_EXPELLED, 4)
    assert got[1].ops[0].value == {"id": gone.id, "address": "g:1", "state": STATE_EXPELLED, "expelled_lsn": 4}
    assert core.receive(PEER, Txn(7, 1, GROUP_DEFAULT, WALL, (Op(OP_PUT, "kv", "x", 1),) * 4), WALL)
    assert core.receive(PEER, put(7, 5), WALL) == []


# --- runs of plain transactions stop at a _cluster one -----------------------------------------------
def test_a_run_of_plain_txns_stops_at_a_cluster_txn_of_the_same_origin_and_claims_nothing_of_it():
    core = _core()
    raws = [put(1, 6), cluster(1, 7, (THIRD, 9, "t:1")), put(1, 8)]
    out: list[Txn] = []
    end, rows = core.receive_run(PEER, raws, 0, out, WALL)
    assert (end, rows) == (1, 1) and [t.lsn for t in out] == [6]
    assert core.claimed.get(2) == 6 and THIRD not in core.table
    # the _cluster txn is then decided as one: the member is registered, our row follows it
    got = core.receive(PEER, raws[1], WALL)
    assert [t.group for t in got] == [GROUP_CLUSTER, GROUP_CLUSTER] and THIRD in core.table
    assert core.receive(PEER, put(9, 1), WALL)[0].replica_id == core.table.id_of(THIRD)


def test_a_run_stops_at_another_origins_txn_and_translates_the_ids_of_what_it_took():
    core = _core()
    out: list[Txn] = []
    end, rows = core.receive_run(PEER, [put(5, 8), put(5, 9), put(1, 6)], 0, out, WALL)
    assert (end, rows) == (2, 2)
    assert [(t.replica_id, t.lsn) for t in out] == [(3, 8), (3, 9)]


def test_a_local_spaces_row_from_a_peer_is_refused():
    core = _core()
    with pytest.raises(RemoteProtocolError, match="local space"):
        core.receive(PEER, Txn(1, 6, GROUP_LOCAL, WALL, (Op(OP_PUT, "loc", "k", 1),)), WALL)
    assert core.claimed.get(2) == 5


# --- whose row says what -----------------------------------------------------------------------
def test_only_a_members_own_row_changes_its_address_here():
    core = _core()
    # the peer (origin 2 here) says OTHER moved: not its to say
    got = core.receive(PEER, cluster(1, 6, (OTHER, 5, "elsewhere:1")), WALL)
    assert [t.group for t in got] == [GROUP_CLUSTER] and core.table.get(OTHER).address == "c:1"
    # OTHER's own row, relayed by the peer, moves it, and this node writes its own row for that
    got = core.receive(PEER, cluster(5, 8, (OTHER, 3, "moved:1")), WALL)
    assert core.table.get(OTHER).address == "moved:1"
    assert len(got) == 2 and got[1].ops[0].value["address"] == "moved:1" and got[1].replica_id == 1


def test_another_members_row_about_this_node_changes_nothing_but_an_expel():
    core = _core()
    got = core.receive(PEER, cluster(1, 6, (SELF, 2, "wrong:1")), WALL)
    assert len(got) == 1 and core.table.get(SELF).address == "a:1"
    got = core.receive(PEER, cluster(1, 7, (SELF, 2, "", STATE_EXPELLED, 4)), WALL)
    assert core.table.get(SELF).state == STATE_EXPELLED and len(got) == 2


# --- how the peer's ids are learned ----------------------------------------------------------------
# Four roads, each needed: the greeting (the whole map before SUBSCRIBE); the peer's own `_cluster`
# row (a member it registers while the link is up); the same row arriving second, as a duplicate,
# after a third node relayed it first; and what any road taught of the peer's ids ("knowledge"),
# for a member the greeting predates and whose row the peer never sends on this link. What the map
# holds shows in what this node acknowledges to the peer, in the peer's ids, and in which of the
# peer's rows it can translate.
def _ack_of(core: NodeCore, uuid: str, lsn: int) -> dict[int, int]:
    """Commit `lsn` rows of `uuid` here; return the ack to PEER (in the peer's ids)."""
    core.commit_tops({core.table.id_of(uuid): lsn})
    return core.ack_vclock(PEER).to_dict()


def test_a_cluster_row_from_the_peer_teaches_its_ids_and_one_relayed_from_another_origin_does_not():
    core = _core()
    core.receive(PEER, cluster(5, 8, (THIRD, 4, "t:1")), WALL)         # OTHER's row: OTHER's id 4
    third = core.table.id_of(THIRD)
    with pytest.raises(RemoteProtocolError, match="unknown"):
        core.receive(PEER, put(4, 1), WALL)                             # not the peer's id for it
    assert 4 not in _ack_of(core, THIRD, 0) and core.ack_vclock(PEER).to_dict() == {1: 5, 2: 4, 5: 7}
    core.receive(PEER, cluster(1, 6, (THIRD, 6, "t:1")), WALL)         # the peer's own: its id 6
    assert _ack_of(core, THIRD, 0).get(6) is None                       # nothing of THIRD yet
    got = core.receive(PEER, put(6, 1), WALL)
    assert got[0].replica_id == third
    assert _ack_of(core, THIRD, 1)[6] == 1


def test_a_cluster_row_that_gives_a_peer_id_a_second_meaning_is_refused_and_claims_nothing():
    core = _core()
    with pytest.raises(RemoteProtocolError, match="said before"):
        core.receive(PEER, cluster(1, 6, (THIRD, 5, "t:1")), WALL)     # 5 is OTHER on the peer
    with pytest.raises(RemoteProtocolError, match="two meanings"):
        core.receive(PEER, cluster(1, 6, (THIRD, 8, "t:1"), (GONE, 8, "g:1")), WALL)
    with pytest.raises(RemoteProtocolError, match="said before"):
        core.receive(PEER, cluster(1, 6, (OTHER, 7, "c:1")), WALL)     # OTHER is the peer's 5
    assert core.claimed.get(2) == 5 and THIRD not in core.table


def test_rows_got_elsewhere_are_acknowledged_to_the_peer_as_soon_as_its_row_names_their_origin():
    """THIRD's rows came through OTHER; once the peer's own row says THIRD is its 6, the ack to
    the peer covers them at once (else its relay would send them again and hold its WAL for
    them), and the peer can no longer call THIRD anything else."""
    core = _core()
    core.receive(PEER, cluster(5, 8, (THIRD, 4, "t:1")), WALL)         # OTHER's row, relayed
    core.commit_tops({core.table.id_of(THIRD): 3})                      # 3 of THIRD's rows, via OTHER
    assert core.ack_vclock(PEER).to_dict() == {1: 5, 2: 4, 5: 7}
    core.receive(PEER, cluster(1, 6, (THIRD, 6, "t:1")), WALL)
    assert core.ack_vclock(PEER).to_dict() == {1: 5, 2: 4, 5: 7, 6: 3}
    with pytest.raises(RemoteProtocolError, match="said before"):
        core.receive(PEER, cluster(1, 7, (THIRD, 8, "t:1")), WALL)


def test_the_peers_own_cluster_row_arriving_second_still_teaches_the_peers_ids():
    """The peer's `_cluster` row came first through OTHER (applied then, but no map entry for the
    peer): when the peer sends it too it is a duplicate, and its ids are learned from it, so what
    this node acknowledges to the peer covers the new member at once."""
    core = _core()
    core.greeting(OTHER, [[OTHER, 1, "c:1", STATE_MEMBER], [SELF, 3, "a:1", STATE_MEMBER],
                          [PEER, 2, "b:1", STATE_MEMBER]], WALL)
    core.receive(OTHER, cluster(2, 6, (THIRD, 6, "t:1")), WALL)      # the peer's row, via OTHER
    assert core.receive(PEER, cluster(1, 6, (THIRD, 6, "t:1")), WALL) == []
    assert _ack_of(core, THIRD, 3).get(6) == 3


def test_a_member_the_greeting_predates_is_translated_from_what_the_peer_said_through_another_node():
    """The peer registered THIRD after its greeting left; its row reached this node through OTHER
    before SUBSCRIBE, so the peer never sends it on this link. THIRD's rows from the peer are
    still translated: from what the peer's row said, however it came."""
    core = _core()
    core.greeting(OTHER, [[OTHER, 1, "c:1", STATE_MEMBER], [SELF, 3, "a:1", STATE_MEMBER],
                          [PEER, 2, "b:1", STATE_MEMBER]], WALL)
    core.receive(OTHER, cluster(2, 6, (THIRD, 6, "t:1")), WALL)
    third = core.table.id_of(THIRD)
    got = core.receive(PEER, put(6, 1), WALL)
    assert [(t.replica_id, t.lsn) for t in got] == [(third, 1)]
    assert _ack_of(core, THIRD, 1).get(6) == 1
    with pytest.raises(RemoteProtocolError, match="unknown"):
        core.receive(PEER, put(7, 1), WALL)                             # what nobody said stays unknown


def test_the_peers_row_about_this_node_teaches_this_nodes_id_on_the_peer():
    """A peer that greeted before it knew this node later writes its row for it: from then on
    this node's own rows are acknowledged, and subscribed for, under the peer's id for it."""
    table = ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER), Member(PEER, 2, "b:1", STATE_MEMBER)])
    core = NodeCore(SELF, table, VClock({1: 4, 2: 5}), spaces={"kv": False})
    core.greeting(PEER, [[PEER, 1, "b:1", STATE_MEMBER]], WALL)
    assert core.ack_vclock(PEER).to_dict() == {1: 5}
    got = core.receive(PEER, cluster(1, 6, (SELF, 9, "a:1")), WALL)
    assert len(got) == 1 and core.table.get(SELF).address == "a:1"
    assert core.ack_vclock(PEER).to_dict() == {1: 5, 9: 4}
    assert core.subscribe_vclock(PEER).to_dict() == {1: 6, 9: 4}


# --- acknowledgements ----------------------------------------------------------------------------
def test_acks_say_applied_and_durable_never_merely_claimed():
    core = _core({1: 4, 2: 5, 3: 7})
    core.receive(PEER, put(1, 6), WALL)
    core.receive(PEER, put(1, 7), WALL)                 # claimed 7, nothing written yet
    assert core.claimed.get(2) == 7
    assert core.ack_vclock(PEER).get(1) == 5 and core.ack_durable(PEER).get(1) == 5
    core.commit([put(2, 6)])                            # 6 written, not synced
    assert core.ack_vclock(PEER).get(1) == 6 and core.ack_durable(PEER).get(1) == 5
    core.mark_synced(VClock({2: 6}))
    assert core.ack_durable(PEER).get(1) == 6
    core.mark_synced(VClock({2: 4}))                    # an older sync report moves nothing back
    assert core.ack_durable(PEER).get(1) == 6
    # in the peer's ids, with components it does not know left out
    assert core.ack_vclock(PEER).to_dict() == {1: 6, 2: 4, 5: 7}


def test_commit_of_local_rows_moves_component_zero_and_not_this_nodes_id():
    core = _core()
    t = core.local_txn([Op(OP_PUT, "loc", "k", 1)], GROUP_LOCAL, WALL)
    assert (t.replica_id, t.lsn) == (1, 1)
    core.commit([t])
    assert core.vclock.get(0) == 1 and core.vclock.get(1) == 4


# --- the relay filter ----------------------------------------------------------------------------
def test_a_relay_sends_what_the_subscriber_lacks_never_local_rows_and_its_own_rows_only_up_to_the_cut():
    sub = {1: 5, 2: 3}
    assert relay_wants([1, 6, GROUP_DEFAULT, 0, [[1, "kv", "k", 1]]], sub)
    assert not relay_wants([1, 5, GROUP_DEFAULT, 0, [[1, "kv", "k", 1]]], sub)
    assert relay_wants([1, 5, GROUP_DEFAULT, 0, [[1, "kv", "k", 1]] * 2], sub)    # ends at 6
    assert relay_wants([4, 1, GROUP_CLUSTER, 0, [[4, "_cluster", "u", {}]]], sub)
    assert not relay_wants([1, 9, GROUP_LOCAL, 0, [[1, "loc", "k", 1]]], sub)
    assert relay_wants([2, 4, GROUP_DEFAULT, 0, [[1, "kv", "k", 1]]], sub, own=(2, 4))
    assert not relay_wants([2, 5, GROUP_DEFAULT, 0, [[1, "kv", "k", 1]]], sub, own=(2, 4))
    assert relay_wants([1, 9, GROUP_DEFAULT, 0, [[1, "kv", "k", 1]]], sub, own=(2, 4))
