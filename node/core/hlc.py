"""Hybrid logical clock: microsecond wall time that never goes backwards and always
exceeds every timestamp this node has seen, so a local write is ordered after every
write it could have observed (the basis of last-writer-wins).

Bounded: no timestamp passes limits.timestamp_us_max (year ~148,000), so the clock can always
add 1 within int64. What it observes is bounded before it gets here: remote rows whose
timestamp leads this node's wall clock by more than limits.hlc_offset_max_s are refused by the
core, and the decoders refuse timestamps past the bound. A clock stored past the bound (by a
version before these rules) is a start-up error (node.wal.recovery)."""
from __future__ import annotations

from node import limits

TS_MAX = limits.timestamp_us_max


class HLC:
    __slots__ = ("last",)

    def __init__(self, last: int = 0):
        assert 0 <= last <= TS_MAX, f"hybrid clock {last} past its bound"
        self.last = last

    def now(self, wall_us: int) -> int:
        self.last = wall_us if wall_us > self.last else self.last + 1
        assert self.last <= TS_MAX, "the hybrid clock reached its bound (year ~148,000)"
        return self.last

    def observe(self, ts: int) -> None:
        assert ts <= TS_MAX, f"a timestamp past the bound ({ts}) reached the hybrid clock"
        if ts > self.last:
            self.last = ts
