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
