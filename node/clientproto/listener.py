"""The binary client protocol's TCP listener: one asyncio.Protocol per connection, feeding
node/clientproto/session.py. It listens on `client_listen` (by default the HTTP port +
client_port_offset, limits.py), with the node's TLS when tls_cert_file is set.

Why a port of its own rather than a WebSocket endpoint on the HTTP port: measured on this
project's machine (docs/client.md, "Why a TCP port"), aiohttp's WebSocket path costs far more
CPU per frame than a bare asyncio.Protocol, which is most of what a pipelined client pays.

Rules kept here:
- open connections are capped (http_connections_max, the HTTP listener's bound); past it a new
  connection is closed at once;
- a frame's length is read first and checked against the frame bound in force (the small
  HELLO bound until the connection is authenticated); a frame past it is answered and closed;
- with a token, a connection that has not authenticated within client_hello_timeout_s is closed;
- a frame must arrive whole within http_body_timeout_s of its first byte (as an HTTP body must),
  or the connection is answered 408 and closed: a half-sent frame holds its buffer no longer;
- anything raised while handling a frame that is not the client's fault is logged as a bug with
  its traceback, answered 500 and the connection closed: the node serves on."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING
import logging

from node import limits
from node.clientproto import wire
from node.clientproto.session import Session

if TYPE_CHECKING:
    from node.process.ports import ClientHost

log = logging.getLogger("replog.client")


class ClientProtocol(asyncio.Protocol):
    def __init__(self, server: "ClientServer"):
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.reader: wire.FrameReader | None = None
        self._hello_timer: asyncio.TimerHandle | None = None
        self._frame_timer: asyncio.TimerHandle | None = None   # a frame begun, not yet whole

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport                      # type: ignore[assignment]
        srv = self.server
        if len(srv.connections) >= srv.cap:
            srv.refused += 1
            transport.close()
            return
        srv.connections.add(self)
        transport.set_write_buffer_limits(high=limits.client_send_buffer_bytes_max)   # type: ignore[attr-defined]
        self.session = Session(srv.node, transport.write, transport.close, self._pause)  # type: ignore[attr-defined]
        authed = self.session.authed
        self.reader = wire.FrameReader(limits.client_frame_bytes_max if authed else limits.client_hello_bytes_max)
        if not authed:
            self._hello_timer = asyncio.get_running_loop().call_later(limits.client_hello_timeout_s, self._no_hello)

    def _no_hello(self) -> None:
        if self.session is not None and not self.session.authed:
            self.session.refuse(401, "unauthorized", f"no HELLO with the client token within "
                                                     f"{limits.client_hello_timeout_s:g} s")

    def _pause(self, pause: bool) -> None:
        if self.transport is not None and not self.transport.is_closing():
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        session, reader = self.session, self.reader
        if session is None or session.closed:
            return
        try:
            for p in reader.frames(data):                           # type: ignore[union-attr]
                authed = session.authed
                try:
                    session.on_payload(p)
                except Exception as e:  # noqa: BLE001 - the one place a bug in handling a frame is mapped
                    log.error("client connection: handling a frame failed (a bug; the node serves on): %s: %s",
                              type(e).__name__, e, exc_info=e)
                    self.server.failures += 1
                    session.refuse(500, "internal", f"{type(e).__name__}: {e}")
                if session.closed:
                    return
                if session.authed and not authed:                   # HELLO passed: frames may be large now
                    reader.max_bytes = limits.client_frame_bytes_max   # type: ignore[union-attr]
                    if self._hello_timer is not None:
                        self._hello_timer.cancel()
        except wire.ProtocolError as e:
            session.refuse(e.status, e.code, e.message)
            return
        partial = reader.buffered > 0                              # type: ignore[union-attr]
        if partial and self._frame_timer is None:
            self._frame_timer = asyncio.get_running_loop().call_later(limits.http_body_timeout_s, self._slow_frame,
                                                                      session.frames_read)
        elif not partial and self._frame_timer is not None:
            self._frame_timer.cancel()
            self._frame_timer = None

    def _slow_frame(self, frames_read: int) -> None:
        """A frame begun http_body_timeout_s ago: refused if none came whole since (and the node
        was not the one holding it back by not reading); else watched for another period."""
        self._frame_timer = None
        s, reader = self.session, self.reader
        if s is None or s.closed or reader is None or not reader.buffered:
            return
        if s.frames_read == frames_read and not (s.paused_reads or s.send_paused):
            s.refuse(408, "frame_timeout", f"a frame did not arrive whole within {limits.http_body_timeout_s:g} s")
            return
        self._frame_timer = asyncio.get_running_loop().call_later(limits.http_body_timeout_s, self._slow_frame,
                                                                  s.frames_read)

    def pause_writing(self) -> None:
        if self.session is not None:
            self.session.send_paused = True
            self._pause(True)

    def resume_writing(self) -> None:
        if self.session is not None:
            self.session.send_paused = False
            if not self.session.paused_reads:
                self._pause(False)

    def eof_received(self) -> bool:
        return False            # close our side too

    def connection_lost(self, exc: BaseException | None) -> None:
        self.server.connections.discard(self)
        for timer in (self._hello_timer, self._frame_timer):
            if timer is not None:
                timer.cancel()
        if self.session is not None:
            self.session.lost()


class ClientServer:
    """The listener and its open connections."""

    def __init__(self, node: "ClientHost"):
        self.node = node
        self.connections: set[ClientProtocol] = set()
        self.cap = limits.http_connections_max
        self.refused = 0
        self.failures = 0
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int, ssl_context=None) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: ClientProtocol(self), host, port, ssl=ssl_context,
                                               reuse_address=True, backlog=limits.client_accept_backlog)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.close()
        if self.server is not None:
            await self.server.wait_closed()
