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

from typing import Annotated, Any, Literal, NamedTuple

import msgpack
import msgspec

from node import limits
from node.core import codec
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
_KEY_BYTES_MAX = limits.key_bytes_max           # bound to module names: read for every row
_SPACE_CHARS_MAX = limits.space_name_chars_max
_REPLICA_ID_MAX = limits.replica_id_max
_TXN_OPS_MAX = limits.txn_ops_max


_new = tuple.__new__     # builds an Op/Txn from a checked sequence in C, without NamedTuple's __new__


def op_from_wire(raw: Any) -> Op:
    # The hot path of every applier: `type(x) is int` also refuses bools.
    t = type(raw)
    if (t is not list and t is not tuple) or len(raw) != 4:
        raise _bad("op is not a 4-element list")
    kind, space, key, value = raw
    if type(kind) is not int or kind not in _OPS_SET:
        raise _bad(f"unknown op kind {kind!r}")
    if type(space) is not str or not (0 < len(space) <= _SPACE_CHARS_MAX):
        raise _bad("space name")
    if type(key) is not str or (len(key) > _KEY_CHARS_SAFE and
                                len(key.encode("utf-8", "surrogatepass")) > _KEY_BYTES_MAX):
        raise _bad("key")
    if kind == OP_CLUSTER:
        if space != CLUSTER_SPACE or type(value) is not dict or type(value.get("id")) is not int:
            raise _bad("_cluster row")
    elif kind == OP_SPACE and type(value) is not dict:
        raise _bad("space definition")
    return _new(Op, raw)


def txn_from_wire(raw: Any) -> Txn:
    t = type(raw)
    if (t is not list and t is not tuple) or len(raw) != 5:
        raise _bad("txn is not a 5-element list")
    replica_id, lsn, group, ts, ops = raw
    if type(replica_id) is not int or type(lsn) is not int or type(ts) is not int:
        raise _bad("replica_id, lsn and timestamp are integers")
    if lsn < 1 or ts < 0 or not (0 <= replica_id <= _REPLICA_ID_MAX):
        raise _bad("lsn, timestamp or replica_id out of range")
    if type(group) is not int or group not in _GROUPS_SET:
        raise _bad(f"group {group!r}")
    t = type(ops)
    if (t is not list and t is not tuple) or not ops or len(ops) > _TXN_OPS_MAX:
        raise _bad("ops")
    return _new(Txn, (replica_id, lsn, group, ts, tuple(map(op_from_wire, ops))))


# --- the fast path --------------------------------------------------------------------------
# msgspec decodes a frame payload straight into Txn/Op tuples, checking types, lengths and
# ranges in C. It accepts a strict subset of what txn_from_wire accepts: data rows and nops
# with keys short enough to be within bounds whatever their characters, values without
# extension types (of those, stored values may hold timestamps only: node.core.codec). Anything else (space and `_cluster` rows, long keys, odd values, damage)
# is decoded again by the exact path, so what is accepted, and every error, is txn_from_wire's.

class _WireOp(Op):
    __slots__ = ()
    _field_defaults = {}              # on the wire an op has all four elements
    kind: Literal[OP_PUT, OP_DELETE, OP_NOP]
    space: Annotated[str, msgspec.Meta(min_length=1, max_length=_SPACE_CHARS_MAX)]
    key: Annotated[str, msgspec.Meta(max_length=_KEY_CHARS_SAFE)]
    value: Any


class _WireTxn(Txn):
    __slots__ = ()
    replica_id: Annotated[int, msgspec.Meta(ge=0, le=_REPLICA_ID_MAX)]
    lsn: Annotated[int, msgspec.Meta(ge=1)]
    group: Literal[GROUP_DEFAULT, GROUP_LOCAL, GROUP_CLUSTER]
    timestamp: Annotated[int, msgspec.Meta(ge=0)]
    ops: Annotated[tuple[_WireOp, ...], msgspec.Meta(min_length=1, max_length=_TXN_OPS_MAX)]


class Unusual(Exception):
    """Raised by fast-path checks: decode this again by the exact path."""


def no_ext(code: int, data: memoryview) -> Any:
    """msgspec ext_hook of the fast paths: extensions go the exact path (node.core.codec)."""
    raise Unusual


WIRE_FRAME = tuple[int, list[_WireTxn]]     # a frame payload, as the fast decoders read it
FAST_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, Unusual)
_fast_frame = msgspec.msgpack.Decoder(WIRE_FRAME, ext_hook=no_ext).decode
_SCALARS = frozenset((str, int, bytes, float, bool, type(None)))


def _plain(v: Any) -> bool:
    """v holds only what msgpack would make of it too: no map key that is an array (msgspec
    makes those tuples, msgpack refuses them) and no timestamp (msgspec makes a datetime)."""
    t = type(v)
    if t is dict:
        return all(type(k) is not tuple and (type(x) in _SCALARS or _plain(x)) for k, x in v.items())
    if t is list:
        return all(type(x) in _SCALARS or _plain(x) for x in v)
    return t in _SCALARS


def check_plain(txns: list[Txn]) -> None:
    """Raise Unusual unless every value in txns (from a fast decoder) is plain."""
    for t in txns:
        for o in t[4]:
            if type(o[3]) not in _SCALARS and not _plain(o[3]):
                raise Unusual


def unpack_frame_txns(body: bytes) -> tuple[int, list[Txn]]:
    """(written_us, txns) of a frame payload (node.wal.format), every txn validated as by
    txn_from_wire. Raises RemoteProtocolError for a bad txn and ValueError/TypeError (or
    msgpack's own errors) for an undecodable payload; use frame_txns_upto to keep the txns
    before a bad one."""
    written_us, txns, err = frame_txns_upto(body)
    if err is not None:
        raise err
    return written_us, txns


def frame_txns_upto(body: bytes) -> tuple[int, list[Txn], RemoteProtocolError | None]:
    """(written_us, the valid txns up to the first bad one, that txn's error or None).
    Raises only when the payload itself cannot be decoded as [written_us, [txn, ...]]."""
    try:
        written_us, txns = _fast_frame(body)
        check_plain(txns)
        return written_us, txns, None
    except FAST_ERRORS:
        pass
    return exact_frame(msgpack.unpackb(body, raw=False, strict_map_key=False, use_list=True,
                                       ext_hook=codec.refuse_ext))


def exact_frame(d: Any) -> tuple[int, list[Txn], RemoteProtocolError | None]:
    """frame_txns_upto's exact path, over a frame payload decoded by msgpack."""
    if type(d) is not list or len(d) != 2 or not isinstance(d[0], int) or type(d[1]) is not list:
        raise ValueError("frame payload is not [written_us, txns]")
    out: list[Txn] = []
    try:
        for raw in d[1]:
            out.append(txn_from_wire(raw))
    except RemoteProtocolError as e:
        return d[0], out, e
    return d[0], out, None
