"""SIGHUP: reopen the log file and reload the options that may change at run time.

Rules kept here:
- The signal handler only sets an event; `Reloader.run` does the work on the loop, one reload at
  a time, so a burst of SIGHUPs is one or two reloads, never concurrent ones.
- The configuration is loaded again exactly as at start (flags > the --config file > REPLOG_*
  environment > defaults) and validated whole; a file that does not load or validate changes
  nothing and is logged with its reason: the node never stops over a reload.
- Only options marked `reload` in the option table (node/config.py) change: peers (appliers are
  started and stopped as by `PUT /v1/admin/peers`), log_level, and the /readyz and /livez
  thresholds. Every other option that differs is refused with one logged line naming it; the
  running value stays. An option set by a flag keeps the flag's value (flags win over the file)."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from node import config as config_mod
from node import logsetup
from node.errors import ConfigError

if TYPE_CHECKING:
    from node.server import Node

log = logging.getLogger("replog.reload")


def plan(old: config_mod.Config, new: config_mod.Config) -> tuple[dict[str, Any], list[str]]:
    """(changes to apply, refusals as log lines) between the running and the reloaded config."""
    changes, refused = {}, []
    for f in config_mod.OPTIONS:
        was, now = getattr(old, f.name), getattr(new, f.name)
        if was == now:
            continue
        if f.metadata["reload"]:
            changes[f.name] = now
        else:
            refused.append(f"{f.name}: changed from {was!r} to {now!r}, but it cannot change while the node runs; "
                           "the running value stays (restart the node to apply it)")
    return changes, refused


class Reloader:
    def __init__(self, node: "Node", flags: dict[str, Any], config_file: str | None):
        self.node = node
        self.flags = {k: v for k, v in flags.items() if v is not None}
        self.config_file = config_file
        self.requested = asyncio.Event()
        self.reloads = 0

    async def run(self) -> None:
        while True:
            await self.requested.wait()
            self.requested.clear()
            self.reload()

    def reload(self) -> None:
        self.reloads += 1
        try:
            reopened = logsetup.reopen()
        except ConfigError as e:
            log.error("SIGHUP: %s; logging goes on to the file already open", e)
            reopened = False
        if not self.config_file:
            log.info("SIGHUP: %s; no --config file, so no option is reloaded",
                     "log file reopened" if reopened else "nothing to reopen (logs go to stderr)")
            return
        try:
            new = config_mod.load(dict(self.flags), self.config_file)
        except ConfigError as e:
            log.error("SIGHUP: %s not reloaded, nothing changed: %s", self.config_file, e)
            return
        node = self.node
        changes, refused = plan(node.cfg, new)
        for line in refused:
            log.warning("SIGHUP: refused %s", line)
        for name in config_mod.RELOADABLE:
            if name in self.flags and name not in changes:
                log.info("SIGHUP: %s is set by --%s, which wins over %s", name, name.replace("_", "-"),
                         self.config_file)
        if not changes:
            log.info("SIGHUP: %s reloaded; no option that can change at run time changed%s", self.config_file,
                     "; log file reopened" if reopened else "")
            return
        node.cfg = dataclasses.replace(node.cfg, **changes)
        if "log_level" in changes:
            logsetup.set_level(changes["log_level"])
        if "peers" in changes:
            if node.status == "running":
                node.configure_peers(list(changes["peers"]))
            else:
                node.peers = list(changes["peers"])           # start-up takes them from here
        log.info("SIGHUP: %s reloaded: %s%s", self.config_file,
                 ", ".join(f"{k} = {v!r}" for k, v in changes.items()), "; log file reopened" if reopened else "")
