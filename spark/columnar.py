"""What the executors' Python does per split in pass 1, in Arrow/numpy columns (no Python loop
per row), and what the driver folds between the passes:

- pass 1 (`write_segment_rows`, a task per segment): cut the segment into splits, decode each
  (spark.walcols.read_split_columns), write its `rows` as one Parquet file, and return the
  split's small facts (`SplitStats`): row counts, the origins it holds, each origin's last lsn
  in it (a max), the span of its written_us, the node's own transactions and rows;
- between the passes the driver folds the facts of each node's splits in WAL order into the
  vclock at every split's start (`prefixes`): a running max is a max of the split maxes before;
- pass 2 (spark.pass2) uses the shared pieces here: the per-transaction table, `_write`.

Files are named by split number, written to a temporary name and renamed: a retried task
writes the same file again. Paths must be reachable from every executor (as the inputs)."""
from __future__ import annotations

import os
import pickle
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from node.core.rows import GROUP_DEFAULT, GROUP_LOCAL, GROUP_NAMES, OP_NAMES
from spark import tables as T
from spark import walcols, walread

codec = "zstd"   # Parquet codec (measured on rows: zstd 0.52 µs/row to write, 24 B/row; snappy 0.48, 34; none 0.44, 76)

ROWS_TYPES = {
    "node_uuid": pa.string(), "segment": pa.string(), "offset": pa.int64(), "index": pa.int32(),
    "position": pa.int64(), "written_us": pa.int64(), "origin_uuid": pa.string(),
    "origin_lsn": pa.int64(), "txn_id": pa.string(), "txn_lsn": pa.int64(), "row_in_txn": pa.int32(),
    "txn_rows": pa.int32(), "timestamp": pa.int64(), "group": pa.string(), "op": pa.string(),
    "space": pa.string(), "key": pa.string(), "content_hash": pa.int64(),
}
# The tables as every reader sees them (written partly as dictionaries: see _write).
ROWS_SCHEMA = pa.schema([(c, ROWS_TYPES[c]) for c in T.ROWS])
VCLOCK_TYPE = pa.map_(pa.string(), pa.int64())
VCLOCK_SCHEMA = pa.schema([(c, ROWS_TYPES[c]) for c in T.VCLOCK_HISTORY[:8]]
                          + [("vclock", VCLOCK_TYPE), ("local_lsn", pa.int64())])


REPLICATION_DELAY_SCHEMA = pa.schema([("node_uuid", pa.string()), ("origin_uuid", pa.string()), ("txns", pa.int64()),
                                      ("delay_us_max", pa.int64()), ("delay_us_mean", pa.float64())])
DIVERGENCE_SCHEMA = pa.schema([("origin_uuid", pa.string()), ("origin_lsn", pa.int64()), ("node_uuid", pa.string()),
                               ("content_hash", pa.int64()), ("op", pa.string()), ("space", pa.string()),
                               ("key", pa.string()), ("variants", pa.int32())])


def write_table(d: str, schema: pa.Schema, rows: list[tuple]) -> None:
    """A small table the driver computed, as a one-file Parquet table (no Spark job)."""
    if os.path.isdir(d):
        import shutil
        shutil.rmtree(d)
    os.makedirs(d)
    cols = list(zip(*rows)) if rows else [[] for _ in schema]
    _write(pa.Table.from_arrays([pa.array(list(c), f.type) for c, f in zip(cols, schema)], schema=schema), d, 0)
    open(os.path.join(d, "_SUCCESS"), "w").close()


class _Names(NamedTuple):
    """A code -> name column as an Arrow dictionary: the names once, the codes as indices."""
    values: pa.Array        # the names, in code order (no nulls: Parquet refuses them there)
    index: np.ndarray       # int32: code -> position in values

    def of(self, codes: np.ndarray) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(self.index[codes], self.values)


def _names(names: dict[int, str]) -> _Names:
    codes = sorted(names)
    index = np.full(max(codes) + 1, -1, np.int32)
    index[codes] = np.arange(len(codes), dtype=np.int32)
    return _Names(pa.array([names[k] for k in codes], pa.string()), index)


_GROUPS, _OPS = _names(GROUP_NAMES), _names(OP_NAMES)


def _same(value: str, n: int) -> pa.DictionaryArray:
    """n copies of one string, as a dictionary of one value (Parquet writes it, never hashes it n times)."""
    return pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), pa.array([value], pa.string()))


def _coded(codes: np.ndarray, values: pa.Array) -> pa.DictionaryArray:
    """values[codes], null where a code is negative, as a dictionary array (values hold no nulls)."""
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32, copy=False), mask=codes < 0), values)


