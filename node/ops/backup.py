"""Hot backup of a node: its store, the WAL segments it holds and its identity file, consistent at
one point, taken while the node runs and writes (`replog backup DIR --to OUT`, and
`POST /v1/admin/backup` inside the node: node/ops/backup_node.py). Restoring one is
node/ops/restore.py.

How a backup is consistent without stopping writes:
  1. A *hold* file in the data dir, flock'd for as long as the backup needs the WAL, keeps the
     node's checkpoint from collecting segments (`wal_holds`); every segment is opened at once,
     so one a checkpoint removed a moment before stays readable through its descriptor.
  2. LMDB copies the store from one read transaction (`env.copy`): the store at some vclock V.
     Writers go on; that transaction only keeps the pages it sees from being reused.
  3. The backup point: the journal's durable position (inside the node), or the segments' sizes
     (from another process). The journal writes the WAL before the store and acknowledges after
     both, so every write acknowledged before this moment lies in the WAL before the point, and
     every row the store copy lacks lies in the WAL past V.
  4. The segments are copied up to the point (a torn last frame cut off) and the store copy is
     recovered from them as the node's start-up would do: the backup holds the node's state at
     the point, and has shown that it can be recovered. Each file's size and crc32c go into
     MANIFEST.json, written last; the backup is built in OUT.tmp-* and renamed to OUT.

Rules kept here:
- Nothing here writes to the node's store or WAL; the one file it writes in the data dir is its
  hold, removed when the WAL copy is done (a hold whose process died is removed by the next
  checkpoint: nobody holds its lock).
- Inside the node only step 3 runs on the event loop (it reads one attribute); the copies run on
  an executor thread, which holds the GIL only between the chunks of a copy.
- Every segment the node holds is copied (not only those past V), so a restored node can serve
  its peers the rows its original could."""
from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import shutil
import threading
import time
from typing import Any

import crc32c

from node import limits
from node.core import messages as m
from node.errors import ReplogError, StorageError
from node.identity.identity_file import IDENTITY_FILE
from node.storage.store import STORE_FORMAT_VERSION, Store, copy_store
from node.wal import format as walfmt
from node.wal.reader import list_segments, read_header
from node.wal.recovery import recover
from node.wal.writer import fsync_dir as fsync_path    # opens read-only and fsyncs: files and directories

log = logging.getLogger("replog.backup")

MANIFEST = "MANIFEST.json"
BACKUP_KIND = "replog-backup"
BACKUP_FORMAT = 1                    # 1: MANIFEST.json, store/data.mdb, wal/*.wal, identity
HOLD_PREFIX, HOLD_SUFFIX = "backup-", ".hold"
_HOLD_TEMP_PREFIX, _HOLD_TEMP_SUFFIX = ".backup-", ".holding"


