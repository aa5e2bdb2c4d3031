"""The relay machine (node/core/link/relay.py) at the edges mutation testing found unpinned:
`behind` component by component, what a machine says before any greeting, what a greeting
leaves (how logs name the subscriber), the host's own refusal with and without fields, BYE as
the request and while streaming, a subscriber's HEARTBEAT, SHUTDOWN and JOIN from an entry that
is not a member, the own-rows cut of an anonymous entry, a malformed SUBSCRIBE vclock, what an
ACK starts from, the need_rejoin stop's note, and the transition table and driver asserts."""
from __future__ import annotations

import pytest

from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core import messages as m
from node.core.link.ready import Send, Stop
from node.core.link.collected import behind, expel_bounds_by_id
from node.core.link.relay import (_NEXT, AckHold, Register, Registered, RelayState, SendSnapshot, Shutdown, SnapshotSent,
                                  Stream)
from node.core.membership import OwnRowsFence
from node.errors import PeerRefused, RemoteProtocolError
from tests.unit.test_lifecycle_rejoin_mut_edges import check_transitions
from tests.unit.test_link_relay_machine import GONE, NEW, NOW, SUB, Host, greeted, greeting, relay, streaming, subscribe


@pytest.mark.parametrize("sub, gc, out", [
    ({}, {3: 1}, [3]), ({3: 1}, {3: 1}, []), ({3: 1}, {3: 2}, [3]), ({}, {3: 0}, []),
    ({}, {0: 5}, []), ({1: 9}, {1: 4, 2: 2, 3: 7}, [2, 3]),
])
def test_a_subscriber_is_behind_in_each_replicated_component_it_holds_less_of_than_was_collected(sub, gc, out):
    assert behind(sub, gc, {}) == out


@pytest.mark.parametrize("sub, gc, bounds, out", [
    ({3: 4}, {3: 6}, {3: 4}, []), ({3: 4}, {3: 6}, {3: 5}, [3]), ({3: 4}, {3: 6}, {3: 9}, [3]),
    ({}, {3: 6}, {3: 0}, []), ({3: 1}, {2: 3, 3: 6}, {3: 1}, [2]),
])
def test_of_an_expelled_member_a_subscriber_is_behind_only_below_the_bound(sub, gc, bounds, out):
    assert behind(sub, gc, bounds) == out


def test_the_bounds_a_relay_serves_by_are_the_subscribers_where_its_greeting_states_one_else_its_own():
    table = ClusterTable([Member(SUB, 2, "", STATE_MEMBER), Member(GONE, 4, "", STATE_EXPELLED, 0, 3),
                          Member(NEW, 5, "", STATE_EXPELLED, 0, 7)])
    cluster = [[GONE, 9, "", STATE_EXPELLED, 0, 5], [SUB, 1, "", STATE_EXPELLED, 0, 2],
               ["00000000-0000-4000-8000-00000000000f", 3, "", STATE_EXPELLED, 0, 1]]
    assert expel_bounds_by_id(table, {"cluster": cluster}) == {4: 5, 5: 7, 2: 2}
    assert expel_bounds_by_id(table, {}) == expel_bounds_by_id(table) == {4: 3, 5: 7}


def test_a_new_relay_machine_has_no_subscriber_request_or_acks_yet():
    mach = relay()
    assert (mach.greeting, mach.uuid, mach.address, mach.anon, mach.request) == ({}, "", "", False, 0)
    assert (mach.sub, mach.durable, mach.acked, mach.acked_at, mach.lag_s) == ({}, {}, {}, 0.0, 0.0)


def test_a_greeting_names_the_subscriber_by_address_and_uuid_for_the_logs():
    mach = greeted(relay())
    assert mach.peer == f"2.example:1 ({SUB[:8]})" and mach.address == "2.example:1"


@pytest.mark.parametrize("body", [None, {"option": "lease_store", "value": "s3"}])
def test_the_hosts_own_refusal_of_a_greeting_is_answered_with_its_code_and_any_fields(body):
    host = Host()
    e = PeerRefused("fenced", "the lease says no")
    if body is not None:
        e.body = body
    host.refusal = e
    mach = relay(host)
    mach.step(m.Message(m.GREETING, greeting(SUB)), NOW)
    rd = mach.ready()
    assert rd.send == (Send(m.ERROR, {"code": "fenced", "message": "the lease says no", **(body or {})}),)
    assert rd.stop.error is e and mach.state is RelayState.CLOSED


def test_bye_as_the_request_ends_the_link_quietly():
    mach = greeted(relay())
    mach.step(m.Message(m.BYE, {}), NOW)
    rd = mach.ready()
    assert rd.send == () and rd.effects == (Stop(None),) and mach.state is RelayState.CLOSED


def test_bye_and_heartbeat_while_streaming():
    mach = streaming()
    mach.step(m.Message(m.HEARTBEAT, {"now_us": 1}), NOW)
    assert not mach.ready() and mach.state is RelayState.STREAMING
    mach.step(m.Message(m.BYE, {}), NOW)
    assert mach.ready().effects == (Stop(None),) and mach.state is RelayState.CLOSED


def _anon_entry(host: Host) -> None:
    host.core.table.upsert(Member(NEW, 3, "3.example:1", STATE_ANON))


def test_a_shutdown_from_an_entry_that_is_not_a_member_is_refused():
    host = Host()
    _anon_entry(host)
    mach = greeted(relay(host, NEW), NEW)
    mach.step(m.Message(m.SHUTDOWN, {"phase": "quiesce", "shutdown_id": NEW}), NOW)
    rd = mach.ready()
    assert [s.body["code"] for s in rd.send] == ["not_member"] and rd.effects == (Stop(None),)


