"""The StateView of node.core.apply over one LMDB write transaction of a Store
(node/storage/store.py `Store.apply`): how a journal batch's rows reach the sub-databases
(node/storage/layout.py).

Rules kept here: every change goes through the one write transaction the view was made for, so
the batch and its vclock commit or abort together; what the view changes in the Store's memory
(spaces created, `_cluster` rows written) it notes, for Store.apply to undo if the transaction
is aborted."""
from __future__ import annotations

from node.cluster_space.table import Member
from node.core import codec, record
from node.storage.layout import SpaceDef

_pack = codec.pack                  # space definitions, _cluster rows, knowledge
_pack_record = record.pack          # records of spaces (node.core.record)
_unpack_record = record.unpack


class TxnView:
    """node.core.apply's StateView over `t`, one write transaction of `store`."""
    __slots__ = ("s", "t", "table", "vclock", "created", "members_changed", "own_history_lsn")

    def __init__(self, store, t):         # a Store, and its LMDB write transaction
        self.s, self.t = store, t
        self.table, self.vclock = store.table, store.vclock
        self.own_history_lsn = store.own_history_lsn
        self.created: list[str] = []
        self.members_changed = False

    def space(self, name: str):
        d = self.s.spaces.get(name)
        return None if d is None else (d.local, d.conflict)

    def create_space(self, name: str, local: bool, conflict: str) -> None:
        sdef = SpaceDef(name, local, conflict)
        self.created.append(name)
        self.s.spaces[name] = sdef
        self.s._dbs[name] = self.s.env.open_db(b"s:" + name.encode(), txn=self.t)
        self.t.put(name.encode(), _pack(sdef.to_dict()), db=self.s._spaces_db)

    def get(self, space: str, key: str):
        b = self.t.get(key.encode(), db=self.s._dbs[space])
        return None if b is None else _unpack_record(b)

    def put(self, space: str, key: str, rec: list) -> None:
        self.t.put(key.encode(), _pack_record(rec), db=self.s._dbs[space])

    def raw_replacer(self, space: str):
        """replacer() for records already packed (bytes in, bytes or None out)."""
        return self.t.cursor(db=self.s._dbs[space]).replace

    def raw_put(self, space: str, key: bytes, record: bytes) -> None:
        self.t.put(key, record, db=self.s._dbs[space])

    def raw_delete(self, space: str, key: bytes) -> None:
        self.t.delete(key, db=self.s._dbs[space])

    def replacer(self, space: str):
        """Put, returning the record replaced: one B-tree lookup instead of get + put, through
        a cursor kept for the batch (Transaction.replace opens one per call, ~3x the cost)."""
        cursor_replace = self.t.cursor(db=self.s._dbs[space]).replace

        def replace(key: str, rec: list) -> list | None:
            b = cursor_replace(key.encode(), _pack_record(rec))
            return None if b is None else _unpack_record(b)
        return replace

    def delete(self, space: str, key: str) -> None:
        self.t.delete(key.encode(), db=self.s._dbs[space])

    def put_member(self, m: Member) -> None:
        self.members_changed = True
        self.t.put(m.uuid.encode(), _pack(m.to_row()), db=self.s._cluster_db)

    def put_knowledge(self, origin_uuid: str, member_uuid: str, their_id: int) -> None:
        self.t.put(f"{origin_uuid}\0{member_uuid}".encode(), _pack(their_id), db=self.s._ids_db)
