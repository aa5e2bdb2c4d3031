"""Accepting an inbound replication link (`GET /v1/replication`): everything a node does for a
peer that has not proven the cluster secret yet.

Order: with tls_client_auth, refuse (403) a TLS connection that presented no client
certificate -> count the handshake (refused with 503 before the upgrade when too many are in flight,
in total or from the remote address) -> upgrade to a WebSocket without compression and with
the pre-auth message limit -> authenticate (node/applier/conn.py: server_auth, which raises the
limit once the peer has proven the secret) -> hand the sealed link to the relay
(node/applier/relay.py: serve_link).

Rules kept here:
- Before auth nothing larger than `preauth_message_bytes_max` is read and nothing is inflated;
  the wait for AUTH is bounded by `handshake_timeout_s`.
- Every handshake admitted is released exactly once, when auth succeeds or fails (or the peer
  goes before the upgrade is answered: a reason logged, no traceback).
- An unauthenticated peer's failures are logged through LinkGuard: one WARNING per remote
  address per `auth_failure_log_interval_s`, carrying the count of those not logged. A peer
  that goes away while its upgrade is answered (killed mid-connect) failed nothing: one INFO
  line, rate-limited the same way, and it is not counted as a failure.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from aiohttp import web

from node import limits
from node.applier.conn import Conn, server_auth
from node.applier.relay import serve_link
from node.applier.ws_limit import reader_limit
from node.core.admission import FailureLog, HandshakeGate
from node.errors import PeerRefused, PeerSilent, RemoteProtocolError

if TYPE_CHECKING:
    from node.process.ports import AcceptHost

log = logging.getLogger("replog.relay")


class LinkGuard:
    """One node's bounds on unauthenticated links, and their rate-limited log."""

    def __init__(self) -> None:
        self.gate = HandshakeGate(limits.handshakes_in_flight_max, limits.handshakes_per_address_max)
        self.failures = FailureLog(limits.auth_failure_log_interval_s, limits.auth_failure_addresses_max)
        self.gone = FailureLog(limits.auth_failure_log_interval_s, limits.auth_failure_addresses_max)

    def note_failure(self, remote: str, why: str) -> None:
        show, suppressed = self.failures.note(remote, time.monotonic())
        if show:
            more = (f" ({suppressed} more from this address since the last such line were not logged)"
                    if suppressed else "")
            log.warning("relay: refused an unauthenticated link from %s: %s%s", remote, why, more)

    def note_gone(self, remote: str, why: str) -> None:
        show, suppressed = self.gone.note(remote, time.monotonic())
        if show:
            more = f" ({suppressed} more from this address since the last such line)" if suppressed else ""
            log.info("relay: a link from %s went away while its upgrade was answered: %s%s", remote, why, more)


async def handle_replication(node: "AcceptHost", request: web.Request) -> web.StreamResponse:
    guard: LinkGuard = node.link_guard
    remote = request.remote or "?"
    transport = request.transport
    if node.cfg.tls_client_auth and not (transport and transport.get_extra_info("peercert")):
        # The TLS layer verified any certificate presented (node/tls.py); links must present one.
        why = "replication links must present a client certificate signed by tls_ca_file (tls_client_auth)"
        guard.note_failure(remote, why)
        return web.json_response({"error": {"code": "client_certificate", "message": why}}, status=403)
    why = guard.gate.admit(remote)
    if why is not None:
        guard.note_failure(remote, f"handshake refused: {why}")
        return web.json_response({"error": {"code": "busy", "message": why}}, status=503)
    admitted = True
    ws = web.WebSocketResponse(max_msg_size=reader_limit(limits.preauth_message_bytes_max), autoping=True,
                               timeout=limits.link_close_timeout_s, compress=False)
    conn = Conn(ws, remote)
    try:
        try:
            await ws.prepare(request)
        except ConnectionError as e:                # gone while its upgrade was answered
            guard.note_gone(remote, str(e) or type(e).__name__)
            # Not `ws`: aiohttp finishes what the handler returns, and a WebSocketResponse
            # whose prepare failed raises RuntimeError there. A plain answer's write fails
            # with ConnectionError, which aiohttp takes quietly as a client gone.
            return web.Response(status=400)
        if node.status in ("stopping", "stopped"):   # stop() has closed the links it knew of
            await conn.refuse("not_ready", "this node is shutting down")
            return ws
        if node.links_refused is not None:           # the store is being swapped (no await from here to add)
            await conn.refuse("not_ready", node.links_refused)
            return ws
        node.links.add(conn)
        try:
            await server_auth(conn, node.cfg.secret, node.uuid)
        except (PeerRefused, RemoteProtocolError, ConnectionError, asyncio.TimeoutError) as e:
            guard.note_failure(remote, str(e) or type(e).__name__)
            if isinstance(e, RemoteProtocolError):   # a handshake that went silent broke; it was not bad bytes
                await conn.refuse("silent" if isinstance(e, PeerSilent) else "protocol", str(e))
            return ws
        finally:
            guard.gate.release(remote)
            admitted = False
        await serve_link(node, conn)
    finally:
        if admitted:
            guard.gate.release(remote)
        node.links.discard(conn)
        await conn.close()
    return ws
