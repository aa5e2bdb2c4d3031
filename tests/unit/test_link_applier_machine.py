"""The applier machine (node/core/link/applier.py) driven directly, with a real NodeCore and
no IO: every state transition, the illegal ones asserting, what each Ready holds and in which
part, and an upstream that lies (wrong vclock, unknown ids, rows out of order, another uuid)."""
from __future__ import annotations

import pytest

from node import limits
from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core import codec, rowscan
from node.core import messages as m
from node.core.link.applier import (ApplierMachine, ApplierState, DisproveClaim, Followed, Resubscribe)
from node.core.link.ready import Send, Stop
from node.core.membership import OwnRowsFence
from node.core.replicaset import NodeCore, cluster_op
from node.core.entry import PackedEntry
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, OP_PUT, Op, Txn
from node.core.vclock import VClock
from node.errors import PeerNotReady, PeerRefused, RemoteProtocolError

SELF = "00000000-0000-4000-8000-000000000001"
UP = "00000000-0000-4000-8000-000000000002"
OTHER = "00000000-0000-4000-8000-000000000003"
NOW = 1_700_000_000.0                      # s
WALL_US = int(NOW * 1e6)


class Host:
    """The node around the machine: records what it was asked."""

    def __init__(self) -> None:
        self.refusal: Exception | None = None
        self.claims: list[str] = []
        self.pending = 0
        self.own: dict[str, int] = {}
        self.without: list[str] = []

    def check_peer_greeting(self, theirs: dict) -> None:
        if self.refusal is not None:
            raise self.refusal

    def claim_link(self, peer_uuid: str) -> None:
        self.claims.append(peer_uuid)

    def journal_pending(self) -> int:
        return self.pending

    def own_claim(self, peer_uuid: str) -> int:
        return self.own.get(peer_uuid, 0)

    def going_without(self) -> list[str]:
        return list(self.without)


def greeting(uuid: str, cluster: list[list] | None = None, **kw) -> dict:
    d = {"uuid": uuid, "cluster_uuid": "c-1", "cluster_name": "t", "options_digest": "d", "options": {},
         "anon": False, "address": f"{uuid[-1]}.example:1", "own_history_lsn": 0, "vclock_uuid": {},
         "cluster": cluster if cluster is not None else []}
    d.update(kw)
    return d


# The upstream's ids: UP 1, SELF 2, OTHER 3 (ours: SELF 1, UP 2; OTHER unknown here).
UP_ROWS = [[UP, 1, "2.example:1", STATE_MEMBER, 1], [SELF, 2, "1.example:1", STATE_MEMBER, 2],
           [OTHER, 3, "3.example:1", STATE_MEMBER, 3]]


def new_core(**kw) -> NodeCore:
    table = ClusterTable([Member(SELF, 1, "1.example:1", STATE_MEMBER), Member(UP, 2, "2.example:1", STATE_MEMBER)])
    return NodeCore(SELF, table, VClock(kw.pop("vclock", {2: 5})), spaces={"kv": False}, **kw)


def machine(core: NodeCore | None = None, host: Host | None = None) -> ApplierMachine:
    return ApplierMachine(core or new_core(), host or Host(), "2.example:1", authenticated=UP)


def greeted(mach: ApplierMachine, **kw) -> ApplierMachine:
    mach.start(greeting(SELF))
    mach.advance(mach.ready())
    mach.step(m.Message(m.GREETING, greeting(UP, UP_ROWS, **kw)), NOW)
    mach.advance(mach.ready())
    return mach


def following(mach: ApplierMachine | None = None, **kw) -> ApplierMachine:
    mach = greeted(mach or machine(), **kw)
    mach.step(m.Message(m.SUBSCRIBED, {"vclock": {}}), NOW)
    mach.advance(mach.ready())
    return mach


def rows(*txns: Txn) -> m.Message:
    return m.Message(m.ROWS, {"txns": list(txns), "error": None})


def put(rid: int, lsn: int, n: int = 1, group: int = GROUP_DEFAULT) -> Txn:
    return Txn(rid, lsn, group, WALL_US, tuple(Op(OP_PUT, "kv", f"k{lsn}.{i}", i) for i in range(n)))



def _persisted(rd) -> list:
    """Each entry a Ready hands over to persist: its txns and its row count."""
    return [(p.entry.txns, p.rows) for p in rd.persist]

