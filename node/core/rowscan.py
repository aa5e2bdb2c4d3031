"""Scanned ROWS messages: the applier's and relay's fast paths, and their reference.

A catching-up replica receives ROWS messages of thousands of plain transactions. Decoding each
into Txn/Op tuples, claiming it, encoding it again for the WAL and once more for the store cost
more than the store's own work. `scan_rows` (native, node/core/_rowscan.c) checks and indexes a
whole message instead; the core claims whole runs of one origin (`NodeCore.receive_scan`); the
journal writes a `PackedEntry` (node.core.entry) as one WAL frame spliced from the received bytes,
and the store puts records built from them (`node.core.apply.apply_packed`). No Python object per row but the
key and record the store puts.

It takes a message only when every transaction is a plain one the exact decoder accepts (group
DEFAULT; puts, nil-valued deletes and nops; values by node.core.validate's rule; each small enough
to travel alone), each origin's transactions follow one another without a gap, and all of it is written as
replog's own encoder writes it (canonical msgpack). Canonical input is what makes splicing exact:
a transaction's or a value's bytes are then what decoding and encoding again would give, so
frames and records are byte for byte those of the exact path. Any other message (`_cluster` and
space rows, extension types, damage, another encoder's choices) gets None and takes the exact
path (node.core.messages.decode), which accepts or refuses it with its own errors.

`ScanPy` / `scan_rows_py` is the reference: the same contract built on the exact decoder
(`txn_from_wire`) and the encoder (`codec.pack`); a differential test holds the native scanner to
it. `relay_scan` is checked against the relay's exact path (node.applier.walcursor.WalCursor) it
stands in for. Without the native module the applier and relays keep their exact paths: the
reference is slower than them and only serves as the oracle."""
from __future__ import annotations

import logging
from array import array
from typing import Any

import msgpack
import msgspec

from node import limits
from node.core import codec, record, validate
from node.core.rows import GROUP_DEFAULT, OP_DELETE, OP_NOP, OP_PUT, Txn, txn_from_wire
from node.errors import RemoteProtocolError

log = logging.getLogger("replog.rowscan")

try:
    from node.core import _rowscan as native
except ImportError as e:     # a build without the extension: exact paths everywhere, slower
    native = None
    log.debug("native row scanner unavailable (%s): exact decoding only", e)

ROWS_HEAD = b"\x92\x1e\x81\xa6frames"  # [ROWS, {"frames": ...}] as codec.pack writes its head
RS_END, RS_BUDGET, RS_STOP = 0, 1, 2   # relay_scan: all read; budget spent; stopped before a frame


def scan_rows(data: bytes) -> Any:
    """The native scan of a ROWS message, or None (not for the fast path, or no native module)."""
    if native is None or type(data) is not bytes:
        return None
    return native.scan_rows(data, limits.replica_id_max, limits.txn_ops_max, limits.space_name_chars_max,
                            limits.key_bytes_max, limits.lsn_max, limits.timestamp_us_max, limits.value_depth_max,
                            limits.value_bytes_max, limits.txn_bytes_max)


# --- the reference -----------------------------------------------------------------------
_raw_message = msgspec.msgpack.Decoder(tuple[int, dict[str, list[tuple[int, list[msgspec.Raw]]]]])
_FAST_KINDS = frozenset((OP_PUT, OP_DELETE, OP_NOP))


def _plain_txn(raw: bytes) -> Txn | None:
    """The txn these bytes hold if the fast path may take it, else None. The rules are the exact
    decoder's (node.core.validate's, through txn_from_wire, and txn_bytes_error as messages.decode
    applies it); the rest is what makes a txn plain."""
    try:
        txn = txn_from_wire(msgpack.unpackb(raw, raw=False, strict_map_key=False, use_list=True,
                                            ext_hook=codec.refuse_ext))
    except (RemoteProtocolError, ValueError, TypeError, msgpack.UnpackException):
        return None
    if txn.group != GROUP_DEFAULT or validate.txn_bytes_error(len(raw)) is not None:
        return None
    for op in txn.ops:
        if op.kind not in _FAST_KINDS:
            return None
    # canonical: encoding it again gives these very bytes (also refuses duplicate map keys,
    # float32, and any int or header not written in its shortest form)
    return txn if codec.pack(txn) == raw else None


