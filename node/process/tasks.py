"""The node's background tasks: one group, the one place a task's failure is mapped.

Rules kept here:
- Every background task of the process is spawned here, so stop() and a lost lease can cancel
  all of them (cancel_all) and none outlives the node.
- A task that ends with an exception hands it to `on_fatal` (the process stops); a supervised
  loop instead logs its failure with the traceback, counts it (/v1/info "tasks", /metrics) and
  starts again after task_restart_s, except for a StorageError (the disk), which is fatal.
- CancelledError is never swallowed, but for the ones join() collects: cancel_all gave them."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from node import limits
from node.errors import StorageError

log = logging.getLogger("replog.node")


class Tasks:
    def __init__(self, on_fatal: Callable[[BaseException], None]):
        self.on_fatal = on_fatal
        self.running: set[asyncio.Task] = set()
        self.failures: dict[str, dict] = {}    # task name -> {"failures", "error"} (note_failure)

    def spawn(self, coro, name: str) -> asyncio.Task:
        t = asyncio.create_task(coro, name=name)
        self.running.add(t)
        t.add_done_callback(self._done)
        return t

    def _done(self, t: asyncio.Task) -> None:
        self.running.discard(t)
        if not t.cancelled() and t.exception() is not None:
            self.on_fatal(t.exception())

    def supervise(self, name: str, run) -> asyncio.Task:
        """Run the long-lived loop `run()` (a coroutine function) under supervision: a failure
        that is not the disk's is a bug, logged with its traceback, counted, and the loop starts
        again after task_restart_s; a StorageError stops the node."""
        async def supervised() -> None:
            while True:
                try:
                    await run()
                    return
                except asyncio.CancelledError:
                    raise
                except StorageError:
                    raise                                  # the disk: spawn's callback stops the node
                except Exception as e:  # noqa: BLE001 - the one place this task's failures are mapped
                    self.note_failure(name, e)
                await asyncio.sleep(limits.task_restart_s)
        return self.spawn(supervised(), name)

    def note_failure(self, name: str, e: BaseException) -> None:
        """An unexpected exception in a task that goes on (or a link that stops): our bug, said
        loudly, with its traceback, and kept where operators look."""
        log.error("%s failed (a bug; the node serves on): %s: %s", name, type(e).__name__, e, exc_info=e)
        f = self.failures.setdefault(name, {"failures": 0, "error": ""})
        f["failures"] += 1
        f["error"] = f"{type(e).__name__}: {e}"[:500]

    def cancel_all(self, but: asyncio.Task | None = None) -> None:
        """Cancel every task of the group (except `but`, the caller's own)."""
        for t in list(self.running):
            if t is not but:
                t.cancel()

    async def join(self) -> None:
        """Wait for every task (after cancel_all): their ends are theirs, already reported."""
        for t in list(self.running):
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
