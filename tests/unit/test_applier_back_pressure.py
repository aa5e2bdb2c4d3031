"""Flow control on a link: how long each side waits for the peer's next message, and the
applier's back-pressure (node/core/link/applier.py `holds_reading` decides; node/applier/applier.py
`_back_pressure` waits on the journal, ticking so what becomes durable is acknowledged, and shows
"paused" while the disk has no room). The machines and their NodeCore are real; the journal and
the disk watch are recording fakes."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from node import limits
from node.applier.applier import Applier
from node.applier.hosts import NodeApplierContext
from node.core import messages as m
from node.core.link.applier import ApplierMachine, ApplierState
from node.core.link.relay import RelayMachine
from tests.unit.test_link_applier_machine import SELF, UP, following, greeting, machine, new_core
from tests.unit.test_link_relay_machine import Host as RelayContext, greeted as relay_greeted, streaming

PENDING_MAX = limits.applier_pending_rows_max


def test_an_applier_waits_a_handshake_timeout_for_answers_and_a_peer_timeout_once_following():
    mach = machine()
    mach.start(greeting(SELF))
    assert mach.recv_timeout_s() == limits.handshake_timeout_s
    assert following().recv_timeout_s() == limits.peer_timeout_s


def test_a_relay_waits_a_handshake_timeout_for_the_request_and_a_peer_timeout_once_streaming():
    assert RelayMachine(RelayContext()).recv_timeout_s() == limits.handshake_timeout_s
    assert relay_greeted(RelayMachine(RelayContext())).recv_timeout_s() == limits.handshake_timeout_s
    assert streaming().recv_timeout_s() == limits.peer_timeout_s


def test_reading_holds_one_row_past_the_pending_bound_and_not_at_it():
    mach = following()
    assert not mach.holds_reading(PENDING_MAX, False)
    assert mach.holds_reading(PENDING_MAX + 1, False)


def test_reading_holds_while_the_disk_has_no_room_however_little_is_queued():
    assert following().holds_reading(0, True)


def test_reading_never_holds_before_the_link_follows_or_after_it_ended():
    mach = machine()
    mach.start(greeting(SELF))
    assert not mach.holds_reading(PENDING_MAX + 1, True)
    mach = following()
    mach.stop()
    assert not mach.holds_reading(PENDING_MAX + 1, True)


class Journal:
    """Pending rows drain (and the alarm clears) one `changed` at a time, as batches become durable."""

    def __init__(self, applier_status, pending_rows: int = 0, alarm_turns: int = 0):
        self.pending = 0
        self.pending_rows = pending_rows
        self.failed: BaseException | None = None
        self.space = Space(alarm_turns)
        self.status_seen: list[str] = []
        self._status = applier_status
        self.waits = 0

    def submit_entry_nowait(self, entry, want_future=True):
        pass

    async def changed(self, timeout=None):
        assert timeout == limits.heartbeat_interval_s
        self.status_seen.append(self._status())
        self.waits += 1
        self.pending_rows = max(0, self.pending_rows - PENDING_MAX)
        self.space.turn()


class Space:
    def __init__(self, alarm_turns: int):
        self.turns = alarm_turns
        self.alarm = "nospace" if alarm_turns else None

    def turn(self) -> None:
        self.turns = max(0, self.turns - 1)
        self.alarm = "nospace" if self.turns else None


class Node:
    def __init__(self):
        self.core = new_core()
        self.followers: dict = {}
        self.own_claims: dict = {}
        self.life = SimpleNamespace(advertised={}, moved_from={})
        self.journal = self.space = None
        self.rejoiner = self                 # (the rejoin watch: nothing gone without)

    def going_without(self) -> dict:
        return {}

    def check_peer_greeting(self, theirs: dict) -> None:
        pass


class Conn:
    def __init__(self):
        self.sent: list[str] = []

    async def send(self, mtype: int, **body) -> None:
        self.sent.append(m.NAMES[mtype])


def applier(pending_rows: int = 0, alarm_turns: int = 0) -> Applier:
    node = Node()
    a = Applier(node, "2.example:1")
    node.journal = Journal(lambda: a.status, pending_rows, alarm_turns)
    node.space = node.journal.space
    a.conn = Conn()
    a.machine = following(ApplierMachine(node.core, NodeApplierContext(node, a), a.address, UP))
    a.status = "follow"
    return a


async def test_the_driver_reads_on_at_once_when_nothing_holds_it():
    a = applier(pending_rows=PENDING_MAX)
    await a._back_pressure()
    assert a.node.journal.waits == 0 and a.status == "follow"


async def test_the_driver_waits_for_the_journal_to_drain_acknowledging_meanwhile_then_reads_on():
    a = applier(pending_rows=3 * PENDING_MAX)
    await a._back_pressure()
    journal = a.node.journal
    assert journal.waits == 2 and journal.pending_rows == PENDING_MAX
    assert journal.status_seen == ["follow", "follow"], "a full queue is no pause"
    assert "ACK" in a.conn.sent, "what became durable is acknowledged while reading holds"


async def test_the_driver_shows_paused_while_the_disk_has_no_room_and_follow_once_it_has():
    a = applier(alarm_turns=2)
    await a._back_pressure()
    assert a.node.journal.status_seen == ["paused", "paused"] and a.status == "follow"


@pytest.mark.parametrize("why", ["journal failed", "stopping"])
async def test_the_driver_stops_holding_when_the_journal_failed_or_the_link_is_stopping(why):
    a = applier(alarm_turns=5)
    if why == "stopping":
        a.stopping = True
    else:
        a.node.journal.failed = OSError("EIO")
    await a._back_pressure()
    assert a.node.journal.waits == 0


async def test_a_link_that_ended_is_never_held():
    a = applier(alarm_turns=5)
    a.machine.stop()
    await a._back_pressure()
    assert a.node.journal.waits == 0 and a.machine.state is ApplierState.STOPPED
