"""A newcomer catching up (node/lifecycle.py Lifecycle.catch_up) waits for what its donor holds,
not for what the donor once said: a greeting counts rows its sender is still writing (the
claimed vclock, so a fenced member counts its rows on their way to a peer's disk), and a donor
that crashed before writing them, or lost rows it had not synced, holds fewer after it
restarts. The donor's latest greeting on our link to it lowers the target; without that the
newcomer stayed "catching_up" until the origin wrote that far again, which may be never."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from node import limits
from node.lifecycle import Lifecycle

DONOR, ORIGIN = "d0000000-0000-4000-8000-000000000001", "e0000000-0000-4000-8000-000000000002"


def _node(have: dict[str, int], appliers: dict) -> SimpleNamespace:
    core = SimpleNamespace(vclock_by_uuid=lambda: dict(have))
    return SimpleNamespace(core=core, status="", status_reason="", peers=[], appliers=appliers,
                           set_peers=lambda peers: None, rejoiner=SimpleNamespace(running=False))


def _applier(peer_uuid: str | None, peer_vclock: dict[str, int], greeted: bool = True) -> SimpleNamespace:
    mach = SimpleNamespace(greeting={"uuid": peer_uuid} if greeted else None, peer_uuid=peer_uuid,
                           peer_vclock=peer_vclock)
    return SimpleNamespace(machine=mach)


async def _catch_up(node, theirs, monkeypatch, within_s: float = 2.0) -> bool:
    monkeypatch.setattr(limits, "catch_up_poll_s", 0.01)
    life = Lifecycle.__new__(Lifecycle)
    life.node = node
    try:
        await asyncio.wait_for(life.catch_up(theirs), within_s)
        return True
    except asyncio.TimeoutError:
        return False


async def test_a_newcomer_stops_waiting_for_rows_its_donor_lost_in_a_crash_after_greeting(monkeypatch):
    # the donor greeted with ORIGIN's rows up to 5 (4 and 5 claimed, not written), then crashed:
    # its greeting on our link since says 3, and we hold 3
    node = _node({ORIGIN: 3, DONOR: 2}, {"d:1": _applier(DONOR, {ORIGIN: 3, DONOR: 2})})
    theirs = {"uuid": DONOR, "address": "d:1", "vclock_uuid": {ORIGIN: 5, DONOR: 2}}
    assert await _catch_up(node, theirs, monkeypatch)


async def test_a_newcomer_still_waits_for_what_its_donor_holds(monkeypatch):
    node = _node({ORIGIN: 3}, {"d:1": _applier(DONOR, {ORIGIN: 5})})
    theirs = {"uuid": DONOR, "address": "d:1", "vclock_uuid": {ORIGIN: 5}}
    assert not await _catch_up(node, theirs, monkeypatch, within_s=0.2)
    assert node.status == "catching_up" and "2 rows behind" in node.status_reason


@pytest.mark.parametrize("applier", [_applier("f0000000-0000-4000-8000-000000000003", {ORIGIN: 3}),
                                     _applier(None, {}, greeted=False)], ids=["another peer", "not greeted yet"])
async def test_only_the_donors_own_greeting_lowers_the_target(applier, monkeypatch):
    node = _node({ORIGIN: 3}, {"x:1": applier})
    theirs = {"uuid": DONOR, "address": "d:1", "vclock_uuid": {ORIGIN: 5}}
    assert not await _catch_up(node, theirs, monkeypatch, within_s=0.2)


async def test_a_donor_that_wrote_more_since_does_not_raise_the_target(monkeypatch):
    node = _node({ORIGIN: 5}, {"d:1": _applier(DONOR, {ORIGIN: 9})})
    theirs = {"uuid": DONOR, "address": "d:1", "vclock_uuid": {ORIGIN: 5}}
    assert await _catch_up(node, theirs, monkeypatch)


async def test_a_catch_up_ends_only_once_a_rejoin_attempt_under_way_is_over(monkeypatch):
    """The member it catches up with told it to rejoin (node/rejoin.py may run an attempt while it
    catches up): it goes active only after the attempt, which shows the status meanwhile and puts
    the catch-up's back at its end (tests/integration/test_catch_up_rejoin.py)."""
    node = _node({ORIGIN: 5}, {"d:1": _applier(DONOR, {ORIGIN: 5})})
    node.rejoiner.running = True
    theirs = {"uuid": DONOR, "address": "d:1", "vclock_uuid": {ORIGIN: 5}}
    assert not await _catch_up(node, theirs, monkeypatch, within_s=0.2)
    node.rejoiner.running = False
    assert await _catch_up(node, theirs, monkeypatch)
