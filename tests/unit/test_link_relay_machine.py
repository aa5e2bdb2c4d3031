"""The relay machine (node/core/link/relay.py) driven directly, with a real NodeCore and no IO:
every request's path through the states, the illegal transitions asserting, what each Ready
holds (a hold persisted before the answer that needs it goes), and a subscriber that lies or
breaks the protocol."""
from __future__ import annotations

import pytest

from node import limits
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core import messages as m
from node.core.link.ready import Hold, Send
from node.core.link.relay import (AckHold, Register, Registered, RelayMachine, RelayState, SendSnapshot, Shutdown,
                                  SnapshotSent, Stream)
from node.core.membership import OwnRowsFence
from node.core.replicaset import NodeCore
from node.core.vclock import VClock
from node.errors import PeerRefused, RemoteProtocolError

SELF = "00000000-0000-4000-8000-000000000001"
SUB = "00000000-0000-4000-8000-000000000002"
NEW = "00000000-0000-4000-8000-000000000003"
GONE = "00000000-0000-4000-8000-000000000004"
NOW = 100.0


def greeting(uuid: str, **kw) -> dict:
    d = {"uuid": uuid, "cluster_uuid": "c-1", "cluster_name": "t", "options_digest": "d", "options": {},
         "anon": False, "address": f"{uuid[-1]}.example:1", "cluster": [], "vclock_uuid": {}}
    d.update(kw)
    return d


class Host:
    def __init__(self, core: NodeCore | None = None):
        self.core = core if core is not None else new_core()
        self.state = ("running", "")
        self.wal = True
        self.gc: dict[int, int] = {}
        self.refusal: Exception | None = None

    def greeting(self) -> dict:
        return greeting(SELF)

    def check_peer_greeting(self, theirs: dict) -> None:
        if self.refusal is not None:
            raise self.refusal

    def status(self) -> tuple[str, str]:
        return self.state

    def serves_wal(self) -> bool:
        return self.wal

    def gc_vclock(self) -> dict[int, int]:
        return self.gc


def new_core() -> NodeCore:
    table = ClusterTable([Member(SELF, 1, "1.example:1", STATE_MEMBER), Member(SUB, 2, "2.example:1", STATE_MEMBER),
                          Member(GONE, 4, "4.example:1", STATE_EXPELLED, 0, 3)])
    return NodeCore(SELF, table, VClock({1: 9, 2: 4}), spaces={"kv": False})


def relay(host: Host | None = None, who: str = SUB) -> RelayMachine:
    return RelayMachine(host or Host(), authenticated=who)


def greeted(mach: RelayMachine, who: str = SUB, **kw) -> RelayMachine:
    mach.step(m.Message(m.GREETING, greeting(who, **kw)), NOW)
    mach.advance(mach.ready())
    return mach


def subscribe(vclock: dict, **kw) -> m.Message:
    return m.Message(m.SUBSCRIBE, {"vclock": vclock, **kw})


def streaming(mach: RelayMachine | None = None, **kw) -> RelayMachine:
    mach = greeted(mach or relay())
    mach.step(subscribe({1: 9, 2: 4}, **kw), NOW)
    mach.advance(mach.ready())
    return mach


def test_a_subscription_holds_the_wal_then_answers_then_streams_without_echoing_the_subscribers_rows():
    mach = relay()
    assert mach.state is RelayState.GREETING
    mach.step(m.Message(m.GREETING, greeting(SUB)), NOW)
    rd = mach.ready()
    assert mach.state is RelayState.REQUEST and rd.send == (Send(m.GREETING, greeting(SELF)),)
    mach.advance(rd)
    mach.step(subscribe({1: 5, 2: 4}, durable={1: 3, 2: 4}), NOW)
    rd = mach.ready()
    assert mach.state is RelayState.STREAMING
    assert rd.persist == (Hold(SUB, False, {1: 3, 2: 4}),)               # at its durable position, first
    assert rd.send == (Send(m.SUBSCRIBED, {"vclock": {1: 9, 2: 4}}),)
    assert rd.effects == (Stream(),)
    assert mach.sub == {1: 5, 2: 4} and mach.own == (2, 4)               # its own rows past 4 come from it
    mach.advance(rd)


def test_a_subscriber_that_asks_for_its_own_rows_gets_them_back():
    mach = streaming(own_rows=True)
    assert mach.own is None and mach.own_rows_only        # (a rejoin does not wait for it to take ours)
    assert not streaming().own_rows_only


def test_an_older_subscriber_without_a_durable_vclock_holds_at_its_subscribe_vclock():
    mach = greeted(relay())
    mach.step(subscribe({1: 5}), NOW)
    assert mach.ready().persist == (Hold(SUB, False, {1: 5}),)


