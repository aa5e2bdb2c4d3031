"""What a relay sends in bulk (node/applier/relay.py hands a link here when the RelayMachine
says so): this node's snapshot (SendSnapshot), and a subscribed link (Stream): rows out from a
WalCursor (node/applier/walcursor.py) filtered by the machine's `sub` and `own`, in this node's
ids, in WAL order, whole transactions, never rows of local spaces; the subscriber's ACKs in,
stepped into the machine.

Rules kept here:
- One link per subscriber: the newest is the one it reads (an older one may be a half-open
  connection the subscriber gave up on), so an older relay of the same uuid is closed first.
- An anonymous subscriber of a `wal_mode write` node gets only rows on disk
  (Journal.synced_position); everyone else reads from the journal's memory tail when it holds
  the next chunk, else from the files.
- Caught up, the machine's tick decides the heartbeats; a durable batch wakes the sender.
- A message that arrives once the send loop has ended the link (greet_again) is not stepped:
  the machine is closed, and the send loop closes the connection.
- Rows read go only if the machine says the greeting still holds (`rows_may_go`, asked after
  every read, with no await between: a row written after it was asked is not in what was read;
  asked when the read found nothing to send too, since rows this link filters out, an
  anonymous node's own, may be what ended it)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from node import limits
from node.applier.conn import Conn
from node.applier.walcursor import WalCursor
from node.core import messages as m
from node.core.link.filter import rows_batches
from node.core.link.relay import AckHold, RelayMachine, RelayState
from node.errors import PeerRefused, RemoteProtocolError

if TYPE_CHECKING:
    from node.process.ports import RelayHost

__all__ = ["Relay", "send_snapshot"]
log = logging.getLogger("replog.relay")


class Relay:
    """A subscribed link: rows out (the send loop), ACKs in (stepped into the machine)."""

    def __init__(self, node: "RelayHost", conn: Conn, machine: RelayMachine):
        self.node = node
        self.conn = conn
        self.machine = machine
        self.uuid, self.address, self.anon = machine.uuid, machine.address, machine.anon
        self.status = "subscribed"
        self.error = ""
        self.cursor = WalCursor(node.wal_dir, machine.sub, machine.own)
        self._wake = asyncio.Event()     # set by the journal after each durable batch
        self.started_at = time.monotonic()   # a subscriber that has not ACKed yet is live this long

    lag_s = property(lambda self: self.machine.lag_s)
    acked = property(lambda self: self.machine.acked)

    def info(self) -> dict:
        return {"uuid": self.uuid, "address": self.address, "status": self.status, "anon": self.anon,
                "lag_s": round(self.lag_s, 6), "error": self.error,
                "vclock": {str(k): v for k, v in sorted(self.acked.items())},
                "durable": {str(k): v for k, v in sorted(self.machine.durable.items())},
                "rows_sent": self.cursor.rows,
                "frames_from_memory": self.cursor.from_tail, "frames_from_file": self.cursor.from_file}

    async def run(self) -> None:
        node = self.node
        for old in [r for r in node.relays if r.uuid == self.uuid]:
            # One link per subscriber: the newest is the one it is reading (an older one may be a
            # half-open connection the subscriber gave up on).
            log.info("relay: %s subscribed again; closing its older link", self.uuid)
            old.error = "replaced by a newer subscription"
            await old.conn.close()
        node.relays.add(self)
        sender = asyncio.create_task(self._send_loop(), name=f"relay-send-{self.uuid[:8]}")
        try:
            await self._recv_loop(sender)
        finally:
            sender.cancel()
            try:
                await sender
            except asyncio.CancelledError:
                pass
            except (ConnectionError, RemoteProtocolError, RuntimeError) as e:
                self.error = str(e)
            node.relays.discard(self)
            self.machine.close()
            self.status = "stopped"

    async def _recv_loop(self, sender: asyncio.Task) -> None:
        mach, retention = self.machine, self.node.retention
        while not sender.done():
            try:
                msg = await self.conn.recv(timeout=mach.recv_timeout_s())
            except PeerRefused as e:
                msg = e
            if mach.state is RelayState.CLOSED:
                break        # the send loop ended the link while this waited (greet_again): it closes it
            mach.step(msg, time.monotonic())
            rd = mach.ready()
            for a in rd.apply:
                assert type(a) is AckHold, a
                retention.on_ack(a.uuid, a.durable, a.anon)
            mach.advance(rd)
            stop = rd.stop
            if stop is not None:
                if stop.error is not None:
                    raise stop.error
                return
        await sender  # re-raise its error

    async def _send_loop(self) -> None:
        journal, mach, lease = self.node.journal, self.machine, self.node.lease
        loop = asyncio.get_running_loop()
        wake, cursor = self._wake, self.cursor
        journal.listen(wake)
        try:
            mach.sent_rows(loop.time())
            while True:
                wake.clear()         # before looking: a batch made durable from here on wakes us
                if self.anon and journal.wal.mode == "write":
                    # only rows on disk: the journal's memory tail runs ahead of that (Journal.synced_position)
                    frames = await loop.run_in_executor(None, cursor.read, journal.synced_position,
                                                        limits.relay_batch_bytes_max)
                else:
                    frames = cursor.read_tail(journal, limits.relay_batch_bytes_max)
                    if frames is None:
                        frames = await loop.run_in_executor(None, cursor.read, journal.position,
                                                            limits.relay_batch_bytes_max)
                if not mach.rows_may_go():           # checked after the read: nothing written since goes
                    await self._greet_again()
                    return
                if lease is not None and not lease.serving():   # no await from here to the send
                    raise PeerRefused("lease_lost", "this node's lease ran out (it was paused or stalled): "
                                                    "it sends no more rows")
                if frames:
                    for batch in rows_batches(frames):
                        await self.conn.send_rows(batch)
                    mach.sent_rows(loop.time())
                    continue
                mach.tick(loop.time(), time.time_ns() // 1000)
                rd = mach.ready()
                if rd.send:
                    for s in rd.send:
                        await self.conn.send(s.mtype, **s.body)
                    mach.advance(rd)
                    continue
                mach.advance(rd)
                timer = loop.call_at(mach.next_heartbeat_at(), wake.set)
                try:
                    await wake.wait()
                finally:
                    timer.cancel()
        finally:
            journal.unlisten(wake)

    async def _greet_again(self) -> None:
        """Our greeting no longer holds (RelayMachine.rows_may_go): ERROR greet_again, then the
        connection closes (the receive loop ends with it) and the subscriber greets again."""
        rd = self.machine.ready()
        for s in rd.send:
            await self.conn.send(s.mtype, **s.body)
        self.machine.advance(rd)
        if rd.stop is not None and rd.stop.note:
            log.info("relay: %s", rd.stop.note)
        self.error = "greet_again"
        await self.conn.close()


async def send_snapshot(node: "RelayHost", conn: Conn) -> None:
    """SNAPSHOT {meta}, SNAPSHOT_ROWS per chunk, SNAPSHOT_END: the store read off the loop."""
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
