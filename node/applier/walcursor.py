"""The relay's WAL cursor: reads whole frames from one position (segment, offset) on, filtered
for one subscriber by node/core/link/filter.py.

From the journal's in-memory tail when it is exactly at a batch the tail holds (caught up: no
file read, no thread hop), else from the WAL file (in an executor thread: behind, or fell out
of the tail), never past the journal's durable position either way. Both paths apply the same
filter to the same frames, so the subscriber cannot tell them apart."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from node import limits
from node.core import rowscan
from node.core.entry import txns_relay_frame
from node.errors import RemoteProtocolError
from node.wal import format as walfmt
from node.wal.reader import list_segments, read_header

if TYPE_CHECKING:
    from node.journal import Journal


class WalCursor:
    """Reads whole frames from the WAL, never past the journal's durable position:
    `read_tail` from the journal's memory, `read` from the file (in an executor thread)."""

    def __init__(self, wal_dir: str, sub_vclock: dict[int, int], own: tuple[int, int] | None = None):
        self.dir = wal_dir
        self.sub = dict(sub_vclock)
        self.own = own                              # the subscriber's own rows cut (relay_wants)
        self.segment: str | None = None
        self.offset = 0
        self._next: tuple[int, int] | None = None   # (chunk seq, frame index) to read next from the tail
        self.from_tail = 0                          # frames sent from memory / read from the file
        self.from_file = 0
        self.rows = 0                               # rows in the txns handed out (both paths)

    def read_tail(self, journal: "Journal", max_bytes: int) -> list | None:
        """Frame payloads to send from the journal's tail; [] when caught up with the durable
        position; None when the tail does not continue this cursor (read the file)."""
        pos = (self.segment, self.offset)
        if self.segment is None or self.offset == 0:
            return None                                 # not started, or a segment header still to read
        if pos == journal.position:
            return []
        i = 0
        if self._next is not None and self._next[1]:      # resuming inside a chunk
            chunk = journal.tail.get(self._next[0])
            i = self._next[1]
            if chunk is None or chunk.segment != self.segment or chunk.frames[i - 1][0] != self.offset:
                chunk = None
        else:
            chunk = journal.tail.chunk(pos, self._next[0] if self._next is not None else None)
        if chunk is None:
            self._next = None
            return None
        out: list = []
        budget = max_bytes
        while chunk is not None and budget > 0:
            frames, written_us = chunk.frames, chunk.written_us
            while i < len(frames) and budget > 0:
                end, body, entry = frames[i]
                i += 1
                send, rows = entry.relay_frame(body, written_us, self.sub, self.own)
                if send is not None:
                    out.append(send)
                    budget -= len(body)
                    self.rows += rows
                self.segment, self.offset = chunk.segment, end
            if i < len(frames):
                self._next = (chunk.seq, i)
                break
            self._next, i = (chunk.seq + 1, 0), 0
            chunk = journal.tail.chunk((self.segment, self.offset), chunk.seq + 1)
        self.from_tail += len(out)
        return out

    def _start(self) -> bool:
        segs = list_segments(self.dir)
        if not segs:
            return False
        start = 0
        for i in range(1, len(segs)):
            hv = read_header(os.path.join(self.dir, segs[i])).vclock
            if all(lsn <= self.sub.get(rid, 0) for rid, lsn in hv.items() if rid != 0):
                start = i
            else:
                break
        self.segment = segs[start]
        self.offset = 0
        return True

    def read(self, position: tuple[str | None, int], max_bytes: int) -> list[bytes]:
        """Frame payloads to send (already filtered, re-packed when filtering dropped txns). A
        segment gone under the cursor (collected, or the WAL of a store swapped out by a rejoin:
        its link is closed by then) ends the link as a RemoteProtocolError, wherever the file
        went missing, never as a FileNotFoundError taken for a bug of ours."""
        try:
            return self._read(position, max_bytes)
        except FileNotFoundError:
            raise RemoteProtocolError(f"WAL segment {self.segment} was collected under the relay") from None

    def _read(self, position: tuple[str | None, int], max_bytes: int) -> list[bytes]:
        self._next = None
        if self.segment is None and not self._start():
            return []
        out: list[bytes] = []
        budget = max_bytes
        while budget > 0:
            path = os.path.join(self.dir, self.segment)  # type: ignore[arg-type]
            active = self.segment == position[0]
            size = position[1] if active else os.path.getsize(path)
            if self.offset == 0:
                with open(path, "rb") as f:
                    _, self.offset = walfmt.decode_header(f.read(limits.segment_header_bytes_max))
            if self.offset >= size:
                if active:
                    break
                segs = list_segments(self.dir)
                nxt = [s for s in segs if walfmt.segment_signature(s) > walfmt.segment_signature(self.segment)]  # type: ignore[arg-type]
                if not nxt:
                    break
                self.segment, self.offset = nxt[0], 0
                continue
            with open(path, "rb") as f:
                want = min(size - self.offset, max(budget, limits.relay_file_read_bytes_min))
                buf = os.pread(f.fileno(), want, self.offset)
            pos = 0
            while pos < len(buf):
                scanned = rowscan.relay_scan(buf, pos, self.sub, budget, self.own)
                if scanned is not None:        # every frame it can decide alone, natively
                    payloads, rows, pos, status = scanned
                    if payloads:
                        out += payloads
                        budget -= sum(map(len, payloads))
                        self.rows += rows
                    if status != rowscan.RS_STOP:
                        break                  # all read, or the budget is spent
                try:
                    body, nxt_pos = walfmt.decode_frame(buf, pos)
                except walfmt.FormatError as e:
                    if e.torn:
                        if pos == 0:  # one frame larger than what we read: read it whole
                            with open(path, "rb") as f:
                                buf = os.pread(f.fileno(), size - self.offset, self.offset)
                            continue
                        break
                    raise
                pos = nxt_pos
                written_us, txns = walfmt.unpack_frame(body)
                send, rows = txns_relay_frame(txns, body, written_us, self.sub, self.own)
                if send is not None:
                    out.append(send)
                    budget -= len(body)
                    self.rows += rows
                if budget <= 0:
                    break
            self.offset += pos
            if pos == 0:
                break
        self.from_file += len(out)
        return out
