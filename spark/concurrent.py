"""concurrent_writes from the origins' own writes, in Python tasks over Arrow (no Spark SQL).

- pass 2 (spark.pass2) writes each split's own writes with their origin's vclock into
  `buckets` files by a hash of the key (`bucket_of`): every write to one (space, key) lands in
  one bucket, from whichever split or node it came. That is the shuffle, done with the files
  the passes already write (they must be reachable from every executor anyway). The files are
  Arrow IPC, lz4 (`write_bucket_file`): read once by one task, never by Spark (Parquet cost
  ~8x more CPU to write and read back, for 30 -> 8 bytes a write);
- one task per bucket (`write_bucket_pairs`) reads its files, sorts the writes by (space, key)
  and compares every two writes of a key from two origins: concurrent when neither origin had
  seen the other's row when it wrote its own (spark.tables.CONCURRENT_WRITES).
Rules: a key's writes are compared in slices of at most `pairs_max` candidate pairs, so a hot
key costs time in proportion to its pairs, never memory; the output is every pair once, with
origin_a < origin_b (origin_idx is the rank of the origin's uuid among the writers)."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

pairs_max = 4_000_000             # candidate pairs held at once by one task (~100 MiB of indices)

def writes_schema(writers: int) -> pa.Schema:
    """A split's own writes, as pass 2 hands them over: `seen` is the writing origin's vclock
    at write time, one component per writer (the origins of replicated rows, sorted), and
    origin_idx the rank of the writing origin among them: longs, no uuids."""
    return pa.schema([("space", pa.string()), ("key", pa.string()), ("origin_idx", pa.int32()),
                      ("origin_lsn", pa.int64()), ("timestamp", pa.int64()), ("seen", pa.list_(pa.int64(), writers))])


_IPC_OPTIONS = ipc.IpcWriteOptions(compression="lz4")


def write_bucket_file(w: pa.Table, writes_dir: str, b: int, i: int) -> None:
    """Split i's writes of bucket b, written whole or not at all (a retried task writes it again)."""
    d = bucket_dir(writes_dir, b)
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".part-{i:05d}.{os.getpid()}.tmp")
    with ipc.new_file(tmp, w.schema, options=_IPC_OPTIONS) as f:
        f.write_table(w)
    os.replace(tmp, os.path.join(d, f"part-{i:05d}.arrow"))


CONCURRENT_SCHEMA = pa.schema([("space", pa.string()), ("key", pa.string()), ("origin_a", pa.string()),
                               ("lsn_a", pa.int64()), ("timestamp_a", pa.int64()), ("origin_b", pa.string()),
                               ("lsn_b", pa.int64()), ("timestamp_b", pa.int64())])


def bucket_of(keys: pa.Array | pa.ChunkedArray, buckets: int) -> np.ndarray:
    """The bucket of each key: a polynomial hash of its UTF-8 bytes mod 2^64, computed over
    Arrow's buffers with numpy (the same in every process, no Python per key)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    n = len(keys)
    _, off_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(off_buf, np.int32)[keys.offset:keys.offset + n + 1].astype(np.int64)
    lengths = np.diff(offsets)
    h = np.zeros(n, np.uint64)
    if n == 0 or offsets[-1] == offsets[0]:
        return h.astype(np.int64) % buckets
    data = np.frombuffer(data_buf, np.uint8)[offsets[0]:offsets[-1]].astype(np.uint64)
    starts = offsets[:-1] - offsets[0]
    pos = np.arange(len(data)) - np.repeat(starts, lengths)            # place of a byte in its key
    powers = np.cumprod(np.concatenate([[np.uint64(1)], np.full(int(lengths.max()) - 1, _HASH_MULTIPLIER)]),
                        dtype=np.uint64)
    some = lengths > 0
    h[some] = np.add.reduceat(data * powers[pos], starts[some])
    return ((h * _HASH_MIX) >> np.uint64(33)).astype(np.int64) % buckets


_HASH_MULTIPLIER = np.uint64(1_000_003)
_HASH_MIX = np.uint64(0x9E3779B97F4A7C15)


def bucket_dir(writes_dir: str, b: int) -> str:
    return os.path.join(writes_dir, f"bucket-{b:04d}")


def _pairs_of_groups(starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (i, j), i < j, of rows within each group [start, start + size) (sorted rows)."""
    sizes = sizes.astype(np.int64)
    p = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)   # place in its group
    later = np.repeat(sizes, sizes) - p - 1                                   # rows after it there
    left = np.repeat(np.repeat(starts, sizes) + p, later)
    right = left + 1 + (np.arange(later.sum()) - np.repeat(np.cumsum(later) - later, later))
    return left, right


