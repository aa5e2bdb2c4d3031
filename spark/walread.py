"""Reading one node's WAL into row observations, for the Spark jobs and the oracle. Pure Python.

Rules kept here:
- a row's replica_id names its origin in THIS node's id space. It is translated to a uuid
  through this node's `_cluster` as of the row's position: the segment header's table, then
  only the node's OWN `_cluster` rows (group CLUSTER, replica_id == the node's own id) change
  it. A followed remote `_cluster` row states its origin's ids and changes nothing here.
- the node's own id is its header uuid's id in the header's table; a segment whose table
  lacks the node learns it from the node's self-registration (a CLUSTER row about its own
  uuid whose value.id equals the row's replica_id).
- rows of group LOCAL count in vclock component 0 and their origin is the node itself.
- a frame's transactions are atomic and in order; a row's `index` counts rows across its
  frame, and `position = (segment ordinal << 42) + frame offset + index` is unique and
  increasing per node because every row takes at least one byte of its frame (asserted).
- a segment is read as byte ranges of whole frames (`Split`s). Each split carries the table
  at its start, found by a cheap planning pass that walks frame headers and decodes only the
  frames that mention `_cluster`; so splits are read independently, in any order, anywhere.
- a torn last frame of a node's last segment ends its input (logged); any other damage is an
  error naming file and offset (`replog wal verify` tells more).
- content_hash is a 63-bit hash of msgpack(op wire form [kind, space, key, value]): the same
  row hashes the same on every node, whatever frame or segment holds it."""
from __future__ import annotations

import logging
import mmap
import os
import struct
import zlib
from typing import Iterable, Iterator, NamedTuple

import msgpack
from crc32c import crc32c

from node import limits
from node.core.rows import (CLUSTER_SPACE, GROUP_CLUSTER, GROUP_LOCAL, GROUP_NAMES, OP_CLUSTER,
                            OP_NAMES)
from node.wal import format as fmt
from node.errors import RecoveryError
from node.wal.reader import SegmentScan, iter_segment, list_segments, read_header

log = logging.getLogger("replog.analyze")

POSITION_SEGMENT_SHIFT = 42          # segment ordinal above, byte position below: 4 TiB a segment
split_bytes_default = 8 * 1024 * 1024  # one Spark task reads about this much of a segment

_FRAME_HDR = struct.Struct("<4sII")   # magic, length, crc32c (node.wal.format's frame header)
_CLUSTER_MARK = msgpack.packb(CLUSTER_SPACE)  # how the space name appears inside a frame body

# Column names of a flat row observation (`flatten_frame`), in order.
ROW_COLUMNS = (
    "node_uuid", "segment", "offset", "index", "position", "written_us",
    "origin_uuid", "origin_lsn", "txn_id", "txn_lsn", "row_in_txn", "txn_rows",
    "timestamp", "group", "op", "space", "key", "content_hash",
)


class WalInputError(Exception):
    """The given directory or its WAL cannot be analysed; the message names file and offset."""


class SegmentFile(NamedTuple):
    path: str
    name: str
    ordinal: int          # index among the node's segments, by starting signature
    is_last: bool


class Split(NamedTuple):
    """Frames [start, end) of one segment, with this node's id -> uuid table at `start`."""
    path: str
    segment: str
    ordinal: int
    is_last: bool
    start: int
    end: int
    node_uuid: str
    own_id: int | None
    table: tuple[tuple[int, str], ...]


class NodeBase(NamedTuple):
    """What a node's first segment header says came before its WAL (rows from a snapshot)."""
    node_uuid: str
    vclock: tuple[tuple[str, int], ...]   # by uuid, components > 0 only
    local_lsn: int                        # component 0


# --- locating a node's segments ---------------------------------------------------
def wal_dir_of(path: str) -> str:
    """A node data dir holding `wal/`, or a WAL dir itself."""
    if list_segments(path):
        return path
    sub = os.path.join(path, "wal")
    if list_segments(sub):
        return sub
    raise WalInputError(f"{path}: no WAL segments (*.wal) here or in {sub}")