class ScanPy:
    """The reference of the native scan: the same methods over decoded Txns."""

    def __init__(self, txns: list[Txn], raws: list[bytes]):
        self.txns, self.raws = txns, raws
        self.ntxn = len(txns)
        self.nops = sum(len(t.ops) for t in txns)

    def runs(self) -> list[tuple[int, int, int]]:
        out: list[tuple[int, int, int]] = []
        for i, t in enumerate(self.txns):
            if out and out[-1][0] == t.replica_id:
                out[-1] = (t.replica_id, out[-1][1], i + 1)
            else:
                out.append((t.replica_id, i, i + 1))
        return out

    def lasts(self) -> bytes:
        return array("q", [t.last_lsn for t in self.txns]).tobytes()

    def lsn(self, i: int) -> int:
        return self.txns[i].lsn

    def txn_bytes(self, i: int) -> bytes:
        return self.raws[i]

    def ts_max(self, a: int, b: int) -> int:
        return max(t.timestamp for t in self.txns[a:b])

    def spaces(self) -> list[str]:
        """The spaces of the puts and deletes, in order, each change of space once."""
        out: list[str] = []
        for t in self.txns:
            for op in t.ops:
                if op.kind != OP_NOP and (not out or out[-1] != op.space):
                    out.append(op.space)
        return out

    def frame_txns(self, ranges) -> bytes:
        return b"".join(codec.pack(t.with_replica_id(rid)) for a, b, rid in ranges for t in self.txns[a:b])

    def records(self, ranges) -> list[tuple[str, list[tuple[bytes, bytes]]]]:
        out: list[tuple[str, list]] = []
        for a, b, rid in ranges:
            for t in self.txns[a:b]:
                for i, (kind, space, key, value) in enumerate(t.ops):
                    if kind == OP_NOP:
                        continue
                    if not out or out[-1][0] != space:
                        out.append((space, []))
                    out[-1][1].append((key.encode(), record.pack(record.make(value, rid, t.lsn + i, t.timestamp,
                                                                             kind == OP_DELETE))))
        return out


def scan_rows_py(data: bytes) -> ScanPy | None:
    """The reference scan: what the native one must accept, and what it must answer."""
    if not data.startswith(ROWS_HEAD):
        return None
    try:
        mtype, body = _raw_message.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    frames = body["frames"]
    if codec.pack([mtype, {"frames": [[w, raws] for w, raws in frames]}]) != data:
        return None                      # the message's own structure is not canonical
    txns: list[Txn] = []
    raws: list[bytes] = []
    for _, frame in frames:
        for r in frame:
            raw = bytes(r)
            txn = _plain_txn(raw)
            if txn is None:
                return None
            if txns and txns[-1].replica_id == txn.replica_id and txns[-1].last_lsn + 1 != txn.lsn:
                return None              # one origin's rows with a gap: the exact path decides
            txns.append(txn)
            raws.append(raw)
    return ScanPy(txns, raws)


# --- the relay's scan ----------------------------------------------------------------------
def relay_scan(buf: Any, pos: int, sub: dict[int, int], budget: int,
               own: tuple[int, int] | None = None) -> tuple[list[bytes], int, int, int] | None:
    """([payload, ...], rows, pos after them, status) of the native relay scan with
    `relay_wants`'s rule (`own` too), or None without the native module (the relay's exact
    path reads every frame)."""
    if native is None:
        return None
    own_id, own_cut = own if own is not None else (-1, 0)
    return native.relay_scan(buf, pos, sub, budget, limits.frame_bytes_max, own_id, own_cut)

