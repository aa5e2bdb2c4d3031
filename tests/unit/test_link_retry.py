"""What an applier does between two links to the same upstream (node/applier/applier.py `run`,
`_rejoin_pause`; node/applier/upstream.py `_log_end`):

- Told to rejoin, it waits `rejoin_retry_s`, or less once other upstreams brought this node every
  row the refusing one collected (node/core/link/collected.py `caught_up_to`): an older member
  subscribing to one that just joined is refused for the moment it lacks rows the joiner's
  snapshot holds, and used to wait the whole 5 s to follow it.
- It does not cut the wait short when the rows were here already (that would retry in a loop).
- A peer that stays down is retried every second or so, and logged once per interval with a
  count, not once per try.

The node, its core and journal are stand-ins; the Applier and FailureLog are the real ones."""
from __future__ import annotations

import logging

import pytest

from node import limits
from node.applier import applier as applier_mod
from node.applier.applier import Applier
from node.applier.outcome import After, RETRY, after_link
from node.core.link.collected import caught_up_to
from node.errors import PeerRefused
from tests.unit.helpers import UUID_A, UUID_B, UUID_C

COLLECTED = {UUID_B: 8, UUID_C: 3}


@pytest.mark.parametrize("mine, caught", [
    ({UUID_B: 8, UUID_C: 3}, True),
    ({UUID_B: 9, UUID_C: 5, UUID_A: 1}, True),         # past it, and components it did not name
    ({UUID_B: 8, UUID_C: 2}, False),                   # one short in one component
    ({UUID_B: 8}, False),                              # a component missing is lsn 0
    ({}, False),
])
def test_a_node_has_caught_up_to_what_an_upstream_collected_only_with_every_component(mine, caught):
    assert caught_up_to(mine, COLLECTED) is caught


def test_a_component_this_node_never_had_is_not_caught_up_to_even_at_lsn_1():
    assert not caught_up_to({UUID_B: 8}, {UUID_B: 8, UUID_C: 1})
    assert caught_up_to({UUID_B: 8, UUID_C: 1}, {UUID_B: 8, UUID_C: 1})


def test_a_refusal_that_named_nothing_collected_is_never_caught_up_to():
    assert not caught_up_to({UUID_B: 100}, {})


class Core:
    def __init__(self, vclock: dict[str, int]):
        self.vclock = dict(vclock)

    def vclock_by_uuid(self) -> dict[str, int]:
        return dict(self.vclock)


class Journal:
    """Each `changed` is one durable batch: from the `arrive_at`-th on, the rows have come."""

    def __init__(self, node: "Node", arrive_at: int | None):
        self.node, self.arrive_at = node, arrive_at
        self.timeouts: list[float] = []

    async def changed(self, timeout=None):
        self.timeouts.append(timeout)
        if self.arrive_at is not None and len(self.timeouts) >= self.arrive_at:
            self.node.core.vclock.update(COLLECTED)


class Rejoiner:
    def __init__(self):
        self.needs: list[tuple[str, dict]] = []

    def on_need_rejoin(self, address, reason, collected):
        self.needs.append((address, collected))

    def status_of(self, address):
        return "need_rejoin"


class Node:
    def __init__(self, vclock: dict[str, int], arrive_at: int | None = None):
        self.core = Core(vclock)
        self.journal = Journal(self, arrive_at)
        self.rejoiner = Rejoiner()

    def twin_refused(self, e):
        pass


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    slept: list[float] = []

    async def sleep(s):
        slept.append(s)
    monkeypatch.setattr(applier_mod.asyncio, "sleep", sleep)
    return slept


async def test_a_link_told_to_rejoin_tries_again_once_other_upstreams_brought_the_rows(sleeps, caplog):
    node = Node({UUID_B: 2}, arrive_at=3)
    a = Applier(node, "127.0.0.1:7303")
    with caplog.at_level(logging.INFO, logger="replog.applier"):
        await a._rejoin_pause(COLLECTED, 30.0)
    assert len(node.journal.timeouts) == 3, "back on the batch that brought the rows, not after 30 s"
    assert all(t <= limits.rejoin_recheck_s for t in node.journal.timeouts)
    assert sleeps == []
    assert "every row it collected has come from other upstreams" in caplog.text


async def test_a_link_told_to_rejoin_waits_the_whole_delay_while_the_rows_do_not_come(monkeypatch, sleeps):
    clock = iter(range(0, 1000))                    # each reading of the clock is one second on
    monkeypatch.setattr(applier_mod.time, "monotonic", lambda: float(next(clock)))
    node = Node({UUID_B: 2}, arrive_at=None)
    await Applier(node, "127.0.0.1:7303")._rejoin_pause(COLLECTED, 5.0)
    assert 3 <= len(node.journal.timeouts) <= 5
    assert node.core.vclock == {UUID_B: 2}


