"""One replication link over a WebSocket, and the authentication + greeting handshake
both sides run before anything else is read or sent.

The handshake is symmetric in shape: the relay (server) sends HELLO with a nonce and its uuid;
the applier (client) proves it knows the cluster secret over both nonces and both uuids; the
relay proves it too; from then on every message is sealed under the session's keys
(node/core/session.py), and both exchange greetings, whose uuid must be the authenticated one.
Checks that refuse a peer raise PeerRefused (logged, retried slowly); malformed input raises
RemoteProtocolError (retried with backoff).

Rules kept here:
- Before auth a link reads messages of at most `preauth_message_bytes_max` and never
  negotiates compression; the limit is raised only once the peer has proven the secret
  (node/applier/ws_limit.py).
- A sealed message is sealed and written in one synchronous step (aiohttp writes an
  uncompressed frame before its first await), so message numbers follow the wire order.
- `connect`, `client_auth` and `server_auth` are the production handshake: tests that play a
  peer use them rather than a copy.
- An ERROR before authentication is anyone's word: only what a relay says then (it is
  shutting down, the protocol version, the secret, a malformed handshake, a handshake that went
  silent: `PREAUTH_ERRORS`) is a refusal; any other code (rejoin, expelled, wrong cluster, ...)
  is a broken link, so a box at a peer's address that holds no secret can state nothing only a
  member may state.
- A receive that waits longer than its bound raises PeerSilent: the link broke, whoever's side
  stalled.
- A receive is bounded with `asyncio.timeout`, never `asyncio.wait_for`: on Python 3.11 wait_for
  loses a cancel that arrives together with a message, and the applier it was meant to stop
  runs on (tests/unit/test_cancellation.py)."""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import ssl
from typing import Any, Callable

import aiohttp
from aiohttp import web

from node import limits
from node.applier.ws_limit import raise_message_limit, reader_limit
from node.core import messages as m
from node.core import session as sess
from node.errors import PeerNotReady, PeerRefused, PeerSilent, RemoteProtocolError

log = logging.getLogger("replog.link")

# A sealed message may be a whole message_bytes_max message plus its tag.
LINK_MESSAGE_BYTES_MAX = limits.message_bytes_max + sess.TAG_BYTES
# The ERROR codes a relay sends before authentication (node/applier/accept.py, server_auth).
PREAUTH_ERRORS = frozenset({"not_ready", "version", "auth", "protocol", "silent"})


