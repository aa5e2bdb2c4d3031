"""The journal's in-memory tail: while relays listen, the frames of the last few durable
batches stay in memory, each batch as a `TailChunk` placed by its WAL position, so that a
caught-up relay sends them without reading the file back (node/applier/walcursor.py).

A chunk is published by the journal at the moment its durable position moves past it, so a
relay never gets from memory what it could not read from the file. Bounded by
`limits.relay_tail_bytes_max` (the oldest chunks go first; the newest always stays); dropped
when the last listener goes. A reader that falls out of it reads the file."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from node import limits

Position = tuple  # (segment name or None, byte offset just past the last whole frame)


@dataclass(frozen=True, slots=True)
class TailChunk:
    """One durable batch as it lies in the WAL: frames [start, end) of `segment`.
    `prev` is the durable position before the batch, so a reader stopped there (also at
    the end of the previous segment, when the batch opened a new one) continues here."""
    seq: int
    prev: Position
    segment: str
    start: int
    end: int
    written_us: int
    frames: tuple            # ((end offset, msgpack payload, its Entry), ...) in WAL order


class Tail(deque):
    """The chunks, oldest first (a deque of TailChunk), with their total size and where each
    can be found: by its seq (consecutive), and by the positions a reader may stop at."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self._seq = 0                              # seq of the next chunk
        self._at: dict[Position, int] = {}         # a chunk's prev and (segment, start) -> its seq

    def chunk(self, pos: Position, seq: int | None = None) -> TailChunk | None:
        """The chunk that continues a reader stopped at `pos` (a batch boundary), or None
        if the tail does not hold it (the reader is behind, or the tail was dropped).
        `seq`, when the reader knows which chunk comes next, saves the lookup."""
        if not self:
            return None
        if seq is None:
            seq = self._at.get(pos)
            if seq is None:
                return None
        c = self.get(seq)
        return c if c is not None and (c.prev == pos or (c.segment, c.start) == pos) else None

    def get(self, seq: int) -> TailChunk | None:
        k = seq - self[0].seq if self else -1
        return self[k] if 0 <= k < len(self) else None

    def publish(self, prev: Position, segment: str, start: int, end: int, written_us: int,
                frames: tuple) -> None:
        c = TailChunk(self._seq, prev, segment, start, end, written_us, frames)
        self._seq += 1
        self.append(c)
        self.bytes += end - start
        self._at[prev] = c.seq
        self._at[(segment, start)] = c.seq
        while self.bytes > limits.relay_tail_bytes_max and len(self) > 1:
            old = self.popleft()
            self.bytes -= old.end - old.start
            for key in (old.prev, (old.segment, old.start)):
                if self._at.get(key) == old.seq:
                    del self._at[key]

    def drop(self) -> None:
        self.clear()
        self._at.clear()
        self.bytes = 0
