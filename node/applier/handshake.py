"""Opening a replication link as a client: connect, authenticate, exchange greetings.

Used by the applier (node/applier/applier.py) and by every short visit to a peer: a probe
(greet and leave: rejoin, lease fencing, the fence's reachability checks), a snapshot fetch
(node/join.py, node/rejoin.py), a cluster shutdown phase (node/cluster_shutdown.py).

Rules kept here:
- Nothing is sent after AUTH but our greeting until the peer's greeting passed both checks:
  the options and cluster (node/core/link/greeting.py) and the node's own (lease fencing, the
  own-rows fence hears it).
- A failed open closes the connection it made; PROBE_ERRORS is every error a peer or the
  network can cause here (anything else is a bug and propagates)."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp

from node import limits
from node.applier.conn import Conn, client_auth, connect
from node.core import messages as m
from node.core.link.greeting import check_greeting
from node.errors import PeerRefused, RemoteProtocolError

if TYPE_CHECKING:
    from node.process.ports import Handshake

__all__ = ["PROBE_ERRORS", "open_link", "probe"]

PROBE_ERRORS = (PeerRefused, RemoteProtocolError, ConnectionError, OSError, asyncio.TimeoutError,
                aiohttp.ClientError)


async def open_link(node: "Handshake", session: aiohttp.ClientSession, address: str) -> tuple[Conn, dict]:
    """Connect, authenticate and exchange greetings; returns the link and the peer's greeting."""
    conn = await connect(session, address, node.cfg.client_ssl)
    try:
        await client_auth(conn, node.cfg.secret, node.uuid)
        mine = node.greeting()
        await conn.send(m.GREETING, **mine)
        theirs = (await conn.expect(m.GREETING, timeout=limits.handshake_timeout_s)).body
        check_greeting(mine, theirs, address, conn.session.peer_uuid)
        node.check_peer_greeting(theirs)
        conn.greeting = theirs
        return conn, theirs
    except BaseException as e:
        node.twin_refused(e)
        await conn.close()
        raise


async def probe(node: "Handshake", session: aiohttp.ClientSession, address: str, timeout: float) -> dict:
    """Greet a peer and leave (BYE): its greeting, or the error that stopped the handshake."""
    conn, theirs = await asyncio.wait_for(open_link(node, session, address), timeout)
    try:
        await conn.send(m.BYE)
    except (ConnectionError, RuntimeError, aiohttp.ClientError):
        pass
    finally:
        await conn.close()
    return theirs
