"""A link that goes silent is a link that broke, not a refusal (node/applier/outcome.py), on a
real node in this process (real LMDB, real sockets) and a peer played by
tests/integration/fakepeer.py. Found by the secure nemesis (seed 48, session 42): a relay that
heard nothing from a subscriber for `peer_timeout_s` (that node had been stopped with SIGSTOP)
ended the link with ERROR `protocol`, and the subscriber, resumed, took that code for a lasting
refusal: `ERROR applier ...: refused: protocol: ...: no message for 10 s`, and
`refused_backoff_s` (10 s) before it followed that peer again. The relay now answers `silent`,
which the applier retries as a broken link: within the backoff, said as a WARNING."""
from __future__ import annotations

import asyncio
import logging

import pytest

from node import limits
from node.applier.conn import Conn
from node.errors import PeerRefused, PeerSilent
from tests.integration.fakepeer import FakePeer
from tests.unit.test_dashboard_http import open_node  # noqa: F401 - the fixture `node` takes
from tests.waiting import until


@pytest.fixture
def node(open_node):
    """A real node in this process, no token (tests/unit/test_dashboard_http.py's)."""
    return open_node


@pytest.fixture
async def peer(node):
    p = await FakePeer(node.cfg.secret).start()
    await p.introduce(node.cfg.listen)
    yield p
    await p.close()


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_relay_ends_a_subscriber_that_says_nothing_with_silent_after_the_peer_timeout(
        node, peer, monkeypatch, caplog):
    monkeypatch.setattr(limits, "peer_timeout_s", 1.5)
    caplog.set_level(logging.INFO, logger="replog")
    t0 = asyncio.get_running_loop().time()
    names, ended = await peer.listen(node.cfg.listen)
    waited = asyncio.get_running_loop().time() - t0
    assert names[0] == "SUBSCRIBED" and "HEARTBEAT" in names, names
    assert isinstance(ended, PeerRefused) and ended.code == "silent", repr(ended)
    assert "no message for" in ended.message
    assert waited >= limits.peer_timeout_s, "ended before the subscriber was silent for the timeout"
    assert errors(caplog) == []
    assert any("relay: link to" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)


async def test_an_applier_whose_upstream_ends_the_link_as_silent_tries_again_within_the_backoff(
        node, peer, caplog):
    """A lasting refusal would wait `refused_backoff_s` (10 s, jittered to at least 5 s) between
    tries: three subscriptions in less than that are retries of a broken link."""
    peer.ending = ("silent", f"{node.cfg.listen}: no message for 10 s")
    caplog.set_level(logging.INFO, logger="replog")
    node.set_peers([peer.address])
    await until(lambda: peer.subscribes >= 3, 0.5 * limits.refused_backoff_s - 0.5,
                "three subscriptions, each ended as silent")
    assert errors(caplog) == []
    said = [r for r in caplog.records if "silent: " in r.getMessage()]
    assert said and all(r.levelno == logging.WARNING for r in said), [r.getMessage() for r in said]
    assert node.appliers[peer.address].status != "refused"


class _Quiet:
    """A WebSocket that never delivers a message."""

    async def receive(self):
        await asyncio.Event().wait()


async def test_a_receive_that_waits_past_its_bound_raises_peer_silent():
    with pytest.raises(PeerSilent, match="no message for"):
        await Conn(_Quiet(), "peer").recv(0.05)
