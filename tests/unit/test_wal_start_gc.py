"""Where a node's WAL starts bounds what its relays can send (node/wal/gc.py `gc_at_wal_start`):
at open, `gc_vclock` is raised to the first segment's start (to the store's vclock when there
is no segment: the next one starts there), in every component but the local 0, so that a
subscriber behind it is told to rejoin instead of being sent rows past a gap; a WAL that
starts at or below what was recorded changes nothing."""
from __future__ import annotations

from node.wal.gc import gc_at_wal_start
from node.wal.writer import WalWriter
from tests.unit.helpers import UUID_A


def segments(tmp_path, *starts: dict[int, int]) -> str:
    w = WalWriter(str(tmp_path), "write", UUID_A)
    for v in starts:
        w.rotate(v, [])
    w.close()
    return str(tmp_path)


def test_a_wal_with_no_segment_starts_at_the_stores_vclock_and_raises_gc_to_it(tmp_path):
    assert gc_at_wal_start(str(tmp_path / "gone"), {0: 4, 1: 20, 2: 3}, {1: 5}) == {1: 20, 2: 3}


def test_an_empty_wal_directory_is_a_wal_with_no_segment(tmp_path):
    assert gc_at_wal_start(str(tmp_path), {1: 20}, {}) == {1: 20}


def test_a_first_segment_that_starts_past_what_was_collected_raises_gc_to_its_start(tmp_path):
    wal = segments(tmp_path, {1: 9, 2: 3}, {1: 12, 2: 3})
    assert gc_at_wal_start(wal, {1: 30, 2: 3}, {1: 5, 2: 3}) == {1: 9, 2: 3}


def test_gc_past_the_first_segments_start_in_one_component_keeps_that_component(tmp_path):
    wal = segments(tmp_path, {1: 9, 2: 3})
    assert gc_at_wal_start(wal, {1: 30, 2: 8}, {1: 5, 2: 6}) == {1: 9, 2: 6}


def test_a_wal_that_starts_at_or_below_what_was_collected_changes_nothing(tmp_path):
    wal = segments(tmp_path, {1: 9, 2: 3}, {1: 12, 2: 3})
    assert gc_at_wal_start(wal, {1: 30, 2: 3}, {1: 9, 2: 3}) is None
    assert gc_at_wal_start(wal, {1: 30, 2: 3}, {1: 12, 2: 3}) is None


def test_a_new_cluster_and_a_fresh_join_change_nothing(tmp_path):
    assert gc_at_wal_start(str(tmp_path), {}, {}) is None                    # founded: nothing yet
    assert gc_at_wal_start(str(tmp_path), {1: 7, 2: 2}, {1: 7, 2: 2}) is None  # installed a snapshot


def test_the_local_component_never_enters_gc(tmp_path):
    wal = segments(tmp_path, {0: 40, 1: 9})
    assert gc_at_wal_start(wal, {0: 50, 1: 9}, {}) == {1: 9}
    assert gc_at_wal_start(str(tmp_path / "gone"), {0: 50}, {}) is None
