"""The analysis in one plain Python process: the reference the Spark jobs are tested against.

Same inputs, same tables (spark.tables), computed the obvious way with dicts and loops over
rows in WAL order, reading each segment whole through node.wal.reader (the Spark jobs read byte
ranges instead, so comparing the two also checks the splitting). For small inputs: everything
is held in memory. Rows are tuples in the tables' column order; a vclock is a dict."""
from __future__ import annotations

import gc
from collections import defaultdict

from spark import tables as T
from spark.walread import WalInputError, flatten_frame, node_base, read_node_frames

_R = {c: i for i, c in enumerate(T.ROWS)}


def read_rows(dirs: list[str]) -> tuple[list[tuple], dict[str, tuple[dict[str, int], int]]]:
    """All row observations of all nodes, and each node's base vclock (by uuid, local)."""
    rows: list[tuple] = []
    bases: dict[str, tuple[dict[str, int], int]] = {}
    for d in dirs:
        base = node_base(d)
        if base.node_uuid in bases:
            raise WalInputError(f"{d}: node {base.node_uuid} is given twice")
        bases[base.node_uuid] = (dict(base.vclock), base.local_lsn)
        for rec in read_node_frames(d):
            if rec[0] != base.node_uuid:
                raise WalInputError(f"{d}: segments of two nodes ({base.node_uuid}, {rec[0]})")
            rows.extend(flatten_frame(rec))
    return rows, bases


def vclock_history(rows: list[tuple], bases: dict) -> list[tuple]:
    out = []
    state: dict[str, tuple[dict[str, int], list[int]]] = {}
    for r in rows:                       # rows are in position order within each node
        if r[_R["row_in_txn"]] != 0:
            continue
        node = r[_R["node_uuid"]]
        if node not in state:
            vc, local = bases[node]
            state[node] = (dict(vc), [local])
        vc, local = state[node]
        origin, group = r[_R["origin_uuid"]], r[_R["group"]]
        last = r[_R["txn_lsn"]] + r[_R["txn_rows"]] - 1
        if group == "local":
            local[0] = max(local[0], last)
        elif origin is not None and last > vc.get(origin, 0):
            vc[origin] = last
        out.append((node, r[_R["position"]], r[_R["segment"]], r[_R["offset"]], r[_R["written_us"]],
                    origin, r[_R["txn_id"]], group, dict(vc), local[0]))
    return out


def _replicated_txns(rows: list[tuple]) -> list[tuple]:
    return [r for r in rows
            if r[_R["row_in_txn"]] == 0 and r[_R["group"]] != "local" and r[_R["origin_uuid"]] is not None]


def origin_history(rows: list[tuple]) -> list[tuple]:
    txns = _replicated_txns(rows)
    own = {(r[_R["origin_uuid"]], r[_R["txn_lsn"]]): r[_R["written_us"]]
           for r in txns if r[_R["node_uuid"]] == r[_R["origin_uuid"]]}
    out = []
    for r in txns:
        origin, lsn, ts = r[_R["origin_uuid"]], r[_R["txn_lsn"]], r[_R["timestamp"]]
        ow = own.get((origin, lsn))
        delay = r[_R["written_us"]] - (ow if ow is not None else ts)
        out.append((origin, lsn, lsn + r[_R["txn_rows"]] - 1, r[_R["txn_id"]], ts, r[_R["node_uuid"]],
                    r[_R["position"]], r[_R["written_us"]], ow, delay,
                    "origin_wal" if ow is not None else "timestamp"))
    return out


def replication_delay(history: list[tuple]) -> list[tuple]:
    ix = {c: i for i, c in enumerate(T.ORIGIN_HISTORY)}
    acc: dict[tuple[str, str], list[int]] = {}
    for h in history:
        node, origin, d = h[ix["node_uuid"]], h[ix["origin_uuid"]], h[ix["delay_us"]]
        if node == origin:
            continue
        a = acc.setdefault((node, origin), [0, d, 0])
        a[0] += 1
        a[1] = max(a[1], d)
        a[2] += d
    return [(node, origin, n, mx, s / n) for (node, origin), (n, mx, s) in acc.items()]