class RowIndex(NamedTuple):
    """Where each row of a split sits: its transaction, its place there, its index in its frame."""
    txn: np.ndarray
    row_in_txn: np.ndarray
    index: np.ndarray


def row_index(c: walcols.SplitColumns | Pass2Input) -> RowIndex:
    n_rows = c.t_rows.astype(np.int64)
    txn = np.repeat(np.arange(len(n_rows), dtype=np.int64), n_rows)
    row_in_txn = np.arange(len(c.r_hash), dtype=np.int64) - (np.cumsum(n_rows) - n_rows)[txn]
    return RowIndex(txn, row_in_txn, c.t_first_index[txn] + row_in_txn)


def txn_table(c: walcols.SplitColumns | Pass2Input) -> pa.Table:
    """Per transaction: the columns of its first row that are the transaction's own. The
    few-valued strings are dictionary arrays (see _write); txn_id is null where the origin is."""
    nt = len(c.t_rows)
    origins = pa.array(c.origins, pa.string())
    local = c.t_group == GROUP_LOCAL
    sep = pa.array(np.where(local, "/local/", "/"), pa.string())
    return pa.table({
        "node_uuid": _same(c.node_uuid, nt),
        "position": pa.array((c.ordinal << walread.POSITION_SEGMENT_SHIFT) + c.t_offset + c.t_first_index),
        "segment": _same(c.segment, nt),
        "offset": pa.array(c.t_offset),
        "written_us": pa.array(c.t_written_us),
        "origin_uuid": _coded(c.t_origin, origins),
        "txn_id": pc.binary_join_element_wise(origins.take(pa.array(c.t_origin, mask=c.t_origin < 0)), sep,
                                              pc.cast(pa.array(c.t_lsn), pa.string()), ""),
        "group": _GROUPS.of(c.t_group),
        "txn_lsn": pa.array(c.t_lsn),
        "timestamp": pa.array(c.t_timestamp),
    })


def rows_batch(c: walcols.SplitColumns, t: pa.Table | None = None, at: RowIndex | None = None) -> pa.Table:
    """One split's columns -> a table of spark.tables.ROWS (ROWS_SCHEMA once written): per-row
    columns are the per-transaction ones (txn_table) taken by each row's transaction; strings
    repeated per transaction are dictionaries indexed by it (no string is copied per row)."""
    t = txn_table(c) if t is None else t
    at = row_index(c) if at is None else at
    txn, row_in_txn, n = at.txn, at.row_in_txn, len(c.r_kind)
    t_off = c.t_offset[txn]
    origin = c.t_origin[txn]
    return pa.table([
        _same(c.node_uuid, n),
        _same(c.segment, n),
        pa.array(t_off),
        pa.array(at.index.astype(np.int32)),
        pa.array((c.ordinal << walread.POSITION_SEGMENT_SHIFT) + t_off + at.index),
        pa.array(c.t_written_us[txn]),
        _coded(origin, pa.array(c.origins, pa.string())),
        pa.array(c.t_lsn[txn] + row_in_txn),
        _coded(np.where(origin < 0, -1, txn), t["txn_id"].combine_chunks().fill_null("")),
        pa.array(c.t_lsn[txn]),
        pa.array(row_in_txn.astype(np.int32)),
        pa.array(c.t_rows[txn]),
        pa.array(c.t_timestamp[txn]),
        _GROUPS.of(c.t_group[txn]),
        _OPS.of(c.r_kind),
        c.r_space,
        c.r_key,
        pa.array(c.r_hash),
    ], names=list(T.ROWS))


class SplitStats(NamedTuple):
    i: int
    node_uuid: str
    rows: int
    txns: int
    own_txns: int                    # replicated transactions of the node itself
    unresolved: int                  # rows whose replica id this node's table does not know
    origin_max: dict[str, int]       # replicated origin -> last lsn of its transactions here
    local_max: int                   # last local lsn here (0: none)
    written_us: tuple[int, int] | None   # min, max written_us of replicated transactions
    own: tuple | None = None         # (lsns, written_us) of the node's own replicated txns (numpy)
    own_rows: tuple | None = None    # (origin_lsns, content_hashes) of the node's own replicated rows
    name: str = ""                   # of the split's files: rows/part-<name>.parquet, its Pass2Input


# Parquet encodings (measured on `rows`, µs/row to write, bytes/row): pyarrow's default (every
# column dictionary-encoded first, statistics for all) 0.52 µs, 24 B; dictionaries only for the
# few-valued strings, deltas for the int64 columns that grow or repeat 0.35 µs, 17 B; and no
# min/max statistics for the many-valued columns (no reader skips a file by its keys or
# hashes) 0.31 µs. Spark reads them all. Columns handed over as Arrow dictionary arrays (the
# uuids, group, op, txn_id per row) are written with their dictionary as it is: the writer then
# hashes each distinct value once, not every row (rows 0.63 -> 0.34 µs/row, same bytes).
_MANY_VALUES = frozenset({"key", "txn_id", "content_hash", "seen"})   # no dictionary, delta, statistics


