"""WAL retention: which segments may go.

A segment may be removed only when everything in it is below all of:
- the store's vclock after a checkpoint (LMDB synced), so recovery never needs it;
- every member's acknowledged position (the vclock it last ACKed to this node);
- every anonymous replica's acknowledged position while it is within its TTL.
Segment i holds rows from its own header vclock up to the header vclock of segment i+1,
so it is removable when segment i+1's start is at or below the keep vclock. The current
(last) segment is never removed. After a removal, the start of the oldest kept segment is
the `gc_vclock`: a subscriber behind it in any component must rejoin from a snapshot.
The rules are node/core/holds.py's (`keep_vclock`, `collectable_before`); this reads the headers.

The WAL's start bounds `gc_vclock` from below however it came to start there (`gc_at_wal_start`,
at open): a WAL directory lost, a wal_mode of none before, a removal whose record did not reach
the disk. The rows below its start are gone from this node's WAL as surely as collected ones."""
from __future__ import annotations

import os

from node.core.holds import collectable_before
from node.wal.reader import list_segments, read_header


def collectable(wal_dir: str, keep: dict[int, int]) -> tuple[list[str], dict[int, int] | None]:
    """Segments that may be removed, and the start vclock of the oldest one that stays."""
    segs = list_segments(wal_dir)
    removable: list[str] = []
    for i in range(len(segs) - 1):
        nxt = read_header(os.path.join(wal_dir, segs[i + 1])).vclock
        if collectable_before(nxt, keep):
            removable.append(segs[i])
        else:
            break
    if not removable:
        return [], None
    first_kept = segs[len(removable)]
    return removable, read_header(os.path.join(wal_dir, first_kept)).vclock


def gc_at_wal_start(wal_dir: str, store_vclock: dict[int, int], gc_vclock: dict[int, int]) -> dict[int, int] | None:
    """`gc_vclock` raised to where the WAL starts, in every component but the local 0: the first
    segment's start, or with no segment the store's vclock (the next segment starts there).
    None: it is there already."""
    segs = list_segments(wal_dir) if os.path.isdir(wal_dir) else []
    start = read_header(os.path.join(wal_dir, segs[0])).vclock if segs else store_vclock
    raised = dict(gc_vclock)
    for rid, lsn in start.items():
        if rid != 0 and lsn > raised.get(rid, 0):
            raised[rid] = lsn
    return raised if raised != gc_vclock else None
