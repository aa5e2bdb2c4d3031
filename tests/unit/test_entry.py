"""Journal entries (node/core/entry.py): the fast representation (PackedEntry, built from a scanned
message) answers every question of the Entry interface as the exact one (TxnEntry) of its txns
answers it, and a batch mixing both applies to a real LMDB store exactly as its txns in order."""
from __future__ import annotations

import random

import pytest

from node.core import codec, rowscan
from node.core.entry import PackedEntry, TxnEntry, apply_entries
from node.core.rows import GROUP_DEFAULT, GROUP_LOCAL, OP_DELETE, OP_NOP, OP_PUT, Op, Txn
from test_rowscan import SELF, _dump, _scan_txns, _store, message, subscribers


def _packed(rng: random.Random, txns: list[Txn]) -> tuple[PackedEntry, list[Txn]]:
    """A PackedEntry of part of each origin's run, as the core may claim, and its txns."""
    scan = rowscan.scan_rows(message([txns]))
    ranges = []
    for rid, a, b in scan.runs():
        x = rng.randint(a, b - 1)
        ranges.append((x, rng.randint(x + 1, b), rid * 10))
    every = rowscan.scan_rows_py(message([txns])).txns
    return PackedEntry(scan, ranges), [t.with_replica_id(rid) for a, b, rid in ranges for t in every[a:b]]


@pytest.mark.parametrize("seed", range(40))
def test_a_packed_entry_answers_as_the_txn_entry_of_its_txns(seed):
    rng = random.Random(seed)
    packed, txns = _packed(rng, _scan_txns(rng, rng.randint(1, 20)))
    exact = TxnEntry(txns)
    assert (packed.ntxn, packed.rows, packed.txns) == (exact.ntxn, exact.rows, exact.txns)
    payload = exact.frame_payload(77)
    assert packed.frame_payload(77) == payload == codec.pack([77, txns])
    for sub, own in subscribers(rng, txns):     # relay frames
        assert packed.relay_frame(payload, 77, sub, own) == exact.relay_frame(payload, 77, sub, own), (sub, own)


def test_a_txn_entry_relays_without_local_rows_and_counts_what_goes():
    data = Txn(3, 5, GROUP_DEFAULT, 1, (Op(OP_PUT, "kv", "a", 1), Op(OP_NOP, "kv", "", None)))
    local = Txn(0, 9, GROUP_LOCAL, 1, (Op(OP_PUT, "loc", "l", 1),))
    e = TxnEntry([data, local])
    payload = e.frame_payload(1)
    assert e.rows == 3 and e.ntxn == 2
    assert e.relay_frame(payload, 1, {}, None) == (codec.pack([1, [data]]), 2)
    assert e.relay_frame(payload, 1, {3: 6}, None) == (None, 0)
    only = TxnEntry([data])
    assert only.relay_frame(only.frame_payload(1), 1, {3: 5}, None) == (only.frame_payload(1), 2), \
        "every txn wanted: the payload itself"


@pytest.mark.parametrize("seed", range(20))
def test_a_batch_mixing_both_representations_applies_as_its_txns_in_order(tmp_path, seed):
    rng = random.Random(seed)
    a, b = _store(str(tmp_path / "a")), _store(str(tmp_path / "b"))
    keys = [f"k{i}" for i in range(8)]
    lsn = {2: 1, 3: 1}
    entries, txns = [], []
    for _ in range(rng.randint(2, 8)):
        batch = []
        for _ in range(rng.randint(1, 4)):
            rid = rng.choice((2, 3))
            ops = tuple(Op(k, rng.choice(("lww", "arr")), rng.choice(keys), rng.randint(0, 9) if k == OP_PUT else None)
                        for k in rng.choices((OP_PUT, OP_PUT, OP_DELETE, OP_NOP), k=rng.randint(1, 3)))
            batch.append(Txn(rid, lsn[rid], GROUP_DEFAULT, rng.randint(1, 100), ops))
            lsn[rid] += len(ops)
        if rng.random() < 0.5:
            scan = rowscan.scan_rows(message([batch]))
            entries.append(PackedEntry(scan, [(x, y, rid) for rid, x, y in scan.runs()]))
        else:
            entries.append(TxnEntry(batch))
        txns += batch
    assert a.apply(entries, SELF, 100) == b.apply([TxnEntry(txns)], SELF, 100)
    assert _dump(a) == _dump(b)


def test_consecutive_entries_of_one_representation_are_applied_in_one_call(monkeypatch):
    """The per-call setup of apply_txns (space lookups, cursors) is paid once per run of txn
    entries, not once per entry: single-row local writes come one entry each."""
    calls = []
    monkeypatch.setattr("node.core.entry.apply_txns", lambda view, txns, uuid: calls.append(len(txns)) or {})
    monkeypatch.setattr("node.core.entry.apply_packed", lambda view, e, uuid: calls.append("packed") or {})
    t = Txn(1, 1, GROUP_DEFAULT, 1, (Op(OP_PUT, "kv", "a", 1),))
    scan = rowscan.scan_rows(message([[t]]))
    p = PackedEntry(scan, [(0, 1, 1)])
    apply_entries(None, [TxnEntry([t]), TxnEntry([t, t]), p, p, TxnEntry([t])], SELF)
    assert calls == [3, "packed", "packed", 1]