def _write(table: pa.Table, d: str, i: int | str) -> None:
    """part-<i>.parquet in d, written whole or not at all (a retried task writes it again).
    Dictionary arrays are stored as dictionary-encoded strings without Arrow's schema, so every
    reader (Spark, pyarrow) sees plain strings: the schema read back is the declared one."""
    name = f"{i:05d}" if isinstance(i, int) else i
    tmp = os.path.join(d, f".part-{name}.{os.getpid()}.tmp")
    coded = [f.name for f in table.schema if pa.types.is_dictionary(f.type)]
    # A map's keys (a vclock's uuids): the leaf column by its Parquet path; not its values.
    coded += [f"{f.name}.key_value.key" for f in table.schema
              if pa.types.is_map(f.type) and pa.types.is_dictionary(f.type.key_type)]
    fields = [f for f in table.schema if f.name not in _MANY_VALUES]
    pq.write_table(table, tmp, compression=codec,
                   use_dictionary=coded + [f.name for f in fields if pa.types.is_string(f.type)],
                   write_statistics=[f.name for f in fields],
                   column_encoding={f.name: "DELTA_BINARY_PACKED" for f in fields if pa.types.is_int64(f.type)},
                   store_schema=not coded)
    os.replace(tmp, os.path.join(d, f"part-{name}.parquet"))


def write_segment_rows(n: int, seg: walread.SegmentFile, split_bytes: int, rows_dir: str, pass2_dir: str,
                       own_cap: int) -> list[tuple[walread.Split, SplitStats]]:
    """Pass 1 of segment n: its splits, each with its rows and its pass-2 input written, and its
    facts. The node's own transactions and rows come back only if the segment holds at most
    own_cap of each (so the driver never gathers more than the tasks of pass 2 can be sent)."""
    out = [(s, _split_rows(k, s, f"{n:05d}-{k:05d}", rows_dir, pass2_dir))
           for k, s in enumerate(walread.plan_segment(seg, split_bytes))]
    if sum(len(x.own[0]) for _, x in out if x.own is not None) > own_cap:
        out = [(s, x._replace(own=None)) for s, x in out]
    if sum(len(x.own_rows[0]) for _, x in out) > own_cap:
        out = [(s, x._replace(own_rows=None)) for s, x in out]
    return out


def _split_rows(i: int, split: walread.Split, name: str, rows_dir: str, pass2_dir: str) -> SplitStats:
    c = walcols.read_split_columns(split)
    at = row_index(c)
    _write(rows_batch(c, at=at), rows_dir, name)
    _save_pass2_input(c, at, pass2_dir, name)
    code, last = c.t_origin, c.t_lsn + c.t_rows - 1
    local = c.t_group == GROUP_LOCAL
    known = ~local & (code >= 0)
    local_max = int(last[local].max()) if local.any() else 0
    unresolved = int(c.t_rows[~local & (code < 0)].sum())
    origin_max = {u: max(0, int(last[known & (code == k)].max()))
                  for k, u in enumerate(c.origins) if (known & (code == k)).any()}
    mine = known & (code == (c.origins.index(c.node_uuid) if c.node_uuid in c.origins else -2))
    own = int(mine.sum())
    span = (int(c.t_written_us[known].min()), int(c.t_written_us[known].max())) if known.any() else None
    own_arrays = (c.t_lsn[mine], c.t_written_us[mine]) if own else None
    mine_rows = mine[at.txn]
    own_rows = (c.t_lsn[at.txn][mine_rows] + at.row_in_txn[mine_rows], c.r_hash[mine_rows])
    return SplitStats(i, c.node_uuid, len(c.r_kind), len(c.t_rows), own, unresolved, origin_max, local_max, span,
                      own_arrays, own_rows, name)


# --- what pass 1 leaves for pass 2 ---------------------------------------------------------------
_WRITE_KINDS = np.array([k for k, name in OP_NAMES.items() if name in T.WRITE_OPS], dtype=np.int8)


class Pass2Input(NamedTuple):
    """A split as pass 2 needs it, kept by pass 1 so that pass 2 does not decode it again
    (decoding was ~0.2 µs/row; this file is ~22 bytes/row, read back in one piece): the
    per-transaction columns of SplitColumns, every row's content hash, and only the rows that
    are the node's own writes (put or delete in a replicated transaction of its own) with
    their space and key."""
    node_uuid: str
    segment: str
    ordinal: int
    t_offset: np.ndarray
    t_written_us: np.ndarray
    t_origin: np.ndarray
    origins: list
    t_lsn: np.ndarray
    t_group: np.ndarray
    t_timestamp: np.ndarray
    t_first_index: np.ndarray
    t_rows: np.ndarray
    r_hash: np.ndarray
    w_row: np.ndarray         # int64: the own writes' row numbers, in order
    w_space: pa.Array         # string, per own write
    w_key: pa.Array           # string, per own write


