"""Edges of node/core/entry.py that its mutation score showed unpinned: a PackedEntry decides a
relay frame wanted whole or not at all from its ranges, without decoding a txn (its point);
its txns are decoded once however often they are asked for; and an entry of no range is a
caller's bug, refused by an assert. A relay frame re-packed for a subscriber is canonical (a
str of 32 to 255 bytes as str8, as codec.pack writes it), and a run of several packed entries
reports every component's top, an origin's lsn 1 too."""
from __future__ import annotations

import pytest

from node.core import codec, rowscan
from node.core.entry import PackedEntry, TxnEntry, apply_entries
from node.core.rows import GROUP_DEFAULT, GROUP_LOCAL, OP_PUT, Op, Txn
from test_rowscan import message

TXNS = [Txn(2, 1, GROUP_DEFAULT, 5, (Op(OP_PUT, "kv", "a", 1),)),
        Txn(2, 2, GROUP_DEFAULT, 5, (Op(OP_PUT, "kv", "b", 2), Op(OP_PUT, "kv", "c", 3)))]


def _entry() -> PackedEntry:
    scan = rowscan.scan_rows(message([TXNS]))
    assert scan is not None, "the native scanner takes a plain message"
    return PackedEntry(scan, [(0, 2, 7)])           # both txns, origin 7 here


@pytest.mark.parametrize("sub, want", [({}, 3), ({7: 3}, 0), ({7: 0}, 3)])
def test_a_packed_entry_wanted_whole_or_not_at_all_is_relayed_without_decoding_a_txn(sub, want):
    e = _entry()
    payload = e.frame_payload(9)
    got = e.relay_frame(payload, 9, sub, None)
    assert got == ((payload, 3) if want else (None, 0))
    assert e._txns is None, "the txns were decoded to decide what the ranges decide"


def test_a_packed_entry_wanted_in_part_is_relayed_as_its_txns_decide():
    e = _entry()
    payload = e.frame_payload(9)
    assert e.relay_frame(payload, 9, {7: 1}, None) == (codec.pack([9, [TXNS[1].with_replica_id(7)]]), 2)


def test_a_packed_entrys_txns_are_decoded_once_however_often_they_are_asked_for():
    e = _entry()
    first = e.txns
    assert first == [t.with_replica_id(7) for t in TXNS]
    assert e.txns is first


def test_a_packed_entry_of_no_range_is_a_callers_bug():
    scan = rowscan.scan_rows(message([TXNS]))
    with pytest.raises(AssertionError, match="at least one transaction"):
        PackedEntry(scan, [])


def test_a_relay_frame_re_packed_for_a_subscriber_is_canonical_msgpack():
    """The subscriber's native scanner takes only canonical bytes: a str of 32 to 255 bytes must
    be str8, as codec.pack writes it (msgpack without bin types would write str16)."""
    data = Txn(3, 5, GROUP_DEFAULT, 1, (Op(OP_PUT, "kv", "a", "x" * 40), Op(OP_PUT, "kv", "b", "y" * 255)))
    local = Txn(0, 9, GROUP_LOCAL, 1, (Op(OP_PUT, "loc", "l", 1),))
    e = TxnEntry([data, local])
    assert e.relay_frame(e.frame_payload(1), 1, {}, None) == (codec.pack([1, [data]]), 2)


def test_a_run_of_packed_entries_reports_each_components_top_an_lsn_of_1_too(monkeypatch):
    tops = iter([{5: 1, 6: 2}, {6: 4}])
    monkeypatch.setattr("node.core.entry.apply_packed", lambda view, e, uuid: next(tops))
    e = _entry()
    assert apply_entries(None, [e, e], "u-self") == {5: 1, 6: 4}
