"""Rows and transactions: the unit that is written to the WAL and streamed to peers.

A transaction (Txn) is one origin's atomic change: `ops` are its rows, and row i has
lsn `txn.lsn + i` in the origin's vclock component, so a transaction of n rows takes
lsns lsn..lsn+n-1 and the last row is the transaction boundary. `replica_id` names the
origin in the id space of whoever holds the Txn (it is translated on every link).

Groups and op kinds are node.core.kinds' (re-exported here).

Wire and WAL form is a msgpack list `[replica_id, lsn, group, timestamp, [[kind, space, key, value], ...]]`;
`txn_from_wire` validates everything a peer or a damaged file could get wrong, by node.core.validate's
rules (the envelope, each kind of row, `_cluster` rows alone); the fast decoder below keeps a subset
of those rules, each check naming the rule it stands for."""
from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple

import msgpack
import msgspec

from node import limits
from node.core import codec, validate
# the numbers rows carry (node.core.kinds): the rest of the node imports them from here
from node.core.kinds import (CLUSTER_SPACE, GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, GROUP_NAMES,  # noqa: F401
                             GROUPS, OP_CLUSTER, OP_DELETE, OP_NAMES, OP_NOP, OP_PUT, OP_SPACE, OPS)
from node.errors import RemoteProtocolError


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


_new = tuple.__new__     # builds an Op/Txn from a checked sequence in C, without NamedTuple's __new__


def op_from_wire(raw: Any, legacy: bool = False) -> Op:
    t = type(raw)
    if (t is not list and t is not tuple) or len(raw) != 4:
        raise _bad("op is not a 4-element list")
    err = validate.op_error(*raw, legacy=legacy)
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
    err = validate.txn_envelope_error(replica_id, lsn, group, ts, ops)
    if err is not None:
        raise _bad(err)
    try:
        out = tuple([op_from_wire(o, legacy) for o in ops])
    except RemoteProtocolError as e:
        raise RemoteProtocolError(f"{e} (row {replica_id}:{lsn})") from None
    err = validate.txn_group_error(group, [o[0] for o in out])
    if err is not None:
        raise _bad(f"row {replica_id}:{lsn}: {err}")
    return _new(Txn, (replica_id, lsn, group, ts, out))


# --- the fast path --------------------------------------------------------------------------
# msgspec decodes a frame payload straight into Txn/Op tuples, checking types, lengths and
# ranges in C. It accepts a strict subset of what txn_from_wire accepts: data rows and nops of
# groups default and local, with keys short enough to be within bounds whatever their characters
# and values that pass the value rule (check_fast). Anything else (space and `_cluster` rows, long
# keys, extension types, odd values, damage, nesting deeper than msgspec recurses) is decoded again
# by the exact path, so what is accepted, and every error, is txn_from_wire's. Each check below
# names the rule of node.core.validate it stands for (tests/unit/test_validate.py holds them equal).

class _WireOp(Op):
    __slots__ = ()
    _field_defaults = {}              # on the wire an op has all four elements
    kind: Literal[OP_PUT, OP_DELETE, OP_NOP]                                 # op_error: these kinds only
    space: Annotated[str, msgspec.Meta(pattern=validate.SPACE_RE.pattern)]   # space_name_error
    key: Annotated[str, msgspec.Meta(max_length=validate.KEY_CHARS_SAFE)]   # key_error: short enough (+ check_fast)
    value: Any                                                               # value_error: check_fast


class _WireTxn(Txn):                  # txn_envelope_error (+ check_fast: the last lsn)
    __slots__ = ()
    replica_id: Annotated[int, msgspec.Meta(ge=0, le=limits.replica_id_max)]
    lsn: Annotated[int, msgspec.Meta(ge=1, le=limits.lsn_max)]
    group: Literal[GROUP_DEFAULT, GROUP_LOCAL]                               # (txn_group_error: no _cluster)
    timestamp: Annotated[int, msgspec.Meta(ge=0, le=limits.timestamp_us_max)]
    ops: Annotated[tuple[_WireOp, ...], msgspec.Meta(min_length=1, max_length=limits.txn_ops_max)]


class Unusual(Exception):
    """Raised by fast-path checks: decode this again by the exact path."""


def no_ext(code: int, data: memoryview) -> Any:
    """msgspec ext_hook of the fast paths: extensions go the exact path (node.core.codec)."""
    raise Unusual


WIRE_FRAME = tuple[int, list[_WireTxn]]     # a frame payload, as the fast decoders read it
# RecursionError: msgspec recurses, and a value nested past its limit is refused by the exact path
FAST_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, Unusual, RecursionError,
               UnicodeDecodeError)      # (msgspec raises it for a str that is not UTF-8)
_fast_frame = msgspec.msgpack.Decoder(WIRE_FRAME, ext_hook=no_ext).decode
_SCALARS = validate.DECODED_SCALARS
_STR_SAFE = validate.STR_CHARS_SAFE
_flat_ok = validate.decoded_flat_ok
_LSN_MAX = limits.lsn_max


def check_fast(txns: list[Txn]) -> None:
    """Raise Unusual unless every txn (from a fast decoder) passes what msgspec's types do not
    check: lsns within lsn_max, a key in every data row, no value on deletes and nops, values
    by the value rule (strictly: values of rows a peer sends, or this node writes)."""
    for t in txns:
        ops = t[4]
        if t[1] + len(ops) - 1 > _LSN_MAX:                  # txn_envelope_error: the last lsn
            raise Unusual
        for o in ops:
            v = o[3]
            if o[0] == OP_PUT:
                if not o[2]:                                 # key_error: 1.. bytes
                    raise Unusual
                tv = type(v)                                 # value_error, sure before it walks:
                if tv in _SCALARS and (tv is not str or len(v) <= _STR_SAFE):   # decoded_value_ok's scalars
                    continue
                if (tv is dict or tv is list) and _flat_ok(v):
                    continue
                if validate.value_error(v) is not None:
                    raise Unusual
            elif v is not None or (not o[2] and o[0] == OP_DELETE):     # op_error: no value; a delete's key
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
    except (TypeError, ValueError):
        return None
    if validate.txn_envelope_error(replica_id, lsn, group, 0, ops) is not None:     # its timestamp may be bad
        return None
    return Txn(replica_id, lsn, group if group != GROUP_CLUSTER else GROUP_DEFAULT,
               ts if type(ts) is int and 0 <= ts <= limits.timestamp_us_max else 0,
               (Op(OP_NOP, "_skipped", "", None),) * len(ops))