def node_segments(path: str) -> list[SegmentFile]:
    wal_dir = wal_dir_of(path)
    names = list_segments(wal_dir)
    return [SegmentFile(os.path.join(wal_dir, n), n, i, i == len(names) - 1) for i, n in enumerate(names)]


# --- the node's `_cluster` as of a position ---------------------------------------
class NodeTable:
    """This node's id -> uuid map, moved forward by the node's own `_cluster` rows only."""
    __slots__ = ("node_uuid", "own_id", "ids", "by_uuid")

    def __init__(self, node_uuid: str, pairs: Iterable[tuple[int, str]], own_id: int | None = None):
        self.node_uuid = node_uuid
        self.ids: dict[int, str] = {}
        self.by_uuid: dict[str, int] = {}
        for rid, uuid in pairs:
            self._set(int(rid), str(uuid))
        self.own_id = own_id if own_id is not None else self.by_uuid.get(node_uuid)

    @classmethod
    def from_header(cls, hdr: fmt.SegmentHeader) -> "NodeTable":
        return cls(hdr.uuid, ((row[1], row[0]) for row in hdr.cluster))

    def _set(self, rid: int, uuid: str) -> None:
        holder = self.ids.get(rid)
        if holder is not None and holder != uuid:
            log.warning("_cluster of %s: id %d moves from %s to %s", self.node_uuid, rid, holder, uuid)
            self.by_uuid.pop(holder, None)
        old = self.by_uuid.get(uuid)
        if old is not None and old != rid:
            # A known uuid never changes id (ClusterTable asserts it); follow the WAL anyway.
            log.warning("_cluster of %s: %s moves from id %d to %d", self.node_uuid, uuid, old, rid)
            self.ids.pop(old, None)
        self.ids[rid] = uuid
        self.by_uuid[uuid] = rid

    def follow(self, replica_id: int, ops: list) -> None:
        """Apply a CLUSTER transaction: only the node's own rows change its table."""
        if self.own_id is None:
            for op in ops:
                if op[0] == OP_CLUSTER and op[2] == self.node_uuid and op[3].get("id") == replica_id:
                    self.own_id = replica_id          # self-registration
        if replica_id != self.own_id:
            return                                    # a followed remote row: the origin's ids
        for op in ops:
            if op[0] == OP_CLUSTER:
                self._set(int(op[3]["id"]), op[2])

    def snapshot(self) -> tuple[tuple[int, str], ...]:
        return tuple(sorted(self.ids.items()))


def header_base(hdr: fmt.SegmentHeader) -> NodeBase:
    table = NodeTable.from_header(hdr)
    by_uuid = []
    for rid, lsn in sorted(hdr.vclock.items()):
        if rid != 0 and lsn > 0 and rid in table.ids:
            by_uuid.append((table.ids[rid], lsn))
    return NodeBase(hdr.uuid, tuple(sorted(by_uuid)), hdr.vclock.get(0, 0))


# --- planning: split a segment into independently readable ranges ---------------
def _walk_frames(buf, start: int, path: str, is_last: bool) -> Iterator[tuple[int, int, int]]:
    """(offset, body start, end) of each frame, from headers alone; stops at a torn tail."""
    off, size = start, len(buf)
    while off < size:
        if size - off < fmt.FRAME_OVERHEAD:
            if is_last:
                log.warning("%s: torn frame header at byte %d ends the WAL", path, off)
                return
            raise WalInputError(f"{path}: frame header truncated at byte {off}")
        magic, length, _crc = _FRAME_HDR.unpack_from(buf, off)
        body = off + fmt.FRAME_OVERHEAD
        if magic != fmt.FRAME_MAGIC or length > limits.frame_bytes_max:
            raise WalInputError(f"{path}: bad frame header at byte {off} (see `replog wal verify`)")
        if body + length > size:
            if is_last:
                log.warning("%s: torn frame at byte %d ends the WAL", path, off)
                return
            raise WalInputError(f"{path}: frame at byte {off} truncated")
        yield off, body, body + length
        off = body + length


