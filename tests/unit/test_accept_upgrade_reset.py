"""node/applier/accept.py: a peer that goes away while its WebSocket upgrade is being answered
(killed mid-connect: the nemesis run of tests/integration/nemesis.py met it) is a logged reason
and a released handshake, not a traceback out of the handler."""
from __future__ import annotations

import logging
from types import SimpleNamespace

from aiohttp import web
from aiohttp.client_exceptions import ClientConnectionResetError
from aiohttp.test_utils import make_mocked_request

from node.applier.accept import LinkGuard, handle_replication

UPGRADE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
           "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}


def _host() -> SimpleNamespace:
    return SimpleNamespace(link_guard=LinkGuard(), links=set(), status="running",
                           cfg=SimpleNamespace(tls_client_auth=False, secret=b"s" * 32), uuid="u")


async def test_a_peer_gone_during_the_upgrade_is_a_logged_reason_and_a_released_handshake(monkeypatch, caplog):
    async def reset(self, request):
        raise ClientConnectionResetError("Cannot write to closing transport")
    monkeypatch.setattr(web.WebSocketResponse, "prepare", reset)
    host = _host()
    with caplog.at_level(logging.WARNING, logger="replog.relay"):
        ws = await handle_replication(host, make_mocked_request("GET", "/v1/replication", headers=UPGRADE))
    assert isinstance(ws, web.WebSocketResponse)
    assert host.link_guard.gate.total == 0 and host.link_guard.gate.by_address == {}, "handshake released"
    assert host.links == set()
    assert [r.getMessage() for r in caplog.records] == [
        "relay: refused an unauthenticated link from ?: closed during the upgrade: "
        "Cannot write to closing transport"]


async def test_other_errors_of_the_upgrade_still_propagate(monkeypatch):
    async def broken(self, request):
        raise RuntimeError("a bug")
    monkeypatch.setattr(web.WebSocketResponse, "prepare", broken)
    host = _host()
    try:
        await handle_replication(host, make_mocked_request("GET", "/v1/replication", headers=UPGRADE))
    except RuntimeError as e:
        assert str(e) == "a bug"
    else:
        raise AssertionError("a bug in the upgrade was swallowed")
    assert host.link_guard.gate.total == 0, "the handshake is released on every path"
