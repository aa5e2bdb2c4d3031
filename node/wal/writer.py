"""Appending to the WAL: segment creation, rotation by size, write and fsync.

The writer is synchronous and single-threaded by contract: the node's commit loop calls
it from one executor thread at a time, with a whole group-commit batch already framed,
so many concurrent transactions share one write() and, in fsync mode, one fsync.
Durability contract per wal_mode:
  write: the batch is in the OS page cache when write_batch returns (survives a crash
         of the process); the journal fsyncs the written tail every wal_sync_interval_s
         (`sync`), and a closed segment is fsync'd, so a power cut loses at most that much;
  fsync: the batch is on stable storage when write_batch returns (survives power loss).
  none:  no Wal object exists at all.
`position` (segment, end offset) only ever covers whole frames: relays never read past it.
A write or rotation that fails (a full disk) leaves no partial frame or segment behind: the
segment is cut back to its last whole frame, so the same batch can be written again."""
from __future__ import annotations

import errno
import logging
import os
import time
from typing import Callable

from node import limits
from node.latency import Histogram
from node.wal import format as fmt
from node.wal.reader import list_segments

log = logging.getLogger("replog.wal")

MODES = ("none", "write", "fsync")


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WalWriter:
    def __init__(
        self,
        wal_dir: str,
        mode: str,
        instance_uuid: str,
        *,
        segment_bytes_max: int = limits.segment_bytes_max,
        fsync: Callable[[int], None] = os.fsync,
    ):
        assert mode in ("write", "fsync"), mode
        self.dir = wal_dir
        self.mode = mode
        self.uuid = instance_uuid
        self.segment_bytes_max = segment_bytes_max
        self._fsync = fsync            # injectable: tests fail or drop it at this point
        self._fd: int | None = None
        self.segment: str | None = None
        self.end = 0                   # bytes of whole frames in the current segment
        self.bytes_written = 0
        self.fsyncs = 0
        self.synced_bytes = 0          # bytes_written when the WAL was last on disk whole
        self.write_seconds = Histogram()   # one batch's write() calls
        self.fsync_seconds = Histogram()   # one batch's fsync (wal_mode fsync)
        os.makedirs(wal_dir, exist_ok=True)

    # --- opening ---------------------------------------------------------------
    def open_last(self, valid_end: int | None) -> None:
        """Continue the last segment after recovery; cut it at valid_end (torn tail)."""
        segs = list_segments(self.dir)
        if not segs:
            return
        name = segs[-1]
        path = os.path.join(self.dir, name)
        fd = os.open(path, os.O_WRONLY)
        size = os.fstat(fd).st_size
        end = size if valid_end is None else valid_end
        if end < size:
            os.ftruncate(fd, end)
            os.fsync(fd)
        if end == 0:
            # The segment never got a whole header: drop it and start afresh.
            os.close(fd)
            os.unlink(path)
            return
        os.lseek(fd, end, os.SEEK_SET)
        self._fd, self.segment, self.end = fd, name, end

    def rotate(self, vclock: dict[int, int], cluster: list[list]) -> None:
        """Start a new segment whose header records the state at its start."""
        self.close()
        sig = sum(vclock.values())
        name = fmt.segment_name(sig)
        path = os.path.join(self.dir, name)
        if os.path.exists(path):
            # Same signature as the previous segment: it ended empty; reuse the name.
            os.unlink(path)
        hdr = fmt.SegmentHeader(fmt.FORMAT_VERSION, self.uuid, dict(vclock), cluster, time.time())
        data = hdr.to_bytes()
        tmp = path + ".inprogress"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)   # a short write: the disk is full
            os.fsync(fd)
            os.rename(tmp, path)
        except OSError:
            # No room (or another failure): nothing half-made stays; the caller may try again.
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        fsync_dir(self.dir)
        self._fd, self.segment, self.end = fd, name, len(data)
        log.info("wal: new segment %s at vclock %s", name, vclock)

    @property
    def needs_rotation(self) -> bool:
        return self._fd is None or self.end >= self.segment_bytes_max

    # --- writing ---------------------------------------------------------------
    def write_batch(self, data: bytes) -> tuple[str, int, int]:
        """Append whole frames; returns (segment, start offset, end offset)."""
        assert self._fd is not None and self.segment is not None
        start = self.end
        view = memoryview(data)
        t0 = time.perf_counter()
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            t1 = time.perf_counter()
            self.write_seconds.observe(t1 - t0)
            if self.mode == "fsync":
                self._fsync(self._fd)
                self.fsyncs += 1
                self.fsync_seconds.observe(time.perf_counter() - t1)
        except OSError:
            # The batch did not land whole (a full disk ends a write part way): cut the segment
            # back to its last whole frame, so a later try appends where this one started.
            os.ftruncate(self._fd, start)
            os.lseek(self._fd, start, os.SEEK_SET)
            raise
        self.end = start + len(data)
        self.bytes_written += len(data)
        if self.mode == "fsync":
            self.synced_bytes = self.bytes_written
        return self.segment, start, self.end

    def sync(self) -> None:
        """wal_mode write, from the journal between batches: everything written is on disk
        (closed segments were fsync'd when they were closed)."""
        written = self.bytes_written
        if self._fd is not None:
            self._fsync(self._fd)
            self.fsyncs += 1
        self.synced_bytes = written

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)         # either mode: a closed segment is on disk (WalWriter.sync)
            os.close(self._fd)
            self._fd = None

    def remove_segments_before(self, keep_signature: int) -> list[str]:
        """Delete whole segments that end at or before keep_signature (never the current one)."""
        segs = list_segments(self.dir)
        removed = []
        for i, name in enumerate(segs[:-1]):
            nxt = fmt.segment_signature(segs[i + 1])
            if nxt <= keep_signature and name != self.segment:
                os.unlink(os.path.join(self.dir, name))
                removed.append(name)
        if removed:
            fsync_dir(self.dir)
        return removed
