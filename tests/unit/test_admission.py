"""Bounds on unauthenticated links (node/core/admission.py): handshakes in flight, in total and
per remote address, and one failed-auth log line per address per interval."""
import pytest

from node.core.admission import OTHERS, FailureLog, HandshakeGate


def test_the_gate_admits_up_to_the_per_address_bound_then_refuses_that_address_only():
    g = HandshakeGate(total_max=10, per_address_max=3)
    assert [g.admit("1.1.1.1") for _ in range(3)] == [None, None, None]
    why = g.admit("1.1.1.1")
    assert why is not None and "from 1.1.1.1" in why
    assert g.admit("2.2.2.2") is None, "another address is not held back by the first"
    g.release("1.1.1.1")
    assert g.admit("1.1.1.1") is None, "a finished handshake frees its place"
    assert g.refused == 1


def test_the_gate_refuses_every_address_at_the_total_bound():
    g = HandshakeGate(total_max=4, per_address_max=3)
    for a in ("a", "a", "a", "b"):
        assert g.admit(a) is None
    assert "the most this node takes" in g.admit("c")
    for a in ("a", "a", "a", "b"):
        g.release(a)
    assert (g.total, g.by_address) == (0, {})


def test_a_release_without_an_admit_is_a_bug():
    g = HandshakeGate(total_max=4, per_address_max=3)
    with pytest.raises(AssertionError):
        g.release("never")


def test_failures_log_one_line_per_address_per_interval_with_the_count_left_out():
    log = FailureLog(interval_s=60, addresses_max=100)
    assert log.note("1.1.1.1", 0.0) == (True, 0)
    assert [log.note("1.1.1.1", t)[0] for t in (1.0, 2.0, 59.0)] == [False, False, False]
    assert log.note("2.2.2.2", 3.0) == (True, 0), "each address has its own window"
    assert log.note("1.1.1.1", 60.0) == (True, 3), "the next line says how many were not logged"
    assert log.failures == 6


def test_addresses_beyond_the_bound_share_one_line():
    log = FailureLog(interval_s=60, addresses_max=3)
    for i in range(3):
        assert log.note(f"10.0.0.{i}", 0.0) == (True, 0)
    assert log.note("10.0.0.99", 1.0) == (True, 0)       # the first of the rest: the shared line
    assert log.note("10.0.0.100", 2.0) == (False, 1)
    assert OTHERS in log._windows and len(log._windows) == 4
    assert log.note("10.0.0.101", 61.0) == (True, 0), "expired windows make room again"


def test_a_gate_or_a_failure_log_with_a_bound_of_zero_is_a_callers_bug():
    """Issue 18 (mutation testing): the constructors' checks are pinned; a bound of 0 would
    refuse every handshake, or log nothing, without a word."""
    for args in ((0, 1), (1, 0)):
        with pytest.raises(AssertionError):
            HandshakeGate(*args)
        with pytest.raises(AssertionError):
            FailureLog(*args)


def test_a_refusal_at_the_total_bound_is_counted_too():
    g = HandshakeGate(total_max=1, per_address_max=1)
    assert g.admit("a") is None and g.admit("b") is not None
    assert g.refused == 1


def test_releasing_an_address_that_was_not_admitted_is_a_bug_even_while_others_are_in():
    g = HandshakeGate(total_max=4, per_address_max=3)
    g.admit("a")
    with pytest.raises(AssertionError, match="release without admit for b"):
        g.release("b")
    assert (g.total, g.by_address) == (1, {"a": 1})


def test_a_failure_windows_interval_counts_from_when_it_opened():
    log = FailureLog(interval_s=60, addresses_max=10)
    assert log.note("a", 100.0) == (True, 0)
    assert log.note("a", 101.0) == (False, 1)
    assert log.note("a", 160.0) == (True, 1)


def test_a_known_address_keeps_its_window_when_the_others_are_full():
    log = FailureLog(interval_s=60, addresses_max=2)
    log.note("a", 0.0)
    log.note("b", 0.0)
    assert log.note("a", 1.0) == (False, 1) and OTHERS not in log._windows


def test_expiry_frees_room_for_an_address_of_its_own_once_windows_are_exactly_an_interval_old():
    log = FailureLog(interval_s=60, addresses_max=3)
    for a in ("a", "b", "c"):
        log.note(a, 0.0)
    assert log.note("d", 30.0) == (True, 0) and OTHERS in log._windows     # no room: the shared line
    assert log.note("e", 59.0) == (False, 1)                                # none has expired yet
    assert log.note("f", 60.0) == (True, 0) and "f" in log._windows         # a, b and c expired at 60