def plan_segment(seg: SegmentFile, split_bytes: int = split_bytes_default) -> list[Split]:
    """Cut one segment into splits of about split_bytes, each with the table at its start."""
    with open(seg.path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return []
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                hdr, first = fmt.decode_header(buf)
            except fmt.FormatError as e:
                if e.torn and seg.is_last:
                    log.warning("%s: torn segment header; nothing in it was acknowledged", seg.path)
                    return []
                raise WalInputError(f"{seg.path}: {e}") from None
            assert size < 1 << POSITION_SEGMENT_SHIFT, seg.path
            table = NodeTable.from_header(hdr)
            if not seg.is_last and size - first <= split_bytes:
                # One split: it starts with the header's table and its reader follows the
                # segment's `_cluster` rows itself, so walking the frames would find nothing to
                # cut at (~0.09 µs/row). Damage is then the reader's to report (file and offset).
                # A node's last segment is walked: a torn tail ends it, and is no error.
                return [Split(seg.path, seg.name, seg.ordinal, seg.is_last, first, size,
                              hdr.uuid, table.own_id, table.snapshot())]
            splits: list[Split] = []
            start = end = first
            last = None
            for off, body, end in _walk_frames(buf, first, seg.path, seg.is_last):
                if off - start >= split_bytes:
                    splits.append(Split(seg.path, seg.name, seg.ordinal, seg.is_last, start, off,
                                        hdr.uuid, table.own_id, table.snapshot()))
                    start = off
                torn_tail = seg.is_last and end == size and not _verifies(buf, off)
                if not torn_tail and buf.find(_CLUSTER_MARK, body, end) >= 0:
                    _follow_cluster_rows(table, _decode(buf, off, seg.path)[1], seg.path, off)
                last = off
            if seg.is_last and last is not None and not _verifies(buf, last):
                # Whole length but bad checksum, with nothing after it: a torn last write
                # (node.wal.reader's rule), not damage.
                log.warning("%s: torn frame at byte %d ends the WAL", seg.path, last)
                end = last
            if end > start or not splits:
                splits.append(Split(seg.path, seg.name, seg.ordinal, seg.is_last, start, end,
                                    hdr.uuid, table.own_id, table.snapshot()))
            return splits


def _verifies(buf, off: int) -> bool:
    try:
        fmt.decode_frame(buf, off)
        return True
    except fmt.FormatError:
        return False


def _follow_cluster_rows(table: NodeTable, txns: list, path: str, offset: int) -> None:
    try:
        for t in txns:
            if t[2] == GROUP_CLUSTER:
                table.follow(t[0], t[4])
    except (TypeError, ValueError, IndexError, KeyError, AttributeError) as e:
        raise WalInputError(f"{path}: malformed _cluster row in frame at byte {offset}: {e!r}") from None


def _decode(buf, off: int, path: str) -> tuple[int, list, int]:
    """(written_us, txns, end) of the frame at off, checksum verified."""
    try:
        body, nxt = fmt.decode_frame(buf, off)
    except fmt.FormatError as e:
        raise WalInputError(f"{path}: {e} (see `replog wal verify`)") from None
    try:
        written_us, txns = fmt.unpack_frame(body)
    except (fmt.FormatError, ValueError, TypeError):      # not msgpack, or not this shape
        written_us = None
    if type(written_us) is not int or not -1 << 63 <= written_us < 1 << 63:
        raise WalInputError(f"{path}: frame payload at byte {off} is not [written_us, txns] (see `replog wal verify`)")
    return written_us, txns, nxt


# --- reading frames ------------------------------------------------------------------
# A frame record, as the Spark job receives it (nested, so per-frame fields travel once):
#   (node_uuid, segment, ordinal, offset, written_us,
#    [(origin_uuid, lsn, group, timestamp, first_index, [(kind, space, key, content_hash), ...]), ...])

class FrameDecoder:
    """Turns frame payloads of one node into frame records, keeping the table moving."""

    def __init__(self, table: NodeTable, segment: str, ordinal: int, path: str):
        self.table = table
        self.segment = segment
        self.ordinal = ordinal
        self.path = path
        self._pack = msgpack.Packer(autoreset=True, use_bin_type=True).pack

    def record(self, offset: int, end: int, written_us: int, txns: list) -> tuple:
        table, pack = self.table, self._pack
        node_uuid, ids = table.node_uuid, table.ids
        out = []
        index = 0
        for t in txns:
            try:
                rid, lsn, group, ts, ops = t
                rows = []
                for op in ops:
                    kind, space, key, _value = op
                    if type(space) is not str or type(key) is not str or kind not in OP_NAMES:
                        raise ValueError("op kind, space or key")
                    b = pack(op)
                    rows.append((kind, space, key, ((crc32c(b) >> 1) << 32) | zlib.crc32(b)))
            except (TypeError, ValueError) as e:
                raise WalInputError(f"{self.path}: malformed transaction in frame at byte {offset}: {e}") from None
            if not rows or group not in GROUP_NAMES or type(lsn) is not int:
                raise WalInputError(f"{self.path}: malformed transaction in frame at byte {offset}")
            origin = node_uuid if group == GROUP_LOCAL else ids.get(rid)
            out.append((origin, lsn, group, ts, index, rows))
            index += len(rows)
            if group == GROUP_CLUSTER:
                try:
                    table.follow(rid, ops)
                except (TypeError, ValueError, KeyError, AttributeError) as e:
                    raise WalInputError(f"{self.path}: malformed _cluster row in frame at byte {offset}: {e!r}") from None
        # Unique positions need every row to own at least one byte of its frame.
        assert index < end - offset, (self.path, offset)
        return (node_uuid, self.segment, self.ordinal, offset, written_us, out)


def read_split(split: Split) -> Iterator[tuple]:
    """Frame records of one split; runs in a Spark executor."""
    table = NodeTable(split.node_uuid, split.table, split.own_id)
    dec = FrameDecoder(table, split.segment, split.ordinal, split.path)
    with open(split.path, "rb") as f:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            off = split.start
            while off < split.end:
                written_us, txns, nxt = _decode(buf, off, split.path)
                yield dec.record(off, nxt, written_us, txns)
                off = nxt


def read_node_frames(path: str) -> Iterator[tuple]:
    """Every frame record of one node, through node.wal.reader (the oracle's path)."""
    for seg in node_segments(path):
        scan = SegmentScan(seg.name, None)
        dec = None
        try:
            for ref in iter_segment(seg.path, is_last=seg.is_last, scan=scan):
                if dec is None:
                    assert scan.header is not None
                    dec = FrameDecoder(NodeTable.from_header(scan.header), seg.name, seg.ordinal, seg.path)
                written_us, txns = fmt.unpack_frame(ref.body)
                yield dec.record(ref.offset, ref.end, written_us, txns)
        except (RecoveryError, fmt.FormatError) as e:
            raise WalInputError(f"{seg.path}: {e}") from None


def node_base(path: str) -> NodeBase:
    """The base of a node's vclock history: its first segment's header."""
    seg = node_segments(path)[0]
    try:
        return header_base(read_header(seg.path))
    except RecoveryError as e:
        raise WalInputError(str(e)) from None


# --- flat rows ------------------------------------------------------------------------
def txn_id(origin_uuid: str | None, group: int, lsn: int) -> str | None:
    if origin_uuid is None:
        return None
    return f"{origin_uuid}/local/{lsn}" if group == GROUP_LOCAL else f"{origin_uuid}/{lsn}"


def flatten_frame(rec: tuple) -> Iterator[tuple]:
    """Flat row observations (ROW_COLUMNS) of one frame record."""
    node_uuid, segment, ordinal, offset, written_us, txns = rec
    base = (ordinal << POSITION_SEGMENT_SHIFT) + offset
    for origin, lsn, group, ts, first, rows in txns:
        tid = txn_id(origin, group, lsn)
        gname = GROUP_NAMES[group]
        n = len(rows)
        for i, (kind, space, key, h) in enumerate(rows):
            yield (node_uuid, segment, offset, first + i, base + first + i, written_us,
                   origin, lsn + i, tid, lsn, i, n, ts, gname, OP_NAMES[kind], space, key, h)
