"""Hybrid logical clock: microsecond wall time that never goes backwards and always
exceeds every timestamp this node has seen, so a local write is ordered after every
write it could have observed (the basis of last-writer-wins)."""
from __future__ import annotations


class HLC:
    __slots__ = ("last",)

    def __init__(self, last: int = 0):
        self.last = last

    def now(self, wall_us: int) -> int:
        self.last = wall_us if wall_us > self.last else self.last + 1
        return self.last

    def observe(self, ts: int) -> None:
        if ts > self.last:
            self.last = ts
