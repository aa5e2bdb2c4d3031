"""The WebSocket message limit before and after authentication (node/applier/ws_limit.py),
pinned to the installed aiohttp: both sides read only pre-auth sized messages until the
handshake succeeds, then whole replication messages, and never negotiate compression.

The link is the production one: node.applier.conn's connect / client_auth / server_auth over
a real aiohttp server on 127.0.0.1."""
from __future__ import annotations

import asyncio
import os

import aiohttp
import pytest
from aiohttp import web

from node import limits
from node.applier.conn import LINK_MESSAGE_BYTES_MAX, Conn, client_auth, connect, server_auth
from node.applier.ws_limit import reader_limit
from node.core import messages as m
from node.core import session as sess
from node.errors import RemoteProtocolError

SECRET = b"s3cret"
S_UUID, C_UUID = "5e1f0000-0000-4000-8000-00000000000a", "c11e0000-0000-4000-8000-00000000000b"
BIG = limits.message_bytes_max        # the largest replication message, plus its tag below


class Server:
    """A relay that authenticates, then echoes each message's length back (sealed)."""

    def __init__(self, pre_auth: bytes | None = None):
        self.pre_auth = pre_auth          # raw bytes the relay sends instead of HELLO
        self.outcome: asyncio.Future = asyncio.get_running_loop().create_future()
        self.extensions: str | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=reader_limit(limits.preauth_message_bytes_max), compress=False)
        await ws.prepare(request)
        self.extensions = ws.headers.get("Sec-WebSocket-Extensions")
        conn = Conn(ws, "client")
        try:
            if self.pre_auth is not None:
                await ws.send_bytes(self.pre_auth)
                await ws.receive(timeout=5)
                return ws
            await server_auth(conn, SECRET, S_UUID)
            while True:
                msg = await conn.recv(timeout=10)
                await conn.send(m.HEARTBEAT, now_us=msg["now_us"])
        except (RemoteProtocolError, ConnectionError) as e:
            if not self.outcome.done():
                self.outcome.set_result(e)
        finally:
            await conn.close()
        return ws


async def serve(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/v1/replication", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"127.0.0.1:{port}"


async def test_before_auth_the_relay_reads_a_message_of_exactly_the_pre_auth_limit_and_refuses_one_byte_more():
    srv = Server()
    runner, address = await serve(srv.handle)
    try:
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(f"http://{address}/v1/replication", max_msg_size=BIG)
            await ws.receive(timeout=5)                                  # HELLO
            await ws.send_bytes(b"\x00" * limits.preauth_message_bytes_max)   # exactly the limit: read
            e = await asyncio.wait_for(srv.outcome, 10)
            assert isinstance(e, RemoteProtocolError) and "undecodable" in str(e), e
            srv.outcome = asyncio.get_running_loop().create_future()
            ws = await session.ws_connect(f"http://{address}/v1/replication", max_msg_size=BIG)
            await ws.receive(timeout=5)
            await ws.send_bytes(b"\x00" * (limits.preauth_message_bytes_max + 1))
            e = await asyncio.wait_for(srv.outcome, 10)
            assert isinstance(e, RemoteProtocolError) and "size" in str(e).lower(), e
            msg = await ws.receive(timeout=5)          # aiohttp's reader closes with "message too big"
            assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, aiohttp.WSCloseCode.MESSAGE_TOO_BIG)
            await ws.close()
    finally:
        await runner.cleanup()


async def test_after_auth_whole_replication_messages_pass_both_ways():
    srv = Server()
    runner, address = await serve(srv.handle)
    try:
        async with aiohttp.ClientSession() as session:
            conn = await connect(session, address)
            await client_auth(conn, SECRET, C_UUID)
            assert conn.session.peer_uuid == S_UUID
            # A message of exactly message_bytes_max (before its tag) each way: a HEARTBEAT whose
            # padding field makes it that long.
            pad = BIG - len(m.encode(m.HEARTBEAT, now_us=7, pad=b"")) - 3   # bin32's head is 3 bytes longer
            big = m.encode(m.HEARTBEAT, now_us=7, pad=b"x" * pad)
            assert len(big) == BIG and LINK_MESSAGE_BYTES_MAX == BIG + sess.TAG_BYTES
            await conn.ws.send_bytes(conn.session.seal(big))
            back = await conn.recv(timeout=20)
            assert back.type == m.HEARTBEAT and back["now_us"] == 7
            await conn.close()
    finally:
        await runner.cleanup()


async def test_before_auth_the_applier_refuses_a_large_hello_without_decoding_it():
    srv = Server(pre_auth=m.encode(m.HELLO, version=m.PROTOCOL_VERSION, nonce=os.urandom(32),
                                   uuid="x", pad=b"\x80" * (4 * limits.preauth_message_bytes_max)))
    runner, address = await serve(srv.handle)
    try:
        async with aiohttp.ClientSession() as session:
            conn = await connect(session, address)
            with pytest.raises(RemoteProtocolError):
                await client_auth(conn, SECRET, C_UUID)
            await conn.close()
    finally:
        await runner.cleanup()


async def test_a_client_offering_compression_gets_none():
    srv = Server()
    runner, address = await serve(srv.handle)
    try:
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(f"http://{address}/v1/replication", compress=15)
            await ws.receive(timeout=5)
            assert srv.extensions is None and ws.compress == 0
            await ws.close()
    finally:
        await runner.cleanup()
