"""`replog wal dump DIR` and `replog wal verify DIR`.

Dump prints one JSON object per row, with the origin's uuid resolved through this node's
own `_cluster` as of that position: the segment header's table, updated by the node's own
`_cluster` rows (rows whose replica id is the node's own id) as they come. Filters (origin,
lsn range, space) pick rows; `--headers` prints each segment's header instead. A directory
without WAL segments is an error (NoWal), never an empty dump."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import IO, Callable, Iterator

from node.core.rows import GROUP_CLUSTER, GROUP_LOCAL, GROUP_NAMES, OP_CLUSTER, OP_NAMES, txn_from_wire
from node.errors import RecoveryError, ReplogError, RemoteProtocolError
from node.wal import format as fmt
from node.wal.reader import SegmentScan, iter_segment, list_segments, read_header


class NoWal(ReplogError):
    """The directory holds no WAL segment."""


def wal_dir_of(path: str) -> str:
    """Accept a node's data dir (holding wal/) or a WAL dir itself."""
    sub = os.path.join(path, "wal")
    return sub if os.path.isdir(sub) else path


def segments_of(path: str) -> tuple[str, list[str]]:
    wal_dir = wal_dir_of(path)
    names = list_segments(wal_dir)
    if not names:
        raise NoWal(f"{path}: no WAL segments here (give a node's data dir or its wal/ dir)")
    return wal_dir, names


@dataclass(frozen=True)
class RowFilter:
    origin: str | None = None       # a uuid or a prefix of one
    lsn_from: int | None = None
    lsn_to: int | None = None
    space: str | None = None

    def __call__(self, row: dict) -> bool:
        return ((self.origin is None or (row["origin"] or "").startswith(self.origin))
                and (self.lsn_from is None or row["lsn"] >= self.lsn_from)
                and (self.lsn_to is None or row["lsn"] <= self.lsn_to)
                and (self.space is None or row["space"] == self.space))


class TableAt:
    """A node's id -> uuid table as of a position in its own WAL."""

    def __init__(self, header: fmt.SegmentHeader):
        self.node_uuid = header.uuid
        self.ids = {int(r[1]): str(r[0]) for r in header.cluster}
        self.self_id = next((i for i, u in self.ids.items() if u == self.node_uuid), None)

    def follow(self, replica_id: int, group: int, ops) -> None:
        if group != GROUP_CLUSTER or replica_id != self.self_id:
            return
        for op in ops:
            if op.kind == OP_CLUSTER:
                self.ids[int(op.value["id"])] = op.key
                if op.key == self.node_uuid:
                    self.self_id = int(op.value["id"])

    def origin(self, replica_id: int, group: int) -> str | None:
        return self.node_uuid if group == GROUP_LOCAL else self.ids.get(replica_id)


def iter_rows(path: str, *, force_recovery: bool = False,
              on_gone: Callable[[str], None] | None = None) -> Iterator[dict]:
    """Every row of the WAL at `path` (none if it holds no segment). The WAL may be a live
    node's: a segment it collects between the listing and its reading is passed over, named to
    `on_gone` (its rows were below what the node keeps, so no row after it is missing)."""
    wal_dir = wal_dir_of(path)
    return _rows(wal_dir, list_segments(wal_dir), force_recovery, on_gone)


