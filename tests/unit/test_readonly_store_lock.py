"""A store read by another process (node/storage/readonly.py: `replog admin`, a backup's copy) is
read with a reader slot in its lock file, so a running node's writer cannot reuse the pages being
read. Where that lock file cannot be used and the file system is writable (a writer may be at
work), the read is refused with the reason; only a read-only file system, where no writer can
be, is read without one. Real LMDB stores; the lock file is made unusable by making it a
directory, which fails even for root."""
from __future__ import annotations

import os

import lmdb
import pytest

from node.errors import StorageError
from node.storage import readonly


def a_store(tmp_path) -> str:
    path = str(tmp_path / "store")
    env = lmdb.open(path, max_dbs=4)
    with env.begin(write=True) as t:
        t.put(b"k", b"v", db=env.open_db(b"data", txn=t))
    env.close()
    return path


def unusable_lock(path: str) -> None:
    os.remove(os.path.join(path, "lock.mdb"))
    os.mkdir(os.path.join(path, "lock.mdb"))


def test_a_store_whose_lock_file_works_is_copied(tmp_path):
    path = a_store(tmp_path)
    os.mkdir(tmp_path / "copy")
    readonly.copy_store(path, str(tmp_path / "copy"))
    assert os.path.getsize(tmp_path / "copy" / "data.mdb") > 0


def test_a_store_whose_lock_file_cannot_be_used_on_a_writable_file_system_is_not_copied(tmp_path):
    path = a_store(tmp_path)
    unusable_lock(path)
    os.mkdir(tmp_path / "copy")
    with pytest.raises(StorageError, match="as a reader .*lock.mdb.*could be inconsistent"):
        readonly.copy_store(path, str(tmp_path / "copy"))
    assert os.listdir(tmp_path / "copy") == []
    with pytest.raises(StorageError, match="as a reader"):
        readonly.read_only_view(path)


def test_on_a_read_only_file_system_a_store_is_read_without_a_reader_slot(tmp_path, monkeypatch):
    path = a_store(tmp_path)
    unusable_lock(path)
    real = os.statvfs(path)

    class ReadOnly:
        def __getattr__(self, name):
            return os.ST_RDONLY | real.f_flag if name == "f_flag" else getattr(real, name)
    monkeypatch.setattr(readonly.os, "statvfs", lambda p: ReadOnly())
    os.mkdir(tmp_path / "copy")
    readonly.copy_store(path, str(tmp_path / "copy"))
    assert os.path.getsize(tmp_path / "copy" / "data.mdb") > 0
