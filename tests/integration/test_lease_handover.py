"""An orderly stop of a lease node hands its rows over before the slot goes
(node/identity/lease_handover.py), on real `replog serve` processes.

A lease node's disk is meant to be ephemeral, and a released slot is taken at once by the next
container, which starts from a peer's snapshot. Before the hand-over, SIGTERM stopped the
relays and released the slot straight away: every acknowledged write no peer had taken yet was
left on the stopped container's disk only, and the replacement never had it (with a persistent
volume too: the dir is stale once another node held the slot)."""
from __future__ import annotations

import os
import shutil
import signal

from tests.integration.harness import wait_for
from tests.integration.oracles import Acked, acked_everywhere
from tests.integration.test_lease_cluster import running_lease_cluster

HANDING_OVER = "lease: handing over before releasing slot"


def test_sigterm_waits_until_a_peer_holds_the_rows_only_this_node_had(tmp_path, procs):
    nodes = running_lease_cluster(tmp_path, procs, 3, duration_s=3)
    leaving, others = nodes[0], nodes[1:]
    slot = leaving.info()["lease"]["slot"]

    # The others stop following the leaving node (a link cut): what it takes from now on is on its
    # disk only.
    for n in others:
        n.set_peers([o for o in nodes if o is not n and o is not leaving])
    wait_for(lambda: not [d for d in leaving.info()["downstreams"] if d["status"] == "subscribed"], 30,
             f"no peer following {leaving.name}")
    acked = Acked()
    for i in range(20):
        acked.put(leaving, "kv", f"only-here-{i}", {"i": i})
    assert all(n.kv_get("kv", "only-here-0")[0] == 404 for n in others)

    leaving.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: HANDING_OVER in leaving.log_text() or leaving.proc.poll() is not None, 30,
             f"{leaving.name} handing over or gone")
    assert leaving.proc.poll() is None, f"{leaving.name} released its slot with rows no peer had:\n" \
                                        f"{leaving.log_tail(20)}"
    status, body = leaving.get("/v1/health")
    assert (status, body.get("status")) == (503, "handing_over"), (status, body)
    assert leaving.put("/v1/spaces/kv/keys/late", {"v": 1})[0] == 503, "a write was taken while handing over"

    for n in others:              # the link is back: the leaving node gives its rows, then goes
        n.set_peers([o for o in nodes if o is not n])
    assert leaving.proc.wait(30) == 0, leaving.log_tail(20)
    assert "are held by" in leaving.log_text(), leaving.log_tail(20)

    # A fresh container (its disk gone) takes the released slot at the same address.
    shutil.rmtree(leaving.data_dir)
    leaving.start(wait=False)
    leaving.wait_healthy(60)
    assert leaving.info()["lease"]["slot"] == slot
    acked_everywhere(nodes, acked, 30)
    assert os.listdir(leaving.data_dir) == [f"slot-{slot}"]


def test_sigterm_with_no_peer_reachable_releases_after_the_bound_and_says_what_may_be_lost(tmp_path, procs):
    """A node none of whose peers come back waits out the bound, then releases and says so."""
    leaving, other = running_lease_cluster(tmp_path, procs, 2, duration_s=3)
    other.kill9()
    leaving.kv_put("kv", "only-here", {"v": 1})
    leaving.proc.send_signal(signal.SIGTERM)
    assert leaving.proc.wait(60) == 0, leaving.log_tail(20)
    text = leaving.log_text()
    assert HANDING_OVER in text and "no peer took this node's rows" in text, leaving.log_tail(20)
    assert "released" in text.rsplit(HANDING_OVER, 1)[1]


def test_sigterm_with_nothing_to_hand_over_stops_at_once(tmp_path, procs):
    leaving, other = running_lease_cluster(tmp_path, procs, 2, duration_s=3)
    leaving.kv_put("kv", "k", {"v": 1})
    wait_for(lambda: other.kv_get("kv", "k")[0] == 200, 30, "the row on the other node")
    leaving.proc.send_signal(signal.SIGTERM)
    assert leaving.proc.wait(30) == 0, leaving.log_tail(20)
    assert "are held by" in leaving.log_text()
    assert "no peer took" not in leaving.log_text()
