"""The relay: the server side of a replication link (`/v1/replication`). It drives
node/core/link/relay.py's RelayMachine, which makes every protocol decision.

Once the link is authenticated (node/applier/accept.py) each message is stepped and its Ready
acted on in order: persist (WAL holds), send, apply, effects (apply a registration, send the
snapshot, run a shutdown phase, stream: node/applier/stream.py), advance. `serve_link` is the
one place that maps a link's errors to a log line and an ERROR answer."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from node import limits
from node.applier.conn import Conn
from node.applier.stream import Relay
from node.core import messages as m
from node.core.link.ready import Hold, Ready
from node.core.link.relay import Register, Registered, RelayMachine, RelayState, SendSnapshot, Shutdown, SnapshotSent, Stream
from node.errors import ClientError, PeerRefused, RemoteProtocolError
from node.faults import fault

if TYPE_CHECKING:
    from node.process.ports import RelayHost

__all__ = ["send_snapshot", "serve_link"]
log = logging.getLogger("replog.relay")


class _Host:
    """The machine's host (node/core/link/relay.py RelayContext) over the node."""

    def __init__(self, node: "RelayHost"):
        self.node = node

    @property
    def core(self):
        return self.node.core

    def greeting(self) -> dict:
        return self.node.greeting()

    def check_peer_greeting(self, theirs: dict) -> None:
        self.node.check_peer_greeting(theirs)

    def status(self) -> tuple[str, str]:
        return self.node.status, self.node.status_reason

    def serves_wal(self) -> bool:
        return self.node.journal is not None and self.node.journal.wal is not None

    def gc_vclock(self) -> dict[int, int]:
        return self.node.store.get_meta("gc_vclock") or {}


def _take(node: "RelayHost", mach: RelayMachine, inp, now: float) -> Ready:
    """Step and persist the holds the step asked for, in one synchronous call."""
    try:
        mach.step(inp, now)
    finally:
        rd = mach.ready()
        for h in rd.persist:
            assert type(h) is Hold, h
            if h.durable is None:
                node.retention.hold_all(h.uuid, anon=h.anon)
            else:
                node.retention.on_subscribe(h.uuid, h.durable, h.anon)
    return rd


async def serve_link(node: "RelayHost", conn: Conn) -> None:
    """An authenticated inbound link (node/applier/accept.py): greetings, then the one request
    it came for."""
    mach = RelayMachine(_Host(node), conn.session.peer_uuid if conn.session else None, conn.peer)
    try:
        inp = None
        while mach.state is not RelayState.CLOSED:
            if inp is None:
                try:
                    inp = await conn.recv(timeout=limits.handshake_timeout_s)
                except PeerRefused as e:
                    inp = e                      # the peer's ERROR: the machine decides
            rd = _take(node, mach, inp, time.monotonic())
            conn.peer = mach.peer
            inp = await _act(node, conn, mach, rd)
    except PeerRefused as e:
        log.warning("relay: refused %s: %s", conn.peer, e)
        await conn.refuse(e.code, e.message)        # (a second ERROR after the greeting's is harmless)
    except RemoteProtocolError as e:
        log.info("relay: link to %s dropped: %s", conn.peer, e)
        await conn.refuse("protocol", str(e))
    except (ConnectionError, asyncio.TimeoutError) as e:
        log.info("relay: link to %s lost: %s", conn.peer, e)
    except Exception as e:  # noqa: BLE001 - the relay's one place: anything else is our bug, not the peer's
        node.note_failure(f"relay to {conn.peer}", e)
        await conn.refuse("internal", f"{type(e).__name__}: {e}")
    finally:
        mach.close()


async def _act(node: "RelayHost", conn: Conn, mach: RelayMachine, rd: Ready):
    """Send, then the effects; returns the next input an effect produced, or None."""
    for s in rd.send:
        await conn.send(s.mtype, **s.body)
    mach.advance(rd)
    nxt = None
    for e in rd.effects:
        t = type(e)
        if t is Register:
            applied = await node.life.apply_registration(e.greeting, e.body)
            if applied.ok and fault("lose_apply_answer"):
                log.warning("relay: fault point lose_apply_answer: dropping the answer to %s", conn.peer)
                mach.close()
                return None
            nxt = Registered(applied.ok, applied.id, applied.reason, applied.next_id)
        elif t is SendSnapshot:
            await send_snapshot(node, conn)
            nxt = SnapshotSent()
        elif t is Shutdown:
            try:
                answer = await node.cluster_shutdown.phase(e.body)
            except ClientError as err:
                await conn.refuse(err.code, err.message)
            else:
                await conn.send(m.SHUTDOWN_OK, **answer)
        elif t is Stream:
            await Relay(node, conn, mach).run()
        else:                                   # Stop
            if e.note:
                log.warning("relay: %s", e.note)
            if e.error is not None:
                raise e.error
    return nxt


async def send_snapshot(node: "RelayHost", conn: Conn) -> None:
    loop = asyncio.get_running_loop()
    it = node.store.snapshot()
    kind, meta = await loop.run_in_executor(None, next, it)
    assert kind == "meta"
    await conn.send(m.SNAPSHOT, **meta)
    while True:
        item = await loop.run_in_executor(None, next, it, None)
        if item is None:
            break
        space, rows = item[1]
        await conn.send(m.SNAPSHOT_ROWS, space=space, rows=rows)
    await conn.send(m.SNAPSHOT_END)
