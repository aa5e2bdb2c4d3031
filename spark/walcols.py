"""One split of a node's WAL as columns (numpy and Arrow): the executors' hot path.

Two readers give the same `SplitColumns`, and the same errors for the same bytes:
- native (`spark._walcols`, C): frames decoded straight into column buffers, no Python object
  per row; the only Python left per split is the id translation below;
- `read_split_columns_py`: the pure-Python reference (msgpack.unpackb per frame), used when the
  extension is not built or cannot load (a cluster on another platform), and by the
  differential test (tests/spark/test_walcols.py).
Rules kept here (see spark.walread for the ones about tables and positions):
- the same checks in the same order as spark.walread.FrameDecoder.record, stricter only where
  a column needs it: replica_id, lsn, timestamp and written_us are integers of int64 (not
  bool); an op is a list;
- a transaction's origin comes from the node's table as of that transaction: `_cluster`
  transactions move the table (NodeTable.follow) after their own origin is taken, in order;
- a reader's damage report names file and offset; the `_cluster` rows before the damage move
  the table first (the reference meets them first)."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import mmap
import os
import sys
import zlib
from typing import NamedTuple

import msgpack
import numpy as np
import pyarrow as pa
from crc32c import crc32c

from node import limits
from node.core.rows import GROUP_CLUSTER, GROUP_LOCAL, GROUP_NAMES, OP_NAMES
from spark.walread import NodeTable, Split, WalInputError, _decode

log = logging.getLogger("replog.analyze")

NATIVE_MODULE = "spark._walcols"
_KINDS_MASK = sum(1 << k for k in OP_NAMES)
_GROUPS_MASK = sum(1 << g for g in GROUP_NAMES)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class SplitColumns(NamedTuple):
    """One split's rows: per transaction (t_*), and per row in frame order (r_*).
    A transaction's rows are t_rows[i] consecutive rows."""
    node_uuid: str
    segment: str
    ordinal: int
    t_offset: np.ndarray      # int64: frame offset
    t_written_us: np.ndarray  # int64
    t_origin: np.ndarray      # int32: index in `origins`, -1 for an id the table does not know
    origins: list             # uuid of each origin code
    t_lsn: np.ndarray         # int64
    t_group: np.ndarray       # int8
    t_timestamp: np.ndarray   # int64
    t_first_index: np.ndarray  # int32: index in its frame of the transaction's first row
    t_rows: np.ndarray        # int32
    r_kind: np.ndarray        # int8
    r_space: pa.Array         # string
    r_key: pa.Array           # string
    r_hash: np.ndarray        # int64


# --- loading the extension ------------------------------------------------------------------
_native_module = None
_native_tried = False


def native():
    """The C reader, or None. In a Spark executor the `spark` package comes from the job's zip,
    which cannot hold an extension: spark.launch.ship_code sends the built file along, and the
    worker puts Spark's files directory on sys.path, where it is found."""
    global _native_module, _native_tried
    if not _native_tried:
        _native_tried = True
        _native_module = _import_built() or _import_shipped(sys.path)
        if _native_module is None:
            log.warning("%s is not built (pip install -e .): reading WAL in pure Python", NATIVE_MODULE)
    return _native_module


def _import_built():
    try:
        from spark import _walcols
        return _walcols
    except ImportError:
        return None


def _import_shipped(dirs: list[str]):
    names = [NATIVE_MODULE.rsplit(".", 1)[1] + s for s in importlib.machinery.EXTENSION_SUFFIXES]
    for d in dirs:
        for name in names:
            path = os.path.join(d or ".", name)
            if not os.path.isfile(path):
                continue
            try:
                spec = importlib.util.spec_from_file_location(NATIVE_MODULE, path)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
            except (ImportError, OSError) as e:      # built for another platform
                log.warning("%s: cannot load (%s); reading WAL in pure Python", path, e)
                continue
            sys.modules[NATIVE_MODULE] = mod
            return mod
    return None


def native_file() -> str | None:
    """The built extension's path (for shipping to executors), or None."""
    mod = native()
    return getattr(mod, "__file__", None)


# --- the native reader -------------------------------------------------------------------------
def read_split_columns(split: Split, *, pure: bool = False) -> SplitColumns:
    """The rows of one split as columns: native when built (unless `pure`), else the reference."""
    mod = None if pure else native()
    if mod is None:
        return read_split_columns_py(split)
    table = NodeTable(split.node_uuid, split.table, split.own_id)
    with open(split.path, "rb") as f:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            *cols, err = mod.decode_split(buf, split.start, split.end, limits.frame_bytes_max,
                                          _KINDS_MASK, _GROUPS_MASK, GROUP_CLUSTER)
            (t_off, t_wus, t_rid, t_lsn, t_group, t_ts, t_first, t_rows, r_kind,
             sp_off, sp, key_off, key, r_hash, cluster) = cols
            t_rid = np.frombuffer(t_rid, np.int64)
            t_group = np.frombuffer(t_group, np.int8)
            t_off = np.frombuffer(t_off, np.int64)
            spans = np.frombuffer(cluster, np.int64).reshape(-1, 3).tolist()
            origin, origins = _translate(table, t_rid, t_group, spans,
                                         lambda a, b: msgpack.unpackb(buf[a:b], raw=False, strict_map_key=False),
                                         t_off, split.path)
    if err is not None:
        raise WalInputError(f"{split.path}: {err}")
    n = len(r_hash) // 8
    return SplitColumns(
        split.node_uuid, split.segment, split.ordinal, t_off, np.frombuffer(t_wus, np.int64), origin, origins,
        np.frombuffer(t_lsn, np.int64), t_group, np.frombuffer(t_ts, np.int64), np.frombuffer(t_first, np.int32),
        np.frombuffer(t_rows, np.int32), np.frombuffer(r_kind, np.int8),
        pa.StringArray.from_buffers(n, pa.py_buffer(sp_off), pa.py_buffer(sp)),
        pa.StringArray.from_buffers(n, pa.py_buffer(key_off), pa.py_buffer(key)),
        np.frombuffer(r_hash, np.int64))