def _slices(sizes: np.ndarray) -> list[tuple[int, int]]:
    """Ranges of groups whose candidate pairs stay near pairs_max (a bigger group: alone)."""
    cost = sizes.astype(np.int64) * (sizes.astype(np.int64) - 1) // 2
    out, lo, acc = [], 0, 0
    for g, c in enumerate(cost.tolist()):
        if acc and acc + c > pairs_max:
            out.append((lo, g))
            lo, acc = g, 0
        acc += c
    out.append((lo, len(cost)))
    return out


def concurrent_pairs(w: pa.Table, writers: list[str]) -> pa.Table:
    """The concurrent pairs among writes (writes_schema) of whole keys."""
    if len(w) == 0:
        return CONCURRENT_SCHEMA.empty_table()
    space = pc.dictionary_encode(w["space"].combine_chunks())
    key = pc.dictionary_encode(w["key"].combine_chunks())
    k = (space.indices.to_numpy().astype(np.int64) * len(key.dictionary) + key.indices.to_numpy())
    order = np.argsort(k, kind="stable")
    k = k[order]
    idx = w["origin_idx"].to_numpy()[order]
    lsn = w["origin_lsn"].to_numpy()[order]
    seen = w["seen"].combine_chunks().flatten().to_numpy().reshape(-1, len(writers))[order]
    bounds = np.flatnonzero(np.diff(k)) + 1
    starts = np.concatenate([[0], bounds])
    sizes = np.diff(np.concatenate([starts, [len(k)]]))
    many = sizes > 1
    starts, sizes = starts[many], sizes[many]
    picked_a, picked_b = [], []
    for lo, hi in _slices(sizes):
        if hi - lo == 1 and sizes[lo] * (sizes[lo] - 1) // 2 > pairs_max:
            pieces = _pairs_of_big_group(int(starts[lo]), int(sizes[lo]))
        else:
            pieces = [_pairs_of_groups(starts[lo:hi], sizes[lo:hi])]
        for i, j in pieces:
            keep = idx[i] != idx[j]
            i, j = i[keep], j[keep]
            a = np.where(idx[i] < idx[j], i, j)          # origin_a < origin_b
            b = np.where(idx[i] < idx[j], j, i)
            ok = (seen[b, idx[a]] < lsn[a]) & (seen[a, idx[b]] < lsn[b])
            picked_a.append(a[ok])
            picked_b.append(b[ok])
    a = order[np.concatenate(picked_a)] if picked_a else np.zeros(0, np.int64)
    b = order[np.concatenate(picked_b)] if picked_b else np.zeros(0, np.int64)
    cols = w.select(["space", "key", "origin_lsn", "timestamp"])
    wa, wb = cols.take(pa.array(a)), cols.take(pa.array(b))
    uuids, origin = pa.array(writers, pa.string()), w["origin_idx"].to_numpy()
    return pa.Table.from_arrays([wa["space"], wa["key"], uuids.take(pa.array(origin[a])), wa["origin_lsn"],
                                 wa["timestamp"], uuids.take(pa.array(origin[b])), wb["origin_lsn"], wb["timestamp"]],
                                schema=CONCURRENT_SCHEMA)


def _pairs_of_big_group(start: int, size: int):
    """A hot key's pairs, one row against the rows after it at a time."""
    for r in range(start, start + size - 1):
        right = np.arange(r + 1, start + size, dtype=np.int64)
        yield np.full(len(right), r, dtype=np.int64), right


def write_bucket_pairs(b: int, writes_dir: str, out_dir: str, write, writers: list[str]) -> int:
    """The concurrent pairs of bucket b, as out_dir/part-b; returns how many."""
    d = bucket_dir(writes_dir, b)
    files = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".arrow")) if os.path.isdir(d) else []
    # An empty bucket writes an empty file: the table is readable even with no writes at all.
    pairs = concurrent_pairs(pa.concat_tables(_read(f) for f in files), writers) if files else \
        CONCURRENT_SCHEMA.empty_table()
    write(pairs, out_dir, b)
    return len(pairs)


def _read(path: str) -> pa.Table:
    with ipc.open_file(pa.memory_map(path)) as f:
        return f.read_all()
