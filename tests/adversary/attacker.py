"""An attacker on the network, for tests: what it runs against real `replog serve` processes.

- `RawLink`: a WebSocket client on bare asyncio streams that sends any frame it likes
  (compressed or not, any length, whether or not compression was agreed), for the pre-auth
  surface.
- `RelayInTheMiddle`: a server a real member's applier connects to (a stale peer address, a
  reused IP); it forwards the member's handshake to a victim node and then tries to talk to
  the victim on the member's authentication.
- `Listener`: a server registered as a member of the cluster (anyone holding the cluster secret
  can register any address); it records every byte a node sends it.
- `register_member` / `greeting`: a peer that holds the secret, on the production handshake
  (node.applier.conn), telling a node whatever it likes in its greeting.
- `rss_kib` / `HealthSampler`: what an attack costs the node, read from outside it (the health
  latencies from a process of their own, so the attacker's CPU and GIL never count as the node's).

Everything here talks to 127.0.0.1 only and is stopped by the test that started it."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import re
import multiprocessing
import struct
import time
import urllib.request
import zlib

import aiohttp
from aiohttp import web

from node.applier.conn import client_auth, connect
from node.config import Config
from node.core import messages as m
from node.core import session as sess

# --- raw WebSocket frames --------------------------------------------------------------------


class RawLink:
    """A WebSocket client that sends frames as it is told, agreed or not."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int, headers: str):
        self.reader, self.writer, self.status, self.headers = reader, writer, status, headers

    @classmethod
    async def open(cls, host: str, port: int, *, deflate: bool = False) -> "RawLink":
        reader, writer = await asyncio.open_connection(host, port)
        key = base64.b64encode(os.urandom(16)).decode()
        ext = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n" if deflate else ""
        writer.write((f"GET /v1/replication HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                      f"{ext}\r\n").encode())
        await writer.drain()
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode("latin-1")
        return cls(reader, writer, int(head.split(" ", 2)[1]), head)

    def send(self, payload: bytes, *, compressed: bool = False, opcode: int = 2) -> None:
        """One masked frame; `compressed` sets RSV1 (permessage-deflate) whatever was agreed."""
        first = 0x80 | (0x40 if compressed else 0) | opcode
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", first, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", first, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", first, 0x80 | 127, n)
        mask = os.urandom(4)
        self.writer.write(head + mask + _masked(payload, mask))

    async def drain(self) -> None:
        await self.writer.drain()

    async def frames(self, timeout: float = 10.0) -> list[tuple[int, bytes]]:
        """(opcode, payload) of every frame the node sends until it closes the connection."""
        out = []
        try:
            while True:
                b0, b1 = await asyncio.wait_for(self.reader.readexactly(2), timeout)
                n = b1 & 0x7F
                if n == 126:
                    n = int.from_bytes(await self.reader.readexactly(2), "big")
                elif n == 127:
                    n = int.from_bytes(await self.reader.readexactly(8), "big")
                out.append((b0 & 0x0F, await self.reader.readexactly(n)))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
            return out

    async def until_closed(self, timeout: float = 10.0) -> None:
        """Read (and drop) whatever the node sends until it closes the connection."""
        try:
            while await asyncio.wait_for(self.reader.read(65536), timeout):
                pass
        except (ConnectionError, asyncio.TimeoutError):
            pass

    def close(self) -> None:
        self.writer.close()


def _masked(payload: bytes, mask: bytes) -> bytes:
    n = len(payload)
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big")


def inflating_message(inflated_bytes: int) -> tuple[bytes, bytes]:
    """(a message that decodes into `inflated_bytes` empty maps in one array, its raw-deflate
    form as permessage-deflate sends it): 16 MiB of maps take ~1 GB of Python objects."""
    n = inflated_bytes - 5
    raw = b"\xdd" + n.to_bytes(4, "big") + b"\x80" * n
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    packed = c.compress(raw) + c.flush(zlib.Z_SYNC_FLUSH)
    assert packed.endswith(b"\x00\x00\xff\xff")
    return raw, packed[:-4]


# --- a peer that holds the secret --------------------------------------------------------------

def greeting(uuid: str, address: str, cluster_uuid: str | None = None, options: dict | None = None,
             **extra) -> dict:
    """A greeting a node of these must-match options (default ones) would accept from a peer."""
    options = Config().must_match() if options is None else options
    digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:16]
    return {"uuid": uuid, "cluster_uuid": cluster_uuid, "cluster_name": "replog", "options_digest": digest,
            "options": options, "anon": False, "address": address, "cluster": [], "status": "joining", **extra}


async def greet(node_address: str, secret: bytes, uuid: str, **fields) -> dict:
    """One authenticated handshake as peer `uuid`, greeting(...) with `fields`, then BYE: the
    node's greeting (a PeerRefused if it refused ours)."""
    async with aiohttp.ClientSession() as session:
        conn = await connect(session, node_address)
        try:
            await client_auth(conn, secret, uuid)
            await conn.send(m.GREETING, **greeting(uuid, **fields))
            theirs = await conn.expect(m.GREETING)
            await conn.send(m.BYE)
            return theirs.body
        finally:
            await conn.close()


async def register_member(node_address: str, secret: bytes, uuid: str, address: str) -> int:
    """JOIN `node_address` as member `uuid` at `address`: the id it was given."""
    async with aiohttp.ClientSession() as session:
        conn = await connect(session, node_address)
        try:
            await client_auth(conn, secret, uuid)
            await conn.send(m.GREETING, **greeting(uuid, address))
            theirs = await conn.expect(m.GREETING)
            assert theirs["cluster_uuid"], theirs.body
            await conn.send(m.JOIN)
            registered = await conn.expect(m.REGISTERED)
            while (await conn.expect(m.SNAPSHOT, m.SNAPSHOT_ROWS, m.SNAPSHOT_END)).type != m.SNAPSHOT_END:
                pass
            await conn.send(m.BYE)
            return registered["id"]
        finally:
            await conn.close()


# --- servers an attacker runs --------------------------------------------------------------------

async def serve(handler, path: str = "/{tail:.*}") -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_route("*", path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


def plain_or_sealed(data: bytes) -> str:
    """The name of a message as sent in the clear, or sealed (its bytes + a session tag)."""
    for body in (data, data[:-sess.TAG_BYTES]):
        try:
            return m.decode(body).name
        except Exception:  # noqa: BLE001 - anything that is not a message
            continue
    return "?"


class RelayInTheMiddle:
    """Answers a member's applier as if it were a peer, forwarding the handshake to `victim`;
    once the victim has accepted the member's AUTH, the attack takes over (one per link, in
    order: `attack(member_ws, victim_ws, auth_ok_bytes)`), and the names of every message the
    victim sent afterwards are kept in `after_auth`; the member's AUTHs in `auths`."""

    def __init__(self, victim: str, attacks: list):
        self.victim = victim
        self.attacks = list(attacks)
        self.after_auth: list[list[str]] = []      # per attack: names of what the victim sent after AUTH_OK
        self.auths: list[bytes] = []
        self.done = asyncio.Event()
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> "RelayInTheMiddle":
        self._runner, self.port = await serve(self.handle, "/v1/replication")
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        member = web.WebSocketResponse(compress=False)
        await member.prepare(request)
        if not self.attacks:
            await member.close()
            return member
        attack = self.attacks.pop(0)
        seen: list[str] = []
        async with aiohttp.ClientSession() as session:
            victim = await session.ws_connect(f"http://{self.victim}/v1/replication", compress=0)
            try:
                hello = await victim.receive(timeout=10)             # the victim's HELLO ...
                await member.send_bytes(hello.data)                  # ... answered by the member
                auth = await member.receive(timeout=10)
                self.auths.append(auth.data)
                await victim.send_bytes(auth.data)
                auth_ok = await victim.receive(timeout=10)
                assert plain_or_sealed(auth_ok.data) == "AUTH_OK", "the victim refused the member's own AUTH"
                await attack(member, victim, auth_ok.data)
                while True:
                    msg = await victim.receive(timeout=5)
                    if msg.type != aiohttp.WSMsgType.BINARY:
                        break
                    seen.append(plain_or_sealed(msg.data))
            except asyncio.TimeoutError:
                seen.append("(silence)")
            finally:
                self.after_auth.append(seen)
                await victim.close()
                await member.close()
                if not self.attacks:
                    self.done.set()
        return member


class Listener:
    """Answers anything: records each HTTP request (and a WebSocket's messages, after sending it
    a HELLO of its own) in `requests`, as the raw text and bytes a node sent."""

    def __init__(self):
        self.requests: list[dict] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> "Listener":
        self._runner, self.port = await serve(self.handle)
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def everything(self) -> bytes:
        """All a node sent here, headers included, as bytes to search."""
        return b"\n".join(r["head"].encode() + b"\n" + r["body"] + b"".join(r["messages"]) for r in self.requests)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        head = f"{request.method} {request.path_qs}\n" + "".join(f"{k}: {v}\n" for k, v in request.headers.items())
        record = {"head": head, "body": b"", "messages": [], "method": request.method, "path": request.path,
                  "headers": dict(request.headers)}
        self.requests.append(record)
        if request.headers.get("Upgrade", "").lower() == "websocket":
            ws = web.WebSocketResponse(compress=False)
            await ws.prepare(request)
            await ws.send_bytes(m.encode(m.HELLO, version=m.PROTOCOL_VERSION, nonce=os.urandom(sess.NONCE_BYTES),
                                         uuid="11111111-2222-4333-8444-555555555555"))
            try:
                async for msg in ws:
                    if msg.type == aiohttp.WSMsgType.BINARY:
                        record["messages"].append(msg.data)
                    await ws.close()
            except asyncio.TimeoutError:
                pass
            return ws
        record["body"] = await request.read()
        return web.json_response({"error": {"code": "nope", "message": "a listener"}}, status=500)


# --- what an attack costs ------------------------------------------------------------------------

def metric(url: str, name: str) -> float:
    """One Prometheus sample of the node at `url` (summed over labels; 0 if absent)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


async def health_latencies_s(url: str, until, ready=None) -> list[float]:
    """GET /v1/health one after another until `until` is set: each answer's latency; `ready` is
    set once the first has come back."""
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while not until.is_set():
            t0 = time.perf_counter()
            async with session.get(url + "/v1/health") as r:
                await r.read()
                assert r.status == 200, r.status
            out.append(time.perf_counter() - t0)
            if ready is not None:
                ready.set()
            await asyncio.sleep(0.01)
    return out


def _sample_health(url: str, until, ready, out) -> None:
    out.put(asyncio.run(health_latencies_s(url, until, ready)))


class HealthSampler:
    """`health_latencies_s` in a process of its own: an attacker building and masking 16 MiB
    frames in the test process holds its GIL and CPU for tenths of a second, which a sampler
    on a thread there would count as the node's slowness (it did, on a busy machine).

        with HealthSampler(url) as s:
            ...                                  # the attack
        latencies = s.latencies"""

    def __init__(self, url: str):
        ctx = multiprocessing.get_context("spawn")
        self._until, self._ready, self._out = ctx.Event(), ctx.Event(), ctx.Queue()
        self._proc = ctx.Process(target=_sample_health, args=(url, self._until, self._ready, self._out), daemon=True)
        self.latencies: list[float] = []

    def __enter__(self) -> "HealthSampler":
        self._proc.start()
        assert self._ready.wait(60), "the health sampler never got an answer"
        return self

    def __exit__(self, *exc) -> None:
        self._until.set()
        try:
            self.latencies = self._out.get(timeout=60)
        finally:
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()