def test_a_link_greets_registers_subscribes_and_follows_in_that_order():
    core, host = new_core(), Host()
    mach = machine(core, host)
    assert mach.state is ApplierState.NEW
    mach.start(greeting(SELF))
    rd = mach.ready()
    assert mach.state is ApplierState.GREETING
    assert rd.send == (Send(m.GREETING, greeting(SELF)),) and not rd.persist
    mach.advance(rd)

    mach.step(m.Message(m.GREETING, greeting(UP, UP_ROWS)), NOW)
    rd = mach.ready()
    assert mach.state is ApplierState.SUBSCRIBING and host.claims == [UP]
    # the member the upstream knows and we did not is registered in persist, SUBSCRIBE in send:
    # the driver persists it before the upstream hears a vclock in ids that depend on it
    assert len(rd.persist) == 1 and rd.persist[0].entry.txns[0].group == GROUP_CLUSTER
    assert rd.persist[0].entry.txns[0].ops[0].key == OTHER and core.table.get(OTHER) is not None
    (sub,) = rd.send
    # in the upstream's ids: its rows (our 2) and ours (its 2), counting the registration just claimed
    assert sub.mtype == m.SUBSCRIBE and sub.body["vclock"] == {1: 5, 2: 1} and sub.body["own_rows"] is False
    mach.advance(rd)

    mach.step(m.Message(m.SUBSCRIBED, {"vclock": {1: 7}}), NOW)
    rd = mach.ready()
    assert mach.state is ApplierState.FOLLOW
    assert rd.apply == (Followed(UP, {1: 5, 2: 1}, False),) and not rd.send and not rd.persist
    mach.advance(rd)

    mach.step(rows(put(1, 6, 2), put(1, 8)), NOW + 1)
    rd = mach.ready()
    assert _persisted(rd) == [([put(1, 6, 2).with_replica_id(2), put(1, 8).with_replica_id(2)], 3)]
    assert core.claimed.get(2) == 8 and mach.rows == 3 and mach.lag_s == pytest.approx(1.0)
    (ack,) = rd.send
    assert ack.mtype == m.ACK and ack.body["vclock"] == {1: 5}   # applied is what the journal committed
    mach.advance(rd)
    mach.stop()
    assert mach.state is ApplierState.STOPPED


def test_rows_claimed_before_a_refused_row_are_persisted_in_the_same_ready_that_stops_the_link():
    mach = following()
    mach.step(rows(put(1, 6), put(1, 7), put(1, 7, 2)), NOW)     # the third (7..8) overlaps the claimed 7
    rd = mach.ready()
    assert _persisted(rd) == [([put(1, 6).with_replica_id(2), put(1, 7).with_replica_id(2)], 2)]
    assert isinstance(rd.stop.error, RemoteProtocolError) and "overlaps" in str(rd.stop.error)
    assert mach.state is ApplierState.STOPPED and not rd.send


def test_a_bad_txn_after_good_ones_in_one_message_stops_after_the_good_ones_are_claimed():
    mach = following()
    bad = RemoteProtocolError("malformed row")
    mach.step(m.Message(m.ROWS, {"txns": [put(1, 6)], "error": bad}), NOW)
    rd = mach.ready()
    assert _persisted(rd) == [([put(1, 6).with_replica_id(2)], 1)] and rd.stop.error is bad


def test_the_machine_takes_no_message_while_rows_it_claimed_are_not_handed_over():
    mach = following()
    mach.step(rows(put(1, 6)), NOW)
    with pytest.raises(AssertionError, match="claimed rows not handed over"):
        mach.step(rows(put(1, 7)), NOW)
    rd = mach.ready()
    with pytest.raises(AssertionError, match="not advanced"):
        mach.step(rows(put(1, 7)), NOW)
    mach.advance(rd)
    mach.step(rows(put(1, 7)), NOW)
    assert mach.ready().persist[0].entry.txns[0].lsn == 7


def test_a_ready_is_handed_out_once_and_advanced_once():
    mach = following()
    mach.step(rows(put(1, 6)), NOW)
    rd = mach.ready()
    with pytest.raises(AssertionError, match="still being persisted"):
        mach.ready()                         # not while claimed rows are being persisted
    mach.advance(rd)
    assert not mach.ready()                  # taken: nothing pending
    with pytest.raises(AssertionError, match="did not hand out, or twice"):
        mach.advance(rd)


