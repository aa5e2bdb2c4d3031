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

from dataclasses import dataclass
from typing import Any

from node import limits
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


@dataclass(frozen=True, slots=True)
class Op:
    kind: int
    space: str
    key: str
    value: Any = None

    def to_wire(self) -> list:
        return [self.kind, self.space, self.key, self.value]


@dataclass(frozen=True, slots=True)
class Txn:
    replica_id: int
    lsn: int
    group: int
    timestamp: int
    ops: tuple[Op, ...]

    def __post_init__(self) -> None:
        assert self.lsn >= 1, self
        assert self.group in GROUPS, self
        assert self.ops, "a transaction has at least one row"

    @property
    def last_lsn(self) -> int:
        return self.lsn + len(self.ops) - 1

    @property
    def component(self) -> int:
        """The vclock component this txn advances: 0 for local rows, else the origin."""
        return 0 if self.group == GROUP_LOCAL else self.replica_id

    def with_replica_id(self, replica_id: int) -> "Txn":
        return Txn(replica_id, self.lsn, self.group, self.timestamp, self.ops)

    def to_wire(self) -> list:
        return [self.replica_id, self.lsn, self.group, self.timestamp, [o.to_wire() for o in self.ops]]


def _bad(what: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"malformed row: {what}")


def op_from_wire(raw: Any) -> Op:
    if not isinstance(raw, (list, tuple)) or len(raw) != 4:
        raise _bad("op is not a 4-element list")
    kind, space, key, value = raw
    if kind not in OPS:
        raise _bad(f"unknown op kind {kind!r}")
    if not isinstance(space, str) or not (0 < len(space) <= limits.space_name_chars_max):
        raise _bad("space name")
    if not isinstance(key, str) or len(key.encode("utf-8", "surrogatepass")) > limits.key_bytes_max:
        raise _bad("key")
    if kind == OP_CLUSTER:
        if space != CLUSTER_SPACE or not isinstance(value, dict) or not isinstance(value.get("id"), int):
            raise _bad("_cluster row")
    if kind == OP_SPACE and not isinstance(value, dict):
        raise _bad("space definition")
    return Op(kind, space, key, value)


def txn_from_wire(raw: Any) -> Txn:
    if not isinstance(raw, (list, tuple)) or len(raw) != 5:
        raise _bad("txn is not a 5-element list")
    replica_id, lsn, group, ts, ops = raw
    for name, v in (("replica_id", replica_id), ("lsn", lsn), ("timestamp", ts)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise _bad(name)
    if lsn < 1 or replica_id > limits.replica_id_max:
        raise _bad("lsn or replica_id out of range")
    if group not in GROUPS:
        raise _bad(f"group {group!r}")
    if not isinstance(ops, (list, tuple)) or not ops or len(ops) > limits.txn_ops_max:
        raise _bad("ops")
    return Txn(replica_id, lsn, group, ts, tuple(op_from_wire(o) for o in ops))
