"""How a lease node gets out of the way fast once its lease is lost (node/identity/lease_node.py):
lease store calls on daemon threads, which a hung call cannot keep alive at exit, and an exit
that skips the interpreter's teardown once the node has stopped."""
from __future__ import annotations

import concurrent.futures
import os
import sys
import threading


class DaemonThreadExecutor(concurrent.futures.Executor):
    """Runs each call on a fresh daemon thread. ThreadPoolExecutor's threads are joined at
    interpreter exit, so one store call hanging on the network would hold the process up
    after the lease is lost; a daemon thread is simply abandoned."""

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                fut.set_exception(e)

        threading.Thread(target=run, name="lease-store", daemon=True).start()
        return fut


def exit_at_once(code: int) -> None:
    """atexit handler registered on a lease loss. By the time it runs the node has stopped
    (store closed, WAL closed, non-daemon threads joined); what is left is the interpreter's
    teardown, which with boto3 loaded takes a second or more of CPU on a busy host. Skipping
    it is never worse than kill -9, which the WAL and store survive by design, and it keeps
    the exit well before the lease expires."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
