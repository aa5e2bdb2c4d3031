"""Journal entries: one WAL frame's transactions, in one of two representations behind one interface.

An entry is what the journal (node/journal.py) queues, writes as one WAL frame, applies to the
store and hands to relays from its in-memory tail. There are two representations:
- `TxnEntry`, the exact one: a list of checked `Txn`s (local writes, `_cluster` and space rows,
  anything a decoder read into tuples);
- `PackedEntry`, the fast one: the plain transactions a native scan of a ROWS message indexed
  (node.core.rowscan), kept as the received bytes; its frame and store records are spliced
  from them with no Python object per row.
Neither the journal, the store nor the relay asks which one it holds: each entry answers
`Entry`'s questions itself.

Rules kept here:
- both representations answer alike: a PackedEntry's frame payload, relay frames, txns and store
  effects are byte for byte those of the TxnEntry of its txns (tests/unit/test_rowscan.py);
- the store applies a batch by runs (`apply_entries`): consecutive entries of one representation
  are one call of that representation's `apply_run`, so the per-call setup (space lookups,
  cursors) is paid once per run, never once per transaction;
- relay filtering is `relay_wanted`'s rule (node.core.replicaset) whichever the representation:
  a PackedEntry decides whole ranges at once, and falls back to its txns when a range is split."""
from __future__ import annotations

from typing import Any, Callable, Protocol

import msgpack

from node.core import codec
from node.core.apply import StateView, apply_packed, apply_txns
from node.core.replicaset import relay_wanted
from node.core.rows import Txn, unpack_frame_txns

_pack = msgpack.Packer(use_bin_type=True).pack     # re-packs what a relay keeps of a frame, as it always has

Own = tuple[int, int] | None                       # the subscriber's own-rows cut (relay_wanted)
Tops = dict[int, int]                              # vclock component -> highest last lsn (NodeCore.commit_tops)


class Entry(Protocol):
    """What the journal, the store and relays need of one WAL frame's transactions."""
    ntxn: int                      # transactions
    rows: int                      # rows (ops) of all of them

    @property
    def txns(self) -> list[Txn]:
        """The transactions, this node's ids (for the rare reader that wants them decoded)."""
        ...

    def frame_payload(self, written_us: int) -> bytes:
        """The WAL frame payload [written_us, [txn, ...]], canonical msgpack."""
        ...

    def relay_frame(self, payload: bytes, written_us: int, sub: dict[int, int], own: Own) -> tuple[bytes | None, int]:
        """What a subscriber at `sub` (and `own`) gets of this entry's frame, whose payload is
        `payload`: the payload itself if it wants every txn, re-packed if some, None if none;
        and the rows that go."""
        ...

    # apply_run(view, entries, self_uuid) -> Tops: a static function that applies a run of
    # entries of this representation, in order, to a node.core.apply.StateView.
    apply_run: Callable[[StateView, list, str], Tops]


def apply_entries(view: StateView, entries: list[Entry], self_uuid: str) -> Tops:
    """Apply a batch's entries in order, each run of one representation in one call of its
    `apply_run`; returns each vclock component's highest last lsn in the batch."""
    tops: Tops = {}
    i, n = 0, len(entries)
    while i < n:
        run_apply = entries[i].apply_run
        j = i + 1
        while j < n and entries[j].apply_run is run_apply:
            j += 1
        for c, last in run_apply(view, entries[i:j], self_uuid).items():
            if last > tops.get(c, 0):
                tops[c] = last
        i = j
    return tops


def txns_relay_frame(txns: list, payload: bytes, written_us: int, sub: dict[int, int],
                     own: Own) -> tuple[bytes | None, int]:
    """Entry.relay_frame over txns (Txns, or wire lists as a WAL frame read from the file holds them)."""
    keep, rows = relay_wanted(txns, sub, own)
    if not keep:
        return None, 0
    return (payload if len(keep) == len(txns) else _pack([written_us, keep])), rows


# --- the exact representation -------------------------------------------------------------
def _apply_txn_entries(view: StateView, run: list["TxnEntry"], self_uuid: str) -> Tops:
    if len(run) == 1:
        return apply_txns(view, run[0].txns, self_uuid)
    return apply_txns(view, [t for e in run for t in e.txns], self_uuid)


