"""What the rest of the node sees of an applier (node/applier/upstream.py): counters that only
grow across its links, what each way a link ends does to its status and to the node, the core's
Peer forgotten once when a link ends, and stop() returning only once the task is done. The
node around it is a recording fake; the machines and their NodeCore are real."""
from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from node import limits
from node.applier.outcome import After, END, FATAL, RETRY, after_link
from node.applier.upstream import Upstream
from node.core.link.applier import Followed
from node.errors import PeerRefused, StorageError
from tests.unit.test_link_applier_machine import NOW, UP, following as follow, new_core, put, rows

ADDR = "2.example:1"


class Rejoiner:
    def __init__(self) -> None:
        self.calls: list = []

    def on_need_rejoin(self, address: str, reason: str, collected: dict) -> None:
        self.calls.append(("need", address, collected))

    def on_follow(self, address: str) -> None:
        self.calls.append(("follow", address))

    def on_duplicate(self, address: str) -> None:
        self.calls.append(("duplicate", address))

    def status_of(self, address: str) -> str:
        return "waiting for a donor"

    def going_without(self) -> dict:
        return {}


class Journal:
    pending = 0


class Node:
    def __init__(self) -> None:
        self.core = new_core()
        self.journal = Journal()
        self.rejoiner = Rejoiner()
        self.followers: dict = {}
        self.own_claims: dict = {}
        self.life = SimpleNamespace(advertised={}, moved_from={})
        self.failures: list = []
        self.fatal: BaseException | None = None

    def check_peer_greeting(self, theirs: dict) -> None:
        pass

    def note_failure(self, name: str, e: BaseException) -> None:
        self.failures.append((name, e))

    def on_fatal(self, e: BaseException) -> None:
        self.fatal = e


def following(u: Upstream):
    """A new link of `u` through GREETING and SUBSCRIBED."""
    mach = u.new_machine()
    mach.authenticated = UP
    return follow(mach)


def test_counters_sum_every_link_the_upstream_ran_and_only_grow():
    u = Upstream(Node(), ADDR)
    assert (u.rows, u.messages_decoded, u.lag_s, u.peer_vclock) == (0, 0, 0.0, {})
    mach = following(u)
    mach.step(rows(put(1, 6), put(1, 7)), NOW)
    mach.advance(mach.ready())
    assert (u.rows, u.messages_decoded) == (2, 1)
    mach.stop()
    u.node.core.drop_peer(UP)
    mach = following(u)                  # the next link: the last one's counts go to the totals
    assert (u.rows, u.messages_decoded) == (2, 1)
    mach.step(rows(put(1, 8)), NOW)
    mach.advance(mach.ready())
    assert (u.rows, u.messages_decoded) == (3, 2)
    assert u.info()["messages"] == {"scanned": 0, "decoded": 2}


def test_info_shows_the_links_peer_its_id_map_and_status():
    u = Upstream(Node(), ADDR)
    following(u)
    u.followed(Followed(UP, {}, False))
    info = u.info()
    assert (info["uuid"], info["address"], info["status"], info["error"]) == (UP, ADDR, "follow", "")
    assert info["id_map"] == {"1": 2, "2": 1, "3": 3}        # OTHER registered here as 3 by the greeting
    assert info["without"] == []


def test_info_shows_what_a_link_goes_without_from_its_first_moment():
    u = Upstream(Node(), ADDR)
    assert u.info()["without"] == []
    u.new_machine()                       # not greeted yet
    assert u.info()["without"] == []
    gone = "00000000-0000-4000-8000-0000000000aa"
    u.node.rejoiner.going_without = lambda: {gone: 3}
    following(u)
    assert u.info()["without"] == [gone]