def test_a_join_registers_then_holds_everything_then_sends_the_snapshot_then_waits_for_subscribe():
    host = Host()
    mach = greeted(relay(host, NEW), NEW)
    mach.step(m.Message(m.JOIN, {"code": "x", "id": 0}), NOW)
    rd = mach.ready()
    assert mach.state is RelayState.REGISTERING and rd.effects == (Register(greeting(NEW), {"code": "x", "id": 0}),)
    mach.advance(rd)
    mach.step(Registered(True, 3), NOW)
    rd = mach.ready()
    assert mach.state is RelayState.SNAPSHOT
    assert rd.persist == (Hold(NEW, False),) and rd.send == (Send(m.REGISTERED, {"id": 3}),)
    assert rd.effects == (SendSnapshot(),)
    mach.advance(rd)
    mach.step(SnapshotSent(), NOW)
    assert mach.state is RelayState.SUBSCRIBE and not mach.ready()
    mach.step(subscribe({1: 9}), NOW)
    assert mach.state is RelayState.STREAMING and mach.ready().effects == (Stream(),)


def test_a_register_is_answered_and_then_subscribes_without_a_snapshot():
    mach = greeted(relay(who=NEW), NEW, anon=True)
    mach.step(m.Message(m.REGISTER, {"code": "x", "id": 5}), NOW)
    mach.advance(mach.ready())
    mach.step(Registered(True, 5), NOW)
    rd = mach.ready()
    assert mach.state is RelayState.SUBSCRIBE and rd.send == (Send(m.REGISTERED, {"id": 5}),) and not rd.persist
    mach.advance(rd)
    mach.step(m.Message(m.BYE, {}), NOW)
    assert mach.state is RelayState.CLOSED and mach.ready().stop.error is None


def test_a_rejected_registration_is_answered_with_the_next_free_id_and_ends_the_link():
    mach = greeted(relay(who=NEW), NEW)
    mach.step(m.Message(m.JOIN, {"code": "x", "id": 3}), NOW)
    mach.advance(mach.ready())
    mach.step(Registered(False, reason="id 3 is taken", next_id=5), NOW)
    rd = mach.ready()
    assert rd.send == (Send(m.ERROR, {"code": "register_rejected", "message": "id 3 is taken", "next_id": 5}),)
    assert mach.state is RelayState.CLOSED and rd.stop.error is None


def test_an_anonymous_fetch_holds_as_anonymous_and_sends_the_snapshot():
    mach = greeted(relay(who=NEW), NEW, anon=True)
    mach.step(m.Message(m.FETCH_SNAPSHOT, {}), NOW)
    rd = mach.ready()
    assert rd.persist == (Hold(NEW, True),) and rd.effects == (SendSnapshot(),) and not rd.send


@pytest.mark.parametrize("why", ["anon", "not_running", "fenced", "no_cluster"])
def test_a_join_this_node_cannot_serve_now_is_refused_with_a_code(why):
    host = Host()
    if why == "anon":
        host.core = NodeCore(SELF, ClusterTable([Member(SELF, 1, "1.example:1", STATE_ANON)]), VClock({}))
    elif why == "not_running":
        host.state = ("joining", "waiting for peers")
    elif why == "fenced":
        host.core.fence = OwnRowsFence("a test loss")
    else:
        host.core = None
    mach = greeted(relay(host, NEW), NEW)
    mach.step(m.Message(m.JOIN, {"code": "x", "id": 0}), NOW)
    rd = mach.ready()
    (err,) = rd.send
    assert err.mtype == m.ERROR and err.body["code"] == ("anon" if why == "anon" else "not_ready")
    assert mach.state is RelayState.CLOSED and not rd.persist and not any(type(e) is Register for e in rd.effects)


@pytest.mark.parametrize("how", ["told", "its own row"])
@pytest.mark.parametrize("request_type", [m.JOIN, m.REGISTER])
def test_a_node_a_member_refused_as_expelled_registers_nobody_not_even_a_member_again(request_type, how):
    host = Host()
    if how == "told":
        host.core.told_expelled("2.example:1", f"{SELF} was expelled from this cluster")
    else:
        host.core.table.upsert(Member(SELF, 1, "1.example:1", STATE_EXPELLED, 0, 3))
    mach = greeted(relay(host, SUB), SUB)
    mach.step(m.Message(request_type, {"code": "x", "id": 2}), NOW)
    rd = mach.ready()
    (err,) = rd.send
    assert err.mtype == m.ERROR and err.body["code"] == "donor_expelled"
    assert ("2.example:1" if how == "told" else "its _cluster says it was expelled") in err.body["message"]
    assert mach.state is RelayState.CLOSED and not rd.persist and not any(type(e) is Register for e in rd.effects)


