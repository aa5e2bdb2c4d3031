"""A member that holds the cluster secret and lies: the malicious peer of the adversary tests.

It speaks the replication protocol through the production handshake and encoders
(node.applier.conn: connect, client_auth, server_auth, Conn; node.core.messages; node.core.codec),
never a copy of them, so it keeps working when the handshake changes. What it says is what the
test tells it to: any greeting field, any rows.

    peer = FakePeer(secret)
    await peer.start()                       # its relay endpoint listens on 127.0.0.1
    await peer.introduce(node.address)       # learns the cluster (uuid, name, _cluster) from a node
    peer.script = [txn_or_bytes, ...]        # sent to every subscriber, in order, on each SUBSCRIBE
    node.set_peers([..., peer.address])      # the node's applier subscribes to it
    answer = await peer.request(node.address, m.JOIN, greeting={"uuid": "x" * 600})   # as a client

`FakePeer(secret, protocol=2)` plays a node of an older protocol version, from before version
negotiation: its HELLO names that one version, its AUTH names none, and as a client it refuses a
relay whose HELLO names another (old_server_auth / old_client_auth: what version-2 nodes run,
kept here as they were). `protocol=(lo, hi)` plays a node that negotiates over that range (the
production handshake). `auth_version=N` makes its AUTH announce N whatever HELLO said.
"""
from __future__ import annotations

import asyncio
import os
import time
import types
import uuid as uuidlib
from typing import Any

import aiohttp
from aiohttp import web

from bench.common import PortReservation
from node import limits
from node.applier.conn import LINK_MESSAGE_BYTES_MAX, Conn, client_auth, connect, server_auth
from node.applier.ws_limit import raise_message_limit, reader_limit
from node.config import Config
from node.core import codec
from node.core import messages as m
from node.core import session as sess
from node.core.rows import Txn
from node.errors import PeerRefused, PeerSilent, RemoteProtocolError
from node.server import Node


def options_digest() -> str:
    """The must-match options digest of a node on default options (Node's own property)."""
    return Node.options_digest.fget(types.SimpleNamespace(cfg=Config()))


def rows_message(txns: list, written_us: int | None = None) -> bytes:
    """One ROWS message of one frame holding `txns` (Txns or wire lists), as a relay writes it."""
    wus = written_us if written_us is not None else time.time_ns() // 1000
    return m.encode_rows([codec.pack([wus, [t.to_wire() if isinstance(t, Txn) else t for t in txns]])])


async def old_server_auth(conn: Conn, secret: bytes, uuid: str, version: int) -> None:
    """The relay's handshake of a node from before version negotiation (protocol 2 as it shipped)."""
    nonce = os.urandom(sess.NONCE_BYTES)
    await conn.send(m.HELLO, version=version, nonce=nonce, uuid=uuid)
    msg = await conn.expect(m.AUTH, timeout=limits.handshake_timeout_s)
    their_uuid = sess.check_hello_fields(msg["nonce"], msg["uuid"], f"{conn.peer}: AUTH")
    t = sess.transcript(version, nonce, uuid, msg["nonce"], their_uuid)
    if not sess.proof_ok(secret, sess.CLIENT, t, msg["mac"]):
        await conn.refuse("auth", "wrong cluster secret")
        raise PeerRefused("auth", f"{conn.peer} failed authentication (wrong cluster secret)")
    raise_message_limit(conn.ws, LINK_MESSAGE_BYTES_MAX)
    await conn.send(m.AUTH_OK, mac=sess.proof(secret, sess.SERVER, t))
    conn.session = sess.Session(secret, t, sess.SERVER, their_uuid, version)


async def old_client_auth(conn: Conn, secret: bytes, uuid: str, version: int, auth_version: int | None = None) -> None:
    """The applier's handshake of a node from before version negotiation: HELLO's version must be
    its own, and its AUTH names no version (`auth_version`: announce one anyway, and skip the check)."""
    hello = await conn.expect(m.HELLO, timeout=limits.handshake_timeout_s)
    if auth_version is None and hello["version"] != version:
        raise PeerRefused("version", f"{conn.peer} speaks protocol {hello['version']}, we speak {version}")
    their_uuid = sess.check_hello_fields(hello["nonce"], hello.get("uuid"), f"{conn.peer}: HELLO")
    nonce = os.urandom(sess.NONCE_BYTES)
    spoken = version if auth_version is None else auth_version
    t = sess.transcript(spoken, hello["nonce"], their_uuid, nonce, uuid)
    extra = {} if auth_version is None else {"version": auth_version}
    await conn.send(m.AUTH, nonce=nonce, uuid=uuid, mac=sess.proof(secret, sess.CLIENT, t), **extra)
    ok = await conn.expect(m.AUTH_OK, timeout=limits.handshake_timeout_s)
    if not sess.proof_ok(secret, sess.SERVER, t, ok["mac"]):
        raise PeerRefused("auth", f"{conn.peer} does not know the cluster secret")
    raise_message_limit(conn.ws, LINK_MESSAGE_BYTES_MAX)
    conn.session = sess.Session(secret, t, sess.CLIENT, their_uuid, spoken)


