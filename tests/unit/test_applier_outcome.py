"""What a driver does after its link ends (node/applier/outcome.py): every way an applier's link
can end has its next step, the backoff grows, caps, starts again after a healthy link and is
jittered; every way a relay's link can end has its log line and its answer."""
import asyncio
import logging
import random

import aiohttp
import pytest

from node import limits
from node.applier.outcome import END, FATAL, REJOIN, RETRY, Retry, after_link, next_backoff, relay_end
from node.core.link.applier import Resubscribe
from node.errors import PeerNotReady, PeerRefused, PeerSilent, RemoteProtocolError, StorageError


def test_a_clean_end_retries_soon_and_keeps_the_links_status():
    a = after_link(None, 7.0)
    assert (a.then, a.status, a.delay, a.line) == (RETRY, None, limits.reconnect_backoff_min_s, "")


def test_need_rejoin_goes_to_the_rejoiner_and_retries_after_the_rejoin_wait():
    a = after_link(PeerRefused("need_rejoin", "collected"), 7.0)
    assert (a.then, a.status, a.delay, a.level) == (REJOIN, "need_rejoin", limits.rejoin_retry_s, logging.WARNING)


@pytest.mark.parametrize("code,status", [("self", "self"), ("duplicate", "duplicate"), ("secret", "refused"),
                                         ("expelled", "refused")])
def test_a_refusal_is_a_lasting_reason_said_loudly_and_retried_slowly(code, status):
    a = after_link(PeerRefused(code, "no"), 7.0)
    assert (a.then, a.status, a.delay, a.level) == (RETRY, status, limits.refused_backoff_s, logging.ERROR)
    assert a.line.startswith("refused: ")


def test_a_stale_lease_holder_is_retried_with_the_backoff_and_said_as_a_warning():
    """One side of the link is a stale lease holder: it stops within a lease duration, and the
    address may serve the slot's next holder then, so the link is tried again as a broken one
    is, not after the 10 s of a lasting refusal, and the line is no ERROR."""
    a = after_link(PeerRefused("lease_fenced", "127.0.0.1:7 claims lease slot 0 at version 1"), 0.4)
    assert (a.then, a.status, a.delay, a.level) == (RETRY, "lease_fenced", 0.4, logging.WARNING)
    assert a.error == a.line == "lease_fenced: 127.0.0.1:7 claims lease slot 0 at version 1"


@pytest.mark.parametrize("why", ["this node is shutting down", "this node has not joined a cluster yet"])
def test_an_upstream_not_ready_yet_is_retried_as_a_broken_link_is_and_said_quietly(why):
    """A member stopping for a restart, or one still joining, refuses links with `not_ready` for
    a moment: it is followed again as soon as a restarted peer is (the backoff), not after the
    slow wait of a lasting refusal, and the line is no ERROR."""
    a = after_link(PeerRefused("not_ready", why), 0.4)
    assert (a.then, a.status, a.delay, a.level) == (RETRY, "disconnected", 0.4, logging.INFO)
    assert a.error == a.line == f"not_ready: {why}"


def test_an_upstream_that_lost_its_lease_is_retried_as_a_restarting_peer_is():
    """A lease holder that lost its slot refuses links (`lease_lost`) while it exits, and a
    container platform starts its replacement, often at the same address: followed again with
    the backoff, not 10 s later, and no ERROR (the lease nemesis logged one per lost lease)."""
    a = after_link(PeerRefused("lease_lost", "this node lost lease slot 1 (...)"), 0.4)
    assert (a.then, a.status, a.delay, a.level) == (RETRY, "disconnected", 0.4, logging.INFO)


def test_an_upstream_that_heard_nothing_for_its_timeout_is_a_broken_link_retried_with_the_backoff():
    """A relay ends a link it heard nothing on for peer_timeout_s with `silent`: this node was
    stalled or stopped, or the network dropped everything. No lasting reason: the backoff, a WARNING."""
    a = after_link(PeerRefused("silent", "127.0.0.1:7302: no message for 10 s"), 0.4)
    assert (a.then, a.status, a.delay, a.level) == (RETRY, "disconnected", 0.4, logging.WARNING)
    assert a.line == "silent: 127.0.0.1:7302: no message for 10 s"


def test_a_peer_that_has_not_joined_yet_is_retried_as_a_broken_link_is_and_said_quietly():
    a = after_link(PeerNotReady("127.0.0.1:7302 has not joined a cluster yet"), 0.4)
    assert (a.then, a.status, a.delay, a.level) == (RETRY, "disconnected", 0.4, logging.INFO)
    assert a.line == "127.0.0.1:7302 has not joined a cluster yet"