class Conn:
    """A WebSocket carrying replication messages (either side)."""

    def __init__(self, ws: web.WebSocketResponse | aiohttp.ClientWebSocketResponse, peer: str):
        self.ws = ws
        self.peer = peer
        self.bytes_in = 0
        self.bytes_out = 0
        self.session: sess.Session | None = None    # set once the handshake succeeded
        self.greeting: dict | None = None           # the peer's greeting, once received
        # an applier's link: ROWS messages the scanner takes arrive as {"scan": ...}
        self.scan_rows: Callable[[bytes], Any] | None = None

    @property
    def closed(self) -> bool:
        """The link is closed or closing (either side's doing)."""
        return self.ws.closed

    async def send(self, mtype: int, **body: Any) -> None:
        data = m.encode(mtype, **body)
        if self.session is not None:
            data = self.session.seal(data)
        self.bytes_out += len(data)
        await self.ws.send_bytes(data)

    async def send_rows(self, frames: list[bytes]) -> None:
        """A ROWS message of WAL frame payloads, spliced as they are (messages.rows_parts)."""
        parts = m.rows_parts(frames)
        data = self.session.seal_parts(parts) if self.session is not None else b"".join(parts)
        self.bytes_out += len(data)
        await self.ws.send_bytes(data)

    async def recv(self, timeout: float = limits.peer_timeout_s) -> m.Message:
        try:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that
            # arrives as the message does, and a stopped applier would then stream on.
            async with asyncio.timeout(timeout):
                msg = await self.ws.receive()
        except TimeoutError:
            raise PeerSilent(f"{self.peer}: no message for {timeout:.0f} s") from None
        if msg.type == aiohttp.WSMsgType.BINARY:
            data = msg.data
            self.bytes_in += len(data)
            if self.session is not None:
                data = self.session.unseal(data)      # the tag over the raw bytes; no decode yet
            elif len(data) > limits.preauth_message_bytes_max:   # the reader's own limit, also checked here
                raise RemoteProtocolError(f"{self.peer}: message of {len(data)} bytes before authentication")
            out = m.decode(data, self.scan_rows)
            if out.type == m.ERROR:       # the peer's words: cut before they reach logs and status
                n = limits.peer_error_chars_max
                if self.session is None and out["code"] not in PREAUTH_ERRORS:
                    raise RemoteProtocolError(f"{self.peer}: ERROR {out['code'][:64]!r} before authentication "
                                              "(only a member that proved the secret may say that)")
                refused = PeerRefused(out["code"][:64], out["message"][:n] + ("…" if len(out["message"]) > n else ""))
                refused.body = out.body     # extra fields, e.g. next_id of a register_rejected
                raise refused
            return out
        if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
            code = msg.data if msg.type == aiohttp.WSMsgType.CLOSE else self.ws.close_code
            if code == aiohttp.WSCloseCode.GOING_AWAY:     # the peer is stopping (Conn.close)
                raise PeerNotReady(f"{self.peer}: it closed the link as it stops")
            raise RemoteProtocolError(f"{self.peer}: connection closed")
        if msg.type == aiohttp.WSMsgType.ERROR:   # e.g. a message over the reader's size limit
            raise RemoteProtocolError(f"{self.peer}: {self.ws.exception()}")
        raise RemoteProtocolError(f"{self.peer}: unexpected {msg.type.name} message")

    async def expect(self, *types: int, timeout: float = limits.peer_timeout_s) -> m.Message:
        msg = await self.recv(timeout)
        if msg.type not in types:
            want = "/".join(m.NAMES[t] for t in types)
            raise RemoteProtocolError(f"{self.peer}: expected {want}, got {msg.name}")
        return msg

    async def refuse(self, code: str, message: str, **fields: Any) -> None:
        try:
            await self.send(m.ERROR, code=code, message=message, **fields)
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            pass

    async def close(self, going_away: bool = False) -> None:
        """`going_away`: this node is stopping; the peer is told so by the close code (1001),
        and says it at INFO, not as a link that broke."""
        try:
            await self.ws.close(code=aiohttp.WSCloseCode.GOING_AWAY if going_away else aiohttp.WSCloseCode.OK)
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            pass


VERSIONS = (m.PROTOCOL_VERSION_MIN, m.PROTOCOL_VERSION)


async def server_auth(conn: Conn, secret: bytes, uuid: str, versions: tuple[int, int] = VERSIONS) -> None:
    """The relay's side: HELLO, check the applier's version and proof, AUTH_OK; then the link is
    sealed, `conn.session.peer_uuid` is the applier's authenticated uuid and `conn.session.version`
    the protocol version of the link. `versions`: the range spoken (tests play older peers)."""
    nonce = os.urandom(sess.NONCE_BYTES)
    await conn.send(m.HELLO, version=versions[0], versions=list(versions), nonce=nonce, uuid=uuid)
    msg = await conn.expect(m.AUTH, timeout=limits.handshake_timeout_s)
    version = msg.get("version", versions[0])    # absent: a version-2 applier, which took HELLO's `version`
    why = sess.accepted(versions, version)
    if why is not None:
        await conn.refuse("version", f"this node speaks protocol {versions[0]}..{versions[1]}")
        raise PeerRefused("version", f"{conn.peer}: {why}")
    their_uuid = sess.check_hello_fields(msg["nonce"], msg["uuid"], f"{conn.peer}: AUTH")
    t = sess.transcript(version, nonce, uuid, msg["nonce"], their_uuid)
    if not sess.proof_ok(secret, sess.CLIENT, t, msg["mac"]):
        await conn.refuse("auth", "wrong cluster secret")
        raise PeerRefused("auth", f"{conn.peer} failed authentication (wrong cluster secret)")
    raise_message_limit(conn.ws, LINK_MESSAGE_BYTES_MAX)   # the applier is silent until AUTH_OK
    await conn.send(m.AUTH_OK, mac=sess.proof(secret, sess.SERVER, t))
    conn.session = sess.Session(secret, t, sess.SERVER, their_uuid, version)
    _note_version(conn, version, versions)


