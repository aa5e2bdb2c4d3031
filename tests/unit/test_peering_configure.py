"""`Peering.configure_peers` (node/process/peering.py): a running node's appliers follow the new
list at once; before the node runs (a join polls the list each round, tests/integration/
test_join_peers.py) the list is only kept, and no applier starts: the node starts them from it
once it runs."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from node.process.peering import Peering


@pytest.mark.parametrize("status, links", [("running", [["127.0.0.1:2", "127.0.0.1:3"]]), ("joining", []),
                                           ("waiting", [])])
def test_new_peers_take_effect_on_links_only_on_a_running_node(status, links):
    p = Peering(SimpleNamespace(status=status), ["127.0.0.1:1"])
    asked: list[list[str]] = []
    p.set_peers = lambda peers: asked.append(peers) or []
    held = p.peers
    assert p.configure_peers(["127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:2"]) == []
    assert asked == links
    assert held is p.peers and p.peers == ["127.0.0.1:2", "127.0.0.1:3"]     # in place: every holder sees it


@pytest.mark.parametrize("status", ["stopping", "stopped", "lease_lost", "failed"])
def test_a_node_that_is_ending_starts_no_applier_and_stops_those_dropped(status, monkeypatch):
    """(node/rejoin.py brings the links back after a rebuild that failed: not on a node that
    stops, whatever ended it.)"""
    started: list[str] = []

    class Applier:
        def __init__(self, node, addr):
            self.addr = addr

        def start(self):
            started.append(self.addr)

        async def stop(self):
            pass
    monkeypatch.setattr("node.process.peering.Applier", Applier)
    old = Applier(None, "127.0.0.1:9")
    node = SimpleNamespace(status=status, appliers={"127.0.0.1:9": old}, cfg=SimpleNamespace(address="127.0.0.1:1"),
                           spawn=lambda coro, name: coro.close() or name)
    p = Peering(node, ["127.0.0.1:2"])
    assert p.set_peers(["127.0.0.1:2"]) == ["stop-applier-127.0.0.1:9"]
    assert started == [] and node.appliers == {}
