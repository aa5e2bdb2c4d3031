"""How a persisted transaction changes state — the one definition shared by the LMDB
store and the simulator's in-memory store.

`apply_txns(view, txns, self_uuid)` (and `apply_txn` for one) needs a `StateView` (get/put/delete records per space,
space definitions, `_cluster` tuples, the origin-ids knowledge; `replacer` is optional: put and
return the old record in one lookup). Rules:
- data rows go through the space's resolver (last-writer-wins by default, with
  tombstones); a row the resolver refuses changes nothing but still counts in the vclock;
- a `_cluster` row whose origin is this node changes this node's table, unless it is history
  (an earlier incarnation's row, at or below the view's `own_history_lsn`); one from another
  origin only records that origin's id for the member;
- the vclock component of the txn (0 for local rows) advances to its last lsn (once per call,
  after the rows: nothing here reads the vclock).

`apply_packed(view, entry, self_uuid)` applies a PackedEntry (node.core.entry: plain txns as
received, their store records already built) with the same outcome as apply_txns on its txns;
it needs the view's raw_replacer/raw_put/raw_delete (records as bytes), which the LMDB store has."""
from __future__ import annotations

from typing import Protocol

from node.cluster_space.resolver import DATA_RESOLVERS
from node.cluster_space.table import ClusterTable, Member
from node.core import record
from node.core.rows import GROUP_LOCAL, OP_CLUSTER, OP_DELETE, OP_NOP, OP_PUT, OP_SPACE, Txn
from node.core.vclock import VClock
from node.errors import StorageError

# The hot loops below build and read records positionally (a name per field would add a global
# lookup per field per row): they spell node.core.record's layout, checked here.
assert record.LAYOUT == ("value", "origin_id", "lsn", "hlc", "deleted"), "apply.py spells the record layout"
_DELETED_TRUE = record.DELETED_TRUE


class StateView(Protocol):
    table: ClusterTable
    vclock: VClock

    def space(self, name: str) -> tuple[bool, str] | None: ...          # (local, conflict)
    def create_space(self, name: str, local: bool, conflict: str) -> None: ...
    def get(self, space: str, key: str) -> list | None: ...              # a record (node.core.record)
    def put(self, space: str, key: str, rec: list) -> None: ...
    # optional: def replacer(self, space: str) -> Callable[[str, list], list | None]
    #   a function that puts a record into that space and returns the one it replaced
    def delete(self, space: str, key: str) -> None: ...
    def put_member(self, m: Member) -> None: ...
    def put_knowledge(self, origin_uuid: str, member_uuid: str, their_id: int) -> None: ...


def _get_then_put(view: StateView, space: str):
    def replace(key: str, rec: list) -> list | None:
        old = view.get(space, key)
        view.put(space, key, rec)
        return old
    return replace


def apply_txn(view: StateView, txn: Txn, self_uuid: str) -> None:
    apply_txns(view, (txn,), self_uuid)