async def client_auth(conn: Conn, secret: bytes, uuid: str, versions: tuple[int, int] = VERSIONS) -> None:
    """The applier's side: settle the protocol version, answer HELLO with our proof, check the
    relay's; then the link is sealed and `conn.session.peer_uuid` is the relay's authenticated
    uuid. A relay that speaks no version we speak is refused, both ranges named."""
    hello = await conn.expect(m.HELLO, timeout=limits.handshake_timeout_s)
    version = sess.negotiate(versions, hello["version"], hello.get("versions"))
    if isinstance(version, str):
        raise PeerRefused("version", f"{conn.peer}: {version}")
    their_uuid = sess.check_hello_fields(hello["nonce"], hello.get("uuid"), f"{conn.peer}: HELLO")
    nonce = os.urandom(sess.NONCE_BYTES)
    t = sess.transcript(version, hello["nonce"], their_uuid, nonce, uuid)
    await conn.send(m.AUTH, nonce=nonce, uuid=uuid, mac=sess.proof(secret, sess.CLIENT, t), version=version)
    ok = await conn.expect(m.AUTH_OK, timeout=limits.handshake_timeout_s)
    if not sess.proof_ok(secret, sess.SERVER, t, ok["mac"]):
        raise PeerRefused("auth", f"{conn.peer} does not know the cluster secret")
    raise_message_limit(conn.ws, LINK_MESSAGE_BYTES_MAX)   # the relay is silent until our GREETING
    conn.session = sess.Session(secret, t, sess.CLIENT, their_uuid, version)
    _note_version(conn, version, versions)


def _note_version(conn: Conn, version: int, versions: tuple[int, int]) -> None:
    if version < versions[1]:       # a peer not upgraded yet (docs/upgrade.md): worth one line per link
        log.info("link %s (%s) speaks protocol %d, older than this node's %d", conn.peer,
                 conn.session.peer_uuid, version, versions[1])


async def connect(session: aiohttp.ClientSession, address: str, tls: ssl.SSLContext | None = None) -> Conn:
    """A WebSocket to a peer's /v1/replication (wss:// with `tls`: node/tls.py), reading only
    pre-auth sized messages so far. A peer whose certificate we do not trust, or that refuses
    ours, is refused for a lasting reason; anything else is a connection error."""
    url = f"{'https' if tls else 'http'}://{address}/v1/replication"
    try:
        ws = await session.ws_connect(url, max_msg_size=reader_limit(limits.preauth_message_bytes_max), autoping=True,
                                      timeout=aiohttp.ClientWSTimeout(ws_close=limits.link_close_timeout_s),
                                      compress=0, ssl=tls if tls is not None else True)
    except aiohttp.ClientConnectorCertificateError as e:
        raise PeerRefused("tls", f"{address}: its TLS certificate does not verify against tls_ca_file "
                                 f"({e.certificate_error})") from None
    except aiohttp.ClientSSLError as e:
        raise PeerRefused("tls", f"{address}: TLS handshake failed ({e}); does it serve TLS, "
                                 f"and does it take this node's certificate?") from None
    except aiohttp.WSServerHandshakeError as e:
        if e.status == 403:      # a relay that requires a client certificate (tls_client_auth)
            raise PeerRefused("tls_client_auth", f"{address} refused the link (HTTP 403): it requires a client "
                                                 "certificate signed by its tls_ca_file") from None
        if e.status == 404:      # an HTTP server, but no replication endpoint there
            raise ConnectionError(f"cannot connect to {address}: it answered HTTP 404 for /v1/replication: not a "
                                  "replog node's HTTP address") from None
        raise ConnectionError(f"cannot connect to {address}: {e}") from None
    except aiohttp.ClientResponseError as e:
        if "Bad status line" in str(e.message):
            raise ConnectionError(f"cannot connect to {address}: it does not answer HTTP (a node's binary client "
                                  "port? peers are nodes' HTTP addresses)") from None
        raise ConnectionError(f"cannot connect to {address}: {e}") from None
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        # Under TLS 1.3 a relay that refuses our certificate resets the connection after our
        # side of the handshake: say so, but retry (a reset may be nothing more).
        reset = getattr(e, "errno", None) == errno.ECONNRESET or isinstance(e, aiohttp.ServerDisconnectedError)
        hint = ""
        if reset:
            hint = (" (a relay that does not take this node's TLS certificate does this)" if tls is not None else
                    " (a node that serves TLS does this to a plaintext client: is tls_cert_file set on every member?)")
        raise ConnectionError(f"cannot connect to {address}: {e}{hint}") from None
    return Conn(ws, address)