def test_following_clears_the_error_and_tells_the_rejoiner(caplog):
    u = Upstream(Node(), ADDR)
    u.status, u.error = "disconnected", "reset"
    with caplog.at_level(logging.INFO, "replog.applier"):
        u.followed(Followed(UP, {1: 5}, True))
    assert (u.status, u.error) == ("follow", "") and u.node.rejoiner.calls == [("follow", ADDR)]
    assert "this node's own rows only" in caplog.text


def test_a_retried_end_sets_the_status_logs_why_and_forgets_the_links_peer(caplog):
    u = Upstream(Node(), ADDR)
    following(u)
    e = ConnectionResetError("reset")
    with caplog.at_level(logging.INFO, "replog.applier"):
        assert u.ended(e, after_link(e, 1.0)) is True
    assert (u.status, u.error) == ("disconnected", "reset") and f"applier {ADDR}: reset" in caplog.text
    assert UP not in u.node.core.peers and u.machine.core_peer is None


def test_a_clean_end_keeps_the_status_and_says_nothing(caplog):
    u = Upstream(Node(), ADDR)
    u.status = "follow"
    with caplog.at_level(logging.DEBUG, "replog.applier"):
        assert u.ended(None, after_link(None, 1.0)) is True
    assert u.status == "follow" and caplog.text == ""


def test_need_rejoin_tells_the_rejoiner_what_was_collected_and_shows_its_status():
    u = Upstream(Node(), ADDR)
    e = PeerRefused("need_rejoin", "collected")
    e.needed = {UP: 9}
    assert u.ended(e, after_link(e, 1.0)) is True
    assert u.node.rejoiner.calls == [("need", ADDR, {UP: 9})]
    assert (u.status, u.error) == ("need_rejoin", "waiting for a donor")


def test_a_second_address_of_a_followed_member_tells_the_rejoiner_its_need_is_over():
    """The member's other link speaks for it now (full+replace seed 203435: a need kept from
    the refused address paused writes for a cover wait on every attempt, for ever)."""
    u = Upstream(Node(), ADDR)
    e = PeerRefused("duplicate", f"{ADDR} is {UP}, already followed through 3.example:1")
    assert u.ended(e, after_link(e, 1.0)) is True
    assert u.node.rejoiner.calls == [("duplicate", ADDR)] and u.status == "duplicate"


def test_the_disk_failing_stops_the_node_and_no_further_link_runs():
    u = Upstream(Node(), ADDR)
    following(u)
    e = StorageError("EIO")
    nxt = after_link(e, 1.0)
    assert nxt.then == FATAL and u.ended(e, nxt) is False
    assert u.node.fatal is e and u.status == "failed"


def test_a_bug_ends_this_upstream_only_reported_to_the_node_with_its_peer_forgotten():
    u = Upstream(Node(), ADDR)
    following(u)
    e = KeyError("oops")
    nxt = after_link(e, 1.0)
    assert nxt.then == END and u.ended(e, nxt) is False
    assert u.node.failures == [(f"applier {ADDR}", e)] and u.node.fatal is None
    assert (u.status, UP in u.node.core.peers) == ("failed", False)


def test_the_cores_peer_is_dropped_once_and_never_a_newer_links():
    u = Upstream(Node(), ADDR)
    old = following(u)
    u.drop_peer()
    core = u.node.core
    newer = core.peers[UP] = object()       # another link to the member greeted since
    old.core_peer = object()
    u.drop_peer()
    assert core.peers[UP] is newer
    assert u.ended(None, After(RETRY, None, "", 0.0)) and core.peers[UP] is newer


async def test_stop_returns_only_once_the_task_is_done_cancelling_it_until_it_is(monkeypatch):
    monkeypatch.setattr(limits, "link_close_timeout_s", 0.05)
    u = Upstream(Node(), ADDR)
    cancels = 0

    async def stubborn():
        nonlocal cancels
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancels += 1
                if cancels == 2:
                    raise                     # the first cancel was swallowed (a lost cancel)

    u.task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(u.stop(), 5)
    assert u.task.done() and cancels == 2 and u.stopping and u.status == "stopped"
