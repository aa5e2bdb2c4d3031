"""Group commit: the one writer of the WAL and the store.

Every transaction to persist is submitted as one *entry* (node.core.entry: it becomes one WAL
frame: a local txn, or a remote txn together with the `_cluster` txn its applier wrote for it,
or the plain txns an applier took from one scanned message, a `PackedEntry` whose frame and
store records are built from the received bytes). The journal never asks which kind it holds.
One task drains the queue and performs, per batch, in this order (on an executor thread
for steps 1-3, or on the loop itself for a small batch that cannot wait for the disk):
  1. encode frames; 2. one WAL write (+ one fsync in fsync mode); 3. one LMDB
  transaction; 4. publish the durable position and the batch's frames (the tail);
  5. advance the core's vclock (and its synced one, when the batch was fsync'd); 6. wake
  relays; 7. resolve waiters.
On the loop, 4 and 6 come right after 2 and the journal yields once before 3, so relays
send while the store applies; either way nothing is sent before its WAL write returned.
Entries are persisted in submission order, which is the order the core claimed lsns in.
A failure to persist is fatal: the node stops rather than acknowledge what it lost. Except
a lack of room (NoSpaceError: a full disk or map): the batch is kept, whatever part of it
was done stays done (a WAL write that failed left nothing behind), and it is tried again
every `nospace_retry_s` while the NOSPACE alarm is raised (node/storage/space.py); its
waiters are answered when it lands. The lsns it claimed are never given up.
Stopping: the queued entries land first, then the task is cancelled; a cancel does not stop an
executor thread, so a call one is making for it (a batch, an fsync) is waited for before the WAL
closes under it.

The tail (node/journal_tail.py): while relays listen, the frames of the last few durable batches
stay in memory, published as `position` moves past them, so a caught-up relay sends them without
reading the file back."""
from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections import deque
from typing import Callable

from node import limits
from node.core.entry import Entry, TxnEntry
from node.core.replicaset import NodeCore
from node.core.rows import Txn
from node.errors import NoSpaceError
from node.latency import Histogram
from node.journal_tail import Position, Tail
from node.storage.store import Store
from node.wal import format as walfmt
from node.wal.writer import WalWriter

log = logging.getLogger("replog.journal")