class BackupError(ReplogError):
    """A backup or restore that cannot be done as asked: `status` is its HTTP status."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


# --- holds: the WAL stays while a backup copies it -----------------------------------------------
class Hold:
    """A file `backup-<pid>-<random>.hold` in the data dir, flock'd from before it has its name
    until release(): while it exists and is locked, the node collects no WAL segment."""

    def __init__(self, data_dir: str):
        token = f"{os.getpid()}-{secrets.token_hex(4)}"
        tmp = os.path.join(data_dir, f"{_HOLD_TEMP_PREFIX}{token}{_HOLD_TEMP_SUFFIX}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"pid": os.getpid(), "started_s": time.time()}).encode())
        self.path = os.path.join(data_dir, f"{HOLD_PREFIX}{token}{HOLD_SUFFIX}")
        os.rename(tmp, self.path)           # visible only once locked: a checkpoint never sees it free
        self.fd: int | None = fd

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            os.close(self.fd)
            self.fd = None


def wal_holds(data_dir: str) -> list[dict[int, int]]:
    """The positions live backups hold the WAL at ({}: all of it), for the checkpoint
    (node/core/holds.py keep_vclock). Hold files nobody has locked belong to backups that died:
    they are removed here."""
    try:
        names = os.listdir(data_dir)
    except FileNotFoundError:
        return []
    out: list[dict[int, int]] = []
    for name in names:
        live = name.startswith(HOLD_PREFIX) and name.endswith(HOLD_SUFFIX)
        if not live and not (name.startswith(_HOLD_TEMP_PREFIX) and name.endswith(_HOLD_TEMP_SUFFIX)):
            continue
        path = os.path.join(data_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                if live:
                    out.append({})
                continue
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue         # its backup ended between our open and our lock, and removed it
            log.warning("backup: removed %s, left by a backup that did not finish", name)
        finally:
            os.close(fd)
    return out


# --- copying -------------------------------------------------------------------------------
def copy_range(src_fd: int, dest_path: str, size: int) -> int:
    """Bytes [0, size) of an open file into a new file; returns its crc32c."""
    crc = 0
    with open(dest_path, "wb") as out:
        off = 0
        while off < size:
            chunk = os.pread(src_fd, min(limits.backup_copy_chunk_bytes, size - off), off)
            if not chunk:
                raise StorageError(f"{dest_path}: the source ended at byte {off} of {size}")
            out.write(chunk)
            crc = crc32c.crc32c(chunk, crc)
            off += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    return crc


def file_crc(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(limits.backup_copy_chunk_bytes):
            crc = crc32c.crc32c(chunk, crc)
    return crc


def check_destination(out: str) -> None:
    """OUT (absolute) must be new (or an empty directory) in a directory that exists."""
    parent = os.path.dirname(out.rstrip("/")) or "/"
    if not os.path.isdir(parent):
        raise BackupError(400, "bad_destination", f"{out}: its directory {parent} does not exist")
    if os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise BackupError(409, "destination_exists", f"{out} exists and is not an empty directory: a backup "
                          "never overwrites anything")


class BackupJob:
    """One backup of the data dir `data_dir` into `out`, in steps (the module comment): begin,
    copy_store, copy_wal, finish; abort on any failure. Each step but the choice of the point
    is slow and belongs on a thread."""

    def __init__(self, data_dir: str, out: str, *, compact: bool = False):
        self.data_dir = os.path.abspath(data_dir)
        self.wal_dir = os.path.join(self.data_dir, "wal")
        self.out = os.path.abspath(out).rstrip("/")
        self.tmp = f"{self.out}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        self.compact = compact
        self.hold: Hold | None = None
        self._fds: dict[str, int] = {}
        self.segments: list[dict[str, Any]] = []     # {"name", "bytes", "crc32c"} as copied
        self.point: tuple[str | None, int] | None = None
        self.point_s: float | None = None           # wall time the point was chosen
        # inside the node: the journal's applied position before the store copy; every row before
        # it is in the copy, so recovering the copy reads the WAL from there only
        self.replay_from: tuple[str | None, int] | None = None
        self.seconds: dict[str, float] = {}
        self.started_s = time.time()
        self.task: Any = None                       # inside the node: the asyncio task running the steps
        self.abandoned = threading.Event()          # inside the node: it stops; no step after this one
        self.abandon_reason = ""

    def abandon(self, reason: str) -> None:
        """Give the backup up after the step under way (a store copy cannot be interrupted)."""
        self.abandon_reason = reason
        self.abandoned.set()

    def check_abandoned(self) -> None:
        if self.abandoned.is_set():
            raise BackupError(503, "stopping", f"the backup to {self.out} was abandoned: {self.abandon_reason}; "
                              "nothing was written there")

    def progress(self) -> str:
        """How far the store copy is, from the files' sizes (a compacting copy ends smaller)."""
        def mib(path: str) -> float:
            try:
                return os.path.getsize(path) / 2 ** 20
            except OSError:
                return 0.0
        if "store_copy_s" in self.seconds:
            return "its store copy is done"
        return (f"{mib(os.path.join(self.tmp, 'store', 'data.mdb')):.0f} MiB of the store's "
                f"{mib(os.path.join(self.data_dir, 'store', 'data.mdb')):.0f} MiB copied")

    def begin(self) -> None:
        check_destination(self.out)
        if not os.path.isfile(os.path.join(self.data_dir, "store", "data.mdb")):
            raise BackupError(400, "no_store", f"{self.data_dir}: no store here (no store/data.mdb)")
        try:
            os.makedirs(os.path.join(self.tmp, "store"))
        except OSError as e:     # a directory nothing may be written in (/proc, read-only, not ours)
            raise BackupError(400, "bad_destination", f"{self.out}: cannot write in {os.path.dirname(self.out)}: "
                              f"{e.strerror}") from None
        os.makedirs(os.path.join(self.tmp, "wal"))
        self.hold = Hold(self.data_dir)
        self._open_segments()

    def _open_segments(self) -> None:
        for name in list_segments(self.wal_dir):
            if name not in self._fds:
                try:
                    self._fds[name] = os.open(os.path.join(self.wal_dir, name), os.O_RDONLY)
                except FileNotFoundError:
                    pass            # collected before the hold: its rows are all in the store already

    def copy_store(self, store: Store | None = None) -> None:
        """`store`: the node's own (inside the node: LMDB forbids a second handle in one process);
        None: open the store read-only (another process, or a stopped node)."""
        t0 = time.monotonic()
        dest = os.path.join(self.tmp, "store")
        if store is not None:
            store.copy_to(dest, self.compact)
        else:
            copy_store(os.path.join(self.data_dir, "store"), dest, self.compact)
        self.seconds["store_copy_s"] = time.monotonic() - t0

    def copy_wal(self, point: tuple[str | None, int] | None) -> None:
        """Copy the segments up to the backup point: the journal's durable position (segment,
        end offset), or None for each segment's size now (only the last may end torn)."""
        t0 = time.monotonic()
        if point is None:
            self.point_s = time.time()
        self._open_segments()
        names = sorted(self._fds, key=walfmt.segment_signature)
        if point is not None:         # nothing the point does not cover: later segments stay out
            last = walfmt.segment_signature(point[0]) if point[0] is not None else -1
            names = [n for n in names if walfmt.segment_signature(n) <= last]
        sizes = {n: point[1] if point is not None and n == point[0] else os.fstat(self._fds[n]).st_size
                 for n in names}
        self.point = (names[-1], sizes[names[-1]]) if names else (None, 0)
        for n in names:
            self.check_abandoned()
            crc = copy_range(self._fds[n], os.path.join(self.tmp, "wal", n), sizes[n])
            self.segments.append({"name": n, "bytes": sizes[n], "crc32c": crc})
        self._close_fds()
        if self.hold is not None:
            self.hold.release()
        self.seconds["wal_copy_s"] = time.monotonic() - t0

    def finish(self) -> dict:
        """Recover the copy to the point, checksum, write the manifest, move into place."""
        t0 = time.monotonic()
        manifest = self._recover()
        self.seconds["recover_s"] = time.monotonic() - t0
        ident = os.path.join(self.data_dir, IDENTITY_FILE)
        if os.path.isfile(ident):
            shutil.copyfile(ident, os.path.join(self.tmp, IDENTITY_FILE))
        files = {f"wal/{s['name']}": {"bytes": s["bytes"], "crc32c": s["crc32c"]} for s in self.segments}
        for rel in ("store/data.mdb", IDENTITY_FILE):     # the WAL copies were checksummed and synced as made
            path = os.path.join(self.tmp, rel)
            if os.path.isfile(path):
                files[rel] = {"bytes": os.path.getsize(path), "crc32c": file_crc(path)}
                fsync_path(path)
        manifest.update(files=files, identity=IDENTITY_FILE in files, compact=self.compact,
                        wal_end={"segment": self.point[0], "offset": self.point[1]} if self.point else None,
                        point_s=self.point_s,
                        seconds={**{k: round(v, 4) for k, v in self.seconds.items()},
                                 "total_s": round(time.time() - self.started_s, 4)},
                        bytes=sum(f["bytes"] for f in files.values()))
        with open(os.path.join(self.tmp, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        for d in ("store", "wal", ""):
            fsync_path(os.path.join(self.tmp, d))
        if os.path.isdir(self.out):
            os.rmdir(self.out)                   # empty (checked): the rename takes its place
        os.rename(self.tmp, self.out)
        fsync_path(os.path.dirname(self.out) or "/")
        log.info("backup: %s at vclock %s into %s (%d bytes, %s)", manifest["uuid"], manifest["vclock"], self.out,
                 manifest["bytes"], manifest["seconds"])
        return manifest

    def _recover(self) -> dict:
        store = Store(os.path.join(self.tmp, "store"))
        try:
            uuid, cluster_uuid = store.get_meta("uuid"), store.get_meta("cluster_uuid")
            if not uuid or not cluster_uuid:
                raise BackupError(409, "not_bootstrapped", f"{self.data_dir}: the store holds no cluster yet "
                                  "(a node that has not joined): nothing to back up")
            store_vclock = by_uuid(store, store.vclock.to_dict())
            if self.replay_from is None:
                self.replay_from = self._first_needed(store.vclock.to_dict())
            view = self._replay_view()
            try:
                res = recover(store, view or os.path.join(self.tmp, "wal"), uuid)
            finally:
                if view:
                    shutil.rmtree(view)
            if res.torn and self.segments:
                name, offset = res.torn[-1]
                if self.replay_from is not None and self.replay_from[0] == name and self.replay_from[1]:
                    raise StorageError(f"backup of {self.data_dir}: a torn frame before the journal's durable "
                                       f"position in {name}")
                path = os.path.join(self.tmp, "wal", name)
                os.truncate(path, offset)                  # an unacknowledged write
                seg = next(s for s in self.segments if s["name"] == name)
                seg["bytes"], seg["crc32c"] = offset, file_crc(path)
                self.point = (name, offset)
            store.sync()
            vclock = store.vclock.to_dict()
            return {"kind": BACKUP_KIND, "backup_format": BACKUP_FORMAT, "created_s": self.started_s,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_s)),
                    "uuid": uuid, "cluster_uuid": cluster_uuid, "cluster_name": store.get_meta("cluster_name"),
                    "anon": bool(store.get_meta("anon")), "self_id": store.table.id_of(uuid),
                    "store_format": STORE_FORMAT_VERSION, "wal_format": walfmt.FORMAT_VERSION,
                    "protocol": [m.PROTOCOL_VERSION_MIN, m.PROTOCOL_VERSION],
                    "store_vclock": store_vclock, "vclock": by_uuid(store, vclock),
                    "local_lsn": vclock.get(0, 0), "replayed_txns": res.replayed_txns}
        finally:
            store.close()

    def _first_needed(self, vclock: dict[int, int]) -> tuple[str | None, int] | None:
        """From outside the node: the last copied segment that starts at or below the store copy's
        vclock (every row before it is in the copy), from its first frame; None if there is none."""
        wal = os.path.join(self.tmp, "wal")
        first = None
        for s in self.segments:
            start = read_header(os.path.join(wal, s["name"])).vclock
            if any(lsn > vclock.get(rid, 0) for rid, lsn in start.items()):
                break
            first = (s["name"], 0)
        return first

    def _replay_view(self) -> str | None:
        """A WAL dir for recovering the copy that holds only what the copy may lack: the segment of
        `replay_from` from that frame on (its header kept, so it is a segment), and the later ones.
        None: recover from every copied segment (a backup from outside knows no such position)."""
        if self.replay_from is None:
            return None
        seg, off = self.replay_from
        names = [s["name"] for s in self.segments]
        if seg is not None and seg not in names:
            return None
        view = os.path.join(self.tmp, "replay")
        os.makedirs(view)
        wal = os.path.join(self.tmp, "wal")
        for name in names:
            if seg is not None and walfmt.segment_signature(name) < walfmt.segment_signature(seg):
                continue                        # wholly applied before the store was copied
            fd = os.open(os.path.join(wal, name), os.O_RDONLY)
            try:
                head = os.pread(fd, len(walfmt.SEGMENT_MAGIC) + 8, 0)      # magic, length, crc32c
                header = os.pread(fd, len(head) + int.from_bytes(head[-8:-4], "little"), 0)
                if name != seg or off <= len(header):          # whole: the same file, offsets and all
                    os.link(os.path.join(wal, name), os.path.join(view, name))
                    continue
                size = os.fstat(fd).st_size
                with open(os.path.join(view, name), "wb") as out:
                    out.write(header)
                    pos = off
                    while pos < size:
                        chunk = os.pread(fd, min(limits.backup_copy_chunk_bytes, size - pos), pos)
                        out.write(chunk)
                        pos += len(chunk)
            finally:
                os.close(fd)
        return view

    def _close_fds(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def abort(self) -> None:
        self._close_fds()
        if self.hold is not None:
            self.hold.release()
        shutil.rmtree(self.tmp, ignore_errors=True)


def by_uuid(store: Store, vclock: dict[int, int]) -> dict[str, int]:
    """A vclock in the store's ids as {member uuid: lsn}, replicated components only."""
    out = {}
    for rid, lsn in vclock.items():
        u = store.table.uuid_of(rid) if rid else None
        if u is not None and lsn:
            out[u] = lsn
    return out


def backup_dir(data_dir: str, out: str, *, compact: bool = False) -> dict:
    """A backup of a data dir by another process than its node's (`replog backup`): the node
    may be running (it keeps writing) or stopped."""
    job = BackupJob(data_dir, out, compact=compact)
    try:
        job.begin()
        job.copy_store(None)
        job.copy_wal(None)
        return job.finish()
    except BaseException:
        job.abort()
        raise
