"""Rows and transactions: the unit that is written to the WAL and streamed to peers.

A transaction (Txn) is one origin's atomic change: `ops` are its rows, and row i has
lsn `txn.lsn + i` in the origin's vclock component, so a transaction of n rows takes
lsns lsn..lsn+n-1 and the last row is the transaction boundary. `replica_id` names the
origin in the id space of whoever holds the Txn (it is translated on every link).

Groups (after Tarantool's replication groups):
- DEFAULT: replicated data and space definitions;
- LOCAL: rows of local spaces; never leave the node; counted in vclock component 0;
- CLUSTER: rows of `_cluster`; replicated and handled specially by appliers.

Wire and WAL form is a msgpack list `[replica_id, lsn, group, timestamp, [[kind, space, key, value], ...]]`;
`txn_from_wire` validates everything a peer or a damaged file could get wrong."""
from __future__ import annotations

from math import isfinite
from typing import Annotated, Any, Literal, NamedTuple

import msgpack
import msgspec

from node import limits
from node.core import codec, validate
from node.errors import RemoteProtocolError

GROUP_DEFAULT = 0
GROUP_LOCAL = 1
GROUP_CLUSTER = 2
GROUPS = (GROUP_DEFAULT, GROUP_LOCAL, GROUP_CLUSTER)
GROUP_NAMES = {GROUP_DEFAULT: "default", GROUP_LOCAL: "local", GROUP_CLUSTER: "cluster"}

OP_PUT = 1          # space, key, value
OP_DELETE = 2       # space, key
OP_SPACE = 3        # space (name), key unused, value: {"local": bool, "conflict": str}
OP_CLUSTER = 4      # space "_cluster", key: member uuid, value: {"id", "address", "state"}
OP_NOP = 5          # advances the vclock only
OPS = (OP_PUT, OP_DELETE, OP_SPACE, OP_CLUSTER, OP_NOP)
OP_NAMES = {OP_PUT: "put", OP_DELETE: "delete", OP_SPACE: "space", OP_CLUSTER: "cluster", OP_NOP: "nop"}

CLUSTER_SPACE = "_cluster"


class Op(NamedTuple):
    """One row's operation. A tuple, so msgpack encodes it as its own wire form."""
    kind: int
    space: str
    key: str
    value: Any = None

    def to_wire(self) -> list:
        return [self.kind, self.space, self.key, self.value]


class Txn(NamedTuple):
    """One origin's transaction; immutable, and cheap to build on the applier's hot path.
    Validated when built from outside (`txn_from_wire`) and by the core when claimed."""
    replica_id: int
    lsn: int
    group: int
    timestamp: int
    ops: tuple

    @property
    def last_lsn(self) -> int:
        return self.lsn + len(self.ops) - 1

    @property
    def component(self) -> int:
        """The vclock component this txn advances: 0 for local rows, else the origin."""
        return 0 if self.group == GROUP_LOCAL else self.replica_id

    def with_replica_id(self, replica_id: int) -> "Txn":
        return tuple.__new__(Txn, (replica_id, self[1], self[2], self[3], self[4]))   # lsn, group, timestamp, ops

    def to_wire(self) -> list:
        return [self.replica_id, self.lsn, self.group, self.timestamp, [list(o) for o in self.ops]]


def _bad(what: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"malformed row: {what}")


_OPS_SET = frozenset(OPS)
_GROUPS_SET = frozenset(GROUPS)
_KEY_CHARS_SAFE = limits.key_bytes_max // 4     # a key this short is within bounds whatever its chars
_SPACE_CHARS_MAX = limits.space_name_chars_max
_REPLICA_ID_MAX = limits.replica_id_max
_TXN_OPS_MAX = limits.txn_ops_max
_LSN_MAX = limits.lsn_max
_TS_MAX = limits.timestamp_us_max


_new = tuple.__new__     # builds an Op/Txn from a checked sequence in C, without NamedTuple's __new__


def op_error(kind: Any, space: Any, key: Any, value: Any, *, legacy: bool = False) -> str | None:
    """What is wrong with one row, by its kind, or None (the rules: node.core.validate).
    `legacy`: values written before the value rule (recovery of this node's own WAL)."""
    if kind == OP_PUT or kind == OP_DELETE:
        err = validate.space_name_error(space) or validate.key_error(key)
        if err is None:
            if kind == OP_PUT:
                err = validate.value_error(value, legacy=legacy)
            elif value is not None:
                err = "a delete carries no value"
        return err
    if kind == OP_CLUSTER:
        if space != CLUSTER_SPACE or not validate.is_uuid(key):
            return f"a _cluster row goes to space _cluster under a canonical uuid, not {str(key)[:80]!r}"
        return validate.cluster_value_error(value)
    if kind == OP_SPACE:
        return validate.space_name_error(space) or (None if key == "" else "a space row has an empty key") \
            or validate.space_def_error(value)
    if kind == OP_NOP:
        return validate.space_name_error(space) or (validate.key_error(key) if key != "" else None) \
            or (None if value is None else "a nop carries no value")
    return f"unknown op kind {str(kind)[:20]}"


