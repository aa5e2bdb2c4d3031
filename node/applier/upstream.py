"""An upstream as the rest of the node sees it: one per configured peer address, whatever link
to it runs now. Its status and last error (/v1/info, /v1/health, metrics, the rejoiner), its
counters summed over every link it ran, what follows the end of a link (node/applier/outcome.py
says; `ended` does it), stopping the task that runs its links, and the core's Peer a link
built. The driving is node/applier/applier.py's (Applier extends this).

Rules kept here:
- Counters only grow: a link's are added to the totals when the next link starts.
- stop() returns only once the task is done: it is cancelled until it is (one cancellation can
  be lost in a race, and an applier that lived on would keep a link nobody configured).
- The core's Peer a link built is dropped once, when the link ends (NodeCore.drop_peer).
- A link retried because it failed the same way as the last ones is logged once per
  `link_retry_log_interval_s`, with how many were not: a peer that is down costs a line per
  interval, not one per reconnect."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from node import limits
from node.applier.conn import Conn
from node.applier.hosts import NodeApplierContext
from node.applier.outcome import END, FATAL, REJOIN, RETRY, After
from node.core.admission import FailureLog
from node.core.link.applier import ApplierMachine, Followed
from node.errors import PeerRefused

if TYPE_CHECKING:
    from node.process.ports import ApplierHost

__all__ = ["Upstream"]
log = logging.getLogger("replog.applier")
_COUNTERS = ("rows", "messages_scanned", "messages_decoded")


class Upstream:
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
        self.fenced: PeerRefused | None = None        # the link's peer turned out a stale lease holder
        self._closing: asyncio.Task | None = None
        self._done = dict.fromkeys(_COUNTERS, 0)      # of links that ended
        self._retries = FailureLog(limits.link_retry_log_interval_s, limits.link_retry_lines_max)

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
                "messages": {"scanned": self.messages_scanned, "decoded": self.messages_decoded},
                # the expelled members whose collected rows this link's SUBSCRIBE went without
                "without": list(self.machine.without) if self.machine is not None else []}

    async def stop(self) -> None:
        """End this upstream for good and return once it has: the socket closed, the task done."""
        self.stopping = True
        if self.conn is not None:
            await self.conn.close()
        while self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=limits.link_close_timeout_s)
        self.status = "stopped"

    def new_machine(self) -> ApplierMachine:
        """The machine of the next link (the last one's counters go to the totals)."""
        old = self.machine
        if old is not None:
            for k in _COUNTERS:
                self._done[k] += getattr(old, k)
        node = self.node
        self.machine = ApplierMachine(node.core, NodeApplierContext(node, self), self.address)
        return self.machine

    def followed(self, a: Followed) -> None:
        """SUBSCRIBED came: the link follows (the rejoiner hears it)."""
        self.status, self.error = "follow", ""
        self.node.rejoiner.on_follow(self.address)
        log.info("applier %s: subscribed to %s from %s%s", self.address, a.peer_uuid, a.vclock,
                 " (this node's own rows only, while it is fenced)" if a.fenced else "")

    def ended(self, err: Exception | None, nxt: After) -> bool:
        """A link ended with `err` (None: the peer said BYE) and `nxt` follows: its status, the
        node's part and the log line. False: no further link (the node stops, or this link
        failed with a bug of ours: logged with its traceback, status "failed", the node serves
        on, and removing the peer later is an ordinary stop)."""
        if nxt.status is not None:
            self.status, self.error = nxt.status, nxt.error
        if nxt.then == FATAL:
            self.node.on_fatal(err)
            return False
        if nxt.then == END:
            self.node.note_failure(f"applier {self.address}", err)
            self.drop_peer()
            return False
        if nxt.then == REJOIN:
            self.node.rejoiner.on_need_rejoin(self.address, err.message, getattr(err, "needed", {}))
            self.error = self.node.rejoiner.status_of(self.address)
        elif nxt.status == "duplicate":
            self.node.rejoiner.on_duplicate(self.address)
        if nxt.line:
            self._log_end(nxt)
        self.drop_peer()
        return True

    def _log_end(self, nxt: After) -> None:
        more = ""
        if nxt.then == RETRY:
            show, suppressed = self._retries.note(nxt.line, time.monotonic())
            if not show:
                return
            more = f" ({suppressed} more like it since the last such line)" if suppressed else ""
        log.log(nxt.level, "applier %s: %s%s", self.address, nxt.line, more)

    def fence(self, why: str) -> None:
        """The lease says this link's peer is a stale holder (node/identity/lease_node.py): no
        message read from now on is taken, and the link closes."""
        self.fenced = PeerRefused("lease_fenced", why)
        conn = self.conn
        if conn is not None:     # kept: the loop holds only a weak reference to a task
            self._closing = asyncio.get_running_loop().create_task(conn.close())

    def drop_peer(self) -> None:
        """The link ended: the core forgets the Peer it built (once)."""
        mach = self.machine
        if self.peer_uuid and self.node.core and mach is not None and mach.core_peer is not None:
            self.node.core.drop_peer(self.peer_uuid, mach.core_peer)
            mach.core_peer = None
