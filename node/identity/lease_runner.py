"""Lease runner: keeps a held lease renewed from asyncio, and says once when it is gone.

Rules it keeps:
- The manager's steps block (boto3, flock), so each renewal runs in a thread executor;
  this coroutine only waits and decides when to call.
- Renew duration/3 after the last successful write; after LeaseStoreUnavailable retry
  every duration/12; never later than the renewal deadline (lease.renew_deadline).
- At the deadline it gives up even if a store call still hangs in its thread: a store
  that cannot be reached stops the node within the lease duration.
- `on_lost(reason)` is called exactly once, when the lease is lost (taken over, or no
  renewal by the deadline); then the runner returns the reason.
- A set `stop` ends the runner without calling on_lost and without releasing: release
  belongs to the node's shutdown order (stop serving, then `manager.release()`).
- CancelledError propagates. The manager's clock must move with real time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
from typing import Any, Callable

from node.identity.lease import LeaseLost
from node.identity.lease_manager import LeaseManager
from node.identity.lease_store import LeaseStoreUnavailable

log = logging.getLogger("replog.identity.lease")


async def run_lease(manager: LeaseManager, on_lost: Callable[[str], Any], stop: asyncio.Event,
                    *, executor: concurrent.futures.Executor | None = None) -> str | None:
    """Renew until `stop` is set (returns None) or the lease is lost (calls on_lost, returns the reason)."""
    assert manager.lease is not None, "run_lease() needs an acquired lease"
    reason = await _renew_until_lost(manager, stop, executor)
    if reason is None:
        return None
    result = on_lost(reason)
    if inspect.isawaitable(result):
        await result
    return reason


async def _renew_until_lost(manager: LeaseManager, stop: asyncio.Event,
                            executor: concurrent.futures.Executor | None) -> str | None:
    loop = asyncio.get_running_loop()
    failed_at_ms: int | None = None
    while True:
        if manager.lease is None:
            return manager.lost_reason or "the lease is no longer held"
        wake_ms = manager.next_renew_ms(failed_at_ms=failed_at_ms)
        if await _stopped(stop, (wake_ms - manager.now_ms()) / 1000):
            return None
        deadline_ms = manager.renew_deadline_ms
        if deadline_ms is None:
            return manager.lost_reason or "the lease is no longer held"
        remaining_ms = deadline_ms - manager.now_ms()
        if remaining_ms <= 0:
            return f"no renewal succeeded by the deadline ({deadline_ms} ms)"
        renewal = loop.run_in_executor(executor, manager.renew)
        # If we stop waiting, the thread still finishes; fetch its outcome so it is not reported as unretrieved.
        renewal.add_done_callback(lambda f: f.cancelled() or f.exception())
        stopper = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait({renewal, stopper}, timeout=remaining_ms / 1000,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if renewal in done:
            try:
                renewal.result()
                failed_at_ms = None
            except LeaseLost as e:
                # Taken over or past the deadline: not retryable, the node must stop.
                return e.reason
            except LeaseStoreUnavailable as e:
                # The store did not answer; the lease may still be ours. Retry soon, until the deadline.
                log.warning("lease renewal failed, will retry before the deadline: %s", e)
                failed_at_ms = manager.now_ms()
        elif stop.is_set():
            return None
        else:
            # The store call is still hanging at the deadline: stop serving now.
            return (f"the lease store did not answer before the renewal deadline ({deadline_ms} ms); "
                    f"store unreachable")


async def _stopped(stop: asyncio.Event, timeout_s: float) -> bool:
    """Wait up to timeout_s for `stop`; True if it was set."""
    if timeout_s > 0:
        try:
            async with asyncio.timeout(timeout_s):   # wait_for would lose a cancel arriving with `stop`
                await stop.wait()
        except TimeoutError:
            pass
    return stop.is_set()