@pytest.mark.parametrize("state", ["new", "stopped"])
def test_a_message_in_a_state_that_takes_none_asserts(state):
    mach = machine()
    if state == "stopped":
        mach.start(greeting(SELF))
        mach.advance(mach.ready())
        mach.stop()
    with pytest.raises(AssertionError, match="step\\(\\) in state"):
        mach.step(m.Message(m.GREETING, greeting(UP, UP_ROWS)), NOW)


def test_starting_twice_or_after_the_end_asserts():
    mach = machine()
    mach.start(greeting(SELF))
    with pytest.raises(AssertionError, match="GREETING -> GREETING"):
        mach.start(greeting(SELF))
    mach.stop()
    with pytest.raises(AssertionError, match="STOPPED -> GREETING"):
        mach.start(greeting(SELF))


@pytest.mark.parametrize("state, wrong", [("greeting", m.SUBSCRIBED), ("subscribing", m.ROWS),
                                          ("follow", m.GREETING), ("follow", m.SUBSCRIBED)])
def test_a_message_out_of_the_protocols_order_ends_the_link_as_the_peers_fault(state, wrong):
    mach = machine()
    if state == "greeting":
        mach.start(greeting(SELF))
        mach.advance(mach.ready())
    elif state == "subscribing":
        greeted(mach)
    else:
        following(mach)
    mach.step(m.Message(wrong, {"txns": [], "error": None, "vclock": {}}), NOW)
    rd = mach.ready()
    assert isinstance(rd.stop.error, RemoteProtocolError) and mach.state is ApplierState.STOPPED


def test_a_greeting_under_another_uuid_than_the_handshake_proved_ends_the_link():
    mach = machine()
    mach.start(greeting(SELF))
    mach.advance(mach.ready())
    mach.step(m.Message(m.GREETING, greeting(OTHER, UP_ROWS)), NOW)
    rd = mach.ready()
    assert isinstance(rd.stop.error, RemoteProtocolError) and "its handshake" in str(rd.stop.error)
    assert not rd.persist and not rd.send and mach.core.table.get(OTHER) is None


def test_the_nodes_own_refusal_of_a_greeting_ends_the_link_before_anything_is_registered():
    host = Host()
    host.refusal = PeerRefused("lease", "its lease is stale")
    mach = machine(host=host)
    greeted(mach)
    assert mach.state is ApplierState.STOPPED and mach.core.table.get(OTHER) is None and not host.claims


def test_a_second_link_to_a_member_already_followed_is_refused_by_the_claim():
    host = Host()

    def duplicate(uuid):
        raise PeerRefused("duplicate", "already followed")
    host.claim_link = duplicate
    mach = machine(host=host)
    mach.start(greeting(SELF))
    mach.advance(mach.ready())
    mach.step(m.Message(m.GREETING, greeting(UP, UP_ROWS)), NOW)
    rd = mach.ready()
    assert rd.stop.error.code == "duplicate" and not rd.persist and not rd.send


def test_an_upstream_that_has_joined_no_cluster_is_not_subscribed_to():
    mach = machine()
    mach.start(greeting(SELF))
    mach.advance(mach.ready())
    mach.step(m.Message(m.GREETING, greeting(UP, UP_ROWS, cluster_uuid=None)), NOW)
    rd = mach.ready()
    assert mach.state is ApplierState.STOPPED and not rd.send and not rd.persist
    assert type(rd.stop.error) is PeerNotReady, "it passes: said quietly, retried as a broken link"


def test_rows_under_an_id_the_upstreams_greeting_did_not_map_end_the_link():
    mach = following()
    mach.step(rows(put(9, 1)), NOW)          # the upstream's id 9 is nobody it told us of
    rd = mach.ready()
    assert isinstance(rd.stop.error, RemoteProtocolError) and not rd.persist


def test_rows_past_a_gap_are_not_claimed_and_the_link_stays():
    mach = following()
    mach.step(rows(put(1, 9)), NOW)          # 6..8 missing
    rd = mach.ready()
    assert not rd.persist and rd.stop is None and mach.core.claimed.get(2) == 5
    assert mach.core.peers[UP].stats.gaps == 1


def test_rows_already_held_are_skipped_without_a_claim():
    mach = following()
    mach.step(rows(put(1, 4), put(1, 5)), NOW)
    rd = mach.ready()
    assert not rd.persist and rd.stop is None and mach.state is ApplierState.FOLLOW


