"""One replication link over a WebSocket, and the authentication + greeting handshake
both sides run before anything else is read or sent.

The handshake is symmetric in shape: the relay (server) sends HELLO with a nonce; the
applier (client) proves it knows the cluster secret; the relay proves it too; then both
exchange greetings. Checks that refuse a peer raise PeerRefused (logged, retried slowly);
malformed input raises RemoteProtocolError (retried with backoff)."""
from __future__ import annotations

import asyncio
import os
from typing import Any, Callable

import aiohttp
from aiohttp import web

from node import limits
from node.core import messages as m
from node.errors import PeerRefused, RemoteProtocolError
from node.identity.signature import first_mismatch


class Conn:
    """A WebSocket carrying replication messages (either side)."""

    def __init__(self, ws: web.WebSocketResponse | aiohttp.ClientWebSocketResponse, peer: str):
        self.ws = ws
        self.peer = peer
        self.bytes_in = 0
        self.bytes_out = 0
        # an applier's link: ROWS messages the scanner takes arrive as {"scan": ...}
        self.scan_rows: Callable[[bytes], Any] | None = None

    async def send(self, mtype: int, **body: Any) -> None:
        data = m.encode(mtype, **body)
        self.bytes_out += len(data)
        await self.ws.send_bytes(data)

    async def send_raw(self, data: bytes) -> None:
        self.bytes_out += len(data)
        await self.ws.send_bytes(data)

    async def recv(self, timeout: float = limits.peer_timeout_s) -> m.Message:
        try:
            msg = await asyncio.wait_for(self.ws.receive(), timeout)
        except asyncio.TimeoutError:
            raise RemoteProtocolError(f"{self.peer}: no message for {timeout:.0f} s") from None
        if msg.type == aiohttp.WSMsgType.BINARY:
            self.bytes_in += len(msg.data)
            out = m.decode(msg.data, self.scan_rows)
            if out.type == m.ERROR:
                refused = PeerRefused(out["code"], out["message"])
                refused.body = out.body     # extra fields, e.g. next_id of a register_rejected
                raise refused
            return out
        if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
            raise RemoteProtocolError(f"{self.peer}: connection closed")
        if msg.type == aiohttp.WSMsgType.ERROR:
            raise RemoteProtocolError(f"{self.peer}: {self.ws.exception()}")
        raise RemoteProtocolError(f"{self.peer}: unexpected {msg.type.name} message")

    async def expect(self, *types: int, timeout: float = limits.peer_timeout_s) -> m.Message:
        msg = await self.recv(timeout)
        if msg.type not in types:
            want = "/".join(m.NAMES[t] for t in types)
            raise RemoteProtocolError(f"{self.peer}: expected {want}, got {msg.name}")
        return msg

    async def refuse(self, code: str, message: str) -> None:
        try:
            await self.send(m.ERROR, code=code, message=message)
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            pass

    async def close(self) -> None:
        try:
            await self.ws.close()
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            pass


async def server_auth(conn: Conn, secret: bytes) -> None:
    nonce = os.urandom(32)
    await conn.send(m.HELLO, version=m.PROTOCOL_VERSION, nonce=nonce)
    msg = await conn.expect(m.AUTH, timeout=limits.handshake_timeout_s)
    if not m.auth_ok(secret, b"client", nonce, msg["nonce"], msg["mac"]):
        await conn.refuse("auth", "wrong cluster secret")
        raise PeerRefused("auth", f"{conn.peer} failed authentication (wrong cluster secret)")
    await conn.send(m.AUTH_OK, mac=m.auth_mac(secret, b"server", msg["nonce"], nonce))


async def client_auth(conn: Conn, secret: bytes) -> None:
    hello = await conn.expect(m.HELLO, timeout=limits.handshake_timeout_s)
    if hello["version"] != m.PROTOCOL_VERSION:
        raise PeerRefused("version", f"{conn.peer} speaks protocol {hello['version']}, we speak {m.PROTOCOL_VERSION}")
    nonce = os.urandom(32)
    await conn.send(m.AUTH, nonce=nonce, mac=m.auth_mac(secret, b"client", hello["nonce"], nonce))
    ok = await conn.expect(m.AUTH_OK, timeout=limits.handshake_timeout_s)
    if not m.auth_ok(secret, b"server", nonce, hello["nonce"], ok["mac"]):
        raise PeerRefused("auth", f"{conn.peer} does not know the cluster secret")


def check_greeting(mine: dict, theirs: dict, peer: str) -> None:
    """Lasting reasons to refuse a peer, from either side's point of view."""
    if theirs["uuid"] == mine["uuid"]:
        raise PeerRefused("self", f"{peer} is this node itself (uuid {mine['uuid']})")
    if mine["cluster_uuid"] and theirs["cluster_uuid"] and mine["cluster_uuid"] != theirs["cluster_uuid"]:
        raise PeerRefused("wrong_cluster", f"{peer} belongs to cluster {theirs['cluster_uuid']}, "
                          f"this node to {mine['cluster_uuid']} (wrong store)")
    if mine["cluster_name"] != theirs["cluster_name"]:
        raise PeerRefused("cluster_name", f"{peer} has cluster_name {theirs['cluster_name']!r}, "
                          f"this node {mine['cluster_name']!r}")
    if mine["options_digest"] != theirs["options_digest"]:
        ours, others = mine.get("options") or {}, theirs.get("options") or {}
        if not isinstance(others, dict):
            others = {}
        name = first_mismatch(ours, others)
        if name is None:
            raise PeerRefused("options", f"{peer} has different must-match options (digest "
                              f"{theirs['options_digest']}, this node {mine['options_digest']})")
        raise PeerRefused("options", f"{peer} has different must-match options: {name} is {others.get(name)!r} "
                          f"there, {ours.get(name)!r} here")


async def connect(session: aiohttp.ClientSession, address: str) -> Conn:
    url = f"http://{address}/v1/replication"
    try:
        ws = await session.ws_connect(url, max_msg_size=limits.message_bytes_max, autoping=True,
                                      timeout=aiohttp.ClientWSTimeout(ws_close=limits.link_close_timeout_s),
                                      compress=0)
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        raise ConnectionError(f"cannot connect to {address}: {e}") from None
    return Conn(ws, address)