def op_from_wire(raw: Any, legacy: bool = False) -> Op:
    t = type(raw)
    if (t is not list and t is not tuple) or len(raw) != 4:
        raise _bad("op is not a 4-element list")
    kind, space, key, value = raw
    if type(kind) is not int or kind not in _OPS_SET:
        raise _bad(f"unknown op kind {str(kind)[:20]}")
    err = op_error(kind, space, key, value, legacy=legacy)
    if err is not None:
        raise _bad(err)
    return _new(Op, raw)


def txn_from_wire(raw: Any, legacy: bool = False) -> Txn:
    """A transaction as the wire or the WAL carries it, checked by every rule of its envelope and
    rows; raises RemoteProtocolError naming the row. `legacy`: see op_from_wire."""
    t = type(raw)
    if (t is not list and t is not tuple) or len(raw) != 5:
        raise _bad("txn is not a 5-element list")
    replica_id, lsn, group, ts, ops = raw
    if type(replica_id) is not int or type(lsn) is not int or type(ts) is not int:
        raise _bad("replica_id, lsn and timestamp are integers")
    t = type(ops)
    if (t is not list and t is not tuple) or not ops or len(ops) > _TXN_OPS_MAX:
        raise _bad(f"a transaction has 1..{_TXN_OPS_MAX} rows")
    if not 0 <= replica_id <= _REPLICA_ID_MAX:
        raise _bad(f"replica ids are 0..{_REPLICA_ID_MAX}, not {replica_id}")
    if lsn < 1 or lsn + len(ops) - 1 > _LSN_MAX:
        raise _bad(f"row {replica_id}:{lsn}: lsns are 1..{_LSN_MAX}")
    if not 0 <= ts <= _TS_MAX:
        raise _bad(f"row {replica_id}:{lsn}: timestamps are 0..{_TS_MAX} µs, not {ts}")
    if type(group) is not int or group not in _GROUPS_SET:
        raise _bad(f"row {replica_id}:{lsn}: group {str(group)[:20]}")
    try:
        out = tuple([op_from_wire(o, legacy) for o in ops])
    except RemoteProtocolError as e:
        raise RemoteProtocolError(f"{e} (row {replica_id}:{lsn})") from None
    if (group == GROUP_CLUSTER) != all(o[0] == OP_CLUSTER for o in out) or \
            (group != GROUP_CLUSTER and any(o[0] == OP_CLUSTER for o in out)):
        raise _bad(f"row {replica_id}:{lsn}: _cluster rows travel alone, in group cluster")
    return _new(Txn, (replica_id, lsn, group, ts, out))


# --- the fast path --------------------------------------------------------------------------
# msgspec decodes a frame payload straight into Txn/Op tuples, checking types, lengths and
# ranges in C. It accepts a strict subset of what txn_from_wire accepts: data rows and nops of
# groups default and local, with keys short enough to be within bounds whatever their characters
# and values that pass the value rule (check_fast). Anything else (space and `_cluster` rows, long
# keys, extension types, odd values, damage, nesting deeper than msgspec recurses) is decoded again
# by the exact path, so what is accepted, and every error, is txn_from_wire's.

class _WireOp(Op):
    __slots__ = ()
    _field_defaults = {}              # on the wire an op has all four elements
    kind: Literal[OP_PUT, OP_DELETE, OP_NOP]
    space: Annotated[str, msgspec.Meta(pattern=validate.SPACE_RE.pattern)]
    key: Annotated[str, msgspec.Meta(max_length=_KEY_CHARS_SAFE)]
    value: Any


class _WireTxn(Txn):
    __slots__ = ()
    replica_id: Annotated[int, msgspec.Meta(ge=0, le=_REPLICA_ID_MAX)]
    lsn: Annotated[int, msgspec.Meta(ge=1, le=_LSN_MAX)]
    group: Literal[GROUP_DEFAULT, GROUP_LOCAL]
    timestamp: Annotated[int, msgspec.Meta(ge=0, le=_TS_MAX)]
    ops: Annotated[tuple[_WireOp, ...], msgspec.Meta(min_length=1, max_length=_TXN_OPS_MAX)]


class Unusual(Exception):
    """Raised by fast-path checks: decode this again by the exact path."""


def no_ext(code: int, data: memoryview) -> Any:
    """msgspec ext_hook of the fast paths: extensions go the exact path (node.core.codec)."""
    raise Unusual