def test_a_greeting_that_claims_more_of_our_rows_than_the_upstream_sends_is_disproved_at_its_heartbeat():
    host = Host()
    host.own[UP] = 40                        # its greeting said it holds our rows up to 40
    mach = following(machine(new_core(vclock={1: 3, 2: 5}), host))
    host.pending = 1                         # our journal still busy: no verdict yet
    mach.step(m.Message(m.HEARTBEAT, {"now_us": WALL_US}), NOW)
    assert not mach.ready().apply
    host.pending = 0
    mach.step(m.Message(m.HEARTBEAT, {"now_us": WALL_US}), NOW + 1)
    rd = mach.ready()
    assert rd.apply == (DisproveClaim(UP, 4),)   # 3, and the registration of OTHER from its greeting
    mach.advance(rd)
    mach.step(m.Message(m.HEARTBEAT, {"now_us": WALL_US}), NOW + 2)
    assert not mach.ready().apply            # said once per link


def test_a_heartbeat_from_an_upstream_that_holds_what_it_claimed_disproves_nothing():
    host = Host()
    host.own[UP] = 3
    mach = following(machine(new_core(vclock={1: 3, 2: 5}), host))
    mach.step(m.Message(m.HEARTBEAT, {"now_us": WALL_US - 2_000_000}), NOW)
    rd = mach.ready()
    assert not rd.apply and mach.lag_s == pytest.approx(2.0)


def test_the_rejoin_answer_says_what_the_upstream_collected_and_what_a_snapshot_from_it_would_lose():
    mach = greeted(machine(new_core(vclock={1: 9, 2: 5})), vclock_uuid={UP: 5, SELF: 4})
    e = PeerRefused("need_rejoin", "rows collected")
    e.body = {"gc_vclock_uuid": {UP: 3}}
    mach.step(e, NOW)
    rd = mach.ready()
    assert rd.stop.error is e and e.needed == {UP: 3}
    assert "this node holds rows it lacks" in e.message      # our 9 rows of our own against its 4
    assert mach.state is ApplierState.STOPPED


def test_a_refusal_while_following_ends_the_link_with_it():
    mach = following()
    e = PeerRefused("expelled", "gone")
    mach.step(e, NOW)
    assert mach.ready().stop.error is e


def test_an_upstream_that_refuses_this_node_as_expelled_is_noted_by_the_core_and_no_other_refusal_is():
    mach = machine()
    mach.start(greeting(SELF))
    mach.advance(mach.ready())
    mach.step(PeerRefused("duplicate", "already followed"), NOW)
    assert mach.core.expelled_by == {}
    mach = machine(mach.core)
    mach.start(greeting(SELF))
    mach.advance(mach.ready())
    e = PeerRefused("expelled", f"{SELF} was expelled from this cluster")
    mach.step(e, NOW)
    assert mach.ready().stop.error is e
    assert mach.core.expelled_by == {"2.example:1": f"{SELF} was expelled from this cluster"}


def test_a_node_is_out_of_the_cluster_by_its_own_expel_row_or_a_members_refusal():
    core = new_core()
    assert core.expelled_reason() is None
    core.told_expelled("2.example:1", "gone")
    core.told_expelled("2.example:1", "said again")
    assert core.expelled_reason() == "2.example:1 refused it as expelled (gone)"
    core = new_core()
    core.table.upsert(Member(SELF, 1, "1.example:1", STATE_EXPELLED, 0, 3))
    assert core.expelled_reason() == "its _cluster says it was expelled"


def test_the_addresses_that_said_this_node_is_expelled_are_bounded(monkeypatch):
    core = new_core()
    monkeypatch.setattr(limits, "members_max", 2)
    for address in ("a:1", "b:1", "c:1", "a:1"):
        core.told_expelled(address, "expelled")
    assert sorted(core.expelled_by) == ["a:1", "b:1"]


def test_an_expelled_members_bound_growing_asks_for_a_fresh_subscribe():
    mach = following()
    mach.core.expel_epoch += 1
    mach.tick(NOW + 1)
    rd = mach.ready()
    assert isinstance(rd.stop.error, Resubscribe) and mach.state is ApplierState.STOPPED


