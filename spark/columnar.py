"""What the executors' Python does per split, in Arrow/numpy columns (no Python loop per row):

- pass 1 (`write_segment_rows`, a task per segment): cut the segment into splits, decode each
  (spark.walcols.read_split_columns), write its `rows` as one Parquet file, and return the
  split's small facts (`SplitStats`): row counts, the origins it holds, each origin's last lsn
  in it (a max), the span of its written_us, the node's own transactions and rows;
- between the passes the driver folds the facts of each node's splits in WAL order into the
  vclock at every split's start (`prefixes`): a running max is a max of the split maxes before;
- pass 2 (`write_split_pass2`, a task per split): decode the split again (faster than reading
  its rows back) and write its `vclock_history` (prefix + running max within the split, exactly
  the window of a running max per node over position), its `origin_history`, its divergence
  suspects and its own writes with their vclock (the input of concurrent_writes, bucketed by
  key), and return the progress-plot partial maxima and replication_delay partial sums.

Files are named by split number, written to a temporary name and renamed: a retried task
writes the same file again. Paths must be reachable from every executor (as the inputs)."""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from node.core.rows import GROUP_DEFAULT, GROUP_LOCAL, GROUP_NAMES, OP_NAMES
from spark import tables as T
from spark import concurrent, walcols, walread

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
# A write's `seen` lists its origin's vclock at write time, component by component in the
# order of the writers (the origins of replicated rows, sorted): longs, no uuids, cheap to shuffle.
WRITES_SCHEMA = pa.schema([("space", pa.string()), ("key", pa.string()), ("origin_uuid", pa.string()),
                           ("origin_idx", pa.int32()), ("origin_lsn", pa.int64()), ("timestamp", pa.int64()),
                           ("seen", pa.list_(pa.int64()))])
WRITES_DIR = "_concurrent_writes_input"     # under OUT while the job runs; removed after


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
_DELAY_BASIS = pa.array(["origin_wal", "timestamp"], pa.string())


def _same(value: str, n: int) -> pa.DictionaryArray:
    """n copies of one string, as a dictionary of one value (Parquet writes it, never hashes it n times)."""
    return pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), pa.array([value], pa.string()))


def _coded(codes: np.ndarray, values: pa.Array) -> pa.DictionaryArray:
    """values[codes], null where a code is negative, as a dictionary array (values hold no nulls)."""
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32, copy=False), mask=codes < 0), values)


_WRITE_KINDS = np.array([k for k, name in OP_NAMES.items() if name in T.WRITE_OPS], dtype=np.int8)


class RowIndex(NamedTuple):
    """Where each row of a split sits: its transaction, its place there, its index in its frame."""
    txn: np.ndarray
    row_in_txn: np.ndarray
    index: np.ndarray


def row_index(c: walcols.SplitColumns) -> RowIndex:
    n_rows = c.t_rows.astype(np.int64)
    txn = np.repeat(np.arange(len(n_rows), dtype=np.int64), n_rows)
    row_in_txn = np.arange(len(c.r_kind), dtype=np.int64) - (np.cumsum(n_rows) - n_rows)[txn]
    return RowIndex(txn, row_in_txn, c.t_first_index[txn] + row_in_txn)


def txn_table(c: walcols.SplitColumns) -> pa.Table:
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


def write_segment_rows(n: int, seg: walread.SegmentFile, split_bytes: int, rows_dir: str,
                       own_cap: int) -> list[tuple[walread.Split, SplitStats]]:
    """Pass 1 of segment n: its splits, each with its rows written and its facts. The node's
    own transactions and rows come back only if the segment holds at most own_cap of each (so
    the driver never gathers more than the tasks of pass 2 can be sent)."""
    out = [(s, _split_rows(k, s, f"{n:05d}-{k:05d}", rows_dir))
           for k, s in enumerate(walread.plan_segment(seg, split_bytes))]
    if sum(len(x.own[0]) for _, x in out if x.own is not None) > own_cap:
        out = [(s, x._replace(own=None)) for s, x in out]
    if sum(len(x.own_rows[0]) for _, x in out) > own_cap:
        out = [(s, x._replace(own_rows=None)) for s, x in out]
    return out


def _split_rows(i: int, split: walread.Split, name: str, rows_dir: str) -> SplitStats:
    c = walcols.read_split_columns(split)
    at = row_index(c)
    _write(rows_batch(c, at=at), rows_dir, name)
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
                      own_arrays, own_rows)


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


DIVERGENCE_INPUT_SCHEMA = pa.schema([("origin_uuid", pa.string()), ("origin_lsn", pa.int64()),
                                     ("content_hash", pa.int64())])
DIVERGENCE_DIR = "_divergence_input"       # under OUT while the job runs; removed after