@pytest.mark.parametrize("e", [RemoteProtocolError("junk"), ConnectionResetError(), OSError("unreachable"),
                               asyncio.TimeoutError(), aiohttp.ClientError("x")])
def test_a_broken_link_or_a_peers_bad_bytes_retry_after_the_current_backoff(e):
    a = after_link(e, 7.0)
    assert (a.then, a.status, a.delay) == (RETRY, "disconnected", 7.0)
    assert a.error, "the error shown is never empty, even for an exception without text"


def test_resubscribe_retries_at_once():
    a = after_link(Resubscribe("fence lifted"), 7.0)
    assert (a.then, a.status, a.delay) == (RETRY, "resubscribing", 0.0)


def test_the_disk_failing_stops_the_node_and_a_bug_ends_only_this_link():
    assert after_link(StorageError("EIO"), 7.0).then == FATAL
    bug = after_link(KeyError("oops"), 7.0)
    assert (bug.then, bug.status) == (END, "failed") and bug.error.startswith("KeyError")


def test_backoff_doubles_caps_and_starts_over_after_a_link_that_lived():
    b = limits.reconnect_backoff_min_s
    seen = [b]
    for _ in range(40):
        b = next_backoff(b, 0.0)
        seen.append(b)
    assert seen[1] == 2 * seen[0] and max(seen) == limits.reconnect_backoff_max_s == seen[-1]
    assert next_backoff(limits.reconnect_backoff_max_s, 10 * limits.reconnect_backoff_max_s + 1) \
        == limits.reconnect_backoff_min_s
    assert next_backoff(1.0, 10 * limits.reconnect_backoff_max_s) == min(2.0, limits.reconnect_backoff_max_s)


def test_retry_maps_each_end_with_the_backoff_it_had_then_doubles_it_for_the_next():
    r = Retry(random.Random(1))
    r.begin(100.0)
    first = r.end(ConnectionResetError(), 100.5)
    assert first.delay == limits.reconnect_backoff_min_s
    r.begin(101.0)
    assert r.end(ConnectionResetError(), 101.5).delay == next_backoff(limits.reconnect_backoff_min_s, 0.5)


def test_retry_starts_the_backoff_over_after_a_link_that_lived():
    r = Retry(random.Random(1))
    r.backoff = limits.reconnect_backoff_max_s
    r.begin(0.0)
    r.end(ConnectionResetError(), 10 * limits.reconnect_backoff_max_s + 1)
    assert r.backoff == limits.reconnect_backoff_min_s


def test_retry_jitters_every_wait_between_half_and_one_and_a_half_times_it():
    r = Retry(random.Random(7))
    waits = [r.jitter(2.0) for _ in range(500)]
    assert 1.0 <= min(waits) < 1.1 and 2.9 < max(waits) < 3.0
    assert r.jitter(0.0) == 0.0, "a resubscribe goes at once"


def test_a_relay_answers_a_refusal_with_its_code_and_says_it_as_a_warning():
    e = PeerRefused("expelled", "gone")
    end = relay_end(e, "b:1 (0badc0de)")
    assert (end.level, end.code, end.message, end.bug) == (logging.WARNING, "expelled", "gone", False)
    assert end.line == f"relay: refused b:1 (0badc0de): {e}"


def test_a_relay_answers_a_peers_bad_input_as_a_protocol_error():
    end = relay_end(RemoteProtocolError("junk"), "b:1")
    assert (end.level, end.code, end.message, end.bug) == (logging.INFO, "protocol", "junk", False)
    assert end.line == "relay: link to b:1 dropped: junk"


def test_a_relay_answers_a_peer_that_said_nothing_for_its_timeout_as_silent_not_as_a_protocol_error():
    end = relay_end(PeerSilent("b:1: no message for 10 s"), "b:1")
    assert (end.level, end.code, end.message, end.bug) == (logging.INFO, "silent", "b:1: no message for 10 s", False)


@pytest.mark.parametrize("e", [ConnectionResetError("reset"), asyncio.TimeoutError()])
def test_a_relay_answers_nobody_when_the_link_is_gone(e):
    end = relay_end(e, "b:1")
    assert (end.level, end.code, end.bug) == (logging.INFO, None, False)
    assert end.line.startswith("relay: link to b:1 lost: ")


@pytest.mark.parametrize("e", [KeyError("k"), OSError("not a connection error"), AssertionError("broken")])
def test_a_relay_reports_its_own_bug_to_the_node_and_answers_internal(e):
    end = relay_end(e, "b:1")
    assert (end.code, end.bug, end.line) == ("internal", True, "")
    assert end.message.startswith(f"{type(e).__name__}: ")