def _rows(wal_dir: str, names: list[str], force_recovery: bool,
          on_gone: Callable[[str], None] | None) -> Iterator[dict]:
    for i, name in enumerate(names):
        scan = SegmentScan(name, None)
        table: TableAt | None = None
        for ref in iter_segment(os.path.join(wal_dir, name), is_last=i == len(names) - 1,
                                force_recovery=force_recovery, scan=scan, missing_ok=True):
            if table is None:
                table = TableAt(scan.header)  # type: ignore[arg-type]
            written_us, txns = fmt.unpack_frame(ref.body)
            for raw in txns:
                t = txn_from_wire(raw, legacy=True)     # this node wrote it: values may predate the rule
                origin = table.origin(t.replica_id, t.group)
                for j, op in enumerate(t.ops):
                    yield {"node": table.node_uuid, "segment": name, "offset": ref.offset,
                           "written_us": written_us, "replica_id": t.replica_id, "origin": origin,
                           "lsn": t.lsn + j, "tsn": t.lsn, "commit": j == len(t.ops) - 1,
                           "group": GROUP_NAMES[t.group], "timestamp": t.timestamp,
                           "op": OP_NAMES[op.kind], "space": op.space, "key": op.key, "value": op.value}
                table.follow(t.replica_id, t.group, t.ops)
        if scan.gone and on_gone is not None:
            on_gone(name)


def dump(path: str, out: IO[str] = sys.stdout, flt: RowFilter = RowFilter(), force_recovery: bool = False) -> int:
    """Print the rows `flt` takes; returns 0 (the exit code)."""
    def gone(name: str) -> None:
        sys.stderr.write(f"replog wal dump: {name} was collected by the node while this dump read its WAL; "
                         "its rows are not shown\n")

    wal_dir, names = segments_of(path)          # NoWal: an empty dump would look like an empty WAL
    for row in _rows(wal_dir, names, force_recovery, gone):
        if flt(row):
            out.write(json.dumps(row, ensure_ascii=False, default=repr) + "\n")
    return 0


def dump_headers(path: str, out: IO[str] = sys.stdout) -> int:
    """One JSON object per segment: its header, with the vclock also by member uuid."""
    wal_dir, names = segments_of(path)
    for name in names:
        p = os.path.join(wal_dir, name)
        try:
            h, size = read_header(p), os.path.getsize(p)
        except FileNotFoundError:       # a live node collected it since the listing
            continue
        ids = {int(r[1]): str(r[0]) for r in h.cluster}
        out.write(json.dumps({
            "segment": name, "bytes": size, "format_version": h.version, "node": h.uuid,
            "created_s": h.created_s, "vclock": {str(k): v for k, v in sorted(h.vclock.items())},
            "vclock_uuid": {ids.get(int(k), f"unknown id {k}"): v for k, v in sorted(h.vclock.items()) if int(k)},
            "cluster": [{"uuid": r[0], "id": r[1], "address": r[2] if len(r) > 2 else "",
                         "state": r[3] if len(r) > 3 else ""} for r in h.cluster],
        }, ensure_ascii=False, default=repr) + "\n")
    return 0


def verify(path: str, out: IO[str] = sys.stdout) -> int:
    """Check every frame of every segment; returns 0 if all verify, 1 otherwise."""
    wal_dir, names = segments_of(path)
    bad = 0
    frames = 0
    gone = 0
    for i, name in enumerate(names):
        scan = SegmentScan(name, None)
        p = os.path.join(wal_dir, name)
        try:
            for ref in iter_segment(p, is_last=i == len(names) - 1, force_recovery=False, scan=scan,
                                    missing_ok=True):
                try:
                    _, txns = fmt.unpack_frame(ref.body)
                    for raw in txns:
                        txn_from_wire(raw, legacy=True)    # as recovery reads it
                except (fmt.FormatError, RemoteProtocolError) as e:
                    out.write(f"{p}: frame at byte {ref.offset} does not decode: {e}\n")
                    bad += 1
        except RecoveryError as e:
            out.write(f"{e}\n")
            bad += 1
            continue
        if scan.gone:
            out.write(f"{p}: collected by the node since the listing, not checked\n")
            gone += 1
            continue
        frames += scan.frames
        state = f"torn tail at byte {scan.torn_at}" if scan.torn_at is not None else "ok"
        out.write(f"{p}: {scan.frames} frames, {scan.valid_end} bytes, {state}\n")
    out.write(f"{len(names) - gone} segments, {frames} frames, {'OK' if not bad else f'{bad} damaged'}\n")
    return 0 if not bad else 1
