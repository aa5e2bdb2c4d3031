"""A registered data resolver (node.cluster_space.resolver.register_resolver, docs/replication.md)
sees every field of both records — the value and the deleted flag too, which last-writer-wins
never reads — and sees them alike whether the rows come as plain txns (apply_txns) or as a packed
entry spliced from received bytes (apply_packed), on a real LMDB store; its verdict decides."""
from __future__ import annotations

from node.cluster_space.resolver import DATA_RESOLVERS, register_resolver
from node.core import record
from node.core.rows import GROUP_DEFAULT, GROUP_LOCAL, OP_DELETE, OP_PUT, OP_SPACE, Op, Txn
from node.core.entry import TxnEntry
from test_apply_edges import IDS, SELF, _packed, _store, _value

SEEN: list[tuple] = []
NAME = "test-larger-value"


def _larger_value(old, new) -> bool:
    """The larger value wins; a tombstone wins only over a tombstone or nothing."""
    SEEN.append((old, new))
    if old is None:
        return True
    if new[4]:
        return bool(old[4])
    return bool(old[4]) or new[0] > old[0]


if NAME not in DATA_RESOLVERS:
    register_resolver(NAME, _larger_value)


def _both(tmp_path, before: list[Txn], wire: list[Txn]):
    """Two stores with a space of the resolver holding `before`; `wire` applied to one as a
    packed entry, to the other as txns. Returns the store and what the resolver saw of `wire`."""
    seen = []
    stores = []
    for name, as_packed in (("a", True), ("b", False)):
        s = _store(tmp_path / name)
        s.apply([TxnEntry([Txn(1, 2, GROUP_DEFAULT, 1, (Op(OP_SPACE, "big", "", {"local": False,
                                                                                 "conflict": NAME}),))])], SELF, 1)
        s.apply([TxnEntry(before)], SELF, 100)
        SEEN.clear()
        s.apply([_packed(wire) if as_packed else TxnEntry(wire)], SELF, 100)
        seen.append(list(SEEN))
        stores.append(s)
    a, b = stores
    with a.env.begin() as ta, b.env.begin() as tb:
        assert list(ta.cursor(db=a._dbs["big"])) == list(tb.cursor(db=b._dbs["big"]))
    assert seen[0] == seen[1], "the packed path shows the resolver what the txn path shows"
    return a, seen[0]


def test_a_resolver_sees_both_records_values_origins_lsns_clocks_and_flags(tmp_path):
    before = [Txn(3, 1, GROUP_DEFAULT, 40, (Op(OP_PUT, "big", "k", 5),))]
    wire = [Txn(2, 7, GROUP_DEFAULT, 50, (Op(OP_PUT, "big", "k", 3),))]
    a, seen = _both(tmp_path, before, wire)
    assert seen == [((5, IDS[3], 1, 40, False), (3, IDS[2], 7, 50, False))]
    assert _value(a, "big", "k")[record.VALUE] == 5, "the smaller value lost, though newer"


def test_a_resolver_sees_a_tombstone_on_either_side_as_deleted_with_no_value(tmp_path):
    before = [Txn(3, 1, GROUP_DEFAULT, 40, (Op(OP_PUT, "big", "k", 5), Op(OP_DELETE, "big", "j", None)))]
    wire = [Txn(2, 7, GROUP_DEFAULT, 50, (Op(OP_DELETE, "big", "k", None), Op(OP_PUT, "big", "j", 1)))]
    a, seen = _both(tmp_path, before, wire)
    assert seen == [((5, IDS[3], 1, 40, False), (None, IDS[2], 7, 50, True)),
                    ((None, IDS[3], 2, 40, True), (1, IDS[2], 8, 50, False))]
    assert _value(a, "big", "k")[record.VALUE] == 5, "a delete does not beat a live value here"
    assert _value(a, "big", "j")[record.VALUE] == 1, "a put beats a tombstone"


def test_a_resolver_sees_this_nodes_own_local_record_under_this_nodes_uuid(tmp_path):
    before = [Txn(0, 1, GROUP_LOCAL, 40, (Op(OP_PUT, "big", "k", 5),))]
    wire = [Txn(2, 7, GROUP_DEFAULT, 50, (Op(OP_PUT, "big", "k", 9),))]
    a, seen = _both(tmp_path, before, wire)
    assert seen == [((5, SELF, 1, 40, False), (9, IDS[2], 7, 50, False))]
    assert _value(a, "big", "k")[record.VALUE] == 9


def test_a_resolver_is_asked_only_where_an_old_record_exists(tmp_path):
    before = [Txn(3, 1, GROUP_DEFAULT, 40, (Op(OP_PUT, "big", "z", 0),))]
    wire = [Txn(2, 7, GROUP_DEFAULT, 50, (Op(OP_PUT, "big", "n", 1),))]
    a, seen = _both(tmp_path, before, wire)
    assert seen == []
    assert _value(a, "big", "n")[record.VALUE] == 1
