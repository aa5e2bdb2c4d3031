"""`replog restore BACKUP --data-dir D [--as-new-member]`: a data dir made from a backup
(node/ops/backup.py), checked file by file against its manifest before anything is written.

What a restored node may do (docs/operations.md, "Backup and restore"):
- Keeping the member's uuid (the default), the store holds this origin's rows up to the backup
  point only, and its peers may hold later ones: rows it wrote and acknowledged after the backup.
  It must never write under an lsn of its own origin that was used before: the restored store is
  fenced (`_meta["own_fence"]`, node/fence.py): the node writes under its own id only once every
  member has said how many of its rows it holds and those rows are back (docs/replication.md, "An
  origin never reuses an lsn"). `_meta["restored_from"]` records the backup and its point (shown
  by `replog admin inspect`).
- `--as-new-member` gives the data a new uuid: the node joins as a new member keeping what it
  holds. Its store gets itself as an anonymous member (a fresh local id), and its first start
  registers it with a running member through the same crash-safe exchange an anonymous replica
  uses to become a member (node/lifecycle.py register_anon). The old member's rows stay
  attributed to the old uuid, whose `_cluster` entry is untouched; the old identity file is not
  copied.

Rules kept here:
- A restore never overwrites: the data dir must not exist, or be empty. It is built beside it
  (D.restoring-*) and renamed into place, so an interrupted restore leaves no half-made data dir.
- Every file's size and crc32c must match the manifest; a backup of a newer format (manifest,
  store, WAL) is refused naming both versions."""
from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
import uuid as uuidlib

from node.cluster_space.table import STATE_ANON, Member
from node.fence import FENCE_META
from node.identity.identity_file import IDENTITY_FILE
from node.ops.backup import BACKUP_FORMAT, BACKUP_KIND, MANIFEST, BackupError, file_crc, fsync_path
from node.storage.store import STORE_FORMAT_VERSION, Store
from node.wal import format as walfmt

log = logging.getLogger("replog.restore")

RESTORED_FROM = "restored_from"      # the `_meta` key of the marker (module comment)


def read_manifest(backup: str) -> dict:
    path = os.path.join(backup, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            man = json.load(f)
    except FileNotFoundError:
        raise BackupError(400, "not_a_backup", f"{backup}: no {MANIFEST}: not a replog backup (or an unfinished "
                          "one)") from None
    except (OSError, ValueError) as e:
        raise BackupError(400, "bad_backup", f"{path}: unreadable: {e}") from None
    if not isinstance(man, dict) or man.get("kind") != BACKUP_KIND:
        raise BackupError(400, "not_a_backup", f"{path} is not a replog backup manifest")
    for what, have, known in (("backup format", man.get("backup_format"), BACKUP_FORMAT),
                              ("store format", man.get("store_format"), STORE_FORMAT_VERSION),
                              ("WAL format", man.get("wal_format"), walfmt.FORMAT_VERSION)):
        if type(have) is not int or have > known:
            raise BackupError(400, "newer_format", f"{backup}: {what} {have!r}, newer than this replog reads "
                              f"({known}): restore it with the replog that took it (docs/upgrade.md)")
    if not isinstance(man.get("files"), dict) or "store/data.mdb" not in man["files"]:
        raise BackupError(400, "bad_backup", f"{path} lists no store")
    return man


def verify(backup: str, man: dict) -> None:
    """Every file the manifest lists is there, with its size and crc32c."""
    for rel, want in sorted(man["files"].items()):
        path = os.path.join(backup, rel)
        if os.path.isabs(rel) or ".." in rel.split("/") or not os.path.isfile(path):
            raise BackupError(400, "bad_backup", f"{backup}: {rel} is missing")
        size = os.path.getsize(path)
        if size != want.get("bytes") or file_crc(path) != want.get("crc32c"):
            raise BackupError(400, "bad_backup", f"{path} does not match the manifest (size {size}, expected "
                              f"{want.get('bytes')}; or its checksum differs): the backup is damaged")


def check_target(data_dir: str) -> None:
    if os.path.lexists(data_dir) and not (os.path.isdir(data_dir) and not os.listdir(data_dir)):
        raise BackupError(409, "data_dir_exists", f"{data_dir} exists and is not empty: a restore never "
                          "overwrites a data dir; move it away first")
    parent = os.path.dirname(os.path.abspath(data_dir))
    if not os.path.isdir(parent):
        raise BackupError(400, "bad_data_dir", f"{data_dir}: its directory {parent} does not exist")


def restore(backup: str, data_dir: str, *, as_new_member: bool = False) -> dict:
    """Make `data_dir` from `backup`; returns what was restored (uuid, vclock, marker)."""
    backup, data_dir = os.path.abspath(backup), os.path.abspath(data_dir).rstrip("/")
    man = read_manifest(backup)
    verify(backup, man)
    check_target(data_dir)
    tmp = f"{data_dir}.restoring-{secrets.token_hex(4)}"
    try:
        os.makedirs(os.path.join(tmp, "store"))
        os.makedirs(os.path.join(tmp, "wal"))
        for rel in man["files"]:
            if rel == IDENTITY_FILE and as_new_member:
                continue            # the old member's identity: the new member registers its own
            shutil.copyfile(os.path.join(backup, rel), os.path.join(tmp, rel))
            fsync_path(os.path.join(tmp, rel))
        marker = {"backup_uuid": man["uuid"], "as_new_member": as_new_member, "vclock": man["vclock"],
                  "own_lsn": man["vclock"].get(man["uuid"], 0), "backup_created_s": man["created_s"],
                  "restored_s": time.time(), "backup": backup}
        store = Store(os.path.join(tmp, "store"))
        try:
            uuid = man["uuid"]
            if as_new_member:
                uuid = str(uuidlib.uuid4())
                me = Member(uuid, store.table.lowest_free_id(), "", STATE_ANON)
                store.put_cluster_member(me)
                store.set_meta(uuid=uuid, anon=True)
            # The marker the node reads to know it was restored (the module comment). A restore that
            # keeps the uuid is fenced (node/fence.py): no row under its own id until every member has
            # said how many of its rows it holds and those rows are back (docs/replication.md).
            store.set_meta(**{RESTORED_FROM: marker})
            if not as_new_member:
                store.set_meta(**{FENCE_META: {"reason": f"this node was restored from a backup made at "
                                                         f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(man['created_s']))}"
                                                         ": its peers may hold rows it wrote after it"}})
            store.sync()
        finally:
            store.close()
        for d in ("store", "wal", ""):
            fsync_path(os.path.join(tmp, d))
        if os.path.isdir(data_dir):
            os.rmdir(data_dir)
        os.rename(tmp, data_dir)
        fsync_path(os.path.dirname(data_dir))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("restore: %s from %s (%s) into %s", uuid, backup, man["uuid"], data_dir)
    return {"uuid": uuid, "backup_uuid": man["uuid"], "cluster_uuid": man["cluster_uuid"],
            "vclock": man["vclock"], "as_new_member": as_new_member, "data_dir": data_dir, RESTORED_FROM: marker}
