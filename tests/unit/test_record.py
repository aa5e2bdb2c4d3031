"""The stored record's one definition (node/core/record.py) and the copies held equal to it: the
native scanner's constants (node/core/_rowscan.c) and the bytes it builds records of, and the byte
level facts the store's packed path reads (the head byte, the deleted flag as the last byte)."""
from __future__ import annotations

import pytest

from node import limits
from node.core import record, rowscan
from node.core.record import DELETED, HLC, LSN, ORIGIN_ID, VALUE, Record
from node.core.rows import GROUP_DEFAULT, OP_DELETE, OP_NOP, OP_PUT, Op, Txn
from test_rowscan import _nested, message

EDGE_VALUES = [None, True, False, 0, -1, 2**64 - 1, -(2**63), 1.5, "", "é", "v" * (limits.value_bytes_max - 5),
               [], {}, {"a": [1, {"b": None}]}, _nested(limits.value_depth_max)]
EDGE_INTS = [0, 1, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, 0xffffffff, 0x100000000, limits.lsn_max]


def test_the_native_scanner_builds_records_by_this_layout():
    native = rowscan.native
    assert native is not None
    assert (native.RECORD_FIELDS, native.RECORD_HEAD, native.RECORD_DELETED_TRUE, native.RECORD_DELETED_FALSE) == \
        (record.FIELDS, record.HEAD, record.DELETED_TRUE, record.DELETED_FALSE)
    assert native.TXN_HEAD == 0x90 | len(Txn._fields), "a txn is a fixarray of its fields"


def test_positions_name_the_layout():
    assert [record.LAYOUT[i] for i in (VALUE, ORIGIN_ID, LSN, HLC, DELETED)] == \
        ["value", "origin_id", "lsn", "hlc", "deleted"]
    assert list(Record.__dataclass_fields__)[1:] == list(record.LAYOUT)
    assert Record.of("k", record.make("v", 3, 9, 77, False)) == Record("k", "v", 3, 9, 77, False)


@pytest.mark.parametrize("value", EDGE_VALUES, ids=range(len(EDGE_VALUES)))
@pytest.mark.parametrize("deleted", [False, True])
def test_a_record_starts_with_its_head_and_ends_with_its_deleted_flag(value, deleted):
    for n in EDGE_INTS:
        b = record.pack(record.make(value, n % (limits.replica_id_max + 1), n, n, deleted))
        assert b[0] == record.HEAD
        assert record.is_tombstone(b) == deleted
        assert b[-1] == (record.DELETED_TRUE if deleted else record.DELETED_FALSE)
        assert record.unpack(b) == [None if deleted else value, n % (limits.replica_id_max + 1), n, n, deleted]


@pytest.mark.parametrize("rid, lsn, ts", [(1, 1, 0), (0x7f, 0x80, 0xff), (0x100, 0xffff, 0x10000),
                                          (limits.replica_id_max, limits.lsn_max - 3, limits.timestamp_us_max)])
def test_records_the_scanner_builds_are_the_records_of_their_rows(rid, lsn, ts):
    ops = (Op(OP_PUT, "kv", "a", {"x": [1, 2.5]}), Op(OP_NOP, "kv", "", None), Op(OP_DELETE, "kv", "b", None),
           Op(OP_PUT, "kv", "c", "v" * 300))
    scan = rowscan.scan_rows(message([[Txn(1, lsn, GROUP_DEFAULT, ts, ops)]]))
    [(space, items)] = scan.records([(0, 1, rid)])
    assert space == "kv"
    want = [(b"a", record.make({"x": [1, 2.5]}, rid, lsn, ts, False)), (b"b", record.make(None, rid, lsn + 2, ts, True)),
            (b"c", record.make("v" * 300, rid, lsn + 3, ts, False))]
    assert [(k, record.unpack(b)) for k, b in items] == want
    assert [b for _, b in items] == [record.pack(r) for _, r in want]
    assert [record.is_tombstone(b) for _, b in items] == [False, True, False]
