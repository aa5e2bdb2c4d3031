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


async def _finished_as_aiohttp_does(resp: web.StreamResponse, request) -> None:
    """What aiohttp's server does with a handler's answer (web_protocol.finish_response):
    prepare it and write its end, taking a ConnectionError as the client gone. Anything else
    raised here is logged by aiohttp as an unhandled exception, with its traceback."""
    try:
        await resp.prepare(request)
        await resp.write_eof()
    except ConnectionError:
        pass


def _host() -> SimpleNamespace:
    return SimpleNamespace(link_guard=LinkGuard(), links=set(), status="running",
                           cfg=SimpleNamespace(tls_client_auth=False, secret=b"s" * 32), uuid="u")


class _ClosingWriter:
    """The payload writer of a connection the peer has just dropped: aiohttp's own raises this
    on the first write (http_writer.py)."""

    def __init__(self) -> None:
        self.transport = None

    async def write_headers(self, status_line, headers) -> None:
        pass

    def send_headers(self) -> None:
        raise ClientConnectionResetError("Cannot write to closing transport")

    async def write(self, data) -> None:
        raise ClientConnectionResetError("Cannot write to closing transport")

    async def write_eof(self, data=b"") -> None:
        raise ClientConnectionResetError("Cannot write to closing transport")

    async def drain(self) -> None:
        pass


async def test_a_peer_gone_during_the_upgrade_is_a_logged_reason_and_a_released_handshake(caplog):
    host = _host()
    request = make_mocked_request("GET", "/v1/replication", headers=UPGRADE, writer=_ClosingWriter())
    with caplog.at_level(logging.INFO, logger="replog.relay"):
        resp = await handle_replication(host, request)
    await _finished_as_aiohttp_does(resp, request)
    assert host.link_guard.gate.total == 0 and host.link_guard.gate.by_address == {}, "handshake released"
    assert host.links == set()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "relay: a link from ? went away while its upgrade was answered: Cannot write to closing transport")]
    assert host.link_guard.failures.failures == 0          # not an authentication failure (/metrics)


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