def test_a_fenced_node_registers_no_entry_that_is_not_a_member():
    host = Host()
    _anon_entry(host)
    host.core.fence = OwnRowsFence("a test loss")
    mach = greeted(relay(host, NEW), NEW)
    mach.step(m.Message(m.JOIN, {}), NOW)
    rd = mach.ready()
    assert [s.body["code"] for s in rd.send] == ["not_ready"] and mach.state is RelayState.CLOSED


def test_an_anonymous_entry_subscribing_gets_no_own_rows_cut():
    host = Host()
    _anon_entry(host)
    mach = greeted(relay(host, NEW), NEW)
    mach.step(subscribe({1: 9}), NOW)
    assert mach.state is RelayState.STREAMING and mach.own is None


@pytest.mark.parametrize("body", [{"vclock": {"x": 1}}, {"vclock": {1: 2}, "durable": {1: -2}},
                                  {"vclock": {1: 2}, "own_rows": 1}])
def test_a_subscribe_with_a_malformed_field_is_refused_by_decode_before_any_relay_takes_it(body):
    # The relay machine reads SUBSCRIBE's vclocks as decode checked them (one home for the rule).
    with pytest.raises(RemoteProtocolError, match="SUBSCRIBE"):
        m.decode(m.encode(m.SUBSCRIBE, **body))


def test_acks_start_from_the_subscribe_vclock():
    mach = streaming()
    assert mach.acked == {1: 9, 2: 4} and mach.acked is not mach.sub


def test_an_ack_of_lag_0_says_no_lag():
    mach = streaming()
    mach.step(m.Message(m.ACK, {"vclock": {1: 9}, "lag_us": 0}), NOW)
    assert mach.lag_s == 0.0


def test_a_subscriber_told_to_rejoin_is_stopped_quietly_with_a_note():
    host = Host()
    host.gc = {1: 20}
    mach = greeted(relay(host))
    mach.step(subscribe({1: 9, 2: 4}), NOW)
    stop = mach.ready().stop
    assert stop.error is None and stop.note.startswith(f"{SUB} is behind collected WAL")


@pytest.mark.parametrize("src", list(RelayState))
def test_every_relay_transition_outside_the_table_asserts_and_every_one_in_it_is_taken(src):
    check_transitions(relay, src, _NEXT, "relay link")


def test_closing_twice_is_no_error():
    mach = streaming()
    mach.close()
    mach.close()
    assert mach.state is RelayState.CLOSED


def test_while_the_snapshot_is_sent_only_its_end_is_taken():
    mach = greeted(relay())
    mach.step(m.Message(m.FETCH_SNAPSHOT, {}), NOW)
    mach.advance(mach.ready())
    assert mach.state is RelayState.SNAPSHOT
    with pytest.raises(AssertionError, match="expected the snapshot sent"):
        mach.step(Registered(True, 3), NOW)


def test_a_subscribe_with_no_core_is_a_drivers_bug_and_asserts():
    host = Host()
    mach = greeted(relay(host))
    mach.step(m.Message(m.REGISTER, {}), NOW)
    mach.advance(mach.ready())
    mach.step(Registered(True, 2), NOW)
    mach.advance(mach.ready())
    host.core = None
    with pytest.raises(AssertionError):
        mach.step(subscribe({1: 9}), NOW)


def test_a_refusal_the_driver_logs_carries_the_code_and_message_the_subscriber_was_sent():
    mach = relay(who=GONE)
    mach.step(m.Message(m.GREETING, greeting(GONE)), NOW)
    rd = mach.ready()
    error = rd.stop.error
    assert (error.code, error.message) == ("expelled", f"{GONE} was expelled from this cluster")
    assert rd.send[0].body == {"code": error.code, "message": error.message}


def _values_a_join_and_a_stream_pass() -> list:
    """What a relay machine takes (Registered, SnapshotSent) and hands out (Register,
    SendSnapshot, Stream, AckHold, Shutdown) on a JOIN, a subscription, an ACK and a SHUTDOWN."""
    values: list = []

    def take(mach, part: str) -> None:
        rd = mach.ready()
        values.extend(getattr(rd, part))
        mach.advance(rd)

    mach = greeted(relay())
    mach.step(m.Message(m.JOIN, {}), NOW)
    take(mach, "effects")                                            # Register
    values.append(Registered(True, 2))
    mach.step(values[-1], NOW)
    take(mach, "effects")                                            # SendSnapshot
    values.append(SnapshotSent())
    mach.step(values[-1], NOW)
    mach.step(subscribe({1: 9, 2: 4}), NOW)
    take(mach, "effects")                                            # Stream
    mach.step(m.Message(m.ACK, {"vclock": {1: 9}}), NOW)
    take(mach, "apply")                                              # AckHold
    mach = greeted(relay())
    mach.step(m.Message(m.SHUTDOWN, {"phase": "quiesce", "shutdown_id": SUB}), NOW)
    values += [e for e in mach.ready().effects if isinstance(e, Shutdown)]
    return values


def test_what_a_relay_machine_takes_and_hands_out_are_values_that_cannot_change_on_the_way():
    values = _values_a_join_and_a_stream_pass()
    assert [type(v) for v in values] == [Register, Registered, SendSnapshot, SnapshotSent, Stream, AckHold, Shutdown]
    for value in values:
        fields = type(value).__struct_fields__
        if fields:
            with pytest.raises(AttributeError):
                setattr(value, fields[0], None)
        else:
            assert hash(value) == hash(type(value)())      # a frozen struct: a value, hashable