async def test_a_link_refused_though_it_held_the_rows_waits_the_whole_delay_without_looking(sleeps):
    node = Node(dict(COLLECTED), arrive_at=1)
    await Applier(node, "127.0.0.1:7303")._rejoin_pause(COLLECTED, 5.0)
    assert sleeps == [5.0] and node.journal.timeouts == []


async def test_a_link_stopped_during_the_wait_ends_it(sleeps):
    node = Node({UUID_B: 2})
    a = Applier(node, "127.0.0.1:7303")
    a.stopping = True
    await a._rejoin_pause(COLLECTED, 5.0)
    assert node.journal.timeouts == [] and sleeps == []


async def test_run_waits_on_the_rows_the_refusal_named_after_need_rejoin_and_sleeps_after_other_ends(
        monkeypatch, sleeps):
    node = Node({UUID_B: 2}, arrive_at=2)
    a = Applier(node, "127.0.0.1:7303")
    pauses: list[tuple[dict, float]] = []
    ends = [ConnectionRefusedError("down"), _need_rejoin()]

    async def run_once():
        raise ends.pop(0)

    real_pause = a._rejoin_pause

    async def pause(collected, delay):
        pauses.append((collected, delay))
        await real_pause(collected, delay)
        a.stopping = True
    monkeypatch.setattr(a, "run_once", run_once)
    monkeypatch.setattr(a, "_rejoin_pause", pause)
    monkeypatch.setattr(a, "drop_peer", lambda: None)
    await a.run()
    assert len(sleeps) == 1 and sleeps[0] <= 1.5 * limits.reconnect_backoff_min_s   # the refused connect
    assert [c for c, _ in pauses] == [COLLECTED]
    assert 0.5 * limits.rejoin_retry_s <= pauses[0][1] <= 1.5 * limits.rejoin_retry_s
    assert node.rejoiner.needs == [("127.0.0.1:7303", COLLECTED)]


async def test_an_upstream_shutting_down_is_tried_again_within_the_backoff_not_the_refusal_wait(
        monkeypatch, sleeps, caplog):
    """A member restarting refuses links with not_ready while it stops: its followers come back
    to it as they would to a peer that was down, and say so without an ERROR."""
    a = Applier(Node({}), "127.0.0.1:7303")
    ends = [PeerRefused("not_ready", "this node is shutting down")] * 3

    async def run_once():
        if not ends:
            a.stopping = True
            return
        raise ends.pop()
    monkeypatch.setattr(a, "run_once", run_once)
    monkeypatch.setattr(a, "drop_peer", lambda: None)
    with caplog.at_level(logging.INFO, logger="replog.applier"):
        await a.run()
    assert len(sleeps) == 3 and max(sleeps) <= 1.5 * 4 * limits.reconnect_backoff_min_s < limits.refused_backoff_s / 2
    assert a.status == "disconnected" and a.error == "not_ready: this node is shutting down"
    assert [r.levelno for r in caplog.records] == [logging.INFO], "said once, quietly"


def _need_rejoin() -> PeerRefused:
    e = PeerRefused("need_rejoin", "rows were collected")
    e.needed = dict(COLLECTED)
    return e


def test_a_peer_that_stays_down_is_logged_once_per_interval_with_the_count(monkeypatch, caplog):
    now = [1000.0]
    monkeypatch.setattr("node.applier.upstream.time.monotonic", lambda: now[0])
    a = Applier(Node({}), "127.0.0.1:7303")
    down = After(RETRY, "disconnected", "Cannot connect", limits.reconnect_backoff_max_s, logging.INFO, "Cannot connect")
    closed = After(RETRY, "disconnected", "closed", limits.reconnect_backoff_max_s, logging.WARNING, "closed")
    with caplog.at_level(logging.INFO, logger="replog.applier"):
        for _ in range(10):                         # ten tries a second apart
            a._log_end(down)
            now[0] += 1.0
        a._log_end(closed)                          # another failure: said at once
        now[0] += limits.link_retry_log_interval_s
        a._log_end(down)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["applier 127.0.0.1:7303: Cannot connect", "applier 127.0.0.1:7303: closed",
                     "applier 127.0.0.1:7303: Cannot connect (9 more like it since the last such line)"]
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.WARNING, logging.INFO]


def test_a_need_rejoin_is_not_a_retry_so_its_lines_are_not_counted():
    """Only retries are counted: the rest (need_rejoin, refusals) keep their own pace."""
    nxt = after_link(_need_rejoin(), limits.reconnect_backoff_min_s)
    assert nxt.then != RETRY and nxt.line