class Journal:
    def __init__(self, core: NodeCore, store: Store, wal: WalWriter | None,
                 on_fatal: Callable[[BaseException], None], space=None):
        self.core = core
        self.space = space          # node.storage.space.SpaceWatch: told when a batch waits for room
        self.nospace: NoSpaceError | None = None    # the kept batch's last failure, while it waits
        self.store = store
        self.wal = wal
        self._on_fatal = on_fatal
        self._queue: deque[tuple[Entry, asyncio.Future | None]] = deque()   # (entry, waiter)
        self._in_flight = 0         # entries taken off the queue whose rows the core's vclock lacks yet
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._off_loop_work: asyncio.Future | None = None   # an executor thread's call under way (_off_loop)
        self._loop = asyncio.get_running_loop()
        self.failed: BaseException | None = None
        self.rows_written = 0
        self.txns_written = 0
        self.batches = 0
        self.commit_seconds = Histogram()   # one batch: WAL write (+ fsync) and LMDB commit, until durable
        self.pending_rows = 0       # rows queued, not yet durable: appliers pause above a bound
        # (segment, end offset) of whole durable frames: relays never read past it
        self.position: Position = (wal.segment, wal.end) if wal else (None, 0)
        # ... and of whole frames the store has applied too: every row before it is in the store
        # (a backup replays its copy of the store from here: node/ops/backup.py)
        self.applied: Position = self.position
        # (segment, end offset) of whole frames on disk: relays to anonymous replicas read no further
        # in wal_mode write (a member that lost its unsynced tail hears from every member before it
        # writes again, node/fence.py; an anonymous replica is never asked, so it gets no such row)
        self.synced_position: Position = self.position
        self.tail = Tail()                          # node/journal_tail.py: kept only while somebody listens
        self._listeners: set[asyncio.Event] = set()
        self._synced_at = time.monotonic()          # wal_mode write: the last periodic fsync (_sync_due)
        self._sync_waiters: list[asyncio.Future] = []  # wal_mode write: durable() callers, for the next fsync

    @property
    def _inline_ok(self) -> bool:
        """A batch may be persisted on the event loop only if nothing in it can wait for the
        disk: no fsync (wal_mode write: the WAL write and LMDB's unsynced commit go to the
        page cache) and no rotation (which fsyncs the new segment and the directory)."""
        return self.wal is None or (self.wal.mode != "fsync" and not self.wal.needs_rotation)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="journal")

    async def stop(self) -> None:
        if self._task:
            # Let queued entries finish: they were claimed and some callers wait on them.
            while self._queue and self.failed is None and self.nospace is None and not self._task.done():
                await self.changed(timeout=limits.journal_drain_wait_s)
            asked = [f for f in self._sync_waiters if not f.done()]   # durable() callers
            if asked:                               # the fsync they asked for comes next (_sync_due)
                await asyncio.wait(asked, timeout=limits.journal_drain_wait_s)
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._fail_sync_waiters(RuntimeError("the journal stopped before the fsync asked for"))
            work = self._off_loop_work
            if work is not None:
                # The cancel stopped the task, not the thread writing the WAL for it: let the
                # thread finish before the WAL is closed under it (its result goes unread; the
                # next start recovers what it wrote).
                await asyncio.wait([work])
                if not work.cancelled() and work.exception() is not None:
                    log.warning("journal: the write under way at the stop failed: %s: %s",
                                type(work.exception()).__name__, work.exception())
        if self.wal:
            self.wal.close()

    # --- submitting -----------------------------------------------------------------
    def submit_entry_nowait(self, entry: Entry, want_future: bool = True) -> asyncio.Future | None:
        """Queue one entry (one frame). Must be called right after the core claimed it,
        with no await in between, so WAL order equals claim order."""
        if self.failed is not None:
            raise self.failed
        fut = self._loop.create_future() if want_future else None
        self._queue.append((entry, fut))
        self.pending_rows += entry.rows
        self._wake.set()
        return fut

    def submit_nowait(self, txns: list[Txn], want_future: bool = True,
                      rows: int | None = None) -> asyncio.Future | None:
        """submit_entry_nowait of these txns as one entry; `rows`: their row count, if the
        caller knows it."""
        return self.submit_entry_nowait(TxnEntry(txns, rows), want_future)

    async def submit(self, txns: list[Txn]) -> None:
        fut = self.submit_nowait(txns)
        await fut  # type: ignore[misc]

    async def durable(self) -> None:
        """Return once every batch written so far is on disk, whatever `wal_mode` says (in
        `write` an fsync is asked for now instead of at the next interval). For rows a peer is
        answered about and relies on: a registration (a member its donor forgot after a power loss
        would be waited for by a fence) and an expel. Raises what stopped the journal."""
        wal = self.wal
        if wal is None or wal.synced_bytes == wal.bytes_written:     # (always, in fsync mode)
            return
        if self.failed is not None:
            raise self.failed
        fut = self._loop.create_future()
        self._sync_waiters.append(fut)
        self._wake.set()
        await fut

    @property
    def pending(self) -> int:
        """Entries submitted whose rows are not in the core's vclock yet: queued, being
        persisted, or kept for want of room. 0 means drained: the vclock holds every row
        submitted (a rejoin takes what a snapshot must cover only then: node/rejoin.py)."""
        return len(self._queue) + self._in_flight

    async def changed(self, timeout: float | None = None) -> None:
        """Wait until the next batch is durable (relays wait here for new rows)."""
        ev = self._changed
        try:
            async with asyncio.timeout(timeout):     # not wait_for: it can swallow a cancellation (3.11)
                await ev.wait()
        except TimeoutError:
            pass

    # --- relays: wake-ups and the in-memory tail ---------------------------------------
    def listen(self, wake: asyncio.Event) -> None:
        """`wake` is set after every durable batch; the tail is kept while anyone listens."""
        self._listeners.add(wake)

    def unlisten(self, wake: asyncio.Event) -> None:
        self._listeners.discard(wake)
        if not self._listeners:
            self.tail.drop()

    # --- the writer -----------------------------------------------------------------
    async def _run(self) -> None:
        batch: list[tuple[Entry, asyncio.Future | None]] = []
        queue = self._queue
        try:
            while True:
                if not queue:
                    self._wake.clear()
                    due = self._sync_due()
                    if due is None:
                        await self._wake.wait()
                        continue
                    try:
                        async with asyncio.timeout(due):
                            await self._wake.wait()
                    except TimeoutError:
                        await self._sync_written()
                    continue
                batch = []
                entries: list[Entry] = []         # for the store, in order
                ntxn = rows = 0
                while queue and len(batch) < limits.group_commit_txns_max and 64 * rows < limits.group_commit_bytes_max:
                    item = queue.popleft()
                    batch.append(item)
                    e = item[0]
                    entries.append(e)
                    ntxn += e.ntxn
                    rows += e.rows
                self._in_flight = len(batch)
                woken = False
                t0 = time.perf_counter()
                try:
                    if rows <= limits.journal_inline_rows_max and self._inline_ok:
                        # Small batch, no fsync (limits.py): on the loop. The rows may leave once
                        # write() has returned, so relays send them while the store applies them.
                        written = self._write(batch)
                        self._advance(written)
                        if written is not None and self._listeners:
                            for wake in self._listeners:
                                wake.set()
                            woken = True
                            try:
                                await asyncio.sleep(0)          # the woken relays send now
                            finally:                            # even if cancelled: the rows are in the WAL
                                tops = self._try_apply(entries)
                        else:
                            tops = self._try_apply(entries)
                    else:
                        written, tops = await self._off_loop(self._persist, batch, entries)
                        self._advance(written)
                except NoSpaceError as e:                       # the WAL write: nothing of it landed
                    tops = await self._wait_for_room(batch, entries, e, wal_done=False)
                if isinstance(tops, NoSpaceError):              # the store: the WAL holds the batch
                    tops = await self._wait_for_room(batch, entries, tops, wal_done=True)
                self.applied = self.position
                if self.space is not None and self.wal is not None:
                    self.space.wrote(self.wal.bytes_written)
                self.core.commit_tops(tops, on_disk=self.wal is not None and self.wal.mode == "fsync")
                self._in_flight = 0
                self.commit_seconds.observe(time.perf_counter() - t0)
                self.batches += 1
                self.txns_written += ntxn
                self.rows_written += rows
                self.pending_rows -= rows
                # Relays first: the loop runs ready tasks in order, and a woken HTTP handler
                # spends ~0.3 ms building its answer, which the rows would otherwise wait for.
                if not woken:
                    for wake in self._listeners:
                        wake.set()
                for _, fut in batch:
                    if fut is not None and not fut.done():
                        fut.set_result(None)
                ev, self._changed = self._changed, asyncio.Event()
                ev.set()
                if self._sync_due() == 0:
                    await self._sync_written()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a persistence failure: nothing after it may be acknowledged
            self.failed = e
            self._in_flight = 0                     # failed below: nothing of it will land
            # Every row was checked before it was claimed, so this is the disk, or a bug: the node
            # stops (it cannot acknowledge), and the next start's recovery replays the WAL and
            # names any row the store still refuses, with the way out (node/wal/recovery.py).
            log.critical("journal: cannot persist: %s: %s", type(e).__name__, e, exc_info=e)
            # the batch that failed was already taken off the queue: its waiters too
            for _, fut in batch:
                if fut is not None and not fut.done():
                    fut.set_exception(e)
            while self._queue:
                _, fut = self._queue.popleft()
                if fut is not None and not fut.done():
                    fut.set_exception(e)
            self._fail_sync_waiters(e)
            self._on_fatal(e)

    # --- wal_mode write: what reaches the disk, and when ----------------------------------
    def _fail_sync_waiters(self, e: BaseException) -> None:
        waiters, self._sync_waiters = self._sync_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_exception(e)

    def _sync_due(self) -> float | None:
        """wal_mode write: seconds until the written tail should be fsync'd (0: now), None if
        nothing waits for it. fsync mode syncs every batch; the core's `synced` vclock, which
        ACKs report and WAL holds go by, moves with it either way."""
        wal = self.wal
        if self._sync_waiters:
            return 0.0
        if wal is None or wal.mode != "write" or wal.synced_bytes == wal.bytes_written:
            return None
        return max(0.0, self._synced_at + limits.wal_sync_interval_s - time.monotonic())

    async def _sync_written(self) -> None:
        applied = self.core.vclock.copy()       # every row in it was written before the fsync below
        position = self.position
        waiters, self._sync_waiters = self._sync_waiters, []    # their batches were all written
        try:
            await self._off_loop(self.wal.sync)
        except BaseException:
            self._sync_waiters += waiters       # answered with the failure (_run), or at the stop
            raise
        self._synced_at = time.monotonic()
        self.core.mark_synced(applied)
        self.synced_position = position
        for wake in self._listeners:            # anonymous replicas' relays may send it now
            wake.set()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _off_loop(self, fn, *args):
        """fn(*args) on an executor thread. A cancel of the journal's task does not stop the
        thread, so the call is kept until it ends: `stop` waits for it before it closes the WAL."""
        work = self._loop.run_in_executor(None, fn, *args)
        self._off_loop_work = work
        try:
            return await asyncio.shield(work)
        finally:
            if work.done():
                self._off_loop_work = None

    def _advance(self, written: tuple | None) -> None:
        """The batch is durable (as wal_mode promises): move the position relays may read up
        to, and hand its frames to the tail."""
        if written is not None:
            prev, self.position = self.position, (written[0], written[2])
            if self.wal is not None and self.wal.mode == "fsync":
                self.synced_position = self.position
            if self._listeners:
                self.tail.publish(prev, *written)

    def _persist(self, batch: list[tuple[Entry, asyncio.Future | None]],
                 entries: list[Entry]) -> tuple[tuple[str, int, int, int, tuple] | None, dict[int, int] | NoSpaceError]:
        """On an executor thread: WAL first, then the store; returns both results (the store's
        may be the NoSpaceError that kept it from applying the batch)."""
        written = self._write(batch)
        return written, self._try_apply(entries)

    def _try_apply(self, entries: list[Entry]) -> dict[int, int] | NoSpaceError:
        try:
            return self._apply(entries)
        except NoSpaceError as e:
            return e

    async def _wait_for_room(self, batch: list, entries: list, e: NoSpaceError, *, wal_done: bool) -> dict[int, int]:
        """A batch that found no room: keep it, raise the alarm, try it again until it lands.
        `wal_done`: its WAL write went through (position advanced); only the store is left."""
        self.nospace = e
        if self.space is not None:
            self.space.on_failure(e)
        log.error("journal: no room to persist a batch of %d entries (%s): %s; it is kept and tried again every "
                  "%g s", len(batch), "the WAL holds it, the store does not yet" if wal_done else "nothing of it "
                  "was written", e, limits.nospace_retry_s)
        while True:
            await asyncio.sleep(limits.nospace_retry_s)
            try:
                if not wal_done:
                    written = await self._off_loop(self._write, batch)
                    wal_done = True
                    self._advance(written)
                tops = await self._off_loop(self._try_apply, entries)
            except NoSpaceError as again:
                tops = again
            if not isinstance(tops, NoSpaceError):
                break
            self.nospace = tops
            if self.space is not None:
                self.space.on_failure(tops)
        self.nospace = None
        if self.space is not None:
            self.space.on_recovered()
        log.warning("journal: the kept batch of %d entries is persisted; there is room again", len(batch))
        return tops

    def _write(self, batch: list[tuple[Entry, asyncio.Future | None]]) -> tuple[str, int, int, int, tuple] | None:
        """The WAL write (+ fsync in fsync mode) of one batch. Returns where the frames went
        (segment, start, end), their written_us and, per frame, (end offset, payload, entry)
        for the tail; None without a WAL."""
        if self.wal is None:
            return None
        try:
            if self.wal.needs_rotation:
                self.wal.rotate(self.store.vclock.to_dict(), self.store.table.rows())
            now_us = time.time_ns() // 1000
            encoded = [walfmt.encode_frame_body(entry.frame_payload(now_us)) for entry, _ in batch]
            data = b"".join(encoded)
            segment, start, end = self.wal.write_batch(data)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):      # the writer left no partial frame behind
                raise NoSpaceError("disk", f"WAL write failed: {e.strerror} ({self.wal.dir})") from None
            raise
        view, frames, off = memoryview(data), [], 0
        for (entry, _), f in zip(batch, encoded):
            off += len(f)
            frames.append((start + off, view[off - len(f) + walfmt.FRAME_OVERHEAD:off], entry))
        assert start + off == end, (start, off, end)
        return segment, start, end, now_us, tuple(frames)

    def _apply(self, entries: list[Entry]) -> dict[int, int]:
        """One LMDB transaction for the batch; returns the store's commit tops."""
        return self.store.apply(entries, self.core.uuid, self.core.hlc.last)
