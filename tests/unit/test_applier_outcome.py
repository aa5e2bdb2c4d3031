"""What an applier does after its link ends (node/applier/outcome.py): every way a link can end
has its next step, and the backoff grows, caps, and starts again after a healthy link."""
import asyncio
import logging

import aiohttp
import pytest

from node import limits
from node.applier.outcome import END, FATAL, REJOIN, RETRY, after_link, next_backoff
from node.core.link.applier import Resubscribe
from node.errors import PeerRefused, RemoteProtocolError, StorageError


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