class FakePeer:
    def __init__(self, secret: bytes, *, uuid: str | None = None, protocol: int | tuple[int, int] | None = None,
                 auth_version: int | None = None):
        self.protocol = protocol             # module comment: None, an old single version, or a range
        self.auth_version = auth_version
        self.secret = secret
        self.uuid = uuid or str(uuidlib.uuid4())
        self._reservation = PortReservation(client_port=False)   # held until close(): no other test's node takes it
        self.port = self._reservation.port
        self.address = f"127.0.0.1:{self.port}"
        self.cluster_uuid: str | None = None
        self.cluster_name = "replog"
        self.table: list[list] = []          # its _cluster as its greeting states it
        self.id = 0                          # its own id in that table
        self.script: list[Any] = []          # Txns (one ROWS message each) or raw message bytes
        self.greeting_extra: dict = {}       # fields its greeting overrides
        self.heartbeats = True               # False: it idles silent after its script (never "caught up")
        self.subscribes = 0                  # SUBSCRIBE requests served
        self.refusing: tuple[str, str] | None = None   # (code, message): refuse every link as it opens
        self.ending: tuple[str, str] | None = None     # (code, message): end each subscription so after its script
        self.links = 0                       # links opened to it (refused or not)
        self.sent = 0                        # script items sent, over all sessions
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._links: set[Conn] = set()       # open relay links, closed first on close()

    # --- what it says ---------------------------------------------------------------------
    def greeting(self) -> dict:
        g = {"uuid": self.uuid, "cluster_uuid": self.cluster_uuid, "cluster_name": self.cluster_name,
             "options_digest": options_digest(), "options": Config().must_match(), "anon": False,
             "address": self.address, "cluster": self.table, "status": "running", "lease": None}
        g.update(self.greeting_extra)
        return g

    def txn(self, lsn: int, ops: tuple, *, group: int = 0, ts: int | None = None, replica_id: int | None = None) -> Txn:
        """A txn of its own origin (its own id), stamped now unless told otherwise."""
        return Txn(self.id if replica_id is None else replica_id, lsn, group,
                   time.time_ns() // 1000 if ts is None else ts, tuple(ops))

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> "FakePeer":
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_get("/v1/replication", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def close(self) -> None:
        for conn in list(self._links):
            await conn.close()
        if self._runner:
            await self._runner.cleanup()
        if self._session:
            await self._session.close()
        self._reservation.close()

    async def introduce(self, address: str) -> dict:
        """Greet a node as a fresh client and leave: take its cluster uuid and `_cluster`, and
        give itself the lowest id free there (so a node's ids and its own agree)."""
        theirs = await self.request(address, m.BYE, greeting={"cluster_uuid": None, "cluster": [],
                                                              "status": "joining"})
        self.cluster_uuid, self.cluster_name = theirs["cluster_uuid"], theirs["cluster_name"]
        self.table = [list(r) for r in theirs["cluster"] if r[3] != "anonymous"]
        taken = {r[1] for r in self.table}
        self.id = min(i for i in range(1, len(taken) + 2) if i not in taken)
        self.table.append([self.uuid, self.id, self.address, "member", 0, 0])
        return theirs

    # --- as a client (the node's relay answers) --------------------------------------------
    async def request(self, address: str, mtype: int, *, greeting: dict | None = None, **body: Any) -> Any:
        """Connect, authenticate, greet (its greeting, `greeting` overriding fields), send one
        request; returns the node's greeting for BYE, else the node's answer (a Message, or the
        PeerRefused / RemoteProtocolError it ended with)."""
        conn = await connect(self._session, address)
        try:
            if isinstance(self.protocol, int) or self.auth_version is not None:
                await old_client_auth(conn, self.secret, self.uuid, self.protocol or m.PROTOCOL_VERSION_MIN,
                                      self.auth_version)
            elif self.protocol is not None:
                await client_auth(conn, self.secret, self.uuid, self.protocol)
            else:
                await client_auth(conn, self.secret, self.uuid)
            await conn.send(m.GREETING, **{**self.greeting(), **(greeting or {})})
            try:
                theirs = (await conn.expect(m.GREETING, timeout=limits.handshake_timeout_s)).body
                await conn.send(mtype, **body)
                if mtype == m.BYE:
                    return theirs
                return await conn.recv(timeout=limits.handshake_timeout_s)
            except (PeerRefused, RemoteProtocolError) as e:
                return e
        finally:
            await conn.close()

    async def listen(self, address: str, **body: Any) -> tuple[list[str], BaseException]:
        """Subscribe to a node (`body`: SUBSCRIBE's fields, vclock {} unless given) and read
        what its relay sends, never answering, until the link ends: returns the names of the
        messages read and the error the link ended with."""
        conn = await connect(self._session, address)
        names: list[str] = []
        try:
            await client_auth(conn, self.secret, self.uuid)
            await conn.send(m.GREETING, **self.greeting())
            await conn.expect(m.GREETING, timeout=limits.handshake_timeout_s)
            await conn.send(m.SUBSCRIBE, **{"vclock": {}, **body})
            while True:
                names.append((await conn.recv(timeout=4 * limits.peer_timeout_s)).name)
        except (PeerRefused, RemoteProtocolError, ConnectionError) as e:
            return names, e
        finally:
            await conn.close()

    # --- as a relay (the node's applier subscribes) ------------------------------------------
    async def _serve(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=reader_limit(limits.preauth_message_bytes_max), compress=False)
        await ws.prepare(request)
        conn = Conn(ws, str(request.remote))
        self._links.add(conn)
        self.links += 1
        try:
            if self.refusing is not None:        # as a node that is shutting down answers
                await conn.refuse(*self.refusing)
                return ws
            if isinstance(self.protocol, int):
                await old_server_auth(conn, self.secret, self.uuid, self.protocol)
            elif self.protocol is not None:
                await server_auth(conn, self.secret, self.uuid, self.protocol)
            else:
                await server_auth(conn, self.secret, self.uuid)
            await conn.expect(m.GREETING, timeout=limits.handshake_timeout_s)
            await conn.send(m.GREETING, **self.greeting())
            req = await conn.expect(m.SUBSCRIBE, m.BYE, m.JOIN, m.FETCH_SNAPSHOT, timeout=limits.handshake_timeout_s)
            if req.type != m.SUBSCRIBE:
                return ws
            self.subscribes += 1
            await conn.send(m.SUBSCRIBED, vclock={})
            for item in list(self.script):
                data = item if isinstance(item, bytes) else rows_message([item])
                await conn.ws.send_bytes(conn.session.seal(data))    # sealed as Conn.send seals
                self.sent += 1
            if self.ending is not None:          # as a relay ends a link it gave up on
                await conn.refuse(*self.ending)
                return ws
            while True:                          # then idle, as a caught-up relay: heartbeats
                if self.heartbeats:
                    await conn.send(m.HEARTBEAT, now_us=time.time_ns() // 1000)
                try:
                    await conn.recv(timeout=limits.heartbeat_interval_s)   # ACKs; the close ends it
                except PeerSilent:
                    pass
                except RemoteProtocolError:
                    return ws
        except (PeerRefused, RemoteProtocolError, ConnectionError, asyncio.TimeoutError):
            pass
        finally:
            self._links.discard(conn)
            await conn.close()
        return ws


class PeerThread:
    """A FakePeer on its own event loop in a thread, so a synchronous test (and the harness's
    blocking HTTP calls) can drive it: `call(coro)` runs a coroutine there and waits for it."""

    def __init__(self, peer: FakePeer):
        import threading
        self.peer = peer
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"fakepeer-{peer.port}", daemon=True)
        self._thread.start()

    def call(self, coro, timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        try:
            self.call(self.peer.close(), 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


class running:
    """`with running(FakePeer(secret), node_address) as (peer, thread):` started and introduced."""

    def __init__(self, peer: FakePeer, introduce_to: str | None = None):
        self.peer, self.introduce_to = peer, introduce_to
        self.thread: PeerThread | None = None

    def __enter__(self) -> tuple[FakePeer, PeerThread]:
        self.thread = PeerThread(self.peer)
        self.thread.call(self.peer.start())
        if self.introduce_to:
            self.thread.call(self.peer.introduce(self.introduce_to))
        return self.peer, self.thread

    def __exit__(self, *exc) -> None:
        self.thread.stop()
