"""Group commit: the one writer of the WAL and the store.

Every transaction to persist is submitted as one *entry* (it becomes one WAL frame: a
local txn, or a remote txn together with the `_cluster` txn its applier wrote for it).
One task drains the queue and performs, per batch, in this order:
  1. encode frames; 2. one WAL write (+ one fsync in fsync mode); 3. one LMDB
  transaction; 4. advance the core's durable vclock; 5. resolve waiters; 6. wake relays.
Entries are persisted in submission order, which is the order the core claimed lsns in.
A failure to persist is fatal: the node stops rather than acknowledge what it lost."""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Callable

from node import limits
from node.core.replicaset import NodeCore
from node.core.rows import Txn
from node.storage.store import Store
from node.wal import format as walfmt
from node.wal.writer import WalWriter

log = logging.getLogger("replog.journal")


class Journal:
    def __init__(self, core: NodeCore, store: Store, wal: WalWriter | None,
                 on_fatal: Callable[[BaseException], None]):
        self.core = core
        self.store = store
        self.wal = wal
        self._on_fatal = on_fatal
        self._queue: deque[tuple[list[Txn], asyncio.Future | None, int]] = deque()   # (entry, waiter, rows)
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._loop = asyncio.get_running_loop()
        self.failed: BaseException | None = None
        self.rows_written = 0
        self.txns_written = 0
        self.batches = 0
        self.pending_rows = 0       # rows queued, not yet durable: appliers pause above a bound
        # (segment, end offset) of whole durable frames: relays never read past it
        self.position: tuple[str | None, int] = (wal.segment, wal.end) if wal else (None, 0)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="journal")

    async def stop(self) -> None:
        if self._task:
            # Let queued entries finish: they were claimed and some callers wait on them.
            while self._queue and self.failed is None and not self._task.done():
                await self.changed(timeout=1.0)
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self.wal:
            self.wal.close()

    # --- submitting -----------------------------------------------------------------
    def submit_nowait(self, txns: list[Txn], want_future: bool = True) -> asyncio.Future | None:
        """Queue one entry (one frame). Must be called right after the core claimed it,
        with no await in between, so WAL order equals claim order."""
        if self.failed is not None:
            raise self.failed
        fut = self._loop.create_future() if want_future else None
        rows = sum([len(t[4]) for t in txns])     # counted once here; the writer only adds up entries
        self._queue.append((txns, fut, rows))
        self.pending_rows += rows
        self._wake.set()
        return fut

    async def submit(self, txns: list[Txn]) -> None:
        fut = self.submit_nowait(txns)
        await fut  # type: ignore[misc]

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def changed(self, timeout: float | None = None) -> None:
        """Wait until the next batch is durable (relays wait here for new rows)."""
        ev = self._changed
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    # --- the writer -----------------------------------------------------------------
    async def _run(self) -> None:
        loop = self._loop
        batch: list[tuple[list[Txn], asyncio.Future | None, int]] = []
        queue = self._queue
        try:
            while True:
                if not queue:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                batch = []
                txns: list[Txn] = []
                rows = 0
                while queue and len(batch) < limits.group_commit_txns_max and 64 * rows < limits.group_commit_bytes_max:
                    entry = queue.popleft()
                    batch.append(entry)
                    txns += entry[0]
                    rows += entry[2]
                await loop.run_in_executor(None, self._persist, batch, txns)
                if self.wal is not None:
                    self.position = (self.wal.segment, self.wal.end)
                self.core.commit(txns)
                self.batches += 1
                self.txns_written += len(txns)
                self.rows_written += rows
                self.pending_rows -= rows
                for _, fut, _ in batch:
                    if fut is not None and not fut.done():
                        fut.set_result(None)
                ev, self._changed = self._changed, asyncio.Event()
                ev.set()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a persistence failure: nothing after it may be acknowledged
            self.failed = e
            log.critical("journal: cannot persist: %s", e)
            # the batch that failed was already taken off the queue: its waiters too
            for _, fut, _ in batch:
                if fut is not None and not fut.done():
                    fut.set_exception(e)
            while self._queue:
                _, fut, _ = self._queue.popleft()
                if fut is not None and not fut.done():
                    fut.set_exception(e)
            self._on_fatal(e)

    def _persist(self, batch: list[tuple[list[Txn], asyncio.Future | None, int]], txns: list[Txn]) -> None:
        """Runs in one executor thread at a time: WAL first, then the store."""
        if self.wal is not None:
            if self.wal.needs_rotation:
                self.wal.rotate(self.store.vclock.to_dict(), self.store.table.rows())
            now_us = time.time_ns() // 1000
            data = b"".join([walfmt.encode_frame(entry, now_us) for entry, _, _ in batch])
            self.wal.write_batch(data)
        self.store.apply(txns, self.core.uuid, self.core.hlc.last)