def test_a_node_a_member_refused_as_expelled_still_serves_subscribers():
    host = Host()
    host.core.told_expelled("2.example:1", "expelled")
    mach = greeted(relay(host, SUB), SUB)
    mach.step(subscribe({}), NOW)
    assert mach.state is RelayState.STREAMING


def test_a_fenced_node_still_answers_a_members_join_again():
    host = Host()
    host.core.fence = OwnRowsFence("a test loss")
    mach = greeted(relay(host), SUB)
    mach.step(m.Message(m.JOIN, {"code": "x", "id": 2}), NOW)
    assert mach.state is RelayState.REGISTERING


def test_an_expelled_member_is_refused_at_its_greeting():
    mach = relay(who=GONE)
    mach.step(m.Message(m.GREETING, greeting(GONE)), NOW)
    rd = mach.ready()
    assert rd.send[0].body["code"] == "expelled" and isinstance(rd.stop.error, PeerRefused)
    assert mach.state is RelayState.CLOSED


def test_a_greeting_under_another_uuid_than_the_handshake_proved_ends_the_link_unanswered():
    mach = relay(who=NEW)
    mach.step(m.Message(m.GREETING, greeting(SUB)), NOW)
    rd = mach.ready()
    assert isinstance(rd.stop.error, RemoteProtocolError) and not rd.send


def test_a_lasting_greeting_refusal_is_answered_with_its_code_and_fields():
    mach = relay()
    mach.step(m.Message(m.GREETING, greeting(SUB, cluster_name="other")), NOW)
    rd = mach.ready()
    (err,) = rd.send
    assert err.body["code"] == "cluster_name" and err.body["option"] == "cluster_name" and err.body["value"] == "t"
    assert rd.stop.error.code == "cluster_name"


def test_a_subscriber_behind_the_collected_wal_is_told_to_rejoin_with_what_was_collected_by_uuid():
    host = Host()
    host.gc = {1: 7}
    mach = greeted(relay(host))
    mach.step(subscribe({1: 5, 2: 4}), NOW)
    rd = mach.ready()
    (err,) = rd.send
    assert err.body["code"] == "need_rejoin" and err.body["gc_vclock_uuid"] == {SELF: 7}
    assert not rd.persist and rd.stop.error is None and "told to rejoin" in rd.stop.note


@pytest.mark.parametrize("sub_gone, said, told", [
    (3, None, False),     # up to our bound of GONE (3): the rows past it, in our snapshot, are nobody's to want
    (2, None, True),      # row 3 of GONE it would take is collected
    (2, 2, False),        # its own bound (its greeting) is 2: it takes no row past it
    (3, 5, True),         # its bound is 5: it wants rows 4 and 5, collected here
])
def test_a_subscriber_needs_no_collected_row_of_an_expelled_member_past_the_bound_it_keeps(sub_gone, said, told):
    host = Host()
    host.gc = {1: 7, 4: 6}          # GONE (expelled here at 3): rows up to 6 came in this node's snapshot
    cluster = [] if said is None else [[GONE, 9, "", STATE_EXPELLED, 0, said]]
    mach = greeted(relay(host), cluster=cluster)
    mach.step(subscribe({1: 7, 2: 4, 4: sub_gone}), NOW)
    rd = mach.ready()
    if told:
        (err,) = rd.send
        assert err.body["code"] == "need_rejoin" and err.body["gc_vclock_uuid"] == {SELF: 7, GONE: 6}
    else:
        assert mach.state is RelayState.STREAMING and not any(x.body.get("code") for x in rd.send), rd.send


def test_a_node_without_a_wal_serves_no_subscriber():
    host = Host()
    host.wal = False
    mach = greeted(relay(host))
    mach.step(subscribe({}), NOW)
    rd = mach.ready()
    assert rd.send[0].body["code"] == "wal_mode" and not rd.persist


def test_a_shutdown_phase_is_run_only_for_a_member():
    mach = greeted(relay())
    mach.step(m.Message(m.SHUTDOWN, {"phase": "quiesce"}), NOW)
    rd = mach.ready()
    assert rd.effects[0] == Shutdown({"phase": "quiesce"}) and mach.state is RelayState.CLOSED
    stranger = greeted(relay(who=NEW), NEW)
    stranger.step(m.Message(m.SHUTDOWN, {"phase": "quiesce"}), NOW)
    rd = stranger.ready()
    assert rd.send[0].body["code"] == "not_member" and not any(type(e) is Shutdown for e in rd.effects)


