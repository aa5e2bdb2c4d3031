"""node/core/apply.py's packed path (apply_packed) at the edges mutation testing found unpinned
(issue 18), on a real LMDB store: last-writer-wins ties broken by the origin's uuid, where the old
record is this node's own (origin id 0: a local txn's) or a peer's; an entry the store's vclock
already covers; an unknown space named by the entry's first row. Each case is also applied as
plain txns (apply_txns) to a second store, which must end the same."""
from __future__ import annotations

import pytest

from node.cluster_space.table import STATE_MEMBER, Member
from node.core import record, rowscan
from node.core.entry import PackedEntry, TxnEntry
from node.core.rows import GROUP_DEFAULT, GROUP_LOCAL, OP_DELETE, OP_PUT, OP_SPACE, Op, Txn
from node.errors import StorageError
from node.storage.store import Store
from test_rowscan import message

# uuids on both sides of this node's, so a tie on the timestamp goes either way by the origin
SELF, LOW, HIGH = "m-self", "a-low", "z-high"
IDS = {1: SELF, 2: LOW, 3: HIGH}
TS = 50


def _store(path) -> Store:
    s = Store(str(path))
    for rid, u in IDS.items():
        s.put_cluster_member(Member(u, rid, "", STATE_MEMBER))
    s.apply([TxnEntry([Txn(1, 1, GROUP_DEFAULT, 1, (Op(OP_SPACE, "lww", "", {"local": False, "conflict": "lww"}),
                                                    Op(OP_SPACE, "arr", "", {"local": False, "conflict": "apply"})))])],
            SELF, 1)
    return s


def _packed(txns: list[Txn]) -> PackedEntry:
    scan = rowscan.scan_rows(message([txns]))
    return PackedEntry(scan, [(x, y, rid) for rid, x, y in scan.runs()])


def _value(s: Store, space: str, key: str):
    with s.env.begin() as t:
        raw = t.get(key.encode(), db=s._dbs[space])
    return None if raw is None else record.unpack(raw)


def _both(tmp_path, before: list[Txn], wire: list[Txn]) -> tuple[Store, Store]:
    """Two stores holding `before`; `wire` applied to one as a packed entry, to the other as txns."""
    a, b = _store(tmp_path / "a"), _store(tmp_path / "b")
    for s in (a, b):
        s.apply([TxnEntry(before)], SELF, 100)
    assert a.apply([_packed(wire)], SELF, 100) == b.apply([TxnEntry(wire)], SELF, 100)
    with a.env.begin() as ta, b.env.begin() as tb:
        for name in ("lww", "arr"):
            assert list(ta.cursor(db=a._dbs[name])) == list(tb.cursor(db=b._dbs[name])), name
    assert a.vclock.to_dict() == b.vclock.to_dict()
    return a, b


def _local_write(key: str, value) -> Txn:
    return Txn(0, 1, GROUP_LOCAL, TS, (Op(OP_PUT, "lww", key, value),))


@pytest.mark.parametrize("origin, wins", [(2, False), (3, True)])
def test_a_tie_with_this_nodes_own_local_record_is_broken_by_this_nodes_uuid(tmp_path, origin, wins):
    """An old record of origin id 0 (a local txn) weighs as this node's uuid, not as no uuid."""
    a, _ = _both(tmp_path, [_local_write("k", "old")], [Txn(origin, 1, GROUP_DEFAULT, TS, (Op(OP_PUT, "lww", "k", "new"),))])
    assert _value(a, "lww", "k")[record.VALUE] == ("new" if wins else "old")


@pytest.mark.parametrize("old_origin, new_origin, wins", [(1, 2, False), (2, 1, True), (2, 3, True), (3, 2, False)])
def test_a_tie_between_members_records_is_broken_by_the_uuid_of_each_rows_origin(tmp_path, old_origin, new_origin, wins):
    """The new row weighs as its own origin's uuid (not this node's), the old one as its own."""
    before = [Txn(old_origin, 1, GROUP_DEFAULT, TS, (Op(OP_PUT, "lww", "k", "old"),))]
    wire = [Txn(new_origin, 5, GROUP_DEFAULT, TS, (Op(OP_PUT, "lww", "k", "new"),))]
    a, _ = _both(tmp_path, before, wire)
    assert _value(a, "lww", "k")[record.VALUE] == ("new" if wins else "old")


def test_a_losing_delete_leaves_the_old_record_and_a_winning_one_leaves_a_tombstone(tmp_path):
    before = [Txn(3, 1, GROUP_DEFAULT, TS, (Op(OP_PUT, "lww", "k", "old"), Op(OP_PUT, "lww", "j", "old")))]
    wire = [Txn(2, 1, GROUP_DEFAULT, TS, (Op(OP_DELETE, "lww", "k", None),)),
            Txn(2, 2, GROUP_DEFAULT, TS + 1, (Op(OP_DELETE, "lww", "j", None),))]
    a, _ = _both(tmp_path, before, wire)
    assert _value(a, "lww", "k")[record.VALUE] == "old"
    assert _value(a, "lww", "j")[record.DELETED]


def test_in_an_arrival_order_space_a_packed_delete_removes_the_key_and_a_put_replaces_it(tmp_path):
    before = [Txn(3, 1, GROUP_DEFAULT, TS + 9, (Op(OP_PUT, "arr", "k", "old"), Op(OP_PUT, "arr", "j", "old")))]
    wire = [Txn(2, 1, GROUP_DEFAULT, TS, (Op(OP_DELETE, "arr", "k", None), Op(OP_PUT, "arr", "j", "new")))]
    a, _ = _both(tmp_path, before, wire)
    assert _value(a, "arr", "k") is None
    assert _value(a, "arr", "j")[record.VALUE] == "new"


def test_a_packed_entry_the_store_already_covers_moves_no_component_and_is_no_error(tmp_path):
    s = _store(tmp_path / "s")
    s.apply([TxnEntry([Txn(2, 1, GROUP_DEFAULT, TS, (Op(OP_PUT, "lww", "k", "v"), Op(OP_PUT, "lww", "j", "v")))])],
            SELF, 100)
    before = s.vclock.to_dict()
    assert before[2] == 2
    tops = s.apply([_packed([Txn(2, 1, GROUP_DEFAULT, TS, (Op(OP_PUT, "lww", "k", "v"),))])], SELF, 100)
    assert tops == {2: 1}
    assert s.vclock.to_dict() == before
    tops = s.apply([_packed([Txn(2, 2, GROUP_DEFAULT, TS, (Op(OP_PUT, "lww", "j", "v"),))])], SELF, 100)
    assert tops == {2: 2} and s.vclock.to_dict() == before, "level with the vclock: no follow either"


def test_a_packed_entry_for_an_unknown_space_names_its_first_row(tmp_path):
    s = _store(tmp_path / "s")
    wire = [Txn(2, 4, GROUP_DEFAULT, TS, (Op(OP_PUT, "nope", "a", 1), Op(OP_PUT, "nope", "b", 2)))]
    with pytest.raises(StorageError, match="row 2:4 writes unknown space 'nope'"):
        s.apply([_packed(wire)], SELF, 100)
    assert s.vclock.get(2) == 0
