"""A relay's greeting must still hold when its rows go (node/core/link/relay.py `rows_may_go`):
a greeting sent while this node's rebuilt store was fenced says every own `_cluster` row of it is
an earlier incarnation's, so the subscriber takes no ids from any of them; once the fence lifts,
the node restates its table and registers members under its own ids, and a link still running
under that greeting would teach the subscriber none of it (its map kept what the earlier
incarnation's rows said: the simulation's full mix, seed 181, invariant 7). The link ends with
ERROR greet_again before such rows go, and the subscriber greets again at once
(node/applier/outcome.py)."""
from __future__ import annotations

import logging

from node import limits
from node.applier.outcome import RETRY, after_link
from node.core import messages as m
from node.core.lifecycle_fence import own_history_lsn
from node.core.link.relay import GREET_AGAIN, RelayState
from node.cluster_space.table import STATE_ANON, STATE_MEMBER, ClusterTable, Member
from node.core.membership import OwnRowsFence
from node.core.replicaset import NodeCore
from node.core.vclock import VClock
from node.errors import PeerRefused
from tests.unit.test_link_relay_machine import NOW, SELF, SUB, Host, greeting, relay, streaming

WALL_US = 1_700_000_000_000_000


class FenceHost(Host):
    """A host whose greeting says what the node's does (node/process/peering.py)."""

    def greeting(self) -> dict:
        return greeting(SELF, own_history_lsn=own_history_lsn(self.core))


def fenced_stream(rebuilt: bool):
    host = FenceHost()
    host.core.fence = OwnRowsFence("the store was lost", rebuilt=rebuilt)
    return host, streaming(relay(host))


def test_a_link_greeted_while_a_rebuilt_store_was_fenced_ends_with_greet_again_once_the_fence_lifts():
    host, mach = fenced_stream(rebuilt=True)
    assert mach.history_said == limits.lsn_max
    assert mach.rows_may_go() and mach.ready().send == ()       # fenced: only history goes, as said
    restate = host.core.clear_fence(WALL_US)
    assert restate is not None and restate.lsn == 10             # own rows up to 9 are history now
    assert not mach.rows_may_go()
    rd = mach.ready()
    assert [s.mtype for s in rd.send] == [m.ERROR] and rd.send[0].body["code"] == GREET_AGAIN
    assert rd.stop is not None and rd.stop.error is None and "greets again" in rd.stop.note
    assert mach.state is RelayState.CLOSED


def test_a_link_greeted_after_the_lift_streams_on():
    host = FenceHost()
    host.core.fence = OwnRowsFence("the store was lost", rebuilt=True)
    host.core.clear_fence(WALL_US)
    mach = streaming(relay(host))
    assert mach.history_said == 9
    assert mach.rows_may_go() and mach.state is RelayState.STREAMING and mach.ready().send == ()


def test_a_fence_over_the_nodes_own_store_changes_no_greeting_and_its_links_stream_on_after_it():
    host, mach = fenced_stream(rebuilt=False)
    assert mach.history_said == 0
    assert host.core.clear_fence(WALL_US) is None
    assert mach.rows_may_go() and mach.state is RelayState.STREAMING


def test_a_greeting_that_says_no_history_bound_never_ends_a_link_for_it():
    host = Host()                                                 # its greeting has no own_history_lsn
    host.core.fence = OwnRowsFence("the store was lost", rebuilt=True)
    mach = streaming(relay(host))
    host.core.clear_fence(WALL_US)
    assert mach.history_said == 0 and mach.rows_may_go()


def test_a_relay_greeting_with_a_history_bound_that_is_not_an_integer_counts_as_none():
    host = Host()
    host.greeting = lambda: greeting(SELF, own_history_lsn="all")  # type: ignore[method-assign]
    mach = relay(host)
    mach.step(m.Message(m.GREETING, greeting("00000000-0000-4000-8000-000000000002")), NOW)
    assert mach.history_said == 0


def test_an_applier_told_to_greet_again_tries_again_at_once_and_says_why_at_info():
    e = PeerRefused(GREET_AGAIN, "this node's own rows are confirmed: greet again")
    nxt = after_link(e, 8.0)
    assert (nxt.then, nxt.status, nxt.delay, nxt.level) == (RETRY, "resubscribing", 0.0, logging.INFO)
    assert "greet again" in nxt.line


# --- an anonymous relay that registers (the simulation's full+anon mix, seeds 4088 and 6200) ------
# R, an anonymous replica, registered, crashed before its registration row was on disk, and came
# back anonymous; the members subscribed to it (R was in their peers) while it registered again.
# Its relay took each SUBSCRIBE with its own component cut at lsn_max (an anonymous node sends
# none of its own rows), and the links outlived the registration: R's own rows, its `_cluster`
# notes and every row written on it from then on, never reached those members (vclocks differ
# after healing).
def anon_core() -> NodeCore:
    table = ClusterTable([Member(SELF, 3, "1.example:1", STATE_ANON), Member(SUB, 2, "2.example:1", STATE_MEMBER)])
    return NodeCore(SELF, table, VClock({2: 4, 3: 2}), spaces={"kv": False})


def test_a_link_subscribed_while_this_node_was_anonymous_greets_again_once_it_is_a_member():
    host = Host(anon_core())
    mach = streaming(relay(host))
    assert mach.anon_cut and mach.sub[3] == limits.lsn_max     # none of our own rows go on it
    assert mach.rows_may_go() and mach.state is RelayState.STREAMING
    _, txn = host.core.register_member(SELF, "1.example:1", WALL_US)
    assert txn is not None and txn.replica_id == 3 and not host.core.anon
    assert not mach.rows_may_go()
    rd = mach.ready()
    assert [s.mtype for s in rd.send] == [m.ERROR] and rd.send[0].body["code"] == GREET_AGAIN
    assert "registered as a member" in rd.send[0].body["message"]
    assert rd.stop is not None and rd.stop.error is None and "member now" in rd.stop.note
    assert mach.state is RelayState.CLOSED


def test_a_link_subscribed_after_the_registration_carries_this_nodes_own_rows():
    host = Host(anon_core())
    host.core.register_member(SELF, "1.example:1", WALL_US)
    mach = streaming(relay(host))
    assert not mach.anon_cut and mach.sub.get(3, 0) < limits.lsn_max         # ours go from where it is
    assert mach.rows_may_go() and mach.state is RelayState.STREAMING


def test_an_anonymous_relay_that_stays_anonymous_streams_on():
    host = Host(anon_core())
    mach = streaming(relay(host))
    for _ in range(3):
        assert mach.rows_may_go()
    assert mach.state is RelayState.STREAMING and mach.ready().send == ()


def test_a_relay_read_while_the_node_swaps_its_store_at_a_rejoin_asks_nothing_of_the_missing_core():
    # node/process/opening.py reopen_after_rejoin closes every link, then drops the core before
    # the new store opens: a send loop that was reading its WAL asks once more on the way out
    for host in (Host(anon_core()), FenceHost()):
        mach = streaming(relay(host))
        host.core = None
        assert mach.rows_may_go() and mach.state is RelayState.STREAMING and mach.ready().send == ()