class TxnEntry:
    """An entry of checked Txns (this node's ids)."""
    __slots__ = ("txns", "ntxn", "rows")

    def __init__(self, txns: list[Txn], rows: int | None = None):
        self.txns = txns
        self.ntxn = len(txns)
        self.rows = sum([len(t[4]) for t in txns]) if rows is None else rows

    apply_run = staticmethod(_apply_txn_entries)

    def frame_payload(self, written_us: int) -> bytes:
        return codec.pack([written_us, self.txns])

    def relay_frame(self, payload: bytes, written_us: int, sub: dict[int, int], own: Own) -> tuple[bytes | None, int]:
        return txns_relay_frame(self.txns, payload, written_us, sub, own)


# --- the fast representation ---------------------------------------------------------------
def _apply_packed_entries(view: StateView, run: list["PackedEntry"], self_uuid: str) -> Tops:
    if len(run) == 1:
        return apply_packed(view, run[0], self_uuid)
    tops: Tops = {}
    for e in run:
        for c, last in apply_packed(view, e, self_uuid).items():
            if last > tops.get(c, 0):
                tops[c] = last
    return tops


class PackedEntry:
    """An entry of the ranges of a scanned message's transactions that the core claimed, each
    (first txn, end txn, this node's id for their origin), in order; built from the received
    bytes (node.core.rowscan: every txn plain, each origin's run without a gap)."""
    __slots__ = ("scan", "ranges", "ntxn", "rows", "tops", "_txns", "_firsts")

    def __init__(self, scan: Any, ranges: list[tuple[int, int, int]]):
        assert ranges, "an entry holds at least one transaction"
        self.scan = scan
        self.ranges = ranges
        lasts = memoryview(scan.lasts()).cast("q")
        rows = 0
        tops: Tops = {}                     # vclock component -> highest last lsn (commit_tops)
        firsts = []                         # per range: id, first lsn, first txn's last lsn, last lsn
        for a, b, rid in ranges:
            first = scan.lsn(a)
            rows += lasts[b - 1] - first + 1
            if lasts[b - 1] > tops.get(rid, 0):
                tops[rid] = lasts[b - 1]
            firsts.append((rid, first, lasts[a], lasts[b - 1]))
        self.ntxn = sum(b - a for a, b, _ in ranges)
        self.rows = rows
        self.tops = tops
        self._firsts = firsts
        self._txns: list[Txn] | None = None

    apply_run = staticmethod(_apply_packed_entries)

    def frame_payload(self, written_us: int) -> bytes:
        return b"\x92" + codec.pack(written_us) + codec.array_head(self.ntxn) + self.scan.frame_txns(self.ranges)

    def records(self) -> list[tuple[str, list[tuple[bytes, bytes]]]]:
        """The store records of the puts and deletes, by runs of one space (node.core.record)."""
        return self.scan.records(self.ranges)

    @property
    def txns(self) -> list[Txn]:
        if self._txns is None:
            self._txns = unpack_frame_txns(self.frame_payload(0))[1]
        return self._txns

    def relay_frame(self, payload: bytes, written_us: int, sub: dict[int, int], own: Own) -> tuple[bytes | None, int]:
        every = self.wanted(sub, own)
        if every is None:
            return txns_relay_frame(self.txns, payload, written_us, sub, own)
        return (payload, self.rows) if every else (None, 0)

    def wanted(self, sub: dict[int, int], own: Own = None) -> bool | None:
        """Would `relay_wants(txn, sub, own)` keep every txn (True), none (False), or some
        (None)? Every txn is plain, and each range is one origin's run, so a range is decided
        by its first lsn, its first txn's last lsn and its last lsn (an own cut is a txn
        boundary of that origin: it never splits a txn)."""
        every = none = True
        for rid, first, first_last, last in self._firsts:
            have = sub.get(rid, 0)
            if own is not None and rid == own[0] and last > own[1]:
                if first > own[1] or own[1] <= have:
                    every = False         # all past the cut, or the subscriber has what is before it
                    continue
                return None               # some it lacks before the cut, then some past it
            if last <= have:
                every = False             # none of this range
            elif first_last > have:
                none = False              # all of this range
            else:
                return None               # part of this range
        return True if every else False if none else None
