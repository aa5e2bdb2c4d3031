"""The applier: the client side of a replication link, one per upstream peer. It drives
node/core/link/applier.py's ApplierMachine, which makes every protocol decision.

Loop: connect -> auth -> the machine greets, builds the upstream's id map, registers unknown
members and SUBSCRIBEs -> each message is stepped and its Ready acted on: persist (journal
entries, submitted in the same synchronous call as the step: check, claim and submit with no
await between), then send, then apply, then the effects (a Stop ends the link), then advance.
`run_once` raises; `run` retries after what node/applier/outcome.py says follows each error
(Upstream.ended acts on it: retry with backoff, tell the rejoiner, stop the node, or end this
link only). What the rest of the node sees of an applier is node/applier/upstream.py's."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from node import limits
from node.applier.conn import client_auth, connect
from node.applier.outcome import REJOIN, Retry
from node.applier.upstream import Upstream
from node.core import messages as m
from node.core import rowscan
from node.core.link.applier import ApplierState, DisproveClaim, Followed
from node.core.link.collected import caught_up_to
from node.core.link.ready import Ready
from node.errors import PeerRefused
from node.faults import fault

if TYPE_CHECKING:
    from node.process.ports import ApplierHost

__all__ = ["Applier"]
log = logging.getLogger("replog.applier")


class Applier(Upstream):
    def __init__(self, node: "ApplierHost", address: str):   # named: its reads are checked against the port
        super().__init__(node, address)
        self._sending = asyncio.Lock()     # one Ready's sends at a time: the read loop's, the ACK writer's
        self._rows_in = asyncio.Event()    # rows came: the ACK writer looks

    def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name=f"applier-{self.address}")

    async def run(self) -> None:
        retry = Retry()
        while not self.stopping:
            retry.begin(time.monotonic())
            err: Exception | None = None
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - after_link maps every error, our bugs included
                err = e
                self.node.twin_refused(e)
            nxt = retry.end(err, time.monotonic())
            if not self.ended(err, nxt) or self.stopping:
                return
            if nxt.then == REJOIN:
                await self._rejoin_pause(getattr(err, "needed", {}), retry.jitter(nxt.delay))
            else:
                await asyncio.sleep(retry.jitter(nxt.delay))

    async def _rejoin_pause(self, collected: dict[str, int], delay: float) -> None:
        """The wait after `need_rejoin`: `delay`, or less once other upstreams have brought this
        node every row this one collected (a member that just joined holds its snapshot's rows
        only in the snapshot, and an older member that had not yet received them all from their
        origins is refused by it for a moment). Not cut short when the rows were here already:
        the upstream refused for a reason this cannot see, and trying at once would only loop."""
        core = self.node.core
        if core is None or caught_up_to(core.vclock_by_uuid(), collected):
            await asyncio.sleep(delay)
            return
        deadline = time.monotonic() + delay
        while not self.stopping and (left := deadline - time.monotonic()) > 0:
            await self.node.journal.changed(timeout=min(left, limits.rejoin_recheck_s))
            core = self.node.core
            if core is not None and caught_up_to(core.vclock_by_uuid(), collected):
                log.info("applier %s: every row it collected has come from other upstreams: subscribing again",
                         self.address)
                return

    async def run_once(self) -> None:
        node = self.node
        self.status = "connecting"
        self.fenced = None
        conn = self.conn = await connect(node.http_session, self.address, node.cfg.client_ssl)
        mach = self.new_machine()
        acker: asyncio.Task | None = None
        try:
            await client_auth(conn, node.cfg.secret, node.uuid)
            if self.stopping:
                return
            mach.authenticated = conn.session.peer_uuid
            conn.scan_rows = rowscan.scan_rows if rowscan.native is not None else None
            mach.start(node.greeting())
            await self._act(self._take())
            acker = asyncio.create_task(self._ack_writer(mach), name=f"acks-{self.address}")
            while mach.state is not ApplierState.STOPPED and not self.stopping:
                try:
                    msg = await conn.recv(mach.recv_timeout_s())
                except PeerRefused as e:
                    msg = e                                   # the peer's ERROR: the machine decides
                rows = getattr(msg, "type", None) == m.ROWS
                async with self._sending:
                    if self.fenced is not None:               # checked with no await before the step
                        raise self.fenced
                    assert not (rows and fault("applier_bug")), "fault point applier_bug"
                    await self._act(self._take(msg, time.time()))
                if rows:
                    self._rows_in.set()
                    await self._back_pressure()
        finally:
            if acker is not None:
                acker.cancel()
            mach.stop()
            mach.host.release()
            self.conn = None
            await conn.close()

    def _take(self, msg=None, now: float = 0.0) -> Ready:
        """Step (a message, or time) and persist what the step claimed, in one synchronous
        call: no other link claims between the claim and the submit, so WAL order is claim order."""
        mach = self.machine
        try:
            if msg is not None:
                mach.step(msg, now)
            elif now:
                mach.tick(now)
        finally:
            rd = mach.ready()
            journal = self.node.journal
            for p in rd.persist:
                journal.submit_entry_nowait(p.entry, want_future=False)
        return rd

    async def _act(self, rd: Ready) -> None:
        """The rest of a Ready, in its order: send, apply, effects; then advance."""
        for s in rd.send:
            await self.conn.send(s.mtype, **s.body)
        for a in rd.apply:
            if type(a) is Followed:
                self.followed(a)
            elif type(a) is DisproveClaim:
                self.node.disprove_claim(a.peer_uuid, a.have)
        self.machine.advance(rd)
        stop = rd.stop
        if stop is not None and stop.error is not None:
            raise stop.error

    async def _ack_writer(self, mach) -> None:
        """Acknowledges a link's rows once they are applied, between messages: after rows come
        (`_rows_in`), it waits for the journal until the machine says an ACK is owed and allowed
        (ack_wait), and sends it. One Ready at a time is taken and acted on (`_sending`, held
        from the step to the advance), so ACKs go in the order their vclocks were read. A link
        that brings no rows (the upstream's own writes are all there is) wakes it never. A
        failed send ends the writer only: the read loop meets the broken link."""
        journal, rows_in = self.node.journal, self._rows_in
        try:
            while not self.stopping:
                if not mach.owes_ack:
                    rows_in.clear()
                    await rows_in.wait()
                    continue
                wait = mach.ack_wait(time.time())
                if wait is None:                        # owed once what came is applied
                    await journal.changed(timeout=limits.heartbeat_interval_s)
                elif wait > 0:
                    await asyncio.sleep(wait)
                else:
                    async with self._sending:
                        queued = mach.ack(time.time())
                        await self._act(self._take())
                    if not queued:              # the clock stepped back, or the read loop just sent one
                        await asyncio.sleep(limits.ack_interval_s)
        except Exception as e:  # noqa: BLE001 - the link's own loop reports how it ended
            log.debug("applier %s: ACK writer ended: %s", self.address, e)

    async def _back_pressure(self) -> None:
        """While the machine holds reading (too much queued, or NOSPACE), tick as the journal
        works: what becomes durable is acknowledged and the link stays."""
        journal, space = self.node.journal, self.node.space
        while self.machine.holds_reading(journal.pending_rows, space.alarm is not None) \
                and journal.failed is None and not self.stopping:
            if space.alarm is not None:
                self.status = "paused"
            await journal.changed(timeout=limits.heartbeat_interval_s)
            async with self._sending:
                await self._act(self._take(None, time.time()))
        if self.status == "paused":
            self.status = "follow"