def _translate(table: NodeTable, rid: np.ndarray, group: np.ndarray, spans: list, txn_at, t_offset: np.ndarray,
               path: str) -> tuple[np.ndarray, list]:
    """Origin codes of the transactions: the table as of each one, moved by each `_cluster`
    transaction (index k, bytes [a, b)) after its own origin is taken."""
    n = len(rid)
    codes = np.full(n, -1, dtype=np.int32)
    origins: list[str] = []
    code_of: dict[str, int] = {}

    def code(uuid: str | None) -> int:
        if uuid is None:
            return -1
        if uuid not in code_of:
            code_of[uuid] = len(origins)
            origins.append(uuid)
        return code_of[uuid]

    lo = 0
    for k, a, b in spans + [(n - 1, None, None)]:
        if k >= lo:
            ids, inverse = np.unique(rid[lo:k + 1], return_inverse=True)
            lut = np.array([code(table.ids.get(i)) for i in ids.tolist()], dtype=np.int32)
            codes[lo:k + 1] = lut[inverse]
            lo = k + 1
        if a is not None:
            txn = txn_at(a, b)
            try:
                table.follow(txn[0], txn[4])
            except (TypeError, ValueError, KeyError, AttributeError) as e:
                raise WalInputError(f"{path}: malformed _cluster row in frame at byte {t_offset[k]}: {e!r}") from None
    codes[group == GROUP_LOCAL] = code(table.node_uuid)
    return codes, origins


# --- the reference ------------------------------------------------------------------------------
def read_split_columns_py(split: Split) -> SplitColumns:
    """The rows of one split as columns, in pure Python: the same checks and table moves as
    spark.walread.FrameDecoder.record (one loop, no tuple per row)."""
    table = NodeTable(split.node_uuid, split.table, split.own_id)
    node_uuid, ids, path = table.node_uuid, table.ids, split.path
    pack = msgpack.Packer(autoreset=True, use_bin_type=True).pack
    t_offset, t_wus, t_origin, t_lsn, t_group, t_ts, t_first, t_rows = ([] for _ in range(8))
    kinds, spaces, keys, hashes = [], [], [], []
    ak, asp, aky, ah = kinds.append, spaces.append, keys.append, hashes.append
    op_names, group_names, lo, hi = OP_NAMES, GROUP_NAMES, _INT64_MIN, _INT64_MAX
    with open(path, "rb") as f:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            off = split.start
            while off < split.end:
                written_us, txns, nxt = _decode(buf, off, path)
                index = 0
                for t in txns:
                    try:
                        if type(t) is not list:
                            raise ValueError("a transaction is a list")
                        rid, lsn, group, ts, ops = t
                        if not (type(rid) is int and type(lsn) is int and type(ts) is int and lo <= rid <= hi
                                and lo <= lsn <= hi and lo <= ts <= hi):
                            raise ValueError("replica_id, lsn and timestamp are int64")
                        n = 0
                        for op in ops:
                            if type(op) is not list:
                                raise ValueError("an op is a list")
                            kind, space, key, _value = op
                            if type(space) is not str or type(key) is not str or type(kind) is not int \
                                    or kind not in op_names:
                                raise ValueError("op kind, space or key")
                            b = pack(op)
                            ak(kind)
                            asp(space)
                            aky(key)
                            ah(((crc32c(b) >> 1) << 32) | zlib.crc32(b))
                            n += 1
                    except (TypeError, ValueError) as e:
                        raise WalInputError(f"{path}: malformed transaction in frame at byte {off}: {e}") from None
                    if not n or type(group) is not int or group not in group_names:
                        raise WalInputError(f"{path}: malformed transaction in frame at byte {off}")
                    t_offset.append(off)
                    t_wus.append(written_us)
                    t_origin.append(node_uuid if group == GROUP_LOCAL else ids.get(rid))
                    t_lsn.append(lsn)
                    t_group.append(group)
                    t_ts.append(ts)
                    t_first.append(index)
                    t_rows.append(n)
                    index += n
                    if group == GROUP_CLUSTER:
                        try:
                            table.follow(rid, ops)
                        except (TypeError, ValueError, KeyError, AttributeError) as e:
                            raise WalInputError(f"{path}: malformed _cluster row in frame at byte {off}: {e!r}") from None
                # Unique positions need every row to own at least one byte of its frame.
                assert index < nxt - off, (path, off)
                off = nxt
    origins = sorted({u for u in t_origin if u is not None})
    code_of = {u: i for i, u in enumerate(origins)}
    return SplitColumns(
        node_uuid, split.segment, split.ordinal, np.array(t_offset, np.int64), np.array(t_wus, np.int64),
        np.array([code_of.get(u, -1) for u in t_origin], np.int32), origins, np.array(t_lsn, np.int64),
        np.array(t_group, np.int8), np.array(t_ts, np.int64), np.array(t_first, np.int32), np.array(t_rows, np.int32),
        np.array(kinds, np.int8), pa.array(spaces, pa.string()), pa.array(keys, pa.string()),
        np.array(hashes, np.int64))
