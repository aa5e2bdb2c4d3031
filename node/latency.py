"""Latency histograms for /metrics: WAL write, fsync, group commit, HTTP requests.

Rules kept here:
- observe() is a bisect and three additions, cheap enough for the commit path (it runs once
  per batch, never per row), and takes no lock: each histogram has one writer at a time (the
  journal's batch, on the loop or its one executor thread; HTTP handlers on the loop). A scrape
  may read a count and a sum one observation apart; Prometheus tolerates that.
- Buckets are fixed and shared (Prometheus needs the same `le` set for a metric across its
  series): 50 µs to 10 s, where the commit path's answers live (a write() ~20 µs, an fsync on
  an SSD ~1 ms, on a busy disk ~100 ms)."""
from __future__ import annotations

from bisect import bisect_left

BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
             1.0, 2.5, 5.0, 10.0)


class Histogram:
    __slots__ = ("counts", "sum", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_S) + 1)     # the last one: above every bucket (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(BUCKETS_S, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, observations <= le), ...] ending with ("+Inf", count), as Prometheus wants them."""
        out, total = [], 0
        for le, n in zip(BUCKETS_S, self.counts):
            total += n
            out.append((repr(le), total))
        out.append(("+Inf", total + self.counts[-1]))
        return out
