"""Lease identity in a running node: take a slot before anything else, serve as the slot's
member, keep the lease renewed, fence off older holders of any slot, and stop when the
lease is gone.

The process (node/process/node.py) drives it in this order: `acquire()` before the store opens
(it decides the member uuid and the data dir `<data_dir>/slot-<k>`), `wait_ready()` and
`mark_serving()` before the node reports "running", `check_peer()` on every handshake,
`release()` on orderly shutdown (after the hand-over of node/identity/lease_handover.py).
Decisions about leases come from lease.py, store steps from lease_manager.py, renewal timing
from lease_runner.py, the start-up waits from lease_startup.py, what a holder shows and
reads of peers from lease_view.py; this module only wires them to the node.

Rules it keeps:
- No slot, no store: `acquire()` returns only holding a lease. While every slot is held it
  polls (logging progress) until one is released or expires; a store that stays
  unavailable for `limits.lease_acquire_store_retry_s_max` ends start-up with the store's error.
- Fencing: `seen` maps slot -> highest version this node has read from the lease store (at
  acquisition, at renewals' reads, and at re-reads). A handshake claiming a slot at an older
  version is refused (PeerRefused "lease_fenced"). A peer's greeting is only a hint: a
  version it claims (its own slot, or any in its `seen`) newer than ours makes the node read
  the store again (`_verify`, at most every `lease_verify_interval_s`); if the store shows our
  slot taken over, we are the stale holder and the lease is lost at once, without waiting for
  the next renewal. A claim the store does not back changes nothing and is never persisted.
- Taking over a slot whose holder did not release (crash, pause): the node does not report
  "running" until every listed peer's greeting shows it has seen our version, or
  `lease.peer_wait_until_ms` passes; then the slot records that this holder serves
  (lease_startup.py).
- Lease lost (a renewal failed up to the deadline, or superseded): status "lease_lost"
  at once (health 503, writes refused), appliers stopped and inbound links closed, handshakes refused;
  after a short grace that lets health checks see why, the process stops with
  `node.fatal = LeaseLost` (exit code 1) well before the lease expires. A process paused past
  its deadline begins the loss at the first thing it does after (`serving()`): nothing is
  claimed, acknowledged or sent, and no handshake taken, before the renewal's timer runs.
- Store calls block (flock, boto3), so they run on daemon threads: a hung call can delay
  neither the event loop nor the process exit. After a loss the process also skips the
  interpreter's teardown once the node has stopped (node/identity/lease_exit.py).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import math
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

from node import limits
from node.errors import PeerRefused, RemoteProtocolError, StorageError
from node.identity import lease as core
from node.identity.lease import LeaseLost
from node.identity.lease_manager import LeaseManager
from node.identity.lease_runner import run_lease
from node.identity.lease_store import LeaseStore, LeaseStoreUnavailable, open_store
from node.identity import lease_startup, lease_view, slot_dir
from node.identity.lease_exit import DaemonThreadExecutor, exit_at_once
from node.identity.lease_view import parse_greeting_lease

if TYPE_CHECKING:
    from node.process.ports import LeaseHost

log = logging.getLogger("replog.identity.lease")


class NoLeaseSlot(StorageError):
    """Start-up ended without a lease slot (the node was told to stop while every slot was held).

    Not a bug: the lease store's slots were all taken by other nodes."""


def default_task_id() -> str:
    """Unique per process: host, pid and a random suffix (a restarted container may reuse a pid)."""
    return f"{socket.gethostname()[:200]}:{os.getpid()}:{secrets.token_hex(4)}"


