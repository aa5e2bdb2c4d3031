"""WAL retention: which segments may go.

A segment may be removed only when everything in it is below all of:
- the store's vclock after a checkpoint (LMDB synced), so recovery never needs it;
- every member's acknowledged position (the vclock it last ACKed to this node);
- every anonymous replica's acknowledged position while it is within its TTL.
Segment i holds rows from its own header vclock up to the header vclock of segment i+1,
so it is removable when segment i+1's start is at or below the keep vclock. The current
(last) segment is never removed. After a removal, the start of the oldest kept segment is
the `gc_vclock`: a subscriber behind it in any component must rejoin from a snapshot.
The rules are node/core/holds.py's (`keep_vclock`, `collectable_before`); this reads the headers."""
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
