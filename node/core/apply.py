"""How a persisted transaction changes state — the one definition shared by the LMDB
store and the simulator's in-memory store.

`apply_txn(view, txn, self_uuid)` needs a `StateView` (get/put/delete records per space,
space definitions, `_cluster` tuples, the origin-ids knowledge). Rules:
- data rows go through the space's resolver (last-writer-wins by default, with
  tombstones); a row the resolver refuses changes nothing but still counts in the vclock;
- a `_cluster` row whose origin is this node changes this node's table; one from another
  origin only records that origin's id for the member;
- the vclock component of the txn (0 for local rows) advances to its last lsn."""
from __future__ import annotations

from typing import Any, Protocol

from node.cluster_space.resolver import DATA_RESOLVERS
from node.cluster_space.table import ClusterTable, Member
from node.core.rows import GROUP_LOCAL, OP_CLUSTER, OP_DELETE, OP_NOP, OP_PUT, OP_SPACE, Txn
from node.core.vclock import VClock
from node.errors import StorageError


class StateView(Protocol):
    table: ClusterTable
    vclock: VClock

    def space(self, name: str) -> tuple[bool, str] | None: ...          # (local, conflict)
    def create_space(self, name: str, local: bool, conflict: str) -> None: ...
    def get(self, space: str, key: str) -> list | None: ...              # [value, origin_id, lsn, hlc, deleted]
    def put(self, space: str, key: str, record: list) -> None: ...
    def delete(self, space: str, key: str) -> None: ...
    def put_member(self, m: Member) -> None: ...
    def put_knowledge(self, origin_uuid: str, member_uuid: str, their_id: int) -> None: ...


def apply_txn(view: StateView, txn: Txn, self_uuid: str) -> None:
    table = view.table
    local = txn.group == GROUP_LOCAL
    origin_uuid = "" if local else (table.uuid_of(txn.replica_id) or "")
    origin_id = 0 if local else txn.replica_id
    lsn = txn.lsn
    for op in txn.ops:
        k = op.kind
        if k == OP_PUT or k == OP_DELETE:
            sdef = view.space(op.space)
            if sdef is None:
                raise StorageError(f"row {txn.replica_id}:{lsn} writes unknown space {op.space!r}")
            conflict = sdef[1]
            deleted = k == OP_DELETE
            old = view.get(op.space, op.key)
            if old is not None and conflict != "apply":
                old_uuid = (table.uuid_of(old[1]) or "") if old[1] else self_uuid
                new_uuid = origin_uuid or self_uuid
                if not DATA_RESOLVERS[conflict]((old[0], old_uuid, old[2], old[3], old[4]),
                                                (op.value, new_uuid, lsn, txn.timestamp, deleted)):
                    lsn += 1
                    continue
            if deleted and conflict == "apply":
                view.delete(op.space, op.key)
            else:
                view.put(op.space, op.key, [None if deleted else op.value, origin_id, lsn, txn.timestamp, deleted])
        elif k == OP_SPACE:
            if view.space(op.space) is None:
                v: Any = op.value
                view.create_space(op.space, bool(v.get("local")), str(v.get("conflict", "lww")))
        elif k == OP_CLUSTER:
            v = op.value
            if origin_uuid == self_uuid:
                m = Member(op.key, int(v["id"]), str(v.get("address") or ""), str(v["state"]), lsn,
                           int(v.get("expelled_lsn") or 0))
                table.upsert(m)
                view.put_member(m)
            else:
                view.put_knowledge(origin_uuid, op.key, int(v["id"]))
        else:
            assert k == OP_NOP, k
        lsn += 1
    c = txn.component
    if txn.last_lsn > view.vclock.get(c):
        view.vclock.follow(c, txn.last_lsn)