WIRE_FRAME = tuple[int, list[_WireTxn]]     # a frame payload, as the fast decoders read it
# RecursionError: msgspec recurses, and a value nested past its limit is refused by the exact path
FAST_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, Unusual, RecursionError)
_fast_frame = msgspec.msgpack.Decoder(WIRE_FRAME, ext_hook=no_ext).decode
_SCALARS = frozenset((str, int, bool, type(None)))       # within the rules as any decoder makes them
_STR_SAFE = limits.value_bytes_max // 4


def _flat_ok(v: Any) -> bool:
    """A small map or array of scalars, as a fast decoder made it (its strings are UTF-8, its ints in
    range): within the value rule without walking it (at most 32 items of at most ~4 KiB each)."""
    if len(v) > 32:
        return False
    if type(v) is dict:
        for k, x in v.items():
            if type(k) is not str or len(k) > 256:
                return False
            t = type(x)
            if t is str:
                if len(x) > 4096:
                    return False
            elif t is float:
                if not isfinite(x):
                    return False
            elif t not in _SCALARS:
                return False
        return True
    for x in v:
        t = type(x)
        if t is str:
            if len(x) > 4096:
                return False
        elif t is float:
            if not isfinite(x):
                return False
        elif t not in _SCALARS:
            return False
    return True


def check_fast(txns: list[Txn]) -> None:
    """Raise Unusual unless every txn (from a fast decoder) passes what msgspec's types do not
    check: lsns within lsn_max, a key in every data row, no value on deletes and nops, values
    by the value rule (strictly: values of rows a peer sends, or this node writes)."""
    for t in txns:
        ops = t[4]
        if t[1] + len(ops) - 1 > _LSN_MAX:
            raise Unusual
        for o in ops:
            v = o[3]
            if o[0] == OP_PUT:
                if not o[2]:
                    raise Unusual
                tv = type(v)
                if tv in _SCALARS and (tv is not str or len(v) <= _STR_SAFE):
                    continue
                if (tv is dict or tv is list) and _flat_ok(v):
                    continue
                if validate.value_error(v) is not None:
                    raise Unusual
            elif v is not None or (not o[2] and o[0] == OP_DELETE):
                raise Unusual


def unpack_frame_txns(body: bytes, legacy: bool = False) -> tuple[int, list[Txn]]:
    """(written_us, txns) of a frame payload (node.wal.format), every txn validated as by
    txn_from_wire. Raises RemoteProtocolError for a bad txn and ValueError/TypeError (or
    msgpack's own errors) for an undecodable payload; use frame_txns_upto to keep the txns
    before a bad one."""
    written_us, txns, err = frame_txns_upto(body, legacy)
    if err is not None:
        raise err
    return written_us, txns


def frame_txns_upto(body: bytes, legacy: bool = False) -> tuple[int, list[Txn], RemoteProtocolError | None]:
    """(written_us, the valid txns up to the first bad one, that txn's error or None).
    `legacy`: a frame of this node's own WAL, whose values may predate the value rule (they were
    acknowledged: node.core.validate). Raises only when the payload itself cannot be decoded as [written_us, [txn, ...]]."""
    try:
        written_us, txns = _fast_frame(body)
        check_fast(txns)
        return written_us, txns, None
    except FAST_ERRORS:
        pass
    return exact_frame(msgpack.unpackb(body, raw=False, strict_map_key=False, use_list=True,
                                       ext_hook=codec.refuse_ext), legacy)


def exact_frame(d: Any, legacy: bool = False) -> tuple[int, list[Txn], RemoteProtocolError | None]:
    """frame_txns_upto's exact path, over a frame payload decoded by msgpack."""
    if type(d) is not list or len(d) != 2 or not isinstance(d[0], int) or type(d[1]) is not list:
        raise ValueError("frame payload is not [written_us, txns]")
    out: list[Txn] = []
    try:
        for raw in d[1]:
            out.append(txn_from_wire(raw, legacy))
    except RemoteProtocolError as e:
        return d[0], out, e
    return d[0], out, None


def nop_of(raw: Any) -> Txn | None:
    """A txn that stands for `raw` in the vclock only (its envelope is sound, its rows are not):
    what recovery applies for a txn --force-recovery skips, so the skip is not made again at every
    start. None if even the envelope is unusable."""
    try:
        replica_id, lsn, group, ts, ops = raw
        n = len(ops)
    except (TypeError, ValueError):
        return None
    if validate.lsn_error(lsn) or type(replica_id) is not int or not 0 <= replica_id <= _REPLICA_ID_MAX \
            or group not in _GROUPS_SET or not 1 <= n <= _TXN_OPS_MAX or lsn < 1 or lsn + n - 1 > _LSN_MAX:
        return None
    return Txn(replica_id, lsn, group if group != GROUP_CLUSTER else GROUP_DEFAULT,
               ts if type(ts) is int and 0 <= ts <= _TS_MAX else 0, (Op(OP_NOP, "_skipped", "", None),) * n)
