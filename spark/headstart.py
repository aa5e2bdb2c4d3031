"""Pass 1 begun on the driver while the Spark session starts (local mode only).

Starting the JVM and the SparkContext takes ~3 s during which about one of a small machine's
CPUs is idle. In local mode the driver's CPUs are the executors' and its files theirs, so one
driver thread does pass 1 (spark.columnar.write_segment_rows: the same function, the same
files) on segments it takes one at a time, from the last, until the pass-1 job is submitted;
the job reads the others.

Rules: a segment is read once: `stop()` closes the thread's intake and names every segment it
took (done or under way), and the job reads exactly the rest; `results()` waits for the one
under way. Going on after the job is submitted was measured worse (the thread competed with
PySpark's daemon and workers as they started, then read nearly every segment alone on one CPU),
and going on only until the job's first task begins (claims by symlink in OUT, tasks leaving the
driver's segments) no better: 8 alternating runs, the same median. A reader's WalInputError
comes back as a value, as from a task (spark.jobs). On a cluster there is no head start: the
driver reads no segment."""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

from spark import walread

log = logging.getLogger("replog.analyze")


class HeadStart:
    def __init__(self, inputs, work):
        """`inputs`: spark.jobs.Inputs; `work(n, segment)`: pass 1 of inputs.segments[n] (its
        result, or an InputFailure)."""
        self.inputs = inputs
        self._segments: list[walread.SegmentFile] = inputs.segments
        self._work = work
        self._lock = threading.Lock()
        self._progress = threading.Condition(self._lock)
        self._open = True
        self._taken: list[int] = []
        self._done: dict[int, object] = {}
        self._busy_s = 0.0
        self._ended = False
        self._future: concurrent.futures.Future | None = None

    def start(self) -> "HeadStart":
        # A pool of one: an exception in the thread comes back from results(), with its traceback.
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="replog-head-start")
        self._future = pool.submit(self._run)
        pool.shutdown(wait=False)
        return self

    def _take(self) -> int | None:
        with self._lock:
            # From the last: the job's tasks start with the first segments.
            n = len(self._segments) - 1 - len(self._taken)
            if not self._open or n < 0:
                return None
            self._taken.append(n)
            return n

    def _run(self) -> None:
        t = time.monotonic()
        try:
            while (n := self._take()) is not None:
                r = self._work(n, self._segments[n])
                with self._lock:
                    self._done[n] = r
                    self._progress.notify_all()
        finally:
            with self._lock:
                self._busy_s = time.monotonic() - t
                self._ended = True
                self._progress.notify_all()

    def wait(self, done: int, timeout_s: float) -> bool:
        """Wait until `done` segments are read (or the thread has ended); whether they are."""
        with self._lock:
            self._progress.wait_for(lambda: len(self._done) >= done or self._ended, timeout_s)
            return len(self._done) >= done

    def stop(self) -> set[int]:
        """Take no more segments; the ones taken (done or under way)."""
        with self._lock:
            self._open = False
            return set(self._taken)

    def results(self) -> dict[int, object]:
        """Segment number -> pass-1 result, for every segment taken (waits for the last one)."""
        self.stop()
        if self._future is not None:
            self._future.result()
        log.info("[3/8] %d of %d segments read on the driver while the session started (%.1fs)",
                 len(self._done), len(self._segments), self._busy_s)
        return self._done