def _divergence_input(c: walcols.SplitColumns, at: RowIndex, ref: dict[str, tuple], out_dir: str, i: int) -> int:
    """The observations of split i that may make an (origin, lsn) divergent: those that differ
    from the origin's own observation (written with that reference content), and those with no
    own observation to compare with. An (origin, lsn) is divergent exactly when its rows here
    hold two different contents (grouped by Spark: usually none, or a few)."""
    codes = np.where(c.t_group != GROUP_LOCAL, c.t_origin, -1)[at.txn]     # replicated rows' origins
    lsn_all = c.t_lsn[at.txn] + at.row_in_txn
    h_all = c.r_hash
    us, ls, hs = [], [], []
    for k, u in enumerate(c.origins):
        here = codes == k
        lsn, h = lsn_all[here], h_all[here]
        if u in ref and len(ref[u][0]):
            lsns, hashes = ref[u]
            j = np.minimum(np.searchsorted(lsns, lsn), len(lsns) - 1)
            found = lsns[j] == lsn
            bad = found & (hashes[j] != h)
            keep = bad | ~found
            parts = [(lsn[keep], h[keep]), (lsn[bad], hashes[j][bad])]
        else:
            parts = [(lsn, h)]
        for pl, ph in parts:
            if len(pl):
                us.append(pa.repeat(pa.scalar(u, pa.string()), len(pl)))
                ls.append(pl)
                hs.append(ph)
    table = pa.Table.from_arrays([pa.chunked_array(us, pa.string()), pa.array(np.concatenate(ls) if ls else [], pa.int64()),
                                  pa.array(np.concatenate(hs) if hs else [], pa.int64())], schema=DIVERGENCE_INPUT_SCHEMA)
    _write(table, out_dir, i)
    return len(table)


ORIGIN_HISTORY_SCHEMA = pa.schema([
    ("origin_uuid", pa.string()), ("txn_lsn", pa.int64()), ("txn_last_lsn", pa.int64()), ("txn_id", pa.string()),
    ("timestamp", pa.int64()), ("node_uuid", pa.string()), ("position", pa.int64()), ("written_us", pa.int64()),
    ("origin_written_us", pa.int64()), ("delay_us", pa.int64()), ("delay_basis", pa.string())])


def _origin_history(c: walcols.SplitColumns, t: pa.Table, replicated: np.ndarray, last: np.ndarray,
                    own: dict[str, tuple], history_dir: str, i: int) -> list[tuple]:
    """Write split i's origin_history; returns replication_delay partials: (node, origin,
    txns, max delay, sum of delays) for origins other than the node."""
    r = t.filter(pa.array(replicated))
    codes = c.t_origin[replicated]
    lsn = c.t_lsn[replicated]
    ow = np.zeros(len(lsn), dtype=np.int64)
    found = np.zeros(len(lsn), dtype=bool)
    here = np.unique(codes).tolist()
    for k in here:
        u = c.origins[k]
        if u not in own:
            continue
        at = codes == k
        lsns, wus = own[u]
        j = np.minimum(np.searchsorted(lsns, lsn[at]), max(len(lsns) - 1, 0))
        hit = lsns[j] == lsn[at] if len(lsns) else np.zeros(at.sum(), dtype=bool)
        found[at] = hit
        ow[at] = np.where(hit, wus[j], 0)
    wus = c.t_written_us[replicated]
    delay = wus - np.where(found, ow, c.t_timestamp[replicated])
    _write(pa.table([
        r["origin_uuid"], r["txn_lsn"], pa.array(last[replicated]), r["txn_id"], r["timestamp"], r["node_uuid"],
        r["position"], r["written_us"], pa.array(ow, mask=~found), pa.array(delay),
        pa.DictionaryArray.from_arrays(np.where(found, 0, 1).astype(np.int32), _DELAY_BASIS)],
        names=list(T.ORIGIN_HISTORY)), history_dir, i)
    out = []
    for k in here:
        u = c.origins[k]
        if u == c.node_uuid:
            continue
        d = delay[codes == k]
        out.append((c.node_uuid, u, len(d), int(d.max()), int(d.sum())))
    return out