def test_a_bound_grown_between_our_greeting_and_our_subscribe_asks_for_a_fresh_link():
    """The relay serves by the bounds our greeting stated (it wants no row of an expelled member
    past them): a bound grown after the greeting went is not in it, whatever the SUBSCRIBE says
    (full-mix seed 832: a relay served a member that stated bound 0, and it never got the rows up
    to the bound it took a moment later, which that relay had collected)."""
    mach = machine()
    mach.start(greeting(SELF))
    mach.advance(mach.ready())
    mach.core.expel_epoch += 1                       # a bound grew: our greeting is already on its way
    mach.step(m.Message(m.GREETING, greeting(UP, UP_ROWS)), NOW)
    mach.advance(mach.ready())
    mach.step(m.Message(m.SUBSCRIBED, {"vclock": {}}), NOW)
    mach.advance(mach.ready())
    mach.tick(NOW + 1)
    rd = mach.ready()
    assert isinstance(rd.stop.error, Resubscribe) and mach.state is ApplierState.STOPPED


def test_a_link_to_an_expelled_upstream_subscribes_for_expelled_members_rows_only():
    core = new_core(vclock={1: 3, 2: 5})
    core.table.upsert(Member(UP, 2, "2.example:1", STATE_EXPELLED, 0, 7))
    mach = greeted(machine(core), vclock_uuid={UP: 8, SELF: 6, OTHER: 4})
    assert mach.outside and not mach.fenced
    assert mach.subscribed_from == {1: 5, 2: 6, 3: 4}  # the upstream's rows from ours; the rest from where it is


def test_a_link_whose_upstream_is_expelled_since_it_subscribed_subscribes_again():
    mach = following(vclock_uuid={UP: 8, SELF: 6})
    assert not mach.outside and mach.subscribed_from == {1: 5, 2: 1}      # ours: our row registering OTHER
    mach.step(m.Message(m.HEARTBEAT, {"now_us": WALL_US}), NOW)
    assert mach.state is ApplierState.FOLLOW
    mach.advance(mach.ready())
    mach.core.register_member(UP, "2.example:1", WALL_US, state=STATE_EXPELLED)
    mach.step(m.Message(m.HEARTBEAT, {"now_us": WALL_US}), NOW)
    rd = mach.ready()
    assert isinstance(rd.stop.error, Resubscribe) and "expelled" in str(rd.stop.error)
    assert mach.state is ApplierState.STOPPED


def test_a_fenced_link_subscribes_for_its_own_rows_and_again_once_the_fence_clears():
    core = new_core(vclock={1: 3, 2: 5})
    core.fence = OwnRowsFence("a test loss")
    mach = greeted(machine(core), vclock_uuid={UP: 8, SELF: 6, OTHER: 4})
    assert mach.state is ApplierState.SUBSCRIBING and mach.fenced
    assert core.table.get(OTHER) is None        # a fenced node registers nobody ...
    assert mach.subscribed_from[3] == 4         # ... and asks for OTHER's rows from where the upstream is
    mach.step(m.Message(m.SUBSCRIBED, {"vclock": {}}), NOW)
    rd = mach.ready()
    (followed,) = rd.apply
    assert followed.fenced and followed.vclock == {1: 8, 2: 3, 3: 4}   # others' rows from where it is
    mach.advance(rd)
    core.fence = None
    mach.step(m.Message(m.HEARTBEAT, {"now_us": WALL_US}), NOW)
    assert isinstance(mach.ready().stop.error, Resubscribe)


def test_acks_go_at_most_every_ack_interval_and_at_least_every_heartbeat_interval():
    mach = following()
    mach.tick(NOW)
    rd = mach.ready()
    assert [s.mtype for s in rd.send] == [m.ACK]
    mach.advance(rd)
    mach.tick(NOW + limits.ack_interval_s / 2)
    assert not mach.ready()                  # too soon
    mach.tick(NOW + limits.ack_interval_s * 2)
    assert not mach.ready()                  # nothing changed since
    mach.tick(NOW + limits.heartbeat_interval_s)
    rd = mach.ready()
    assert [s.mtype for s in rd.send] == [m.ACK]   # a heartbeat interval passed: say it anyway
    assert set(rd.send[0].body) == {"vclock", "durable", "lag_us"}


def applied(mach: ApplierMachine) -> ApplierMachine:
    """What the machine claimed so far (the registration of the upstream's member) is applied."""
    mach.core.commit_tops(dict(mach.core.claimed.items()))
    return mach


