"""A backup of the running node from inside it (`POST /v1/admin/backup`): node/ops/backup.py's
BackupJob, its slow steps on a thread and the backup point taken on the event loop, and what
else the node does meanwhile must respect.

Rules kept here:
- At most `limits.backups_in_flight_max` at a time; none while the node rejoins (its store may
  be swapped for one rebuilt from a snapshot: process/opening.py waits for one under way) or
  stops (its store is about to close).
- A client that goes away does not stop a backup half-way: it ends, or cleans up, by itself.
- A stopping node gives up its backups under way (`abandon_backups`), after the step each is in:
  a store copy reads through the node's own LMDB handle and cannot be interrupted."""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING

from node import limits
from node.ops.backup import BackupError, BackupJob
from node.process.ports import ENDING

if TYPE_CHECKING:
    from node.process.ports import BackupHost

log = logging.getLogger("replog.backup")


async def backup_node(node: "BackupHost", out: str, *, compact: bool = False) -> dict:
    """`POST /v1/admin/backup`: a backup of this running node. The event loop only picks the
    point: the journal's durable position once the store copy is done."""
    if not os.path.isabs(out):         # the node's working directory is nothing its client knows
        raise BackupError(400, "bad_destination", f"{out}: the destination must be an absolute path on the "
                          "node's host")
    if node.store is None or node.core is None or node.journal is None:
        raise BackupError(503, "not_ready", f"node is {node.status}: it has no store to back up yet")
    if node.status == "rejoining":   # its store may be swapped for a rebuilt one under the copy
        raise BackupError(503, "not_ready", "node is rejoining (its store may be replaced by a donor's snapshot): "
                          "back it up once it is running again")
    if node.status in ENDING:          # its store is about to close
        raise BackupError(503, "not_ready", f"node is {node.status}: {node.status_reason}")
    if len(node.backups) >= limits.backups_in_flight_max:
        raise BackupError(409, "backup_in_progress", f"a backup of this node is running (to {node.backups[0].out})")
    loop = asyncio.get_running_loop()
    job = BackupJob(node.data_dir, out, compact=compact)
    node.backups.append(job)

    async def run() -> dict:
        try:
            await loop.run_in_executor(None, job.begin)
            job.check_abandoned()
            if node.journal.wal is not None:
                job.replay_from = node.journal.applied     # read on the loop, before the copy starts
            await loop.run_in_executor(None, job.copy_store, node.store)
            job.check_abandoned()
            journal = node.journal
            point = journal.position if journal.wal is not None else (None, 0)
            job.point_s = time.time()
            await loop.run_in_executor(None, job.copy_wal, point)
            job.check_abandoned()
            return await loop.run_in_executor(None, job.finish)
        except BaseException:
            await loop.run_in_executor(None, job.abort)
            raise
        finally:
            node.backups.remove(job)

    # A client that goes away does not stop the copy half-way: the job ends (or cleans up) by itself.
    job.task = asyncio.ensure_future(run())      # a rejoin's swap waits for it (process/opening.py)
    return await asyncio.shield(job.task)


async def abandon_backups(jobs: list[BackupJob], reason: str) -> None:
    """A stopping node (node/process/node.py stop) gives up its backups under way and waits
    until each has ended its current step and cleaned up: a store copy reads through the
    node's LMDB handle, which must not close under it, and cannot be interrupted. Each
    backup's request is answered 503 `stopping`. Says what it waits for every few seconds."""
    running = [j for j in jobs if j.task is not None and not j.task.done()]
    if not running:
        return
    for j in running:
        j.abandon(reason)
    while True:
        _, pending = await asyncio.wait([j.task for j in running], timeout=limits.backup_stop_log_s)
        if not pending:
            return
        for j in running:
            if not j.task.done():
                log.info("backup: the stop waits for the backup to %s to end its step: %s", j.out, j.progress())
