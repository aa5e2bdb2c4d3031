"""How a persisted transaction changes state — the one definition shared by the LMDB
store and the simulator's in-memory store.

`apply_txn(view, txn, self_uuid)` needs a `StateView` (get/put/delete records per space,
space definitions, `_cluster` tuples, the origin-ids knowledge; `replace` is optional: put and
return the old record in one lookup). Rules:
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
    # optional: def replace(self, space: str, key: str, record: list) -> list | None  (put; the old record)
    def delete(self, space: str, key: str) -> None: ...
    def put_member(self, m: Member) -> None: ...
    def put_knowledge(self, origin_uuid: str, member_uuid: str, their_id: int) -> None: ...


def _get_then_put(view: StateView, space: str, key: str, record: list) -> list | None:
    old = view.get(space, key)
    view.put(space, key, record)
    return old


def apply_txn(view: StateView, txn: Txn, self_uuid: str) -> None:
    table = view.table
    local = txn.group == GROUP_LOCAL
    origin_uuid = "" if local else (table.uuid_of(txn.replica_id) or "")
    origin_id = 0 if local else txn.replica_id
    lsn = txn.lsn
    ts = txn.timestamp
    replace = getattr(view, "replace", None)
    space = conflict = None          # the space of the previous data row and its resolver's name
    for op in txn.ops:
        k = op.kind
        if k == OP_PUT or k == OP_DELETE:
            if op.space != space:
                sdef = view.space(op.space)
                if sdef is None:
                    raise StorageError(f"row {txn.replica_id}:{lsn} writes unknown space {op.space!r}")
                space, conflict = op.space, sdef[1]
            deleted = k == OP_DELETE
            if conflict == "apply":              # arrival order: no need to read the old record
                if deleted:
                    view.delete(space, op.key)
                else:
                    view.put(space, op.key, [op.value, origin_id, lsn, ts, False])
            else:
                # Write first (one lookup when the view can replace); the old record, if it
                # wins, is written back: the outcome is the resolver's either way.
                new = [None if deleted else op.value, origin_id, lsn, ts, deleted]
                old = replace(space, op.key, new) if replace is not None else _get_then_put(view, space, op.key, new)
                if old is not None:
                    old_uuid = (table.uuid_of(old[1]) or "") if old[1] else self_uuid
                    new_uuid = origin_uuid or self_uuid
                    if not DATA_RESOLVERS[conflict]((old[0], old_uuid, old[2], old[3], old[4]),
                                                    (op.value, new_uuid, lsn, ts, deleted)):
                        view.put(space, op.key, old)
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
    last = lsn - 1                     # txn.last_lsn: every op above took one lsn
    c = origin_id                      # txn.component: 0 for local rows, else the origin
    vclock = view.vclock
    if last > vclock.get(c):
        vclock.follow(c, last)
