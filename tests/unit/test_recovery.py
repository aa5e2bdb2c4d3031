"""Recovery (node/wal/recovery.py) against a real LMDB store: the WAL holds transactions
past the vclock the store reflects (the store applied only a prefix, as after a crash
between the WAL write and the LMDB commit); recover() replays exactly the missing ones,
in WAL order, and a second recovery changes nothing. Local-space rows are counted in
vclock component 0, not in the writer's own component."""

import pytest

from helpers import (UUID_A, UUID_B, UUID_C, WalBuilder, cluster_txn, local_put_txn, open_store, put_txn,
                     space_txn, store_state)
from node.core.entry import TxnEntry
from node.core.rows import GROUP_LOCAL, OP_DELETE, OP_SPACE, Op, Txn
from node.wal.recovery import recover


def history() -> list[list[Txn]]:
    """Node A's WAL, one list per frame: bootstrap, spaces, B registered as id 2 before any
    of B's rows, local and replicated writes from A, B and C, and a remote `_cluster` txn
    sharing a frame with the own `_cluster` txn A's applier wrote for it."""
    return [
        [cluster_txn(1, 1, (UUID_A, 1))],
        [space_txn(1, 2, "data")],
        [Txn(1, 1, GROUP_LOCAL, 3, (Op(OP_SPACE, "notes", "", {"local": True, "conflict": "lww"}),))],
        [put_txn(1, 3, "data", ("a", 1), ("b", 2))],
        [cluster_txn(1, 5, (UUID_B, 2))],
        [cluster_txn(2, 1, (UUID_B, 1), (UUID_A, 2))],          # B's own rows, in B's ids
        [put_txn(2, 3, "data", ("a", 10), ts=5000)],
        [local_put_txn(1, 2, "notes", ("n1", "x"))],
        [put_txn(1, 6, "data", ("c", 3))],
        [Txn(1, 7, 0, 5100, (Op(OP_DELETE, "data", "b"),))],
        [cluster_txn(2, 4, (UUID_C, 3)), cluster_txn(1, 8, (UUID_C, 3))],
        [local_put_txn(1, 3, "notes", ("n2", "y"), ("n1", "z"))],
        [put_txn(2, 5, "data", ("d", 4), ("e", 5), ("f", 6))],
        [put_txn(3, 1, "data", ("g", 7))],
        [put_txn(1, 9, "data", ("h", 8))],
    ]


def write_history(wal_dir, frames, segment_bytes_max=256) -> WalBuilder:
    b = WalBuilder(wal_dir, segment_bytes_max=segment_bytes_max)
    for frame in frames:
        b.write(*frame)
    b.close()
    return b


def apply_frames(store, frames) -> None:
    txns = [t for f in frames for t in f]
    if txns:
        store.apply([TxnEntry(txns)], UUID_A, max(t.timestamp for t in txns))


def reference_state(tmp_path, frames) -> dict:
    ref = open_store(tmp_path / "reference")
    apply_frames(ref, frames)
    state = store_state(ref)
    ref.close()
    return state


def spy_on_apply(store) -> list:
    applied = []
    real = store.apply

    def apply(entries, self_uuid, hlc_last):
        for e in entries:                  # recovery replays decoded txns (TxnEntry), never packed entries
            applied.extend(e.txns)
        return real(entries, self_uuid, hlc_last)

    store.apply = apply
    return applied


@pytest.mark.parametrize("prefix", [0, 1, 3, 5, 7, 10, 11, 13, 15])
def test_recover_replays_exactly_the_transactions_past_the_stores_vclock(tmp_path, prefix):
    frames = history()
    b = write_history(tmp_path / "wal", frames)
    assert len(b.rotations) >= 3                  # the missing part spans segments
    store = open_store(tmp_path / "store")
    apply_frames(store, frames[:prefix])
    missing = [t for f in frames[prefix:] for t in f]
    replayed = spy_on_apply(store)
    res = recover(store, str(tmp_path / "wal"), UUID_A)
    assert replayed == missing
    assert res.replayed_txns == len(missing)
    assert res.torn == [] and res.skipped == []
    assert res.segments == len(b.rotations)
    assert store_state(store) == reference_state(tmp_path, frames)
    assert store.vclock.to_dict() == {0: 4, 1: 9, 2: 7, 3: 1}
    assert store.get("data", "a").value == 10 and store.get("data", "a").origin_id == 2
    assert store.get("data", "b").deleted
    assert store.get("notes", "n1").value == "z" and store.get("notes", "n1").origin_id == 0
    assert store.get("data", "g").origin_id == 3
    table = store.load_cluster()
    assert (table.uuid_of(2), table.uuid_of(3)) == (UUID_B, UUID_C)
    assert store.load_knowledge()[(UUID_B, UUID_C)] == 3     # B's id for C, from B's row


