"""LMDB state: spaces, `_cluster`, and the vclock the state reflects — all changed in one
LMDB transaction per batch, so recovery replays exactly the WAL rows past that vclock.

The store is split along its seams: the layout (sub-databases, `SpaceDef`) and the format
version are node/storage/layout.py's; how a batch's rows reach the sub-databases is
node/storage/txnview.py's (`TxnView`, the StateView of node.core.apply); reading a store another
process holds open is node/storage/readonly.py's. `STORE_FORMAT_VERSION`, `check_format`,
`SpaceDef`, `read_only_view` and `copy_store` are imported from here too. node/storage/ is the
only package that imports lmdb.

Rules kept here:
- `_meta["store_format"]` is written when a store is created (or first opened by a replog that
  knows it); a store of a newer format is refused at open with one line (`check_format`).
- A batch and the vclock after it are written in one LMDB transaction; if it is aborted, what it
  changed in memory (the vclock, spaces created, the `_cluster` table) goes back too.
- A write that fails for lack of room (the map is full, or the disk) raises NoSpaceError after its
  LMDB transaction was aborted, so it can be tried again as it was; any other failure of the disk
  is a StorageError.
- A snapshot holds the replicated spaces, `_cluster` and the vclock without component 0, from
  one read transaction; installing one raises the HLC above every record it brought."""
from __future__ import annotations

import errno
import os
from typing import Any, Iterator

import lmdb

from node import limits
from node.cluster_space.table import ClusterTable, Member
from node.core import codec, record
from node.core.entry import Entry, apply_entries
from node.core.record import DELETED, HLC, Record
from node.core.vclock import VClock
from node.errors import NoSpaceError, StorageError
from node.storage.layout import STORE_FORMAT_VERSION, SpaceDef, check_format  # noqa: F401  (imported from here too)
from node.storage.readonly import copy_store, read_only_view  # noqa: F401  (imported from here too)
from node.storage.txnview import TxnView

_pack = codec.pack                  # meta values, space definitions, _cluster rows
_unpack = codec.unpack
_pack_record = record.pack          # records of spaces (node.core.record)
_unpack_record = record.unpack