def test_an_ack_moves_the_subscribers_hold_to_its_durable_vclock_and_records_its_lag():
    mach = streaming()
    mach.step(m.Message(m.ACK, {"vclock": {1: 9}, "durable": {1: 8}, "lag_us": 250_000}), NOW + 1)
    rd = mach.ready()
    assert rd.apply == (AckHold(SUB, {1: 8}, False),) and not rd.send
    assert mach.acked == {1: 9} and mach.durable == {1: 8} and mach.lag_s == 0.25   # /v1/info shows both
    mach.advance(rd)
    mach.step(m.Message(m.ACK, {"vclock": {1: 9}, "lag_us": -1}), NOW + 2)
    assert mach.ready().apply == (AckHold(SUB, {1: 9}, False),) and mach.lag_s == 0.0   # an older peer
    assert mach.durable == {1: 9}


@pytest.mark.parametrize("body", [{"vclock": {1: -5}}, {"vclock": {1: 5}, "durable": {1: -5}},
                                  {"vclock": {"1": 5}}, {"vclock": {1: 5}, "durable": [1, 5]}])
def test_an_ack_with_a_malformed_vclock_is_refused_by_decode_before_any_relay_takes_it(body):
    # The relay machine reads an ACK's vclocks as decode checked them (one home for the rule):
    # a malformed one is a RemoteProtocolError at the driver's recv, the subscriber's fault.
    with pytest.raises(RemoteProtocolError, match="ACK"):
        m.decode(m.encode(m.ACK, **body))


@pytest.mark.parametrize("mtype", [m.ROWS, m.JOIN, m.GREETING])
def test_a_subscriber_that_sends_what_only_a_relay_sends_ends_the_link(mtype):
    mach = streaming()
    mach.step(m.Message(mtype, {}), NOW)
    assert isinstance(mach.ready().stop.error, RemoteProtocolError) and mach.state is RelayState.CLOSED


@pytest.mark.parametrize("state, mtype", [("greeting", m.SUBSCRIBE), ("request", m.ACK), ("subscribe", m.ACK)])
def test_a_message_out_of_order_before_streaming_ends_the_link(state, mtype):
    mach = relay(who=NEW)
    if state != "greeting":
        greeted(mach, NEW)
    if state == "subscribe":
        mach.step(m.Message(m.FETCH_SNAPSHOT, {}), NOW)
        mach.advance(mach.ready())
        mach.step(SnapshotSent(), NOW)
    mach.step(m.Message(mtype, {"vclock": {}}), NOW)
    assert isinstance(mach.ready().stop.error, RemoteProtocolError)


def test_heartbeats_go_only_when_nothing_was_sent_for_a_heartbeat_interval():
    mach = streaming()
    mach.sent_rows(NOW)
    mach.tick(NOW + limits.heartbeat_interval_s / 2, 5)
    assert not mach.ready()
    mach.tick(NOW + limits.heartbeat_interval_s, 7)
    rd = mach.ready()
    assert rd.send == (Send(m.HEARTBEAT, {"now_us": 7}),)
    assert mach.next_heartbeat_at() == NOW + 2 * limits.heartbeat_interval_s


def test_the_two_loops_of_a_streaming_relay_each_take_their_own_ready():
    mach = streaming()
    mach.tick(NOW + 10, 1)
    beat = mach.ready()                        # the send loop's, being sent
    mach.step(m.Message(m.ACK, {"vclock": {1: 9}}), NOW + 10)
    ack = mach.ready()                         # the ACK loop's, meanwhile
    assert beat.send and not beat.apply and ack.apply and not ack.send
    mach.advance(ack)
    mach.advance(beat)


def test_illegal_inputs_assert():
    mach = greeted(relay())
    with pytest.raises(AssertionError, match="not a message"):
        mach.step(Registered(True, 1), NOW)
    with pytest.raises(AssertionError, match="not a message"):
        mach.step(SnapshotSent(), NOW)
    joining = greeted(relay(who=NEW), NEW)
    joining.step(m.Message(m.JOIN, {"code": "x", "id": 0}), NOW)
    joining.advance(joining.ready())
    with pytest.raises(AssertionError, match="registration's result"):
        joining.step(m.Message(m.SUBSCRIBE, {"vclock": {}}), NOW)
    done = streaming()
    with pytest.raises(AssertionError):
        done.step(SnapshotSent(), NOW)
    done.close()
    with pytest.raises(AssertionError, match="closed"):
        done.step(m.Message(m.ACK, {"vclock": {}}), NOW)
    with pytest.raises(AssertionError):
        done.sent_rows(NOW)


def test_a_refusal_from_the_subscriber_ends_the_link_with_it():
    mach = streaming()
    e = PeerRefused("protocol", "bad")
    mach.step(e, NOW)
    assert mach.ready().stop.error is e