def test_recovering_twice_changes_nothing_and_survives_reopening_the_store(tmp_path):
    frames = history()
    write_history(tmp_path / "wal", frames)
    store = open_store(tmp_path / "store")
    apply_frames(store, frames[:4])
    first = recover(store, str(tmp_path / "wal"), UUID_A)
    assert first.replayed_txns == sum(len(f) for f in frames[4:])
    after_first = store_state(store)
    replayed = spy_on_apply(store)
    second = recover(store, str(tmp_path / "wal"), UUID_A)
    assert second.replayed_txns == 0 and replayed == []
    assert store_state(store) == after_first
    store.close()
    # the vclock was committed with the data: a reopened store needs nothing either
    store = open_store(tmp_path / "store")
    assert store.vclock.to_dict() == after_first["vclock"]
    third = recover(store, str(tmp_path / "wal"), UUID_A)
    assert third.replayed_txns == 0
    assert store_state(store) == after_first


def _local_and_replicated(applied: dict[int, int]):
    """Frames of A writing replicated rows (component 1) and local rows (component 0),
    and the prefix of them that leaves the store at `applied`."""
    frames = [[cluster_txn(1, 1, (UUID_A, 1))], [space_txn(1, 2, "data")],
              [Txn(1, 1, GROUP_LOCAL, 3, (Op(OP_SPACE, "notes", "", {"local": True, "conflict": "lww"}),))]]
    lsn = {0: 1, 1: 2}
    for i in range(8):
        for comp in (1, 0):
            lsn[comp] += 1
            if comp == 0:
                frames.append([local_put_txn(1, lsn[0], "notes", (f"l{lsn[0]}", i))])
            else:
                frames.append([put_txn(1, lsn[1], "data", (f"d{lsn[1]}", i))])
    prefix = [f for f in frames if f[0].last_lsn <= applied.get(f[0].component, 0)]
    return frames, prefix


@pytest.mark.parametrize("applied", [
    {0: 8, 1: 3},      # missing replicated rows have lsns the local component already passed
    {0: 1, 1: 9},      # missing local rows have lsns the own component already passed
])
def test_local_space_rows_are_replayed_by_vclock_component_zero(tmp_path, applied):
    frames, prefix = _local_and_replicated(applied)
    write_history(tmp_path / "wal", frames)
    store = open_store(tmp_path / "store")
    apply_frames(store, prefix)
    assert store.vclock.to_dict() == applied
    missing = [t for f in frames if f not in prefix for t in f]
    replayed = spy_on_apply(store)
    res = recover(store, str(tmp_path / "wal"), UUID_A)
    assert replayed == missing and res.replayed_txns == len(missing)
    assert store.vclock.to_dict() == {0: 9, 1: 10}
    for lsn in range(2, 10):
        rec = store.get("notes", f"l{lsn}")
        assert rec is not None and rec.origin_id == 0 and rec.lsn == lsn
    for lsn in range(3, 11):
        rec = store.get("data", f"d{lsn}")
        assert rec is not None and rec.origin_id == 1 and rec.lsn == lsn
    assert store_state(store) == reference_state(tmp_path, frames)


def test_recover_with_no_wal_changes_nothing(tmp_path):
    store = open_store(tmp_path / "store")
    before = store_state(store)
    res = recover(store, str(tmp_path / "no-wal"), UUID_A)
    assert res.replayed_txns == 0 and res.segments == 0 and res.last_segment is None
    assert store_state(store) == before
