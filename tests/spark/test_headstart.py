"""spark.headstart without Spark: which segments the driver's thread takes, that stop() names
exactly those (so the job reads the rest), and that its results and errors come back."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from spark.headstart import HeadStart

WAIT_S = 30          # generous: a loaded CI machine; every wait ends on a condition first


def _inputs(n: int) -> SimpleNamespace:
    return SimpleNamespace(segments=[f"seg{i}" for i in range(n)])


def test_takes_segments_from_the_last_until_stopped_and_names_what_it_took():
    gate = threading.Semaphore(0)              # one segment per release

    def work(n, seg):
        gate.acquire()
        return (n, seg)

    h = HeadStart(_inputs(6), work).start()
    gate.release()
    gate.release()
    assert h.wait(2, WAIT_S)
    taken = h.stop()                           # the third is under way: taken, not yet done
    gate.release()
    done = h.results()
    assert taken == {5, 4, 3}
    assert done == {5: (5, "seg5"), 4: (4, "seg4"), 3: (3, "seg3")}
    assert h.stop() == taken                   # nothing taken after stop()


def test_reads_every_segment_when_never_stopped():
    h = HeadStart(_inputs(4), lambda n, seg: n * 10).start()
    assert h.wait(4, WAIT_S)
    assert h.results() == {0: 0, 1: 10, 2: 20, 3: 30}
    assert not h.wait(5, 0)                    # the thread has ended: no fifth segment


def test_a_bug_in_the_work_comes_back_from_results():
    def work(n, seg):
        raise ZeroDivisionError("a bug, not an input error")

    h = HeadStart(_inputs(3), work).start()
    assert not h.wait(1, WAIT_S)               # ended without a result
    with pytest.raises(ZeroDivisionError):
        h.results()
