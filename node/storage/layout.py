"""The layout of a replog store (LMDB) and its format version.

Sub-databases:
  _meta          node facts: uuid, cluster uuid/name, vclock, hlc, store status, signatures
  _spaces        space name -> {"local", "conflict"}  (`SpaceDef`)
  _cluster       member uuid -> [uuid, id, address, state, lsn] (this node's ids)
  _cluster_ids   origin uuid NUL member uuid -> the origin's id for the member
  s:<space>      key -> a record [value, origin id, lsn, hlc, deleted] (node.core.record)
Records keep tombstones (deleted=True) so last-writer-wins converges after deletes.

Rules kept here: `_meta["store_format"]` is the layout's version (STORE_FORMAT_VERSION); a store
of a newer format, or of one replog never wrote, is refused with one line (`check_format`), never
read as if it were this one (docs/upgrade.md). A store without the key is a version 1 store."""
from __future__ import annotations

from dataclasses import dataclass

from node.errors import StorageError

STORE_FORMAT_VERSION = 1     # 1: the sub-databases above; a store without the key is a version 1 store


def check_format(path: str, version) -> None:
    """Refuse a store whose layout this replog does not know (a newer replog wrote it)."""
    if version is None or version == STORE_FORMAT_VERSION:
        return
    if type(version) is not int or version < 1:
        raise StorageError(f"store {path}: its format version {version!r} is not one replog writes; "
                           "the store is damaged")
    raise StorageError(f"store {path} has format version {version}, newer than this replog reads "
                       f"({STORE_FORMAT_VERSION}): a newer replog wrote it; run that version, or restore a backup "
                       "taken with this one (docs/upgrade.md)")


@dataclass(frozen=True, slots=True)
class SpaceDef:
    name: str
    local: bool = False
    conflict: str = "lww"

    def to_dict(self) -> dict:
        return {"local": self.local, "conflict": self.conflict}
