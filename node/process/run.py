"""Running one node process until it is told to stop (`replog serve`): the signal handlers,
the SIGHUP reload, and the exit code.

Rules kept here:
- Signal handlers only set an event; a second SIGINT/SIGTERM exits at once (130).
- Exit codes: 0 after an orderly stop, 2 for a bad option or a port that cannot be had
  (ConfigError, one line on stderr), 1 for a storage error or any other fatal error, or when
  cleanup failed. Never a traceback for a user's error."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from node.errors import ConfigError, StorageError
from node.process.node import Node
from node.reload import Reloader

log = logging.getLogger("replog")


async def serve(cfg, flags: dict | None = None, config_file: str | None = None) -> int:
    node = Node(cfg)
    loop = asyncio.get_running_loop()
    interrupts = 0
    reloader = Reloader(node, flags or {}, config_file)

    def on_signal() -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1:
            log.warning("second interrupt: exiting now")
            os._exit(130)
        node.stopped.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    loop.add_signal_handler(signal.SIGHUP, reloader.requested.set)   # handled by reloader.run
    reload_task = asyncio.create_task(reloader.run(), name="sighup")
    try:
        try:
            await node.start()
        except ConfigError as e:
            sys.stderr.write(f"replog: error: {e}\n")
            await node.stop()
            return 2
        except OSError as e:                     # what start-up met on the host (its files, its sockets)
            sys.stderr.write(f"replog: error: cannot start: {e}\n")
            await node.stop()
            return 1
        except StorageError as e:
            sys.stderr.write(f"replog: error: {e}\n")
            await node.stop()
            return 1
        await node.stopped.wait()
        errors = await node.stop()
    finally:
        reload_task.cancel()
    if node.fatal is not None:
        if isinstance(node.fatal, ConfigError):
            sys.stderr.write(f"replog: error: {node.fatal}\n")
            return 2
        if isinstance(node.fatal, StorageError):   # e.g. Cannot recover, no clean store; wrong store
            sys.stderr.write(f"replog: error: {node.fatal}\n")
        return 1
    return 1 if errors else 0
