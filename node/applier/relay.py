"""The relay: the server side of a replication link (`/v1/replication`). It drives
node/core/link/relay.py's RelayMachine, which makes every protocol decision.

Once the link is authenticated (node/applier/accept.py) each message is stepped and its Ready
acted on in order: persist (WAL holds), send, apply, effects (apply a registration, send the
snapshot, run a shutdown phase, stream: node/applier/stream.py), advance. `serve_link` is the
one place that catches a link's errors; node/applier/outcome.py's relay_end says what each gets
(a log line, an ERROR answer). The machine's host over the node is node/applier/hosts.py's."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from node.applier.conn import Conn
from node.applier.hosts import NodeRelayContext
from node.applier.outcome import relay_end
from node.applier.stream import Relay, send_snapshot
from node.core import messages as m
from node.core.link.ready import Hold, Persist, Ready
from node.core.link.relay import Register, Registered, RelayMachine, RelayState, SendSnapshot, Shutdown, SnapshotSent, Stream
from node.errors import ClientError, PeerRefused
from node.faults import fault

if TYPE_CHECKING:
    from node.process.ports import RelayHost

__all__ = ["serve_link"]
log = logging.getLogger("replog.relay")


def _take(node: "RelayHost", mach: RelayMachine, inp, now: float, followed: list[str]) -> Ready:
    """Step and persist the holds the step asked for, in one synchronous call (`followed`: the
    remembered anonymous followers this link serves, whose end retention must hear of)."""
    try:
        mach.step(inp, now)
    finally:
        rd = mach.ready()
        for h in rd.persist:
            if type(h) is Persist:      # an own `_cluster` txn (expels the subscriber's greeting stated)
                node.journal.submit_entry_nowait(h.entry, want_future=False)
                continue
            assert type(h) is Hold, h
            if h.anon:                  # remembered before it gets rows (or refused: followers_full)
                node.retention.follower(h.uuid, mach.address)
                followed.append(h.uuid)
            if h.durable is None:
                node.retention.hold_all(h.uuid, anon=h.anon)
            else:
                node.retention.on_subscribe(h.uuid, h.durable, h.anon)
    return rd


async def serve_link(node: "RelayHost", conn: Conn) -> None:
    """An authenticated inbound link (node/applier/accept.py): greetings, then the one request
    it came for."""
    mach = RelayMachine(NodeRelayContext(node), conn.session.peer_uuid if conn.session else None, conn.peer)
    followed: list[str] = []
    try:
        inp = None
        while mach.state is not RelayState.CLOSED:
            if inp is None:
                try:
                    inp = await conn.recv(timeout=mach.recv_timeout_s())
                except PeerRefused as e:
                    inp = e                      # the peer's ERROR: the machine decides
            rd = _take(node, mach, inp, time.monotonic(), followed)
            conn.peer = mach.peer
            inp = await _act(node, conn, mach, rd)
    except Exception as e:  # noqa: BLE001 - the relay's one place: relay_end maps every error, our bugs included
        end = relay_end(e, conn.peer)
        node.twin_refused(e)
        if end.bug:
            node.note_failure(f"relay to {conn.peer}", e)
        elif end.line:
            log.log(end.level, "%s", end.line)
        if end.code is not None:
            await conn.refuse(end.code, end.message)
    finally:
        mach.close()
        for uuid in followed:
            node.retention.follower_link_ended(uuid)


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
