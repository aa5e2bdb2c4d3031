"""The link drivers act on a machine's Ready in its written order: what the step claimed is
submitted to the journal in the same synchronous call as the step (before any await), then
the messages go, then the rest of the node learns, then the link ends if the machine said so.
The node around the applier driver (node/applier/applier.py) is a recording fake; the machine
and its NodeCore are real."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from node.applier.applier import Applier
from node.applier.hosts import NodeApplierContext
from node.applier.relay import _take as relay_take
from node.core import messages as m
from node.core.anon_followers import followers_full
from node.core.link.applier import ApplierMachine, ApplierState
from node.core.link.relay import RelayMachine
from node.errors import PeerRefused, RemoteProtocolError
from tests.unit.test_link_applier_machine import NOW, SELF, UP, UP_ROWS, greeting, new_core, put, rows
from tests.unit.test_link_relay_machine import SUB, Host as RelayContext, greeted as relay_greeted, subscribe
from tests.waiting import until


class Journal:
    def __init__(self, events: list):
        self.events = events
        self.pending = 0
        self._changed = asyncio.Event()
        self.waiting = 0

    async def changed(self, timeout: float | None = None) -> None:
        self.waiting += 1
        try:
            async with asyncio.timeout(timeout):
                await self._changed.wait()
        except TimeoutError:
            pass
        finally:
            self.waiting -= 1

    def batch_durable(self) -> None:
        ev, self._changed = self._changed, asyncio.Event()
        ev.set()

    def submit_entry_nowait(self, entry, want_future=True):
        self.events.append(("persist", [(t.replica_id, t.lsn) for t in entry.txns]))


class Rejoiner:
    def __init__(self, events: list):
        self.events = events

    def on_follow(self, address: str) -> None:
        self.events.append(("apply", "follow"))

    def going_without(self) -> dict:
        return {}


class Node:
    def __init__(self, events: list):
        self.core = new_core()
        self.journal = Journal(events)
        self.rejoiner = Rejoiner(events)
        self.followers: dict = {}
        self.own_claims: dict = {}
        self.life = SimpleNamespace(advertised={}, moved_from={})
        self.events = events

    def check_peer_greeting(self, theirs: dict) -> None:
        pass

    def disprove_claim(self, uuid: str, have: int) -> None:
        self.events.append(("apply", "disprove"))


class Conn:
    def __init__(self, events: list):
        self.events = events
        self.bodies: list[dict] = []

    async def send(self, mtype: int, **body) -> None:
        self.events.append(("send", m.NAMES[mtype]))
        self.bodies.append(body)


def applier() -> tuple[Applier, list]:
    events: list = []
    node = Node(events)
    a = Applier(node, "2.example:1")
    a.conn = Conn(events)
    a.machine = ApplierMachine(node.core, NodeApplierContext(node, a), a.address, UP)
    return a, events


async def following() -> tuple[Applier, list]:
    """A driver whose link follows its upstream, events cleared."""
    a, events = applier()
    a.machine.start(greeting(SELF))
    await a._act(a._take())
    for msg in (m.Message(m.GREETING, greeting(UP, UP_ROWS)), m.Message(m.SUBSCRIBED, {"vclock": {}})):
        await a._act(a._take(msg, NOW))
    del events[:]
    return a, events


async def test_the_applier_driver_persists_what_a_step_claimed_before_it_sends_or_applies():
    a, events = applier()
    a.machine.start(greeting(SELF))
    await a._act(a._take())
    rd = a._take(m.Message(m.GREETING, greeting(UP, UP_ROWS)), NOW)
    assert events == [("send", "GREETING"), ("persist", [(1, 1)])]     # the registration: before any await
    await a._act(rd)
    assert events[-1] == ("send", "SUBSCRIBE") and a.node.followers == {UP: a}
    await a._act(a._take(m.Message(m.SUBSCRIBED, {"vclock": {}}), NOW))
    assert events[-1] == ("apply", "follow") and a.status == "follow"
    del events[:]
    await a._act(a._take(rows(put(1, 6)), NOW))
    assert events == [("persist", [(2, 6)]), ("send", "ACK")]


async def test_the_applier_drivers_ack_writer_acknowledges_rows_once_durable_with_no_further_message():
    """The last message of a burst is acknowledged before its rows are durable; the ACK that says
    they are goes once the journal has them, not with the upstream's next message."""
    a, events = await following()
    core = a.node.core
    core.commit_tops(dict(core.claimed.items()))       # the registration the greeting claimed is applied
    writer = asyncio.create_task(a._ack_writer(a.machine))
    rd = a._take(rows(put(1, 6, 2)), NOW)
    await a._act(rd)
    a._rows_in.set()                                    # as the read loop does after a ROWS message
    assert events == [("persist", [(2, 6)]), ("send", "ACK")] and a.conn.bodies[-1]["vclock"] == {1: 5, 2: 1}
    try:
        await until(lambda: a.node.journal.waiting, what="the writer to wait for the rows to be applied")
        core.commit(list(rd.persist[0].entry.txns))
        a.node.journal.batch_durable()
        await until(lambda: len(events) == 3, what="the ACK of the applied rows")
        assert events[2] == ("send", "ACK") and a.conn.bodies[-1]["vclock"] == {1: 7, 2: 1}
        assert not writer.done()                        # and it waits for the next batch
    finally:
        writer.cancel()


