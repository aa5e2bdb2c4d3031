"""The hybrid clock's edges (node/core/hlc.py), found unpinned by mutation testing (issue 18):
every comparison at its boundary (a timestamp equal to the clock, the bound itself, one past it)
and every branch (a wall clock ahead, level, behind; an observed timestamp ahead, level, behind)."""
from __future__ import annotations

import pytest

from node import limits
from node.core.hlc import HLC, TS_MAX


def test_the_clock_bound_is_the_largest_row_timestamp():
    assert TS_MAX == limits.timestamp_us_max


def test_a_new_clock_starts_at_zero_and_its_first_tick_is_the_wall_clock():
    h = HLC()
    assert h.last == 0
    assert h.now(1) == 1


def test_a_clock_may_start_at_zero_and_at_the_bound_but_not_below_zero_or_past_the_bound():
    assert HLC(0).last == 0
    assert HLC(TS_MAX).last == TS_MAX
    with pytest.raises(AssertionError, match="past its bound"):
        HLC(-1)
    with pytest.raises(AssertionError, match="past its bound"):
        HLC(TS_MAX + 1)


def test_a_wall_clock_ahead_of_the_clock_is_taken_as_it_is():
    h = HLC(10)
    assert h.now(15) == 15 and h.last == 15


def test_a_wall_clock_equal_to_the_clock_still_moves_it_on_by_exactly_one():
    h = HLC(10)
    assert h.now(10) == 11 and h.last == 11


def test_a_wall_clock_behind_the_clock_moves_it_on_by_exactly_one():
    h = HLC(10)
    assert h.now(3) == 11
    assert h.now(3) == 12 and h.last == 12


def test_the_clock_may_tick_onto_the_bound_but_never_past_it():
    h = HLC(TS_MAX - 1)
    assert h.now(0) == TS_MAX
    with pytest.raises(AssertionError, match="reached its bound"):
        h.now(0)
    assert HLC(0).now(TS_MAX) == TS_MAX


def test_a_wall_clock_past_the_bound_is_refused():
    with pytest.raises(AssertionError, match="reached its bound"):
        HLC(0).now(TS_MAX + 1)


def test_an_observed_timestamp_ahead_of_the_clock_moves_it_there_and_the_next_tick_follows_it():
    h = HLC(10)
    h.observe(20)
    assert h.last == 20
    assert h.now(5) == 21


def test_an_observed_timestamp_equal_to_or_behind_the_clock_leaves_it_where_it_is():
    h = HLC(10)
    h.observe(10)
    assert h.last == 10
    h.observe(4)
    assert h.last == 10
    assert h.now(0) == 11


def test_a_timestamp_at_the_bound_may_be_observed_but_one_past_it_is_refused():
    h = HLC(0)
    h.observe(TS_MAX)
    assert h.last == TS_MAX
    with pytest.raises(AssertionError, match="past the bound"):
        HLC(0).observe(TS_MAX + 1)


def test_observe_returns_nothing_and_now_returns_the_clock_it_set():
    h = HLC(7)
    assert h.observe(9) is None
    t = h.now(0)
    assert t == h.last == 10


def test_a_clock_holds_nothing_but_its_last_timestamp():
    h = HLC(1)
    with pytest.raises(AttributeError):
        h.other = 2
