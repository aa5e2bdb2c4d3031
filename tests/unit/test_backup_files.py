"""Backup and restore of a data dir on disk (node/ops/backup.py, node/ops/restore.py), without a
node: the WAL's torn last frame stays out of the backup, the copy is recovered to the backup's
point, the manifest checks every file, and a restore marks the store and (as a new member) gives
it a new uuid that is an anonymous member until it registers."""
import json
import os

import pytest

from helpers import UUID_A, WalBuilder, cluster_txn, open_store, put_txn, space_txn
from node.cluster_space.table import STATE_ANON
from node.ops.backup import MANIFEST, BackupError, backup_dir
from node.ops.restore import RESTORED_FROM, restore
from node.storage.store import Store


def data_dir(tmp_path, puts: int = 5) -> str:
    """A stopped node's data dir: a bootstrapped store and a WAL the store has not applied yet."""
    d = tmp_path / "data"
    store = open_store(d / "store", UUID_A)
    store.close()
    wal = WalBuilder(d / "wal")
    wal.write(cluster_txn(1, 1, (UUID_A, 1)))
    wal.write(space_txn(1, 2, "kv"))
    for i in range(puts):
        wal.write(put_txn(1, 3 + i, "kv", (f"k{i}", i)))
    wal.close()
    return str(d)


def test_a_backup_leaves_out_a_torn_last_frame_and_recovers_its_copy_to_the_point(tmp_path):
    d = data_dir(tmp_path)
    seg = os.path.join(d, "wal", sorted(os.listdir(os.path.join(d, "wal")))[-1])
    whole = os.path.getsize(seg)
    with open(seg, "ab") as f:
        f.write(b"\xd5\x1a\x7e\x01\x40\x00\x00\x00half a frame")     # a write the crash cut short
    man = backup_dir(d, str(tmp_path / "b"))
    assert man["vclock"] == {UUID_A: 7} and man["store_vclock"] == {}, man
    assert man["wal_end"] == {"segment": os.path.basename(seg), "offset": whole}
    copy = os.path.join(tmp_path, "b", "wal", os.path.basename(seg))
    assert os.path.getsize(copy) == whole == man["files"][f"wal/{os.path.basename(seg)}"]["bytes"]
    s = Store(os.path.join(tmp_path, "b", "store"))
    assert s.get("kv", "k4").value == 4 and s.vclock.get(1) == 7, "the copy holds the state at the point"
    s.close()
    assert os.path.getsize(seg) > whole, "the node's own WAL is not touched"
    assert not [n for n in os.listdir(d) if "hold" in n]


def test_a_restore_checks_the_files_marks_the_store_and_keeps_the_uuid(tmp_path):
    d = data_dir(tmp_path)
    man = backup_dir(d, str(tmp_path / "b"))
    out = restore(str(tmp_path / "b"), str(tmp_path / "r"))
    assert out["uuid"] == UUID_A
    s = Store(os.path.join(tmp_path, "r", "store"))
    marker = s.get_meta(RESTORED_FROM)
    assert marker["backup_uuid"] == UUID_A and marker["own_lsn"] == 7 and marker["vclock"] == man["vclock"]
    assert not marker["as_new_member"] and s.get_meta("uuid") == UUID_A
    s.close()
    assert sorted(os.listdir(tmp_path / "r")) == ["store", "wal"]
    assert not [n for n in os.listdir(tmp_path) if ".restoring-" in n]


def test_a_restore_as_a_new_member_gives_the_data_a_new_uuid_that_is_anonymous_until_it_registers(tmp_path):
    d = data_dir(tmp_path)
    backup_dir(d, str(tmp_path / "b"))
    out = restore(str(tmp_path / "b"), str(tmp_path / "r"), as_new_member=True)
    s = Store(os.path.join(tmp_path, "r", "store"))
    new = out["uuid"]
    assert new != UUID_A and s.get_meta("uuid") == new and s.get_meta("anon") is True
    me, old = s.table.get(new), s.table.get(UUID_A)
    assert me.state == STATE_ANON and me.id != old.id and old.state == "member"
    assert s.get("kv", "k2").origin_id == old.id, "the old member's rows stay the old member's"
    assert s.get_meta(RESTORED_FROM)["as_new_member"] is True
    s.close()


def test_a_backup_refuses_to_overwrite_and_a_restore_refuses_a_damaged_or_foreign_backup(tmp_path):
    d = data_dir(tmp_path)
    with pytest.raises(BackupError, match="never overwrites"):
        backup_dir(d, d)
    backup_dir(d, str(tmp_path / "b"))
    store_file = os.path.join(tmp_path, "b", "store", "data.mdb")
    with open(store_file, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(BackupError, match="does not match the manifest"):
        restore(str(tmp_path / "b"), str(tmp_path / "r"))
    man_path = os.path.join(tmp_path, "b", MANIFEST)
    man = json.load(open(man_path))
    man["files"]["../../etc/passwd"] = {"bytes": 1, "crc32c": 0}
    json.dump(man, open(man_path, "w"))
    with pytest.raises(BackupError, match="missing"):
        restore(str(tmp_path / "b"), str(tmp_path / "r"))
    assert not os.path.exists(tmp_path / "r")