def test_between_messages_an_ack_is_owed_once_this_links_rows_are_applied_and_goes_after_the_interval():
    """The driver's ACK writer asks ack_wait after each durable batch: the last rows of a burst
    are acknowledged once applied, not with the next message (up to a heartbeat later)."""
    mach = applied(following())
    assert mach.ack_wait(NOW) is None and not mach.owes_ack    # no rows came: nothing owed
    mach.step(rows(put(1, 6)), NOW)
    first = mach.ready()
    assert first.send[0].body["vclock"] == {1: 5, 2: 1}   # sent before the journal took the rows
    mach.advance(first)
    mach.step(rows(put(1, 7, 2)), NOW + 0.01)
    second = mach.ready()
    mach.advance(second)
    assert mach.ack_wait(NOW + 1) is None and mach.owes_ack    # claimed, not applied
    mach.core.commit(list(first.persist[0].entry.txns))
    assert mach.ack_wait(NOW + 1) is None            # the second message's rows are not applied yet
    mach.core.commit(list(second.persist[0].entry.txns))
    assert mach.ack_wait(NOW + 0.01) == pytest.approx(limits.ack_interval_s - 0.01)   # owed, too soon
    assert mach.ack(NOW + 0.01) is False and not mach.ready()
    assert mach.ack_wait(NOW + 2 * limits.ack_interval_s) == 0.0
    assert mach.ack(NOW + 2 * limits.ack_interval_s) is True
    rd = mach.ready()
    assert [(s.mtype, s.body["vclock"]) for s in rd.send] == [(m.ACK, {1: 8, 2: 1})] and not rd.persist
    mach.advance(rd)
    assert mach.ack_wait(NOW + 1) is None and not mach.owes_ack    # said
    mach.core.commit([Txn(1, 2, GROUP_DEFAULT, WALL_US, (Op(OP_PUT, "kv", "own", 1),))])
    assert mach.ack_wait(NOW + 1) is None            # rows that did not come on this link wait for its next message


def test_an_ack_a_message_brought_covers_what_was_owed():
    mach = applied(following())
    mach.step(rows(put(1, 6)), NOW)
    rd = mach.ready()
    mach.advance(rd)
    mach.core.commit(list(rd.persist[0].entry.txns))
    mach.step(m.Message(m.HEARTBEAT, {"now_us": WALL_US}), NOW + 1)    # its ACK says the rows are applied
    assert mach.ready().send[0].body["vclock"] == {1: 6, 2: 1}
    assert mach.ack_wait(NOW + 2) is None


def test_no_ack_is_owed_or_queued_outside_following():
    mach = greeted(machine())
    assert mach.ack_wait(NOW + 5) is None and mach.ack(NOW + 5) is False and not mach.ready().send
    mach = applied(following())
    mach.step(rows(put(1, 6)), NOW)
    rd = mach.ready()
    mach.advance(rd)
    mach.core.commit(list(rd.persist[0].entry.txns))
    assert mach.ack_wait(NOW + 5) == 0.0
    mach.stop()
    assert mach.ack_wait(NOW + 5) is None and mach.ack(NOW + 5) is False


def test_a_cluster_row_and_this_nodes_own_answer_to_it_go_as_one_entry_between_plain_ones():
    mach = following()
    core = mach.core
    new = "00000000-0000-4000-8000-000000000009"
    reg = Txn(1, 7, GROUP_CLUSTER, WALL_US, (cluster_op(Member(new, 4, "9.example:1", STATE_MEMBER)),))
    mach.step(rows(put(1, 6), reg, put(1, 8)), NOW)
    rd = mach.ready()
    assert rd.stop is None
    frames = [[(t.replica_id, t.lsn, t.group) for t in p.entry.txns] for p in rd.persist]
    own = core.self_id
    assert frames[0] == [(2, 6, GROUP_DEFAULT)]                       # the plain run before it, first
    assert frames[1][0] == (2, 7, GROUP_CLUSTER) and frames[1][1][0] == own   # its row and ours: one frame
    assert frames[2] == [(2, 8, GROUP_DEFAULT)]
    assert core.table.get(new) is not None and core.claimed.get(2) == 8


