"""A peer that is shutting down for a restart, or has not joined a cluster yet, refuses links
with `not_ready` for a moment. A real node keeps trying it as it would a peer that is down
(its reconnect backoff, about a second at most), shows the link disconnected with the reason,
logs it without an ERROR, and follows the peer as soon as it serves. (It used to take the
refusal for a lasting one: an ERROR line, and 5 to 15 s before the next try, so a member
restarted under load was followed again that much later.)"""
from __future__ import annotations

import pytest

from node import limits
from tests.integration.fakepeer import FakePeer, running
from tests.integration.harness import ReplogProcess, mesh, wait_for
from tests.integration.oracles import upstream

SECRET = b"the cluster secret of a peer that restarts"


@pytest.fixture
def node(tmp_path, procs):
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    a = ReplogProcess(tmp_path, "a", extra=["--secret-file", str(secret)])
    procs.append(a)
    a.start()
    return a


def test_a_peer_refusing_with_not_ready_is_retried_within_the_backoff_and_followed_once_it_serves(node):
    with running(FakePeer(SECRET), node.address) as (peer, _):
        peer.refusing = ("not_ready", "this node is shutting down")
        node.set_peers([peer])
        # A lasting refusal waits refused_backoff_s (jittered to at least half of it) between
        # tries: three tries inside that half are the backoff's, not the refusal's.
        wait_for(lambda: peer.links >= 3, 0.5 * limits.refused_backoff_s, "three tries of the refusing peer")
        up = upstream(node, peer.address)
        assert up["status"] == "disconnected" and up["error"] == "not_ready: this node is shutting down", up
        peer.refusing = None                            # the peer is back
        wait_for(lambda: upstream(node, peer.address).get("status") == "follow", 10, "the node following the peer")
        assert peer.subscribes >= 1
    said = [line for line in node.log_text().splitlines() if "not_ready" in line]
    assert said and not [line for line in said if " ERROR " in line], said


def test_a_member_stopping_closes_its_followers_links_as_going_away_and_they_say_so_quietly(tmp_path, procs):
    """An orderly stop closes every link with the WebSocket's going-away code: its followers log
    why at INFO instead of a WARNING that the connection broke, and follow it again when it
    is back."""
    a, b = mesh(tmp_path, 2)
    procs.extend([a, b])
    wait_for(lambda: upstream(a, b.address).get("status") == "follow", 30, "A following B")
    b.stop()
    wait_for(lambda: "it closed the link as it stops" in a.log_text(), 10, "A telling why B's link closed")
    about_b = [line for line in a.log_text().splitlines() if f"applier {b.address}" in line]
    assert not [line for line in about_b if line.split()[1:2] in (["WARNING"], ["ERROR"])], about_b
    b.start()
    wait_for(lambda: upstream(a, b.address).get("status") == "follow", 30, "A following B again")