def apply_txns(view: StateView, txns, self_uuid: str) -> dict[int, int]:
    """Apply txns in order: the same as apply_txn on each, with the per-call setup done once
    (this is the write thread's hot loop: a catch-up applies many small txns per batch).
    Returns each vclock component's highest last lsn among txns (NodeCore.commit_tops)."""
    table = view.table
    own_history = getattr(view, "own_history_lsn", 0)
    uuid_of = table.uuid_of
    space_of = view.space
    put = view.put
    replacer = getattr(view, "replacer", None) or (lambda space: _get_then_put(view, space))
    replace = None                   # replacer(space)
    space = conflict = None          # the space of the previous data row and its resolver's name
    tops: dict[int, int] = {}        # vclock component -> last lsn applied in this call
    for txn in txns:
        replica_id, lsn, group, ts, ops = txn
        local = group == GROUP_LOCAL
        origin_id = 0 if local else replica_id      # also the txn's vclock component
        origin_uuid = "" if local else (uuid_of(replica_id) or "")
        for kind, op_space, key, value in ops:
            if kind == OP_PUT or kind == OP_DELETE:
                if op_space != space:
                    sdef = space_of(op_space)
                    if sdef is None:
                        raise StorageError(f"row {replica_id}:{lsn} writes unknown space {op_space!r}")
                    space, conflict = op_space, sdef[1]
                    replace = replacer(space)
                deleted = kind == OP_DELETE
                if conflict == "apply":              # arrival order: no need to read the old record
                    if deleted:
                        view.delete(space, key)
                    else:
                        put(space, key, [value, origin_id, lsn, ts, False])
                else:
                    # Write first (one lookup); the old record, if it wins, is written back:
                    # the outcome is the resolver's either way.
                    new = [None if deleted else value, origin_id, lsn, ts, deleted]
                    old = replace(key, new)
                    if old is not None:
                        old_uuid = (uuid_of(old[1]) or "") if old[1] else self_uuid
                        if not DATA_RESOLVERS[conflict]((old[0], old_uuid, old[2], old[3], old[4]),
                                                        (value, origin_uuid or self_uuid, lsn, ts, deleted)):
                            put(space, key, old)
            elif kind == OP_SPACE:
                if space_of(op_space) is None:
                    view.create_space(op_space, bool(value.get("local")), str(value.get("conflict", "lww")))
            elif kind == OP_CLUSTER:
                if origin_uuid == self_uuid and lsn <= own_history:
                    pass             # an earlier incarnation's row (NodeCore.own_history_lsn): history only
                elif origin_uuid == self_uuid:
                    m = Member(key, int(value["id"]), str(value.get("address") or ""), str(value["state"]), lsn,
                               int(value.get("expelled_lsn") or 0))
                    table.upsert(m)
                    view.put_member(m)
                else:
                    view.put_knowledge(origin_uuid, key, int(value["id"]))
            else:
                assert kind == OP_NOP, kind
            lsn += 1
        if lsn - 1 > tops.get(origin_id, 0):    # lsn - 1: the txn's last lsn
            tops[origin_id] = lsn - 1
    vclock = view.vclock
    for c, last in tops.items():
        if last > vclock.get(c):
            vclock.follow(c, last)
    return tops


def apply_packed(view, entry, self_uuid: str) -> dict[int, int]:
    """A PackedEntry's puts and deletes, as apply_txns applies its txns: each record goes in as
    it was built, and an old record is decoded only where there was one (then the space's
    resolver decides, and a winning old record is written back). Nops only count in the
    vclock. Returns the entry's vclock tops (components are members: never 0)."""
    uuid_of = view.table.uuid_of
    for space, items in entry.records():
        sdef = view.space(space)
        if sdef is None:
            rec = record.unpack(items[0][1])
            raise StorageError(f"row {rec[record.ORIGIN_ID]}:{rec[record.LSN]} writes unknown space {space!r}")
        conflict = sdef[1]
        if conflict == "apply":              # arrival order: a delete removes, a put replaces
            for key, rec in items:
                if rec[-1] == _DELETED_TRUE:  # a tombstone (node.core.record: the flag is the last byte)
                    view.raw_delete(space, key)
                else:
                    view.raw_put(space, key, rec)
            continue
        replace = view.raw_replacer(space)
        resolve = DATA_RESOLVERS[conflict]
        for key, rec in items:
            old = replace(key, rec)
            if old is not None:
                o, n = record.unpack(old), record.unpack(rec)
                old_uuid = (uuid_of(o[1]) or "") if o[1] else self_uuid
                if not resolve((o[0], old_uuid, o[2], o[3], o[4]), (n[0], uuid_of(n[1]) or self_uuid, n[2], n[3], n[4])):
                    view.raw_put(space, key, old)
    vclock = view.vclock
    for c, last in entry.tops.items():
        if last > vclock.get(c):
            vclock.follow(c, last)
    return entry.tops
