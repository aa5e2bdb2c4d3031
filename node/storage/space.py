"""The NOSPACE alarm, after etcd's: what the node does when the disk or the store's map is full.

The alarm is raised when
  - a write failed for lack of room (a NoSpaceError from the WAL or the store): the journal
    keeps that batch and tries it again (node/journal.py), or
  - the file system holding the data dir has less than `disk_reserve_bytes` free (sampled every
    `space_check_interval_s`, and after every `1/space_sample_reserve_parts` of the reserve the WAL
    took since the last sample, however fast writes come), so that writes stop before a batch meets
    a full disk.
While it is raised, client writes are refused with 507 `no_space`, appliers pause (they keep
their links: node/applier/applier.py), and reads, relays, health and metrics go on. It clears by
itself once the kept batch went through and the reserve is free again; nothing acknowledged is
lost, and nothing is acknowledged that was not persisted.

Rules kept here:
- The alarm is a fact about the node, never a guess about one write: a 507 is answered before
  any lsn is claimed (node/server.py), so a refused write leaves no trace.
- Warnings come before the alarm: the map's high-water mark past `store_map_warn_ratio` of
  map_size is reported by health and metrics while writes still work (freed pages are reused
  inside the map, so the mark is an upper bound of what the store needs).
- Transitions are logged once each way, never per write."""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Callable

from node import limits
from node.errors import NoSpaceError
from node.storage.store import Store, disk_free_bytes

log = logging.getLogger("replog.space")

ALARM_NOSPACE = "NOSPACE"


class SpaceWatch:
    def __init__(self, paths: list[str], reserve_bytes: int, store: Callable[[], Store | None]):
        self.paths = paths                     # directories whose file systems hold the data (store, WAL)
        self.reserve_bytes = reserve_bytes
        self._store = store
        self.failure: NoSpaceError | None = None   # a batch the journal keeps until there is room
        self.low_disk: str | None = None           # the file system is below the reserve
        self.disk_free: int | None = None
        self.map: dict = {}                         # Store.space(): map_size, map_used, file_bytes
        self.raised_at: float | None = None         # wall time the alarm was last raised
        self.raised = 0                             # times the alarm was raised
        self._wal_bytes_sampled = 0                 # the WAL's bytes_written at the last wrote() sample

    # --- state -------------------------------------------------------------------------
    @property
    def alarm(self) -> str | None:
        """Why writes are refused now, or None."""
        if self.failure is not None:
            return str(self.failure)
        return self.low_disk

    @property
    def kind(self) -> str | None:
        if self.failure is not None:
            return self.failure.kind
        return "disk" if self.low_disk else None

    def warnings(self) -> list[str]:
        out = []
        size, used = self.map.get("map_size"), self.map.get("map_used")
        if size and used is not None and used >= limits.store_map_warn_ratio * size:
            out.append(f"the store's map is {100 * used / size:.0f}% used ({used} of map_size {size} bytes): "
                       "raise map_size before it fills")
        if self.alarm is None and self.reserve_bytes and self.disk_free is not None \
                and self.disk_free < 2 * self.reserve_bytes:
            out.append(f"{self.disk_free} bytes free on the data dir's file system; writes stop below "
                       f"disk_reserve_bytes = {self.reserve_bytes}")
        return out

    def info(self) -> dict:
        return {"alarms": [ALARM_NOSPACE] if self.alarm else [], "reason": self.alarm, "kind": self.kind,
                "disk_free_bytes": self.disk_free, "disk_reserve_bytes": self.reserve_bytes,
                "map_size_bytes": self.map.get("map_size"), "map_used_bytes": self.map.get("map_used"),
                "store_file_bytes": self.map.get("file_bytes"), "warnings": self.warnings(),
                "raised_at_s": self.raised_at, "raised": self.raised}

    # --- transitions -----------------------------------------------------------------------
    def _changed(self, before: str | None) -> None:
        now = self.alarm
        if before is None and now is not None:
            self.raised += 1
            self.raised_at = time.time()
            log.error("NOSPACE alarm raised: %s; client writes are refused (507 no_space) and appliers pause "
                      "until there is room", now)
        elif before is not None and now is None:
            log.warning("NOSPACE alarm cleared: writes resume")

    def on_failure(self, e: NoSpaceError) -> None:
        before = self.alarm
        self.failure = e
        self._changed(before)

    def on_recovered(self) -> None:
        before = self.alarm
        self.failure = None
        self.sample()
        self._changed(before)

    def wrote(self, wal_bytes_written: int) -> None:
        """After a batch: sample now if the WAL took a part of the reserve since the last sample.
        The store grows by about as much again, so a sample every reserve/parts of WAL keeps a
        fast writer from running through the reserve between two timed samples."""
        if self.reserve_bytes and (wal_bytes_written - self._wal_bytes_sampled) * limits.space_sample_reserve_parts \
                >= self.reserve_bytes:
            self._wal_bytes_sampled = wal_bytes_written
            self.sample()

    def sample(self) -> None:
        """Read the free space of the data's file systems and the map's use (statvfs, LMDB env
        info: a few microseconds)."""
        before = self.alarm
        frees = [f for f in (disk_free_bytes(p) for p in self.paths if os.path.exists(p)) if f is not None]
        self.disk_free = min(frees) if frees else None
        store = self._store()
        self.map = store.space() if store is not None else {}
        if self.reserve_bytes and self.disk_free is not None and self.disk_free < self.reserve_bytes:
            self.low_disk = (f"{self.disk_free} bytes free on the data dir's file system, less than "
                             f"disk_reserve_bytes = {self.reserve_bytes}")
        else:
            self.low_disk = None
        self._changed(before)

    def now(self) -> dict:
        """info() from a fresh sample: what health, metrics and /v1/info show."""
        self.sample()
        return self.info()

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(limits.space_check_interval_s)