def test_a_stop_is_the_last_thing_a_machine_says():
    mach = following()
    mach.step(rows(put(9, 1)), NOW)
    rd = mach.ready()
    assert rd.effects[-1] == rd.stop and isinstance(rd.stop, Stop)
    mach.advance(rd)
    with pytest.raises(AssertionError):
        mach.step(rows(put(1, 6)), NOW)


@pytest.mark.parametrize("scanner", ["native", "python"])
def test_a_message_the_row_scanner_took_is_claimed_by_runs_and_persisted_as_one_packed_entry(scanner):
    if scanner == "native" and rowscan.native is None:
        pytest.skip("the native row scanner is not built")
    scan_rows = rowscan.scan_rows if scanner == "native" else rowscan.scan_rows_py
    mach = following()
    data = m.encode_rows([codec.pack([WALL_US, [put(1, 6, 2).to_wire(), put(1, 8).to_wire()]])])
    mach.step(m.decode(data, scan_rows), NOW)
    rd = mach.ready()
    (p,) = rd.persist
    assert type(p.entry) is PackedEntry and p.rows == 3 and mach.messages_scanned == 1
    assert [(t[0], t[1]) for t in p.entry.txns] == [(2, 6), (2, 8)] and mach.core.claimed.get(2) == 8


def test_a_scanned_message_with_a_row_the_core_refuses_takes_the_exact_path_and_stops_after_the_good_rows():
    mach = following()
    bad = Txn(1, 7, GROUP_DEFAULT, WALL_US, (Op(OP_PUT, "nope", "k", 1),))    # no such space here
    data = m.encode_rows([codec.pack([WALL_US, [put(1, 6).to_wire(), bad.to_wire()]])])
    mach.step(m.decode(data, rowscan.scan_rows_py), NOW)
    rd = mach.ready()
    claimed = [t for p in rd.persist for t in p.entry.txns]
    assert [(t[0], t[1]) for t in claimed] == [(2, 6)]
    assert isinstance(rd.stop.error, RemoteProtocolError) and mach.core.claimed.get(2) == 6


# --- expels a fenced upstream told us of, which our greeting did not state ------------------------
def _greeted_by_fenced_upstream(our_greeting: dict, heard: list[str]):
    """The upstream is fenced and its greeting says OTHER is expelled (`expels_heard`)."""
    mach = machine()
    mach.start(our_greeting)
    mach.advance(mach.ready())
    mach.step(m.Message(m.GREETING, greeting(UP, UP_ROWS, expels_heard=heard)), NOW)
    rd = mach.ready()
    mach.advance(rd)
    return mach, rd


def test_an_expel_taken_from_a_fenced_upstreams_greeting_makes_the_link_greet_again():
    """Our greeting went before we took the expel: the upstream's fence may wait for a word of
    ours that knows it, and its relay asks at most once per news (full+replace seed 208588)."""
    mach, rd = _greeted_by_fenced_upstream(greeting(SELF), [OTHER])
    assert mach.core.table.expelled(OTHER)
    assert rd.persist                                        # the expel is ours now, in a row of ours
    assert mach.state is ApplierState.STOPPED and rd.send == ()
    (stop,) = rd.effects
    assert isinstance(stop.error, Resubscribe) and "greeting it again" in str(stop.error)


@pytest.mark.parametrize("ours, heard", [
    ({"expels_heard": [OTHER]}, [OTHER]),                    # our greeting said so already
    ({"cluster": [[OTHER, 3, "3.example:1", STATE_EXPELLED, 3, 0]]}, [OTHER]),
    ({}, []),                                                # the upstream is not fenced / heard nothing
])
def test_a_greeting_that_stated_the_expels_already_subscribes(ours, heard):
    mach, rd = _greeted_by_fenced_upstream(greeting(SELF, **ours), heard)
    assert mach.state is ApplierState.SUBSCRIBING and [s.mtype for s in rd.send] == [m.SUBSCRIBE]


def test_a_fenced_node_that_takes_no_expel_from_the_greeting_does_not_greet_again_for_ever():
    """Fenced here, it registers and expels nothing (the fence hears instead): no loop."""
    core = new_core(vclock={1: 3, 2: 5})
    core.fence = OwnRowsFence("a test loss")
    mach = machine(core)
    mach.start(greeting(SELF))
    mach.advance(mach.ready())
    mach.step(m.Message(m.GREETING, greeting(UP, UP_ROWS, expels_heard=[OTHER])), NOW)
    assert mach.state is ApplierState.SUBSCRIBING