def disk_free_bytes(path: str) -> int | None:
    """Bytes an unprivileged process may still write on the file system holding `path`."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


class Store:
    def __init__(self, path: str, *, sync: bool = False, map_size: int = limits.store_map_bytes_default):
        os.makedirs(path, exist_ok=True)
        try:
            self.env = lmdb.open(path, map_size=map_size, max_dbs=limits.store_spaces_max + limits.store_system_dbs,
                                 sync=sync, metasync=False, writemap=False, max_readers=limits.store_readers_max)
        except lmdb.Error as e:
            raise StorageError(f"cannot open store {path}: {e}") from None
        if self.env.max_key_size() < limits.key_bytes_max:
            self.env.close()       # every key the API accepts must fit; refusing here loses nothing
            raise StorageError(f"cannot open store {path}: this build of LMDB takes keys of at most "
                               f"{self.env.max_key_size()} bytes, replog needs {limits.key_bytes_max}")
        self.path = path
        self._meta = self.env.open_db(b"_meta")
        self._spaces_db = self.env.open_db(b"_spaces")
        self._cluster_db = self.env.open_db(b"_cluster")
        self._ids_db = self.env.open_db(b"_cluster_ids")
        self.spaces: dict[str, SpaceDef] = {}
        self._dbs: dict[str, Any] = {}
        with self.env.begin() as t:
            for k, v in t.cursor(db=self._spaces_db):
                d = _unpack(v)
                name = k.decode()
                self.spaces[name] = SpaceDef(name, bool(d.get("local")), d.get("conflict", "lww"))
        for name in self.spaces:
            self._dbs[name] = self.env.open_db(b"s:" + name.encode())
        self.table = self.load_cluster()
        self.vclock = VClock(self.get_meta("vclock") or {})
        # own `_cluster` rows at or below this lsn are an earlier incarnation's (node.core.apply);
        # all of them while the fence of a store rebuilt from a donor's snapshot stands (its ids
        # are the donor's); a fence over this node's own store (a lost WAL tail) keeps them
        fence = self.get_meta("own_fence")
        self.own_history_lsn = limits.lsn_max if isinstance(fence, dict) and fence.get("rebuilt") else \
            int(self.get_meta("own_history_lsn") or 0)
        version = self.get_meta("store_format")
        try:
            check_format(path, version)
        except StorageError:
            self.env.close()
            raise
        if version is None:
            try:
                self.set_meta(store_format=STORE_FORMAT_VERSION)
            except NoSpaceError:
                pass              # a full store of version 1 stays readable; the key is written later

    # --- failures and room --------------------------------------------------------------
    def write_failed(self, what: str, e: lmdb.Error) -> StorageError:
        """The error for an LMDB write that failed (its transaction aborted): NoSpaceError when
        the map or the disk is full, so the caller can try it again when room returns."""
        if isinstance(e, lmdb.MapFullError):
            return NoSpaceError("map", f"{what}: the store's map is full (map_size {self.env.info()['map_size']} "
                                       "bytes): raise map_size, or end long readers (a backup holds pages)")
        free = disk_free_bytes(self.path)
        if os.strerror(errno.ENOSPC) in str(e) or os.strerror(errno.EDQUOT) in str(e) \
                or (free is not None and free < limits.nospace_suspect_bytes):
            return NoSpaceError("disk", f"{what}: {e} ({free} bytes free on the file system of {self.path})")
        return StorageError(f"{what}: {type(e).__name__}: {e}")

    def space(self) -> dict:
        """The map's size and high-water mark (pages LMDB has ever used; freed pages are reused
        inside it), and the store file's size on disk; {} for a store closed under the caller."""
        try:
            info = self.env.info()
            used = (info["last_pgno"] + 1) * self.env.stat()["psize"]
        except lmdb.Error:
            return {}
        try:
            file_bytes = os.path.getsize(os.path.join(self.path, "data.mdb"))
        except OSError:
            file_bytes = 0
        return {"map_size": info["map_size"], "map_used": used, "file_bytes": file_bytes}

    def copy_to(self, dest_dir: str, compact: bool = False) -> None:
        """A consistent copy of the whole store into the empty directory `dest_dir`, from one
        read transaction (writers go on; the pages it holds are not reused until it ends)."""
        try:
            self.env.copy(dest_dir, compact=compact)
        except lmdb.Error as e:
            raise StorageError(f"copying the store to {dest_dir} failed: {e}") from None

    # --- meta --------------------------------------------------------------------
    def get_meta(self, key: str) -> Any:
        with self.env.begin(db=self._meta) as t:
            v = t.get(key.encode())
        return None if v is None else _unpack(v)

    def set_meta(self, **items: Any) -> None:
        try:
            with self.env.begin(db=self._meta, write=True) as t:
                for k, v in items.items():
                    if v is None:
                        t.delete(k.encode())
                    else:
                        t.put(k.encode(), _pack(v))
        except lmdb.Error as e:
            raise self.write_failed(f"store write of {', '.join(items)} failed", e) from None

    @property
    def is_empty(self) -> bool:
        return self.get_meta("uuid") is None or self.get_meta("cluster_uuid") is None

    def load_cluster(self) -> ClusterTable:
        with self.env.begin(db=self._cluster_db) as t:
            return ClusterTable(Member.from_row(_unpack(v)) for _, v in t.cursor())

    def load_knowledge(self) -> dict[tuple[str, str], int]:
        out = {}
        with self.env.begin(db=self._ids_db) as t:
            for k, v in t.cursor():
                o, _, m = k.decode().partition("\0")
                out[(o, m)] = _unpack(v)
        return out

    def space_flags(self) -> dict[str, bool]:
        """Space name -> local?, as the core keeps it (NodeCore.spaces)."""
        return {n: d.local for n, d in self.spaces.items()}

    # --- applying ------------------------------------------------------------------
    def _db(self, space: str):
        db = self._dbs.get(space)
        if db is None:
            db = self._dbs[space] = self.env.open_db(b"s:" + space.encode())
        return db

    def apply(self, entries: list[Entry], self_uuid: str, hlc_last: int) -> dict[int, int]:
        """Apply a batch of journal entries (node.core.entry) in WAL order, and the vclock after
        it, in one LMDB transaction; returns each component's highest last lsn in the batch."""
        vclock = self.vclock.copy()
        view = None
        try:
            with self.env.begin(write=True) as t:
                view = TxnView(self, t)
                tops = apply_entries(view, entries, self_uuid)
                t.put(b"vclock", _pack(self.vclock.to_dict()), db=self._meta)
                t.put(b"hlc", _pack(hlc_last), db=self._meta)
        except BaseException as e:
            # The LMDB transaction was aborted: what it changed in memory goes back too, so a
            # caller that goes on (recovery, one txn at a time) sees the store as it is on disk.
            self.vclock = vclock
            if view is not None:
                for name in view.created:
                    self.spaces.pop(name, None)
                    self._dbs.pop(name, None)
                if view.members_changed:
                    self.table = self.load_cluster()
            if isinstance(e, lmdb.Error):
                raise self.write_failed("store write failed", e) from None
            raise
        return tops

    def install_snapshot(self, meta: dict, spaces: dict[str, dict], cluster_rows: list[list],
                         vclock: dict[int, int]) -> None:
        """A JOIN/FETCH_SNAPSHOT: adopt the donor's `_cluster`, spaces and vclock."""
        with self.env.begin(write=True) as t:
            for name, d in spaces.items():
                sdef = SpaceDef(name, bool(d.get("local")), d.get("conflict", "lww"))
                self.spaces[name] = sdef
                self._dbs[name] = self.env.open_db(b"s:" + name.encode(), txn=t)
                t.put(name.encode(), _pack(sdef.to_dict()), db=self._spaces_db)
            for row in cluster_rows:
                m = Member.from_row(row)
                self.table.upsert(m)
                t.put(m.uuid.encode(), _pack(m.to_row()), db=self._cluster_db)
            self.vclock = VClock(vclock)
            t.put(b"vclock", _pack(self.vclock.to_dict()), db=self._meta)
            for k, v in meta.items():
                t.put(k.encode(), _pack(v), db=self._meta)

    def install_records(self, space: str, items: list[list]) -> None:
        """Snapshot rows; the HLC is raised above each record's, so this node's later
        writes order after everything it received (last-writer-wins)."""
        hlc = self.get_meta("hlc") or 0
        with self.env.begin(write=True) as t:
            db = self._db(space)
            for key, rec in items:
                t.put(key.encode(), _pack_record(rec), db=db)
                if rec[HLC] > hlc:
                    hlc = rec[HLC]
            t.put(b"hlc", _pack(hlc), db=self._meta)

    def put_cluster_member(self, m: Member) -> None:
        """Write one `_cluster` tuple outside the WAL (bootstrap of this node's own entry)."""
        self.table.upsert(m)
        with self.env.begin(write=True, db=self._cluster_db) as t:
            t.put(m.uuid.encode(), _pack(m.to_row()))

    # --- reading -----------------------------------------------------------------------
    def get(self, space: str, key: str) -> Record | None:
        db = self._dbs.get(space)
        if db is None:
            return None
        with self.env.begin(db=db) as t:
            b = t.get(key.encode())
        if b is None:
            return None
        return Record.of(key, _unpack_record(b))

    def get_many(self, items: list[tuple[str, str]]) -> list[list | None]:
        """The records (node.core.record, as lists) of (space, key) pairs of existing
        spaces (None where a key is absent), read in one LMDB read transaction: a client
        frame's reads (node/clientproto/session.py)."""
        out: list[list | None] = []
        dbs = self._dbs
        with self.env.begin() as t:
            get = t.get
            for space, key in items:
                b = get(key.encode(), db=dbs[space])
                out.append(None if b is None else _unpack_record(b))
        return out

    def range(self, space: str, after: str | None, limit: int) -> tuple[list[Record], str | None]:
        db = self._dbs[space]
        out: list[Record] = []
        with self.env.begin(db=db) as t:
            cur = t.cursor()
            ok = cur.set_range(after.encode()) if after is not None else cur.first()
            while ok:
                k, v = cur.item()
                key = k.decode()
                if after is not None and key == after:
                    ok = cur.next()
                    continue
                o = _unpack_record(v)
                if not o[DELETED]:
                    if len(out) == limit:
                        return out, out[-1].key
                    out.append(Record.of(key, o))
                ok = cur.next()
        return out, None

    def snapshot(self, chunk_rows: int = limits.snapshot_chunk_rows_max,
                 chunk_bytes: int = limits.snapshot_chunk_bytes_max) -> Iterator[tuple[str, Any]]:
        """A consistent snapshot of the replicated state, from one LMDB read transaction:
        ("meta", {vclock, cluster, spaces}) then ("rows", (space, [[key, record], ...])) chunks,
        each at most `chunk_rows` records and sent once it holds `chunk_bytes` (so it stays below
        that plus one record: one message carries it, limits.py). Local spaces, and component 0
        of the vclock, are never part of it."""
        t = self.env.begin()
        try:
            vclock = _unpack(t.get(b"vclock", db=self._meta) or _pack({}))
            vclock.pop(0, None)
            cluster = [_unpack(v) for _, v in t.cursor(db=self._cluster_db)]
            spaces = {k.decode(): _unpack(v) for k, v in t.cursor(db=self._spaces_db)}
            spaces = {n: d for n, d in spaces.items() if not d.get("local")}
            yield "meta", {"vclock": vclock, "cluster": cluster, "spaces": spaces}
            for name in sorted(spaces):
                chunk: list[list] = []
                size = 0
                for k, v in t.cursor(db=self._db(name)):
                    chunk.append([k.decode(), _unpack_record(v)])
                    size += len(k) + len(v)
                    if len(chunk) >= chunk_rows or size >= chunk_bytes:
                        yield "rows", (name, chunk)
                        chunk, size = [], 0
                if chunk:
                    yield "rows", (name, chunk)
        finally:
            t.abort()

    def meta_items(self) -> dict[str, Any]:
        with self.env.begin(db=self._meta) as t:
            return {k.decode(): _unpack(v) for k, v in t.cursor()}

    def records(self, space: str, chunk_rows: int = limits.snapshot_chunk_rows_max) -> Iterator[list[list]]:
        """Every record of a space (tombstones too) as [[key, record], ...] chunks."""
        with self.env.begin(db=self._db(space)) as t:
            chunk: list[list] = []
            for k, v in t.cursor():
                chunk.append([k.decode(), _unpack_record(v)])
                if len(chunk) >= chunk_rows:
                    yield chunk
                    chunk = []
            if chunk:
                yield chunk

    def count(self, space: str) -> int:
        with self.env.begin(db=self._dbs[space]) as t:
            return t.stat(self._dbs[space])["entries"]

    def sync(self) -> None:
        self.env.sync(True)

    def close(self) -> None:
        self.env.close()