def _save_pass2_input(c: walcols.SplitColumns, at: RowIndex, d: str, name: str) -> None:
    own = c.origins.index(c.node_uuid) if c.node_uuid in c.origins else -2
    own_txn = (c.t_origin == own) & (c.t_group == GROUP_DEFAULT)
    w_row = np.nonzero(own_txn[at.txn] & np.isin(c.r_kind, _WRITE_KINDS))[0]
    sel = pa.array(w_row)
    p = Pass2Input(c.node_uuid, c.segment, c.ordinal, c.t_offset, c.t_written_us, c.t_origin, c.origins, c.t_lsn,
                   c.t_group, c.t_timestamp, c.t_first_index, c.t_rows, c.r_hash, w_row, c.r_space.take(sel),
                   c.r_key.take(sel))
    # Written whole or not at all, like the Parquet files: a retried task writes it again.
    tmp = os.path.join(d, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(p, f, protocol=5)
    os.replace(tmp, os.path.join(d, name))


def load_pass2_input(d: str, name: str) -> Pass2Input:
    """The split pass 1 kept (a file this job wrote, under OUT)."""
    with open(os.path.join(d, name), "rb") as f:
        p = pickle.load(f)
    assert isinstance(p, Pass2Input), name
    return p


def prefixes(splits: list[walread.Split], stats: list[SplitStats],
             bases: list[walread.NodeBase]) -> dict[int, tuple[dict[str, int], int]]:
    """Split number -> (vclock by uuid, local lsn) at the split's start: the node's base, then
    the maxima of its earlier splits (WAL order: segment ordinal, then byte offset)."""
    state = {b.node_uuid: (dict(b.vclock), b.local_lsn) for b in bases}
    out = {}
    for i in sorted(range(len(splits)), key=lambda i: (splits[i].node_uuid, splits[i].ordinal, splits[i].start)):
        vc, local = state[splits[i].node_uuid]
        out[i] = (dict(vc), local)
        for u, lsn in stats[i].origin_max.items():
            if lsn > vc.get(u, 0):
                vc[u] = lsn
        state[splits[i].node_uuid] = (vc, max(local, stats[i].local_max))
    return out


def finals(splits: list[walread.Split], stats: list[SplitStats],
           pre: dict[int, tuple[dict[str, int], int]]) -> dict[str, tuple[dict[str, int], int]]:
    """Each node's vclock after its last split."""
    out = {}
    for i in sorted(range(len(splits)), key=lambda i: (splits[i].ordinal, splits[i].start)):
        vc, local = dict(pre[i][0]), max(pre[i][1], stats[i].local_max)
        for u, lsn in stats[i].origin_max.items():
            if lsn > vc.get(u, 0):
                vc[u] = lsn
        out[splits[i].node_uuid] = ({u: v for u, v in vc.items() if v > 0}, local)
    return out


def own_written(splits: list[walread.Split], stats: list[SplitStats]) -> dict[str, tuple]:
    """Origin uuid -> (its own transactions' lsns, sorted; their written_us): the origin side
    of origin_history, small enough to send to every task."""
    parts: dict[str, list] = {}
    for x in stats:
        if x.own is not None:
            parts.setdefault(x.node_uuid, []).append(x.own)
    out = {}
    for u, ps in parts.items():
        lsn = np.concatenate([p[0] for p in ps])
        wus = np.concatenate([p[1] for p in ps])
        order = np.argsort(lsn, kind="stable")
        out[u] = (lsn[order], wus[order])
    return out


def own_contents(stats: list[SplitStats], most: int) -> dict[str, tuple] | None:
    """Origin uuid -> (its own rows' lsns, sorted; their content hashes): the reference each
    observation is compared with for divergence. None if more than `most` (too many to send)."""
    parts: dict[str, list] = {}
    if any(x.own_rows is None for x in stats) or sum(len(x.own_rows[0]) for x in stats) > most:
        return None
    for x in stats:
        if len(x.own_rows[0]):
            parts.setdefault(x.node_uuid, []).append(x.own_rows)
    out = {}
    for u, ps in parts.items():
        lsn = np.concatenate([p[0] for p in ps])
        h = np.concatenate([p[1] for p in ps])
        order = np.argsort(lsn, kind="stable")
        out[u] = (lsn[order], h[order])
    return out
