"""Reading WAL segments: listing, frame iteration, torn-tail and corruption handling.

Rules: only the last segment may end in a torn frame, and only its last frame; that
frame is reported (file and byte offset) so recovery can cut it off. A damaged frame with
valid data after it is corruption: recovery refuses to start unless force_recovery, which
skips to the next frame that verifies and reports each skip loudly."""
from __future__ import annotations

import logging
import mmap
import os
from dataclasses import dataclass, field
from typing import Callable, Iterator

from node.errors import RecoveryError
from node.wal import format as fmt

log = logging.getLogger("replog.wal")


def list_segments(wal_dir: str) -> list[str]:
    """Segment file names in order of their starting signature."""
    try:
        names = os.listdir(wal_dir)
    except FileNotFoundError:
        return []
    segs = [n for n in names if n.endswith(fmt.SEGMENT_SUFFIX) and n[: -len(fmt.SEGMENT_SUFFIX)].isdigit()]
    return sorted(segs, key=fmt.segment_signature)


@dataclass
class FrameRef:
    segment: str
    offset: int
    end: int
    body: bytes


@dataclass
class SegmentScan:
    """What reading one segment found."""
    name: str
    header: fmt.SegmentHeader | None
    frames: int = 0
    valid_end: int = 0                 # offset after the last good frame
    torn_at: int | None = None         # offset of a torn last frame
    skipped: list[int] = field(default_factory=list)  # offsets skipped under force_recovery
    gone: bool = False                 # listed, then removed before it was read (missing_ok)


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m[:]


def iter_segment(
    path: str,
    *,
    is_last: bool,
    force_recovery: bool = False,
    scan: SegmentScan | None = None,
    start_offset: int | None = None,
    missing_ok: bool = False,
) -> Iterator[FrameRef]:
    """Yield every good frame of one segment; fill `scan` with what was found.

    Raises RecoveryError for damage that needs an operator (unless force_recovery). With
    `missing_ok`, a segment removed since it was listed (a live node collecting its WAL) yields
    nothing and sets `scan.gone`; a segment once opened is read whole, so it is never cut short."""
    name = os.path.basename(path)
    scan = scan if scan is not None else SegmentScan(name, None)
    try:
        buf = _read_file(path)
    except FileNotFoundError:
        if not missing_ok:
            raise
        scan.gone = True
        return
    try:
        header, off = fmt.decode_header(buf)
    except fmt.FormatError as e:
        if e.torn and is_last:
            # A crash while creating the segment: nothing in it was acknowledged.
            scan.torn_at = 0
            return
        raise RecoveryError(f"{path}: {e}") from None
    scan.header = header
    if start_offset is not None:
        off = max(off, start_offset)
    scan.valid_end = off
    end = len(buf)
    while off < end:
        try:
            body, nxt = fmt.decode_frame(buf, off)
        except fmt.FormatError as e:
            if is_last and _nothing_valid_after(buf, off):
                scan.torn_at = off
                return
            if not force_recovery:
                raise RecoveryError(
                    f"{path}: {e}; the WAL is damaged before its end "
                    "(--force-recovery skips damaged frames, losing them: `replog serve` and `replog wal dump` take it)"
                ) from None
            nxt = _next_valid_frame(buf, off + 1)
            log.error("force_recovery: skipping damaged WAL bytes %s:%d..%d (%s)", path, off, nxt, e)
            scan.skipped.append(off)
            off = nxt
            continue
        scan.frames += 1
        scan.valid_end = nxt
        yield FrameRef(name, off, nxt, body)
        off = nxt


def _next_valid_frame(buf: bytes, start: int) -> int:
    pos = start
    while True:
        pos = buf.find(fmt.FRAME_MAGIC, pos)
        if pos < 0:
            return len(buf)
        try:
            fmt.decode_frame(buf, pos)
            return pos
        except fmt.FormatError:
            pos += 1


def _nothing_valid_after(buf: bytes, off: int) -> bool:
    """True if no verifiable frame starts after `off`: the damage is a torn tail."""
    return _next_valid_frame(buf, off + 1) >= len(buf)


def read_header(path: str) -> fmt.SegmentHeader:
    with open(path, "rb") as f:
        head = f.read(64 * 1024)
        try:
            return fmt.decode_header(head)[0]
        except fmt.FormatError as e:
            if not e.torn:
                raise RecoveryError(f"{path}: {e}") from None
        f.seek(0)
        try:
            return fmt.decode_header(f.read())[0]
        except fmt.FormatError as e:
            raise RecoveryError(f"{path}: {e}") from None


def iter_wal(
    wal_dir: str,
    *,
    force_recovery: bool = False,
    on_scan: Callable[[SegmentScan], None] | None = None,
    first_signature: int = 0,
) -> Iterator[tuple[fmt.SegmentHeader, FrameRef]]:
    """Every good frame of every segment, in order; segments that end before
    `first_signature` (their successor starts at or below it) are skipped."""
    names = list_segments(wal_dir)
    start = 0
    for i, n in enumerate(names):
        if fmt.segment_signature(n) <= first_signature:
            start = i
    for i in range(start, len(names)):
        n = names[i]
        scan = SegmentScan(n, None)
        for ref in iter_segment(os.path.join(wal_dir, n), is_last=(i == len(names) - 1),
                                force_recovery=force_recovery, scan=scan):
            yield scan.header, ref  # type: ignore[misc]
        if on_scan:
            on_scan(scan)


def read_range(path: str, offset: int, limit: int) -> bytes:
    """Bytes [offset, limit) of a segment, for relays reading behind the writer."""
    with open(path, "rb") as f:
        return os.pread(f.fileno(), limit - offset, offset)