async def test_the_applier_driver_persists_the_claimed_rows_of_a_refused_message_then_raises():
    a, events = await following()
    rd = a._take(rows(put(1, 6), put(9, 1)), NOW)      # id 9 is unknown on this link
    assert events == [("persist", [(2, 6)])]
    with pytest.raises(RemoteProtocolError):
        await a._act(rd)
    assert a.machine.state is ApplierState.STOPPED


async def test_the_applier_driver_persists_claims_even_when_the_step_fails_with_a_bug():
    a, events = await following()
    with pytest.raises(TypeError):
        a._take(m.Message(m.ROWS, {"txns": [put(1, 6), None], "error": None}), NOW)   # a bug, not the peer
    assert events == [("persist", [(2, 6)])]


@pytest.mark.parametrize("anon,remembered", [(False, False), (True, True), (True, False)],
                         ids=["member", "anonymous-remembered", "anonymous-refused"])
def test_the_relay_driver_puts_a_subscribers_hold_in_place_in_the_step_that_answers_it(anon, remembered):
    """... and an anonymous subscriber is remembered first; one remembered is a link whose end
    serve_link tells retention of (node.core.anon_followers FollowerReach). One retention
    cannot remember (anon_followers_max) is refused before its hold or any answer."""
    calls: list = []

    class Retention:
        def on_subscribe(self, uuid, durable, anon):
            calls.append(("hold", uuid, durable))

        def hold_all(self, uuid, anon):
            calls.append(("hold all", uuid))

        def follower(self, uuid, address):
            calls.append(("follower", uuid))
            if not remembered:
                raise followers_full(1024)

    class RelayNode:
        retention = Retention()

    mach = relay_greeted(RelayMachine(RelayContext(), authenticated=SUB), anon=anon)
    followed: list[str] = []
    if anon and not remembered:
        with pytest.raises(PeerRefused) as e:
            relay_take(RelayNode(), mach, subscribe({1: 9}, durable={1: 8}), NOW, followed)
        assert e.value.code == "followers_full" and calls == [("follower", SUB)] and followed == []
        return
    rd = relay_take(RelayNode(), mach, subscribe({1: 9}, durable={1: 8}), NOW, followed)
    assert calls == [("follower", SUB)] * anon + [("hold", SUB, {1: 8})] and rd.send[0].mtype == m.SUBSCRIBED
    assert followed == ([SUB] if anon else [])


async def test_the_relay_driver_steps_no_message_into_a_link_its_send_loop_ended():
    """The send loop ends the link with ERROR greet_again (RelayMachine.rows_may_go closes the
    machine), then awaits that ERROR and the close; an ACK the receive loop was waiting for
    arrives meanwhile. Stepped into the closed machine, it failed an assertion, logged as a bug
    with a traceback (a nemesis run on real processes met it)."""
    from node.applier.stream import Relay
    from node.core.link.relay import RelayState
    from tests.unit.test_link_relay_machine import streaming

    mach = streaming()
    ack_came = asyncio.Event()

    class AckConn:
        async def recv(self, timeout: float) -> m.Message:
            await ack_came.wait()
            return m.Message(m.ACK, {"vclock": {1: 9, 2: 4}, "durable": {1: 9, 2: 4}})

    async def send_loop() -> None:
        mach.close()                      # as rows_may_go's refusal does
        ack_came.set()
        await asyncio.sleep(0)            # its ERROR and the close are awaited: the receive loop runs
        await asyncio.sleep(0)

    acks = []
    r = Relay.__new__(Relay)
    r.machine, r.conn = mach, AckConn()
    r.node = SimpleNamespace(retention=SimpleNamespace(on_ack=lambda *a: acks.append(a)))
    await r._recv_loop(asyncio.create_task(send_loop()))
    assert mach.state is RelayState.CLOSED and acks == []
