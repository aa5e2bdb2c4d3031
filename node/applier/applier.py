"""The applier: the client side of a replication link, one per upstream peer.

Loop: connect -> auth -> greeting (the core builds this peer's id map and registers
unknown members before anything is applied) -> SUBSCRIBE from our vclock permuted into
the peer's ids -> apply ROWS, ACK in the peer's ids. A broken link reconnects with
capped exponential backoff; a refusal (secret, cluster, options) is logged and retried
slowly. `run_once` raises; `run` is the one place that maps errors to next steps, and it maps
every one: a peer's bad input arrives as RemoteProtocolError (the decoders and the core's checks
raise nothing else for it); anything else is a bug here, logged with its traceback, shown as
status "failed", and ends this link only: the node serves on, and removing the peer later is an
ordinary stop."""
from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING

import aiohttp

from node import limits
from node.applier.conn import Conn, check_greeting, client_auth, connect
from node.core import messages as m
from node.core import rowscan
from node.core.membership import describe_uncovered, greeting_vclock, uncovered
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT
from node.errors import PeerRefused, RemoteProtocolError, StorageError
from node.faults import fault

if TYPE_CHECKING:
    from node.server import Node

log = logging.getLogger("replog.applier")


async def open_link(node: "Node", session: aiohttp.ClientSession, address: str) -> tuple[Conn, dict]:
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
    except BaseException:
        await conn.close()
        raise


async def probe(node: "Node", session: aiohttp.ClientSession, address: str, timeout: float) -> dict:
    """Greet a peer and leave (BYE): its greeting, or the error that stopped the handshake."""
    conn, theirs = await asyncio.wait_for(open_link(node, session, address), timeout)
    try:
        await conn.send(m.BYE)
    except (ConnectionError, RuntimeError, aiohttp.ClientError):
        pass
    finally:
        await conn.close()
    return theirs


PROBE_ERRORS = (PeerRefused, RemoteProtocolError, ConnectionError, OSError, asyncio.TimeoutError,
                aiohttp.ClientError)


class Resubscribe(Exception):
    """Our own state asks for a fresh SUBSCRIBE (an expelled member's accepted bound grew,
    so rows refused under the smaller bound must be sent again). Nobody's fault."""


