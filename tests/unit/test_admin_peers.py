"""`PUT /v1/admin/peers` on a real node (in this process, real LMDB, real sockets): removing a
peer answers once its applier has stopped, and always within a client's request timeout — it
waited exactly that timeout before, so an applier slow to stop (or one whose cancel was lost:
tests/unit/test_cancellation.py) turned into a client-side TimeoutError with no answer."""
from __future__ import annotations

import asyncio
import time

import aiohttp

from node import limits
from node.applier.applier import Applier
from tests.integration.harness import silent_address
from tests.unit.test_dashboard_http import open_node as node  # noqa: F401 (a fixture: a node without a token)


async def _set_peers(node, peers: list[str]) -> tuple[int, dict, float]:
    started = time.monotonic()
    async with aiohttp.ClientSession() as http, \
            http.put(f"http://{node.cfg.address}/v1/admin/peers", json={"peers": peers}) as r:
        return r.status, await r.json(), time.monotonic() - started


async def test_removing_a_peer_answers_once_its_applier_has_stopped(node):
    with silent_address() as peer:                # nobody listens there: the applier keeps retrying
        assert (await _set_peers(node, [peer]))[:2] == (200, {"peers": [peer], "stopping": []})
        applier = node.appliers[peer]
        status, body, _ = await _set_peers(node, [])
        assert (status, body) == (200, {"peers": [], "stopping": []})
        assert applier.task.done() and applier.status == "stopped"


async def test_removing_a_peer_whose_applier_does_not_stop_answers_within_the_bound_and_names_it(node, monkeypatch):
    with silent_address() as peer:                # nobody listens there
        await _set_peers(node, [peer])
        applier = node.appliers[peer]
        release = asyncio.Event()

        async def stuck(self):                         # a stop that does not finish in time
            await release.wait()
        monkeypatch.setattr(Applier, "stop", stuck)
        try:
            status, body, took = await _set_peers(node, [])
            assert (status, body) == (200, {"peers": [], "stopping": [peer]})
            assert limits.peers_stop_wait_s <= took < limits.client_request_timeout_s, took
        finally:
            release.set()
            monkeypatch.undo()
            await applier.stop()