def divergence(rows: list[tuple]) -> list[tuple]:
    by_row: dict[tuple[str, int], list[tuple]] = defaultdict(list)
    for r in rows:
        if r[_R["group"]] != "local" and r[_R["origin_uuid"]] is not None:
            by_row[(r[_R["origin_uuid"]], r[_R["origin_lsn"]])].append(r)
    out = []
    for (origin, lsn), obs in by_row.items():
        hashes = {r[_R["content_hash"]] for r in obs}
        if len(hashes) > 1:
            for r in obs:
                out.append((origin, lsn, r[_R["node_uuid"]], r[_R["content_hash"]], r[_R["op"]],
                            r[_R["space"]], r[_R["key"]], len(hashes)))
    return out


def concurrent_writes(rows: list[tuple], history: list[tuple]) -> list[tuple]:
    at = {(h[0], h[1]): h[8] for h in history}      # (node, txn position) -> vclock
    by_key: dict[tuple[str, str], list[tuple]] = defaultdict(list)
    for r in rows:
        if (r[_R["node_uuid"]] == r[_R["origin_uuid"]] and r[_R["group"]] == "default"
                and r[_R["op"]] in T.WRITE_OPS):
            vc = at[(r[_R["node_uuid"]], r[_R["position"]] - r[_R["row_in_txn"]])]
            by_key[(r[_R["space"]], r[_R["key"]])].append(
                (r[_R["origin_uuid"]], r[_R["origin_lsn"]], r[_R["timestamp"]], vc))
    out = []
    for (space, key), ws in by_key.items():
        for oa, la, ta, va in ws:
            for ob, lb, tb, vb in ws:
                if oa < ob and vb.get(oa, 0) < la and va.get(ob, 0) < lb:
                    out.append((space, key, oa, la, ta, ob, lb, tb))
    return out


def summary(rows: list[tuple], history: list[tuple], vclocks: list[tuple], delays: list[tuple],
            div: list[tuple], conc: list[tuple]) -> dict:
    """The figures `replog analyze` prints (same shape as spark.jobs.summary)."""
    nodes: dict[str, dict] = {}
    for r in rows:
        n = nodes.setdefault(r[_R["node_uuid"]], {"rows": 0, "max_delay_us": None, "vclock": {}, "local_lsn": 0})
        n["rows"] += 1
    last: dict[str, tuple] = {}
    for v in vclocks:
        if v[0] not in last or v[1] > last[v[0]][1]:
            last[v[0]] = v
    for node, v in last.items():
        nodes[node]["vclock"], nodes[node]["local_lsn"] = v[8], v[9]
    for d in delays:
        n = nodes[d[0]]
        n["max_delay_us"] = d[3] if n["max_delay_us"] is None else max(n["max_delay_us"], d[3])
    origins = {r[_R["origin_uuid"]] for r in rows if r[_R["group"]] != "local" and r[_R["origin_uuid"]] is not None}
    return {
        "nodes": nodes,
        "origins": sorted(origins),
        "rows": len(rows),
        "unresolved_rows": sum(1 for r in rows if r[_R["origin_uuid"]] is None),
        "divergent_rows": sorted({(d[0], d[1]) for d in div}),
        "concurrent_writes": len(conc),
    }


def analyze(dirs: list[str]) -> dict:
    """Every table (name -> list of tuples) and the summary, for the given node dirs."""
    gc_was = gc.isenabled()
    gc.disable()                  # millions of long-lived tuples: collection cycles only cost time
    try:
        rows, bases = read_rows(dirs)
        vc = vclock_history(rows, bases)
        oh = origin_history(rows)
        rd = replication_delay(oh)
        div = divergence(rows)
        cw = concurrent_writes(rows, vc)
        return {"rows": rows, "vclock_history": vc, "origin_history": oh, "replication_delay": rd,
                "divergence": div, "concurrent_writes": cw,
                "summary": summary(rows, oh, vc, rd, div, cw)}
    finally:
        if gc_was:
            gc.enable()