class Applier:
    def __init__(self, node: "Node", address: str):
        self.node = node
        self.address = address
        self.peer_uuid: str | None = None
        self.status = "connecting"
        self.error = ""
        self.lag_s = 0.0
        self.last_row_at = 0.0
        self.rows = 0
        self.messages_scanned = 0   # ROWS messages taken by the row scanner (node.core.rowscan)
        self.messages_decoded = 0   # ... and decoded txn by txn (the exact path)
        self.task: asyncio.Task | None = None
        self.stopping = False       # stop() was called: every loop ends at its next turn
        self.conn: Conn | None = None
        self.core_peer = None       # the core's Peer this link built (NodeCore.greeting)
        self.peer_vclock: dict[str, int] = {}   # the upstream's vclock by uuid, from its last greeting
        self._rng = random.Random()

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
            try:
                await self.run_once()
                delay = limits.reconnect_backoff_min_s       # the peer said BYE: come back soon
            except asyncio.CancelledError:
                raise
            except Resubscribe as e:
                self.status, self.error = "resubscribing", str(e)
                log.info("applier %s: %s", self.address, e)
                delay = 0.0
            except PeerRefused as e:
                if e.code == "need_rejoin":
                    # The upstream collected rows we still need: another upstream may have them, or
                    # we rebuild from a snapshot that loses nothing (node/rejoin.py decides); this
                    # link is tried again, and serves once we are past what it collected.
                    self.status = "need_rejoin"
                    self.node.rejoiner.on_need_rejoin(self.address, e.message, getattr(e, "needed", {}))
                    self.error = self.node.rejoiner.status_of(self.address)
                    log.warning("applier %s: %s", self.address, e)
                    delay = limits.rejoin_retry_s
                else:
                    # A lasting reason (secret, cluster, options, expelled, this node itself, a second
                    # address of a member already followed): say it once per try, slowly.
                    self.status = e.code if e.code in ("self", "duplicate") else "refused"
                    self.error = str(e)
                    log.error("applier %s: refused: %s", self.address, e)
                    delay = limits.refused_backoff_s
            except RemoteProtocolError as e:
                # The peer sent something we cannot use (or the link broke mid-message).
                self.status, self.error = "disconnected", str(e)
                log.warning("applier %s: %s", self.address, e)
                delay = backoff
            except (ConnectionError, OSError, asyncio.TimeoutError, aiohttp.ClientError) as e:
                self.status, self.error = "disconnected", str(e) or type(e).__name__
                log.info("applier %s: %s", self.address, self.error)
                delay = backoff
            except StorageError as e:
                # The disk failed us: the node stops (the journal has usually said so already).
                self.status, self.error = "failed", str(e)
                self.node.on_fatal(e)
                return
            except Exception as e:  # noqa: BLE001 - the one place: anything else is our bug, not the peer's
                self.status, self.error = "failed", f"{type(e).__name__}: {e}"
                self.node.note_failure(f"applier {self.address}", e)
                self._drop_peer()
                return                                         # this link stops; the node serves on
            if time.monotonic() - started > 10 * limits.reconnect_backoff_max_s:
                backoff = limits.reconnect_backoff_min_s       # the link was healthy for a while
            else:
                backoff = min(backoff * 2, limits.reconnect_backoff_max_s)
            self._drop_peer()
            if self.stopping:
                return
            await asyncio.sleep(delay * (0.5 + self._rng.random()))   # jittered backoff, not sync

    def _drop_peer(self) -> None:
        if self.peer_uuid and self.node.core and self.core_peer is not None:
            self.node.core.drop_peer(self.peer_uuid, self.core_peer)
        self.core_peer = None

    def claim(self) -> None:
        """One link per member: the first applier to reach a member keeps it; another address
        of the same member (a second spelling, a moved peer) is refused while it does, and a
        new link waits for a removed one to the same member to finish closing. No await between
        the check and the claim."""
        followers = self.node.followers
        owner = followers.get(self.peer_uuid)
        if owner is not None and owner is not self:
            if owner.stopping:
                raise ConnectionError(f"the previous link to {self.peer_uuid} ({owner.address}) is still closing")
            raise PeerRefused("duplicate", f"{self.address} is {self.peer_uuid}, already followed through "
                                           f"{owner.address}")
        followers[self.peer_uuid] = self

    def release(self) -> None:
        if self.peer_uuid and self.node.followers.get(self.peer_uuid) is self:
            del self.node.followers[self.peer_uuid]

    async def run_once(self) -> None:
        node = self.node
        self.status = "connecting"
        conn, theirs = await open_link(node, node.http_session, self.address)
        self.conn = conn
        try:
            if self.stopping:
                return
            # Who is at this address, known even if it cannot serve us yet: a peer that moves
            # before it ever did is followed by its uuid (Lifecycle.follow_addresses).
            self.peer_uuid = theirs["uuid"]
            self.peer_vclock = greeting_vclock(theirs)
            self.claim()
            if not theirs["cluster_uuid"]:
                raise RemoteProtocolError(f"{self.address} has not joined a cluster yet")
            core = node.core
            history = theirs.get("own_history_lsn")
            history = history if type(history) is int and 0 <= history <= limits.lsn_max else 0
            regs = core.greeting(self.peer_uuid, theirs["cluster"], node.wall_us(), history)
            self.core_peer = core.peers[self.peer_uuid]
            for txn in regs:
                node.journal.submit_nowait([txn], want_future=False)
            fenced = core.fence is not None      # then only our own rows (NodeCore.subscribe_vclock)
            vclock = core.subscribe_vclock(self.peer_uuid, greeting_vclock(theirs) if fenced else None,
                                           theirs["cluster"])
            await conn.send(m.SUBSCRIBE, vclock=vclock.to_dict(), durable=core.ack_durable(self.peer_uuid).to_dict(),
                            own_rows=fenced)
            try:
                await conn.expect(m.SUBSCRIBED, timeout=limits.handshake_timeout_s)
            except PeerRefused as e:
                if e.code == "need_rejoin":       # what a snapshot from it would discard, said now
                    missing = uncovered(core.vclock_by_uuid(), greeting_vclock(theirs))
                    if missing:
                        e.message += f"; this node holds rows it lacks ({describe_uncovered(missing)})"
                    e.needed = greeting_vclock({"vclock_uuid": (getattr(e, "body", None) or {}).get("gc_vclock_uuid")})
                raise
            self.status, self.error = "follow", ""
            node.rejoiner.on_follow(self.address)
            log.info("applier %s: subscribed to %s from %s%s", self.address, self.peer_uuid, vclock,
                     " (this node's own rows only, while it is fenced)" if fenced else "")
            await self._stream(conn, fenced)
        finally:
            self.release()
            self.conn = None
            await conn.close()

    async def _stream(self, conn: Conn, fenced: bool) -> None:
        core, journal = self.node.core, self.node.journal
        peer = self.peer_uuid
        last_ack = 0.0
        acked_sig: tuple[int, int] = (-1, -1)
        claim_checked = False
        expel_epoch = core.expel_epoch
        conn.scan_rows = rowscan.scan_rows if rowscan.native is not None else None
        while not self.stopping:
            msg = await conn.recv(timeout=limits.peer_timeout_s)
            now = time.time()
            if msg.type == m.ROWS:
                assert not fault("applier_bug"), "fault point applier_bug"
                scan = msg.body.get("scan")
                last_ts = None
                if scan is not None:
                    last_ts = self._receive_scan(scan, now)
                    if last_ts is None:                  # a row the core must refuse exactly
                        msg = m.decode(msg["data"])
                    else:
                        self.messages_scanned += 1
                if last_ts is None:
                    self.messages_decoded += 1
                    last_ts = self._receive_txns(msg, now)
                if last_ts:
                    self.lag_s = max(0.0, now - last_ts / 1e6)
                    self.last_row_at = now
                space = self.node.space
                while (journal.pending_rows > limits.applier_pending_rows_max or space.alarm is not None) \
                        and journal.failed is None:
                    # Back-pressure, or no room (NOSPACE): stop reading the socket, but keep the link,
                    # acknowledging what is durable so the relay does not time it out.
                    if space.alarm is not None:
                        self.status = "paused"
                    await journal.changed(timeout=limits.heartbeat_interval_s)
                    if time.time() - last_ack >= limits.heartbeat_interval_s:
                        await conn.send(m.ACK, vclock=core.ack_vclock(peer).to_dict(), lag_us=int(self.lag_s * 1e6))
                        last_ack = time.time()
                if self.status == "paused":
                    self.status = "follow"
                if core.expel_epoch != expel_epoch:
                    raise Resubscribe("an expelled member's accepted rows grew: subscribing again")
                if fenced and core.fence is None:
                    raise Resubscribe("this node's own rows are confirmed: subscribing for every origin")
            elif msg.type == m.HEARTBEAT:
                if journal.pending == 0:
                    self.lag_s = max(0.0, now - msg["now_us"] / 1e6)
                if not claim_checked and journal.pending == 0:
                    claim_checked = True
                    self._check_claim()
                if fenced and core.fence is None:
                    raise Resubscribe("this node's own rows are confirmed: subscribing for every origin")
            else:
                raise RemoteProtocolError(f"unexpected {msg.name} while streaming")
            if now - last_ack >= limits.ack_interval_s:
                v, d = core.ack_vclock(peer), core.ack_durable(peer)
                if (v.signature, d.signature) != acked_sig or now - last_ack >= limits.heartbeat_interval_s:
                    await conn.send(m.ACK, vclock=v.to_dict(), durable=d.to_dict(), lag_us=int(self.lag_s * 1e6))
                    acked_sig, last_ack = (v.signature, d.signature), now

    def _check_claim(self) -> None:
        """The relay heartbeats once it has sent all it held: by now every row of ours its
        greeting claimed to hold has come (its own-rows cut is at that claim). If some did not,
        the claim was false: it must not hold our writes or our fence for ever."""
        node, core = self.node, self.node.core
        have = core.claimed.get(core.self_id)
        claimed = max(node.own_claims.get(self.peer_uuid, (0, ""))[0],
                      core.fence.heard.get(self.peer_uuid, 0) if core.fence is not None else 0)
        if claimed > have:
            node.disprove_claim(self.peer_uuid, have)

    def _receive_scan(self, scan, now: float) -> int | None:
        """A message the row scanner took (plain txns only): the core claims whole runs of
        each origin, and what it took becomes one WAL frame built from the received bytes.
        Returns the last txn's timestamp, or None if the core wants the message decided by
        the exact path (nothing claimed). Check + claim + submit: no await in between."""
        ranges: list[tuple[int, int, int]] = []
        try:
            if self.node.core.receive_scan(self.peer_uuid, scan, ranges, int(now * 1e6)) is None:
                return None
        finally:
            # Claimed rows must reach the WAL even if a later run is refused (as below).
            if ranges:
                entry = rowscan.PackedEntry(scan, ranges)
                self.rows += entry.rows
                self.node.journal.submit_nowait(entry, want_future=False, rows=entry.rows)
        return scan.ts_max(scan.ntxn - 1, scan.ntxn) if scan.ntxn else 0

    def _receive_txns(self, msg: m.Message, now: float) -> int:
        """A decoded message: each txn by the core's rules (runs of one origin's plain txns
        at once), consecutive plain ones sharing one WAL frame. Returns the last txn's
        timestamp. Check + claim + submit: no await in between."""
        core, journal, peer = self.node.core, self.node.journal, self.peer_uuid
        wall_us = int(now * 1e6)
        entry: list = []          # consecutive plain txns share one WAL frame
        entry_rows = 0
        valid, bad = msg["txns"], msg["error"]
        try:
            i, n = 0, len(valid)
            while i < n:
                txn = valid[i]
                if txn.group == GROUP_DEFAULT:   # a run of one origin's plain txns
                    k = len(entry)
                    try:
                        i, rows = core.receive_run(peer, valid, i, entry, wall_us)
                    except RemoteProtocolError:
                        claimed = sum(len(t.ops) for t in entry[k:])   # claimed before it
                        self.rows += claimed
                        entry_rows += claimed
                        raise
                    self.rows += rows
                    entry_rows += rows
                    continue
                i += 1
                out = core.receive(peer, txn, wall_us)
                if out:
                    self.rows += len(txn.ops)
                    if len(out) == 1 and txn.group != GROUP_CLUSTER:
                        entry.append(out[0])
                        entry_rows += len(txn.ops)
                    else:                                 # with our own _cluster row: one frame
                        if entry:
                            journal.submit_nowait(entry, want_future=False, rows=entry_rows)
                            entry, entry_rows = [], 0
                        journal.submit_nowait(out, want_future=False)
            if bad is not None:
                raise bad
        finally:
            # Claimed rows must reach the WAL even if a later row of the message is
            # refused: a claim without a write would make the node skip them for ever.
            if entry:
                journal.submit_nowait(entry, want_future=False, rows=entry_rows)
        return valid[-1].timestamp if valid else 0
