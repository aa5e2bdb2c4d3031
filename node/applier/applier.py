"""The applier: the client side of a replication link, one per upstream peer. It drives
node/core/link/applier.py's ApplierMachine, which makes every protocol decision.

Loop: connect -> auth -> the machine greets, builds the upstream's id map, registers unknown
members and SUBSCRIBEs -> each message is stepped and its Ready acted on: persist (journal
entries, submitted in the same synchronous call as the step: check, claim and submit with no
await between), then send, then apply, then the effects (a Stop ends the link), then advance.
`run_once` raises; `run` acts on what node/applier/outcome.py says follows each error (retry
with backoff, tell the rejoiner, stop the node, or end this link only: a bug here is logged
with its traceback and shown as status "failed", the node serves on, and removing the peer
later is an ordinary stop). Opening a link for a short visit is node/applier/handshake.py."""
from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING

from node import limits
from node.applier.conn import Conn, client_auth, connect
from node.applier.outcome import END, FATAL, REJOIN, after_link, next_backoff
from node.core import messages as m
from node.core import rowscan
from node.core.lifecycle_fence import claim_of
from node.core.link import claims
from node.core.link.applier import ApplierMachine, ApplierState, DisproveClaim, Followed
from node.core.link.ready import Ready
from node.errors import PeerRefused
from node.faults import fault

if TYPE_CHECKING:
    from node.process.ports import ApplierHost

__all__ = ["Applier"]
log = logging.getLogger("replog.applier")


