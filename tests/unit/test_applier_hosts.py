"""The link machines' hosts over a node (node/applier/hosts.py): one link per member, claimed
when the applier machine names its peer and released when the link ends; the questions each
machine asks answered from the node (the journal's pending entries, a peer's claim on our own
rows, whether this node serves a WAL, where it was collected)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from node.applier.hosts import NodeApplierContext, NodeRelayContext
from node.core.membership import OwnRowsFence
from node.errors import PeerNotReady, PeerRefused

UP = "00000000-0000-4000-8000-000000000002"


def link(address: str, stopping: bool = False):
    return SimpleNamespace(address=address, stopping=stopping, peer_uuid=None)


def node(**kw):
    d = dict(followers={}, own_claims={}, journal=SimpleNamespace(pending=3), core=SimpleNamespace(fence=None),
             life=SimpleNamespace(advertised={}, moved_from={}))
    d.update(kw)
    return SimpleNamespace(**d)


def test_the_first_link_to_reach_a_member_keeps_it_and_another_address_of_it_is_refused():
    n = node()
    first, second = link("a:1"), link("b:1")
    NodeApplierContext(n, first).claim_link(UP)
    assert first.peer_uuid == UP and n.followers == {UP: first}
    with pytest.raises(PeerRefused) as e:
        NodeApplierContext(n, second).claim_link(UP)
    assert e.value.code == "duplicate" and n.followers == {UP: first}


def test_a_new_link_waits_while_a_removed_one_to_the_same_member_is_closing():
    n = node()
    old = link("a:1", stopping=True)
    n.followers[UP] = old
    with pytest.raises(ConnectionError):
        NodeApplierContext(n, link("b:1")).claim_link(UP)


def test_a_member_that_moved_is_followed_at_its_new_address_as_soon_as_the_old_link_ends():
    """A container took the member's lease slot at another address (or the node restarted
    there): the link at the address it advertises now is told to come back soon, not refused
    for a while as a second spelling is, and takes the member once the old link ends."""
    n = node()
    old, new = link("a:1"), link("b:1")
    NodeApplierContext(n, old).claim_link(UP)
    n.life.advertised[UP], n.life.moved_from[UP] = "b:1", {"a:1"}
    with pytest.raises(PeerNotReady, match="moved here from a:1"):
        NodeApplierContext(n, new).claim_link(UP)
    assert n.followers == {UP: old}
    NodeApplierContext(n, old).release()                # its peer went, or was fenced
    NodeApplierContext(n, new).claim_link(UP)
    assert n.followers == {UP: new}


def test_a_link_to_an_address_the_member_no_longer_advertises_is_a_duplicate_still():
    n = node()
    first = link("b:1")
    NodeApplierContext(n, first).claim_link(UP)
    n.life.advertised[UP], n.life.moved_from[UP] = "b:1", {"a:1"}
    with pytest.raises(PeerRefused) as e:               # the address it left (a zombie still answering)
        NodeApplierContext(n, link("a:1")).claim_link(UP)
    assert e.value.code == "duplicate"
    n.life.advertised[UP], n.life.moved_from[UP] = "c:1", {"d:1"}
    with pytest.raises(PeerRefused) as e:               # a second spelling: the member never left b:1
        NodeApplierContext(n, link("c:1")).claim_link(UP)
    assert e.value.code == "duplicate" and n.followers == {UP: first}


def test_a_link_releases_only_its_own_claim():
    n = node()
    first, second = link("a:1"), link("b:1")
    NodeApplierContext(n, first).claim_link(UP)
    second.peer_uuid = UP
    NodeApplierContext(n, second).release()          # refused earlier: it holds nothing
    assert n.followers == {UP: first}
    NodeApplierContext(n, first).release()
    assert n.followers == {}


def test_the_applier_machine_hears_the_journals_pending_entries_and_a_peers_claim_or_what_a_fence_heard():
    n = node(own_claims={UP: (7, "a:1")})
    ctx = NodeApplierContext(n, link("a:1"))
    assert ctx.journal_pending() == 3 and ctx.own_claim(UP) == 7
    fence = OwnRowsFence(9, "rejoined")
    fence.heard[UP] = 12
    n.core = SimpleNamespace(fence=fence)
    assert ctx.own_claim(UP) == 12


def test_a_node_without_a_wal_serves_no_subscriber_and_one_never_collected_has_collected_nothing():
    store = SimpleNamespace(get_meta=lambda key: None)
    ctx = NodeRelayContext(SimpleNamespace(journal=None, store=store, lease=None, status="joining", status_reason="no donor",
                                           core=None))
    assert not ctx.serves_wal() and ctx.gc_vclock() == {} and ctx.status() == ("joining", "no donor")
    assert not NodeRelayContext(SimpleNamespace(journal=SimpleNamespace(wal=None))).serves_wal()
    collected = SimpleNamespace(get_meta=lambda key: {1: 5} if key == "gc_vclock" else None)
    ctx = NodeRelayContext(SimpleNamespace(journal=SimpleNamespace(wal=object()), store=collected, core=None))
    assert ctx.serves_wal() and ctx.gc_vclock() == {1: 5} and ctx.core is None


def test_a_links_subscribe_goes_without_what_the_nodes_rejoin_watch_goes_without():
    """The applier machine asks the host (SUBSCRIBE `without`); the node's rejoin watch answers
    (node/rejoin.py Rejoiner.going_without, the machine's): the expelled members' uuids only."""
    from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
    from node.core.replicaset import NodeCore
    from node.core.vclock import VClock
    from node.rejoin import Rejoiner
    gone = "00000000-0000-4000-8000-000000000004"
    table = ClusterTable([Member(UP, 1, "a:1", STATE_MEMBER), Member(gone, 2, "g:1", STATE_EXPELLED, 0, 9)])
    n = node(core=NodeCore(UP, table, VClock({2: 3}), spaces={"kv": False}))
    n.rejoiner = Rejoiner(n)
    ctx = NodeApplierContext(n, link("a:1"))
    assert ctx.going_without() == []
    n.rejoiner.machine.without = {gone: 6}
    assert ctx.going_without() == [gone]
    n.core.vclock = VClock({2: 6})                   # the rows came: nothing gone without
    assert ctx.going_without() == []
