"""Waiting on a condition with a deadline, never a bare sleep: `wait_for` for threads and real
processes, `until` inside an event loop. Both poll, fail with what they waited for, and return
the condition's truthy value."""
from __future__ import annotations

import asyncio
import time
import urllib.error
from typing import Any, Callable

# What a condition that asks a node over HTTP may raise while the node is not up yet.
TRANSIENT = (OSError, urllib.error.URLError, ValueError, KeyError)


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition",
             interval: float = 0.05) -> Any:
    """Poll cond() until it returns a truthy value; fail with `what` after timeout."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except TRANSIENT as e:
            last_exc = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                         + (f" (last error: {last_exc})" if last_exc else ""))


async def until(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition",
                interval: float = 0.01) -> Any:
    """In a running loop: poll cond() (the loop runs between polls) until it returns a truthy
    value; fail with `what` after timeout. Exceptions of cond() are the test's failure."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