class LeaseIdentity:
    def __init__(self, node: "LeaseHost", *, exit_at_once_on_loss: bool = True):
        """`exit_at_once_on_loss=False` is for tests that run a LeaseIdentity inside the test
        process: a loss must not end that process (see lease_exit.exit_at_once)."""
        self.node = node
        self._exit_at_once_on_loss = exit_at_once_on_loss
        cfg = node.cfg
        self.task_id = cfg.task_id or default_task_id()
        self.store: LeaseStore | None = None
        self._store_closed = False
        self.manager: LeaseManager | None = None
        self.executor = DaemonThreadExecutor()
        self._stop = asyncio.Event()
        self._runner: asyncio.Task | None = None
        self._wind_down_task: asyncio.Task | None = None
        # Our lease as acquired; kept after a loss so greetings and /v1/info still say what it was.
        self.slot: int | None = None
        self.version: int | None = None
        self.member_uuid: str | None = None
        self.seen: dict[int, int] = {}               # fencing: slot -> highest version read from the store
        self.fenced = 0                              # handshakes refused for an older version
        self.verifications = 0                       # re-reads of the store a peer's claim asked for
        self._verify_task: asyncio.Task | None = None
        self._verify_again = False
        self._verified_at = -math.inf                # monotonic time of the last re-read
        self.lost_reason: str | None = None
        self.released: bool | None = None
        # Taking over from a holder that did not release: wait for peers (see module doc).
        self.peer_wait_until_ms: int | None = None
        self.peers_confirmed: set[str] = set()       # peer addresses whose greeting showed our version
        self.peer_wait_outcome: str | None = None    # "confirmed" | "timed_out" | None (no wait needed)
        self.peers_changed = asyncio.Event()
        # mark_serving's record landed: from here on this process may claim lsns of the member
        # (the own-rows fence lifts only then: node/fence.py try_lift)
        self.served_recorded = False

    # --- start-up --------------------------------------------------------------------
    async def acquire(self) -> None:
        """Take a slot (waiting while all are held), set the node's data dir and start renewing."""
        node, cfg = self.node, self.node.cfg
        self.store = open_store(cfg.lease_store)
        self.manager = mgr = LeaseManager(self.store, cfg.cluster_size, self.task_id, cfg.lease_duration_s)
        node.status_reason = f"acquiring a lease slot in {self.store.url}"
        log.info("lease: task %s looking for a slot among %d in %s", self.task_id, cfg.cluster_size, self.store.url)
        await self._store_step("bootstrap", mgr.bootstrap)
        started = time.monotonic()
        last_logged: float | None = None
        poll_s = max(mgr.duration_ms / limits.lease_acquire_poll_divisor / 1000, limits.lease_acquire_retry_s_min)
        # The slots this node holds data of: one that nobody held since is the one it takes.
        held_here = slot_dir.mine(os.path.abspath(cfg.data_dir))
        served_here = slot_dir.last_served(os.path.abspath(cfg.data_dir), held_here)
        if held_here:
            log.info("lease: this node holds data of slot(s) %s (taken last at version(s) %s, served last at %s): it "
                     "takes such a slot if no holder served it since", ", ".join(map(str, sorted(held_here))),
                     ", ".join(str(held_here[k]) for k in sorted(held_here)),
                     ", ".join(str(served_here[k]) for k in sorted(held_here)))
        while True:
            lease = await self._store_step("acquire", functools.partial(mgr.acquire, held_here, served_here))
            if lease is not None:
                break
            waited = time.monotonic() - started
            node.status_reason = f"all {cfg.cluster_size} lease slots in {self.store.url} are held; waiting"
            if last_logged is None or time.monotonic() - last_logged >= limits.lease_acquire_log_s:
                what = f"all {cfg.cluster_size} slots in {self.store.url} are"
                if held_here:
                    what = f"the slot whose data this node holds (or, once another node held it, {what[:-4]}) is"
                log.info("lease: %s held by other nodes; waiting for one to be released or expire (waited %.0f s)",
                         what, waited)
                last_logged = time.monotonic()
            if await self._stopped_within(poll_s):
                raise NoLeaseSlot(f"stopped after {waited:.0f} s without a lease slot: all {cfg.cluster_size} "
                                  f"slots in {self.store.url} are held by other nodes")
        self.slot, self.version, self.member_uuid = lease.slot, lease.version, lease.member_uuid
        for slot, version in mgr.known_versions.items():
            if version:   # version 0: never held, fences nothing
                self.seen = core.note_version(self.seen, slot, version)
        self.seen = core.note_version(self.seen, lease.slot, lease.version)
        if mgr.wait_for_peers:
            self.peer_wait_until_ms = mgr.peer_wait_until_ms
        node.data_dir = os.path.join(os.path.abspath(cfg.data_dir), f"slot-{lease.slot}")
        # A dir another holder's tenure made stale is moved aside (node/identity/slot_dir.py).
        await asyncio.get_running_loop().run_in_executor(self.executor, slot_dir.take, node.data_dir,
                                                         lease.slot, lease.version, core.served_version(lease))
        log.info("lease: serving as member %s of slot %d at version %d; data in %s", lease.member_uuid,
                 lease.slot, lease.version, node.data_dir)
        self._runner = asyncio.create_task(run_lease(mgr, self._on_lost, self._stop, executor=self.executor),
                                           name="lease-renew")
        self._runner.add_done_callback(self._runner_done)

    async def _store_step(self, what: str, fn) -> Any:
        """One blocking manager step off the loop; retries while the store does not answer."""
        loop = asyncio.get_running_loop()
        first_failure: float | None = None
        delay = limits.lease_acquire_retry_s_min
        while True:
            try:
                return await loop.run_in_executor(self.executor, fn)
            except LeaseStoreUnavailable as e:
                now = time.monotonic()
                first_failure = first_failure or now
                if now - first_failure >= limits.lease_acquire_store_retry_s_max:
                    log.error("lease: %s gave up after %.0f s: %s", what, now - first_failure, e)
                    raise
                log.warning("lease: %s: %s; retrying", what, e)
                if await self._stopped_within(delay):
                    raise
                delay = min(delay * 2, limits.lease_acquire_retry_s_max)

    async def _stopped_within(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for the node to be told to stop; True if it was."""
        try:
            async with asyncio.timeout(timeout_s):   # wait_for would lose a cancel arriving with the stop
                await self.node.stopped.wait()
        except TimeoutError:
            pass
        return self.node.stopped.is_set()

    def _runner_done(self, t: asyncio.Task) -> None:
        if not t.cancelled() and t.exception() is not None:
            self.node.on_fatal(t.exception())   # a bug in the renewal path: stop rather than serve unrenewed

    # --- start-up: waiting for peers, then serving (node/identity/lease_startup.py) ---------
    def ready(self) -> bool:
        """May the node report "running"? False after a loss, and while waiting for peers."""
        return lease_startup.ready(self)

    async def wait_ready(self) -> None:
        await lease_startup.wait_ready(self)

    async def mark_serving(self) -> None:
        await lease_startup.mark_serving(self)

    # --- handshakes ------------------------------------------------------------------
    def greeting_field(self) -> dict:
        return {"slot": self.slot, "version": self.version,
                "seen": {str(k): v for k, v in sorted(self.seen.items())}}

    def serving(self) -> bool:
        """Whether this node may act as the slot's member now: not lost, and the renewal deadline
        not passed by the clock. A process that was paused (SIGSTOP, a frozen VM, a stalled loop)
        past its deadline runs whatever was waiting first (a request in a socket before the
        renewal's timer): every path that claims, acknowledges or sends rows of ours, and every
        handshake, asks here first, and the loss begins at once, synchronously."""
        if self.lost_reason is not None:
            return False
        mgr = self.manager
        if mgr is None or mgr.lease is None or mgr.holds_valid_lease():
            return True
        late_s = mgr.late_ms() / 1000
        self.lose_now(f"the renewal deadline passed {late_s:.1f} s ago with no renewal: this process was paused "
                       "or stalled (a stopped process, a frozen VM, a blocked event loop)")
        return False

    def check_peer(self, theirs: dict) -> None:
        """Fencing for one peer greeting (either side of a handshake): raises PeerRefused to refuse.
        Acts on versions read from the lease store only; newer claims ask for a re-read."""
        peer = f"{theirs.get('address')} ({str(theirs.get('uuid'))[:8]})"
        if not self.serving():
            raise PeerRefused("lease_lost", f"this node lost lease slot {self.slot} ({self.lost_reason}); "
                                            f"it no longer replicates")
        slot, version, their_seen = parse_greeting_lease(theirs)
        if not core.check_fencing(self.seen, slot, version):
            self.fenced += 1
            raise PeerRefused("lease_fenced", f"{peer} claims lease slot {slot} at version {version}, but version "
                                              f"{self.seen[slot]} of that slot exists: the peer is a stale holder "
                                              f"and must stop")
        claims = dict(their_seen)
        claims[slot] = max(claims.get(slot, 0), version)
        if core.unverified_claims(self.seen, claims) and self.manager is not None:
            self._verify_soon()
        if self.version is not None and their_seen.get(self.slot, 0) >= self.version:
            address = theirs.get("address")
            if isinstance(address, str) and address not in self.peers_confirmed:
                self.peers_confirmed.add(address)
                self.peers_changed.set()

    def _fence_open_links(self) -> None:
        """A link this node follows whose upstream greeted it as the holder of a slot at a version
        older than one now read from the store ends at once: that upstream is a stale holder
        (paused past its lease, or its clock behind), and a row it still sent could be a second
        row for an (origin, lsn) the new holder writes. Its next handshake is refused by
        check_peer. The old holder stops sending at its own deadline (`serving`); this closes
        the window on the receiving side, whatever its clock says."""
        for a in list(self.node.appliers.values()):
            mach = a.machine
            theirs = mach.greeting if mach is not None else None
            if a.conn is None or not theirs:
                continue
            try:
                slot, version, _ = parse_greeting_lease(theirs)
            except RemoteProtocolError:
                continue
            if not core.check_fencing(self.seen, slot, version):
                self.fenced += 1
                a.fence(f"{a.address} greeted as the holder of lease slot {slot} at version {version}, but version "
                        f"{self.seen[slot]} of that slot exists: the peer is a stale holder; its link is closed")

    def _verify_soon(self) -> None:
        """Re-read the lease store (once at a time, at most every lease_verify_interval_s)."""
        if self._verify_task is not None and not self._verify_task.done():
            self._verify_again = True
            return
        self._verify_task = asyncio.get_running_loop().create_task(self._verify(), name="lease-verify")
        self._verify_task.add_done_callback(self._runner_done)

    async def _verify(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.0, self._verified_at + limits.lease_verify_interval_s - time.monotonic()))
            self._verify_again = False
            try:
                versions, lost = await loop.run_in_executor(self.executor, self.manager.refresh)
            except LeaseStoreUnavailable as e:
                # The renewal path owns store outages (it stops serving at the deadline).
                log.warning("lease: re-reading the store after a peer's claim failed: %s", e)
                return
            finally:
                self._verified_at = time.monotonic()
            self.verifications += 1
            before = self.seen
            for s, v in versions.items():
                if v:
                    self.seen = core.note_version(self.seen, s, v)
            if self.seen != before:
                self._fence_open_links()
            if lost is not None and self.lost_reason is None:
                self.lose_now(f"the lease store shows slot {self.slot} taken over: {lost}")
                return
            if not self._verify_again:
                return

    # --- loss ------------------------------------------------------------------------
    async def _on_lost(self, reason: str) -> None:
        """The runner's on_lost: called once when no renewal succeeded or the slot was taken."""
        if self._begin_loss(reason):
            await self._wind_down()

    def lose_now(self, reason: str) -> None:
        """A loss seen outside the runner (a peer showed a newer version of our slot)."""
        if self._begin_loss(reason):
            self._stop.set()   # the runner ends without calling on_lost again
            self._wind_down_task = asyncio.get_running_loop().create_task(self._wind_down(), name="lease-lost")

    def _begin_loss(self, reason: str) -> bool:
        """Stop serving at once (synchronously: no await before writes are refused). False if already lost."""
        if self.lost_reason is not None:
            return False
        node = self.node
        self.lost_reason = reason
        node.fatal = node.fatal or LeaseLost(self.slot, reason)
        node.status, node.status_reason = "lease_lost", f"lease slot {self.slot} lost: {reason}; exiting"
        log.critical("lease: slot %s version %s lost: %s; stopped serving, exiting", self.slot, self.version, reason)
        if self._exit_at_once_on_loss:
            atexit.register(exit_at_once, 1)   # serve() returns 1 for node.fatal; keep that code
        return True

    async def _wind_down(self) -> None:
        node = self.node
        me = asyncio.current_task()
        node.tasks.cancel_all(but=me)   # start-up steps (join, bootstrap) must not resume serving
        for a in list(node.appliers.values()):
            try:
                await asyncio.wait_for(a.stop(), limits.lease_wind_down_step_s)
            except (asyncio.TimeoutError, Exception) as e:  # noqa: BLE001 - the exit must not wait on one applier
                log.error("lease: stopping applier %s after the loss failed: %s", a.address, e)
        node.appliers.clear()
        # Every link accept took, not only the relays streaming: one greeted before the loss
        # could otherwise subscribe or register during the grace. Links opened from now on
        # are refused by check_peer ("lease_lost").
        links = list(node.links)
        if links:
            await asyncio.gather(*(c.close(going_away=True) for c in links))
        # Keep answering 503 (with the reason) briefly so health checks see why, then exit;
        # by construction this ends well before the lease expires.
        grace_ms = min(core.safety_margin_ms(self.manager.duration_ms) // limits.lease_lost_grace_divisor,
                       limits.lease_lost_grace_ms_max)
        await self._stopped_within(grace_ms / 1000)
        node.stopped.set()

    # --- shutdown --------------------------------------------------------------------
    async def release(self) -> None:
        """Orderly shutdown: stop renewing and give the slot back (not after a loss)."""
        self._stop.set()
        if self._verify_task is not None:
            self._verify_task.cancel()
        for t in (self._runner, self._wind_down_task):
            if t is not None and not t.done():
                try:
                    await t
                except asyncio.CancelledError:
                    if asyncio.current_task().cancelling():
                        raise
                except Exception:  # noqa: BLE001 - already reported by _runner_done / on_fatal
                    pass
        try:
            mgr = self.manager
            if mgr is None or mgr.lease is None or self.lost_reason is not None:
                if self.slot is not None:
                    log.info("lease: slot %s not released (%s)", self.slot, self.lost_reason or "not held")
                return
            loop = asyncio.get_running_loop()
            self.released = await loop.run_in_executor(self.executor, mgr.release)
        finally:
            if self.store is not None and not self._store_closed:
                self._store_closed = True
                self.store.close()   # a call still hanging on a daemon thread just fails

    # --- views -----------------------------------------------------------------------
    def state(self) -> str:
        return lease_view.state(self)

    def info(self) -> dict:
        return lease_view.info(self)

    def metrics(self) -> list:
        return lease_view.metrics(self)