class Applier:
    def __init__(self, node: "ApplierHost", address: str):
        self.node = node
        self.address = address
        self.status = "connecting"
        self.error = ""
        self.task: asyncio.Task | None = None
        self.stopping = False       # stop() was called: every loop ends at its next turn
        self.conn: Conn | None = None
        self.machine: ApplierMachine | None = None   # this link's (the last one's once it ended)
        self.peer_uuid: str | None = None
        self._done = {"rows": 0, "messages_scanned": 0, "messages_decoded": 0}   # of links that ended
        self._rng = random.Random()

    def _count(self, name: str) -> int:
        return self._done[name] + (getattr(self.machine, name) if self.machine is not None else 0)

    rows = property(lambda self: self._count("rows"))
    messages_scanned = property(lambda self: self._count("messages_scanned"))
    messages_decoded = property(lambda self: self._count("messages_decoded"))
    lag_s = property(lambda self: self.machine.lag_s if self.machine is not None else 0.0)
    peer_vclock = property(lambda self: self.machine.peer_vclock if self.machine is not None else {})

    def info(self) -> dict:
        peer = self.node.core.peers.get(self.peer_uuid) if (self.node.core and self.peer_uuid) else None
        return {"uuid": self.peer_uuid, "address": self.address, "status": self.status,
                "lag_s": round(self.lag_s, 6), "error": self.error,
                "id_map": {str(k): v for k, v in (peer.map.as_dict() if peer else {}).items()},
                "gaps": peer.stats.gaps if peer else 0,
                "messages": {"scanned": self.messages_scanned, "decoded": self.messages_decoded}}

    def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name=f"applier-{self.address}")

    async def stop(self) -> None:
        """End this link for good and return once it has: the socket is closed and the task
        done (cancelled until it is: one cancellation can be lost in a race, and an applier
        that lived on would keep a link nobody configured)."""
        self.stopping = True
        if self.conn is not None:
            await self.conn.close()
        while self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=limits.link_close_timeout_s)
        self.status = "stopped"

    async def run(self) -> None:
        backoff = limits.reconnect_backoff_min_s
        while not self.stopping:
            started = time.monotonic()
            err: Exception | None = None
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - after_link maps every error, our bugs included
                err = e
            nxt = after_link(err, backoff)
            if nxt.status is not None:
                self.status, self.error = nxt.status, nxt.error
            if nxt.then == FATAL:
                self.node.on_fatal(err)
                return
            if nxt.then == END:
                self.node.note_failure(f"applier {self.address}", err)
                self._drop_peer()
                return                                         # this link stops; the node serves on
            if nxt.then == REJOIN:
                self.node.rejoiner.on_need_rejoin(self.address, err.message, getattr(err, "needed", {}))
                self.error = self.node.rejoiner.status_of(self.address)
            if nxt.line:
                log.log(nxt.level, "applier %s: %s", self.address, nxt.line)
            backoff = next_backoff(backoff, time.monotonic() - started)
            self._drop_peer()
            if self.stopping:
                return
            await asyncio.sleep(nxt.delay * (0.5 + self._rng.random()))   # jittered backoff, not sync

    def _drop_peer(self) -> None:
        mach = self.machine
        if self.peer_uuid and self.node.core and mach is not None and mach.core_peer is not None:
            self.node.core.drop_peer(self.peer_uuid, mach.core_peer)
            mach.core_peer = None

    # --- the machine's host (node/core/link/applier.py ApplierContext) -----------------------
    def check_peer_greeting(self, theirs: dict) -> None:
        self.node.check_peer_greeting(theirs)

    def claim_link(self, peer_uuid: str) -> None:
        """One link per member: the first applier to reach a member keeps it; another address
        of the same member (a second spelling, a moved peer) is refused while it does, and a
        new link waits for a removed one to the same member to finish closing."""
        self.peer_uuid = peer_uuid
        claims.claim_link(self.node.followers, peer_uuid, self)

    def journal_pending(self) -> int:
        return self.node.journal.pending

    def own_claim(self, peer_uuid: str) -> int:
        return claim_of(self.node.own_claims, self.node.core.fence, peer_uuid)

    def release(self) -> None:
        claims.release_link(self.node.followers, self.peer_uuid, self)

    # --- the driver ------------------------------------------------------------------------
    async def run_once(self) -> None:
        node = self.node
        self.status = "connecting"
        conn = await connect(node.http_session, self.address, node.cfg.client_ssl)
        self.conn = conn
        old = self.machine
        if old is not None:
            for k in self._done:
                self._done[k] += getattr(old, k)
        mach = self.machine = ApplierMachine(node.core, self, self.address)
        try:
            await client_auth(conn, node.cfg.secret, node.uuid)
            if self.stopping:
                return
            mach.authenticated = conn.session.peer_uuid
            conn.scan_rows = rowscan.scan_rows if rowscan.native is not None else None
            mach.start(node.greeting())
            await self._act(self._take())
            while mach.state is not ApplierState.STOPPED and not self.stopping:
                follow = mach.state is ApplierState.FOLLOW
                try:
                    msg = await conn.recv(limits.peer_timeout_s if follow else limits.handshake_timeout_s)
                except PeerRefused as e:
                    msg = e                                   # the peer's ERROR: the machine decides
                rows = getattr(msg, "type", None) == m.ROWS
                assert not (rows and fault("applier_bug")), "fault point applier_bug"
                await self._act(self._take(msg, time.time()))
                if rows:
                    await self._back_pressure(mach)
        finally:
            mach.stop()
            self.release()
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
        mach = self.machine
        for s in rd.send:
            await self.conn.send(s.mtype, **s.body)
        for a in rd.apply:
            if type(a) is Followed:
                self.status, self.error = "follow", ""
                self.node.rejoiner.on_follow(self.address)
                log.info("applier %s: subscribed to %s from %s%s", self.address, a.peer_uuid, a.vclock,
                         " (this node's own rows only, while it is fenced)" if a.fenced else "")
            elif type(a) is DisproveClaim:
                self.node.disprove_claim(a.peer_uuid, a.have)
        mach.advance(rd)
        stop = rd.stop
        if stop is not None and stop.error is not None:
            raise stop.error

    async def _back_pressure(self, mach: ApplierMachine) -> None:
        """Too much queued, or no room (NOSPACE): stop reading the socket but keep the link,
        acknowledging what is durable so the relay does not time it out."""
        journal, space = self.node.journal, self.node.space
        while (journal.pending_rows > limits.applier_pending_rows_max or space.alarm is not None) \
                and journal.failed is None and mach.state is ApplierState.FOLLOW and not self.stopping:
            if space.alarm is not None:
                self.status = "paused"
            await journal.changed(timeout=limits.heartbeat_interval_s)
            await self._act(self._take(None, time.time()))
        if self.status == "paused":
            self.status = "follow"