def _vclocks(prefix: dict[str, int], c: walcols.SplitColumns, replicated: np.ndarray, last: np.ndarray
             ) -> tuple[pa.Array, np.ndarray, list[str]]:
    """The vclock after each transaction: prefix, then a running max per origin (a map,
    components > 0, in uuid order); also as a matrix (transaction x uuid) and its uuids."""
    codes = np.where(replicated, c.t_origin, -1)
    present = np.unique(codes[codes >= 0]).tolist()
    uuids = sorted(set(prefix) | {c.origins[k] for k in present})
    m = np.zeros((len(last), len(uuids)), dtype=np.int64)
    for j, u in enumerate(uuids):
        base = prefix.get(u, 0)
        k = c.origins.index(u) if u in c.origins else -2
        col = np.where(codes == k, last, 0)
        np.maximum.accumulate(col, out=col)
        m[:, j] = np.maximum(col, base)
    mask = m > 0
    offsets = np.zeros(len(last) + 1, dtype=np.int32)
    np.cumsum(mask.sum(axis=1), out=offsets[1:])
    keys = _coded(np.nonzero(mask)[1], pa.array(uuids, pa.string()))
    return pa.MapArray.from_arrays(pa.array(offsets), keys, pa.array(m[mask])), m, uuids


def write_split_pass2(i: int, split: walread.Split, vclock_dir: str, writes_dir: str, history_dir: str | None,
                      own: dict[str, tuple] | None, div_dir: str | None, ref: dict[str, tuple] | None,
                      prefix: tuple[dict[str, int], int], t0: int | None,
                      width: float, writers: list[str], buckets: int) -> tuple[list[tuple], list[tuple], int]:
    """Pass 2 of split i: its vclock_history, its own writes with their vclock and, given the
    origins' own transactions (`own`), its origin_history. Returns the split's progress partials
    (node, origin, bucket, max written_us, max last lsn) of its replicated transactions, and
    its replication_delay partials (see _origin_history). The split is decoded again: the native
    reader is faster than reading pass 1's Parquet back, and leaves origins as integer codes."""
    c = walcols.read_split_columns(split)
    t, at = txn_table(c), row_index(c)
    node = c.node_uuid
    local = c.t_group == GROUP_LOCAL
    known = c.t_origin >= 0
    replicated = ~local & known
    last = c.t_lsn + c.t_rows - 1
    vclock, m, uuids = _vclocks(prefix[0], c, replicated, last)
    local_lsn = np.maximum(np.maximum.accumulate(np.where(local, last, 0)) if len(last) else last, prefix[1])
    cols = [t[name] for name in T.VCLOCK_HISTORY[:8]] + [vclock, pa.array(local_lsn, pa.int64())]
    _write(pa.table(cols, names=list(T.VCLOCK_HISTORY)), vclock_dir, i)

    # Own writes with the vclock of their transaction (concurrent_writes' input): one origin,
    # the node's own, which is a writer (it has replicated rows).
    own_txn = (c.t_origin == (c.origins.index(node) if node in c.origins else -2)) & (c.t_group == GROUP_DEFAULT)
    writes = np.nonzero(own_txn[at.txn] & np.isin(c.r_kind, _WRITE_KINDS))[0]
    wt = at.txn[writes]
    seen = np.zeros((len(wt), len(writers)), dtype=np.int64)
    for j, u in enumerate(writers):
        if u in uuids:
            seen[:, j] = m[wt, uuids.index(u)]
    seen_list = pa.ListArray.from_arrays(pa.array(np.arange(len(wt) + 1, dtype=np.int32) * len(writers)),
                                         pa.array(seen.reshape(-1)))
    sel = pa.array(writes)
    ws = pa.Table.from_arrays([
        c.r_space.take(sel), c.r_key.take(sel), pa.repeat(pa.scalar(node, pa.string()), len(wt)),
        pa.array(np.full(len(wt), writers.index(node) if node in writers else -1, dtype=np.int32)),
        pa.array(c.t_lsn[wt] + at.row_in_txn[writes]), pa.array(c.t_timestamp[wt]), seen_list], schema=WRITES_SCHEMA)
    bucket = concurrent.bucket_of(ws["key"], buckets)
    for b in np.unique(bucket).tolist():
        d = concurrent.bucket_dir(writes_dir, b)
        os.makedirs(d, exist_ok=True)
        _write(ws.filter(pa.array(bucket == b)), d, i)

    suspects = 0 if div_dir is None else _divergence_input(c, at, ref or {}, div_dir, i)
    delays = [] if history_dir is None else _origin_history(c, t, replicated, last, own or {}, history_dir, i)
    if t0 is None or not replicated.any():
        return [], delays, suspects
    wus, lst = c.t_written_us[replicated], last[replicated]
    b = np.floor((wus - t0) / width).astype(np.int64)
    per = int(b.max()) + 1
    keys, at = np.unique(c.t_origin[replicated].astype(np.int64) * per + b, return_inverse=True)
    tw, ls = np.full(len(keys), np.iinfo(np.int64).min), np.full(len(keys), np.iinfo(np.int64).min)
    np.maximum.at(tw, at, wus)
    np.maximum.at(ls, at, lst)
    return [(node, c.origins[k // per], k % per, x, y)
            for k, x, y in zip(keys.tolist(), tw.tolist(), ls.tolist())], delays, suspects
