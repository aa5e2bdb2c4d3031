"""Pass 2, a task per split (`write_split_pass2`), in Arrow/numpy columns, from what pass 1
kept of the split (columnar.Pass2Input: no second decode): write its `vclock_history` (the vclock
at the split's start, from the driver, + a running max within the split: exactly the window of a
running max per node over position), its `origin_history`, its divergence suspects and its own
writes with their vclock (the input of concurrent_writes, bucketed by key), and return the
progress-plot partial maxima and replication_delay partial sums.

Files are named by split number, written to a temporary name and renamed (spark.columnar._write):
a retried task writes the same file again."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from node.core.rows import GROUP_LOCAL
from spark import concurrent
from spark import tables as T
from spark.columnar import Pass2Input, RowIndex, _coded, _write, load_pass2_input, row_index, txn_table

_DELAY_BASIS = pa.array(["origin_wal", "timestamp"], pa.string())
WRITES_DIR = "_concurrent_writes_input"     # under OUT from pass 2 to concurrent_writes; removed after

DIVERGENCE_INPUT_SCHEMA = pa.schema([("origin_uuid", pa.string()), ("origin_lsn", pa.int64()),
                                     ("content_hash", pa.int64())])
DIVERGENCE_DIR = "_divergence_input"       # under OUT while the job runs; removed after


def _divergence_input(c: Pass2Input, at: RowIndex, ref: dict[str, tuple], out_dir: str, i: int) -> int:
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


def _origin_history(c: Pass2Input, t: pa.Table, replicated: np.ndarray, last: np.ndarray,
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


def _vclocks(prefix: dict[str, int], c: Pass2Input, replicated: np.ndarray, last: np.ndarray
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


def write_split_pass2(i: int, name: str, input_dir: str, vclock_dir: str, writes_dir: str, history_dir: str | None,
                      own: dict[str, tuple] | None, div_dir: str | None, ref: dict[str, tuple] | None,
                      prefix: tuple[dict[str, int], int], t0: int | None,
                      width: float, writers: list[str], buckets: int) -> tuple[list[tuple], list[tuple], int]:
    """Pass 2 of split i: its vclock_history, its own writes with their vclock and, given the
    origins' own transactions (`own`), its origin_history. Returns the split's progress partials
    (node, origin, bucket, max written_us, max last lsn) of its replicated transactions, and
    its replication_delay partials (see _origin_history). The split is as pass 1 kept it
    (columnar.Pass2Input `name` in input_dir): no decoding again, origins as integer codes."""
    c = load_pass2_input(input_dir, name)
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
    writes = c.w_row
    wt = at.txn[writes]
    seen = np.zeros((len(wt), len(writers)), dtype=np.int64)
    for j, u in enumerate(writers):
        if u in uuids:
            seen[:, j] = m[wt, uuids.index(u)]
    ws = pa.Table.from_arrays([
        c.w_space, c.w_key, pa.array(np.full(len(wt), writers.index(node) if node in writers else -1, dtype=np.int32)),
        pa.array(c.t_lsn[wt] + at.row_in_txn[writes]), pa.array(c.t_timestamp[wt]),
        pa.FixedSizeListArray.from_arrays(pa.array(seen.reshape(-1)), len(writers))],
        schema=concurrent.writes_schema(len(writers)))
    bucket = concurrent.bucket_of(ws["key"], buckets)
    for b in np.unique(bucket).tolist():
        concurrent.write_bucket_file(ws.filter(pa.array(bucket == b)), writes_dir, b, i)

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
