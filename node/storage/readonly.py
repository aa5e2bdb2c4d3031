"""A store another process may hold open (a running node), read without writing to it:
its `_meta` and `_cluster` for `replog admin` (`read_only_view`), a consistent copy for a
backup (`copy_store`).

Rules kept here: nothing here writes to the store; LMDB readers of several processes share its
lock file, so what is read is as consistent as the node's own reads; only on a read-only file
system (where no writer can be) is a store read without a reader slot, and a lock file that
cannot be used anywhere else refuses the read; a store of a format this replog does not know is refused
(node/storage/layout.py `check_format`)."""
from __future__ import annotations

import os

import lmdb

from node import limits
from node.core import codec
from node.errors import StorageError
from node.storage.layout import check_format

_unpack = codec.unpack


def _open_read_only(path: str):
    if not os.path.isfile(os.path.join(path, "data.mdb")):
        raise StorageError(f"{path}: no store here (no data.mdb)")
    kw = dict(readonly=True, max_dbs=limits.store_spaces_max + limits.store_system_dbs,
              max_readers=limits.store_readers_max)
    try:
        return lmdb.open(path, lock=True, **kw)
    except lmdb.Error as e:
        if not _read_only_fs(path):
            # Without a reader slot a writer may reuse the pages being read: refused, never
            # read (or copied for a backup) inconsistently.
            raise StorageError(f"cannot open store {path} as a reader (its lock file lock.mdb: {e}); "
                               "a read without a reader slot could be inconsistent") from None
    try:   # a read-only file system: no reader slot to take, and no writer either
        return lmdb.open(path, lock=False, **kw)
    except lmdb.Error as e:
        raise StorageError(f"cannot open store {path}: {e}") from None


def _read_only_fs(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def read_only_view(path: str) -> dict:
    """`_meta` and `_cluster` of a store, read without writing to it (`replog admin`); works
    while a node has the store open. {"meta": {key: value}, "cluster": [row, ...]}."""
    env = _open_read_only(path)
    try:
        with env.begin() as t:
            out: dict = {"meta": {}, "cluster": []}
            try:
                meta_db = env.open_db(b"_meta", txn=t, create=False)
                cluster_db = env.open_db(b"_cluster", txn=t, create=False)
            except lmdb.NotFoundError:
                return out
            out["meta"] = {k.decode(): _unpack(v) for k, v in t.cursor(db=meta_db)}
            out["cluster"] = [_unpack(v) for _, v in t.cursor(db=cluster_db)]
    except lmdb.Error as e:
        raise StorageError(f"cannot read store {path}: {e}") from None
    finally:
        env.close()
    check_format(path, out["meta"].get("store_format"))
    return out


def copy_store(path: str, dest_dir: str, compact: bool = False) -> None:
    """Store.copy_to for a store another process (a running node) may hold open: LMDB readers
    of several processes share its lock file, so the copy is as consistent as the node's own."""
    env = _open_read_only(path)
    try:
        env.copy(dest_dir, compact=compact)
    except lmdb.Error as e:
        raise StorageError(f"copying the store {path} to {dest_dir} failed: {e}") from None
    finally:
        env.close()
