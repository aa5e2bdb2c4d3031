"""Recovery of a WAL holding a transaction that reads back but cannot be applied — what versions
before issue 15's checks wrote (a 512-byte key, a value nested 400 deep, a 2^64-1 timestamp, a row
for a space that never existed), and what a bug could still write. Start-up stops with one message
naming the file, the frame's byte offset, the row and the way out; --force-recovery skips it loudly
(logged, counted, its lsns counted as done), keeps everything around it, and the next start needs
nothing. Values from before the value rule (timestamps, bin, NaN, other map keys) recover as they are."""
import math
import os

import msgpack
import pytest

from helpers import UUID_A, WalBuilder, cluster_txn, open_store, put_txn, space_txn
from node import limits
from node.core.rows import OP_PUT, Op, Txn
from node.errors import RecoveryError
from node.wal.recovery import recover


def _nested(depth: int):
    v: list = []
    for _ in range(depth - 1):
        v = [v]
    return v


def _wal(path, *frames) -> WalBuilder:
    b = WalBuilder(path)
    for f in frames:
        b.write(*f)
    b.close()
    return b


BASE = [[cluster_txn(1, 1, (UUID_A, 1))], [space_txn(1, 2, "data")], [put_txn(1, 3, "data", ("before", 1))]]
AFTER = [put_txn(1, 5, "data", ("after", 2))]


@pytest.mark.parametrize("why, bad, says", [
    ("a key of 512 bytes", put_txn(1, 4, "data", ("k" * 512, 1)), "keys are"),
    ("a value nested 400 deep", put_txn(1, 4, "data", ("deep", _nested(400))), "nest"),
    ("a timestamp of 2^64 - 1", put_txn(1, 4, "data", ("ts", 1), ts=2**64 - 1), "timestamps are"),
    ("an lsn past lsn_max", Txn(1, limits.lsn_max + 1, 0, 1, (Op(OP_PUT, "data", "x", 1),)), "lsns are"),
    ("a row for a space that never existed", put_txn(1, 4, "nowhere", ("x", 1)), "unknown space"),
])
def test_a_transaction_that_cannot_be_replayed_stops_start_up_then_force_recovery_skips_it(tmp_path, why, bad, says):
    wal = tmp_path / "wal"
    b = _wal(wal, *BASE, [bad], AFTER)
    segment, offset, _ = b.frames[3]
    store = open_store(tmp_path / "store")
    with pytest.raises(RecoveryError) as e:
        recover(store, str(wal), UUID_A)
    msg = str(e.value)
    assert os.path.join(str(wal), segment) in msg and f"byte {offset}" in msg, msg
    assert says in msg and "--force-recovery" in msg, msg
    assert "\n" not in msg
    store.close()

    store = open_store(tmp_path / "store")
    res = recover(store, str(wal), UUID_A, force_recovery=True)
    assert [(s, o) for s, o, _ in res.skipped_txns] == [(segment, offset)]
    assert store.get("data", "before").value == 1 and store.get("data", "after").value == 2
    if bad.lsn <= limits.lsn_max:
        assert store.vclock.get(1) == 5             # the skipped lsns count as done
    assert 0 <= (store.get_meta("hlc") or 0) <= limits.timestamp_us_max
    store.close()

    store = open_store(tmp_path / "store")        # the next start meets nothing
    again = recover(store, str(wal), UUID_A)
    assert again.skipped_txns == [] and again.replayed_txns == 0


def test_only_the_bad_transaction_of_a_frame_is_skipped(tmp_path):
    wal = tmp_path / "wal"
    _wal(wal, *BASE, [put_txn(1, 4, "data", ("x", 1)), put_txn(1, 5, "data", ("k" * 600, 2)),
                      put_txn(1, 6, "data", ("y", 3))])
    store = open_store(tmp_path / "store")
    res = recover(store, str(wal), UUID_A, force_recovery=True)
    assert len(res.skipped_txns) == 1 and "keys are" in res.skipped_txns[0][2]
    assert store.get("data", "x").value == 1 and store.get("data", "y").value == 3
    assert store.vclock.get(1) == 6


def test_a_space_created_in_a_batch_the_store_refused_is_not_left_half_made(tmp_path):
    """The store refuses a batch (an unknown space) after creating a space in it: the LMDB
    transaction is aborted, and so is what it changed in memory; replayed one by one, the space
    is made for real."""
    wal = tmp_path / "wal"
    _wal(wal, *BASE, [space_txn(1, 4, "fresh")], [put_txn(1, 5, "fresh", ("f", 1))],
         [put_txn(1, 6, "nowhere", ("x", 1))], [put_txn(1, 7, "fresh", ("g", 2))])
    store = open_store(tmp_path / "store")
    recover(store, str(wal), UUID_A, force_recovery=True)
    assert store.get("fresh", "f").value == 1 and store.get("fresh", "g").value == 2
    store.close()
    store = open_store(tmp_path / "store")
    assert store.get("fresh", "g").value == 2 and "fresh" in store.spaces


def test_values_written_before_the_value_rule_recover_as_they_are(tmp_path):
    legacy = {"at": msgpack.Timestamp(7, 9), "raw": b"\x00\xff", "nan": float("nan"), "n": {1: "one"}}
    wal = tmp_path / "wal"
    _wal(wal, *BASE, [put_txn(1, 4, "data", ("legacy", legacy))])
    store = open_store(tmp_path / "store")
    res = recover(store, str(wal), UUID_A)
    assert res.skipped_txns == []
    got = store.get("data", "legacy").value
    assert got["at"] == legacy["at"] and got["raw"] == b"\x00\xff" and math.isnan(got["nan"]) and got["n"] == {1: "one"}


def test_a_stored_hybrid_clock_past_its_bound_stops_start_up_then_force_recovery_restarts_it(tmp_path):
    wal = tmp_path / "wal"
    _wal(wal, *BASE)
    store = open_store(tmp_path / "store")
    store.set_meta(hlc=2**64 - 1)                  # what absorbing a 2^64-1 timestamp left
    with pytest.raises(RecoveryError, match="hybrid clock .* past its bound.*--force-recovery"):
        recover(store, str(wal), UUID_A)
    res = recover(store, str(wal), UUID_A, force_recovery=True)
    assert res.hlc_last <= limits.timestamp_us_max
    store.close()
    store = open_store(tmp_path / "store")
    assert recover(store, str(wal), UUID_A).hlc_last <= limits.timestamp_us_max
