"""A greeting counts the rows a node is still writing (node/lifecycle.py greeting_fields: the
claimed vclock by uuid), and a relay sends no heartbeat while rows of its subscriber's own are
claimed here and not applied yet (node/core/link/relay.py): a member that lost its store and is
fenced hears how many of its rows each member holds *or is writing*, so it cannot lift its fence
and write an lsn again whose earlier row is on its way to a peer's disk (the simulation's full
mix, seed 1134, invariant 1: C had D's row 1 queued for 14 ticks while D, rebuilt, heard C's
applied vclock, lifted its fence and wrote a second row 1). And a subscriber does not take such
a relay's word as false (DisproveClaim at the first idle heartbeat) before those rows can come."""
from __future__ import annotations

from types import SimpleNamespace

from node import limits
from node.core import messages as m
from node.core.lifecycle_fence import hear_greeting
from node.core.link.ready import Send
from node.core.membership import OwnRowsFence
from node.core.rows import GROUP_DEFAULT, OP_PUT, Op, Txn
from node.lifecycle import Lifecycle
from tests.unit.test_link_relay_machine import NOW, SELF, SUB, Host, new_core, relay, streaming

WALL_US = 1_700_000_000_000_000


def test_a_greeting_says_the_rows_a_node_is_still_writing():
    core = new_core()                                   # applied {1: 9, 2: 4}
    core.claimed.follow(2, 6)                           # the subscriber's rows 5-6 are on their way
    store = SimpleNamespace(get_meta=lambda key, default=None: {"cluster_uuid": "c-1"}.get(key, default))
    node = SimpleNamespace(store=store, core=core, uuid=SELF, options_digest="d", lease=None, data_dir="/nonexistent",
                           cfg=SimpleNamespace(transient=False, cluster_wait_for=0))
    fields = Lifecycle(node).greeting_fields()
    assert fields["vclock_uuid"] == {SELF: 9, SUB: 6}
    assert core.vclock_by_uuid() == {SELF: 9, SUB: 4}   # what it has applied: still 4


def test_a_fenced_member_waits_for_its_rows_a_peer_is_still_writing():
    core = new_core()                                   # SELF lost its store: fenced, 9 of its rows here
    core.fence = OwnRowsFence("the store was lost", rebuilt=True)
    claims: dict = {}
    hear_greeting(core, claims, set(), {"uuid": SUB, "vclock_uuid": {SELF: 11, SUB: 4}, "cluster": []}, SELF)
    assert core.fence.target() == 11 and claims[SUB][0] == 11
    assert not core.fence_state()[0]                    # rows 10-11 must come back first


def test_a_relay_sends_no_heartbeat_while_rows_of_the_subscribers_own_are_claimed_and_not_applied():
    host = Host()
    mach = streaming(relay(host))
    host.core.claimed.follow(2, 5)                      # the subscriber's row 5: claimed, not applied
    mach.tick(NOW + limits.heartbeat_interval_s, 7)
    assert mach.ready().send == ()
    host.core.commit([Txn(2, 5, GROUP_DEFAULT, WALL_US, (Op(OP_PUT, "kv", "k", 1),))])
    mach.tick(NOW + limits.heartbeat_interval_s, 8)
    assert mach.ready().send == (Send(m.HEARTBEAT, {"now_us": 8}),)


def test_rows_of_other_origins_in_flight_hold_no_heartbeat_back():
    host = Host()
    mach = streaming(relay(host))
    host.core.claimed.follow(1, 12)                     # this node's own rows, being written
    mach.tick(NOW + limits.heartbeat_interval_s, 7)
    assert mach.ready().send == (Send(m.HEARTBEAT, {"now_us": 7}),)
