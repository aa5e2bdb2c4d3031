"""The stored record: what the store keeps under each key of a space, defined once.

A record is the canonical msgpack (node.core.codec) of the array

    [value, origin id, lsn, hlc, deleted]

- value: the row's value (nil in a tombstone);
- origin id: this node's id for the row's origin (0: this node's own local rows);
- lsn: the row's lsn in its origin's vclock component;
- hlc: its transaction's timestamp (the hybrid clock: last-writer-wins compares it first);
- deleted: a tombstone, kept so that last-writer-wins converges after deletes.

Snapshots carry records as they are ([[key, record], ...]); data resolvers
(node.cluster_space.resolver) see the same positions with the origin as a uuid. The layout is part
of the store format (node.storage.store.STORE_FORMAT_VERSION) and of the replication protocol.

Rules kept here:
- code that reads or writes a record names its fields by the positions below; the two hot loops
  that spell them as literals for speed (node.core.apply, node.cluster_space.resolver) assert at
  import that LAYOUT is what they spell;
- at the byte level a record starts with HEAD (a fixarray of FIELDS) and ends with its deleted flag
  (DELETED or LIVE, msgpack true/false: the flag is the last field and a bool is one byte), and its
  ints are written in their shortest unsigned form. The native scanner (node/core/_rowscan.c)
  builds records from received value bytes that way, and node.core.apply reads the flag off the
  last byte; tests/unit/test_record.py holds the C copies of these constants equal to these."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from node.core import codec

LAYOUT = ("value", "origin_id", "lsn", "hlc", "deleted")
VALUE, ORIGIN_ID, LSN, HLC, DELETED = range(len(LAYOUT))
FIELDS = len(LAYOUT)

HEAD = 0x90 | FIELDS          # the first byte of every record: a fixarray of FIELDS items
DELETED_TRUE = 0xc3           # the last byte of a tombstone (msgpack true) ...
DELETED_FALSE = 0xc2          # ... and of a live record (msgpack false)


def make(value: Any, origin_id: int, lsn: int, hlc: int, deleted: bool) -> list:
    """A record as a list (a tombstone's value is nil)."""
    return [None if deleted else value, origin_id, lsn, hlc, deleted]


pack = codec.pack             # a record list -> its bytes
unpack = codec.unpack         # record bytes -> the list


def is_tombstone(b: bytes) -> bool:
    """Whether packed record bytes are a tombstone, read off the last byte (module comment)."""
    return b[-1] == DELETED_TRUE


@dataclass(frozen=True, slots=True)
class Record:
    """A decoded record with its key: what a read of the store answers."""
    key: str
    value: Any
    origin_id: int
    lsn: int
    hlc: int
    deleted: bool

    @classmethod
    def of(cls, key: str, rec: list) -> "Record":
        return cls(key, rec[VALUE], rec[ORIGIN_ID], rec[LSN], rec[HLC], bool(rec[DELETED]))
