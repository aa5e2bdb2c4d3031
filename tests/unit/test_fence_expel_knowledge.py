"""A fence waits for no expelled member, so a member whose word it counts must know of that
expel when it speaks (node/core/membership.py OwnRowsFence.unaware): one that did not could take
from the expelled member, after its word, a row of the fenced node's that member alone kept,
which the fenced node then writes again under the same lsn (tests/sim/test_scenarios_expel.py,
the fence that lifts only once the members it heard know). A fenced node's greeting states the
expels it heard (`expels_heard`); a member expels those too before its greeting answers or its
SUBSCRIBE goes; the fenced node's links are begun again until the word it counts knows."""
from __future__ import annotations

from node import limits
from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core import messages as m
from node.core.link.applier import ApplierMachine, ApplierState, Resubscribe
from node.core.link.ready import Persist, Send
from node.core.link.relay import GREET_AGAIN, RelayState
from node.core.membership import OwnRowsFence, news_for
from node.core.replicaset import NodeCore
from node.core.rows import GROUP_CLUSTER
from node.core.validate_msgs import greeting_error
from node.core.vclock import VClock
from tests.unit.test_link_applier_machine import Host as AHost, greeting as agreeting
from tests.unit.test_link_relay_machine import NOW, SELF, SUB, Host, greeting, relay, subscribe

B = "00000000-0000-4000-8000-00000000000b"
WALL = 1_700_000_000_000_000


def core(fenced: bool = False) -> NodeCore:
    table = ClusterTable([Member(SELF, 1, "1.example:1", STATE_MEMBER), Member(SUB, 2, "2.example:1", STATE_MEMBER),
                          Member(B, 3, "b.example:1", STATE_MEMBER)])
    c = NodeCore(SELF, table, VClock({1: 9, 2: 4, 3: 6}), spaces={"kv": False})
    if fenced:
        c.fence = OwnRowsFence("the store was lost")
    return c


class PeeringHost(Host):
    """A host whose greeting is built as node/process/peering.py builds it."""

    def greeting(self) -> dict:
        g = greeting(SELF, cluster=self.core.greeting_rows())
        heard = self.core.expels_heard()
        if heard:
            g["expels_heard"] = heard
        return g

    def check_peer_greeting(self, theirs: dict) -> None:
        vu = theirs.get("vclock_uuid") or {}
        self.core.observe_peer(theirs["uuid"], vu, theirs.get("cluster") or [],
                               expels_heard=theirs.get("expels_heard") or ())


# --- what a greeting says, and who takes it ---------------------------------------------------
def test_a_fenced_node_states_the_expels_it_heard_and_an_unfenced_one_states_none():
    c = core(fenced=True)
    assert c.expels_heard() == []
    c.fence.expelled.add(B)
    c.fence.expelled.add("00000000-0000-4000-8000-0000000000ff")    # not in its table: nothing to name
    assert c.expels_heard() == [B]
    c.fence = None
    assert c.expels_heard() == []


def test_an_upstreams_heard_expel_is_a_row_of_ours_before_we_subscribe():
    c = core()
    txns = c.greeting(SUB, [mem.to_row() for mem in c.table.members()], WALL, 0, [B])
    assert c.table.expelled(B) and c.table.get(B).expelled_lsn == 6       # bound: the rows of it we hold
    assert [(t.group, [o.key for o in t.ops]) for t in txns] == [(GROUP_CLUSTER, [B])]


def test_a_heard_expel_of_ourselves_or_of_an_unknown_member_writes_nothing():
    c = core()
    assert c.greeting(SUB, [mem.to_row() for mem in c.table.members()], WALL, 0,
                      [SELF, "00000000-0000-4000-8000-0000000000ff"]) == []
    assert c.table.get(SELF).state == STATE_MEMBER
    assert c.adopt_expels(SUB, [SELF], WALL) is None


def test_a_fenced_node_writes_no_heard_expel_but_hears_it_and_says_it_on():
    c = core(fenced=True)
    assert c.greeting(SUB, [mem.to_row() for mem in c.table.members()], WALL, 0, [B]) == []
    assert c.adopt_expels(SUB, [B], WALL) is None
    assert c.table.get(B).state == STATE_MEMBER
    c.observe_peer(SUB, {}, [], expels_heard=[B])
    assert c.fence.is_expelled(c.table, B) and c.expels_heard() == [B]


def test_the_expels_a_fence_heard_are_written_when_it_lifts_before_any_link_subscribes_again():
    c = core(fenced=True)
    c.fence.expelled.add(B)
    txn = c.clear_fence(WALL)
    assert txn is not None and [o.key for o in txn.ops] == [B] and txn.lsn == 10
    assert c.table.expelled(B)
    plain = core(fenced=True)
    assert plain.clear_fence(WALL) is None                   # nothing heard: nothing to write


def test_a_greeting_names_at_most_members_max_canonical_uuids_as_heard_expels():
    base = greeting(SUB) | {"status": "running", "cluster_uuid": "00000000-0000-4000-8000-0000000000cc"}
    assert greeting_error(base | {"expels_heard": [B]}) is None
    for bad in ("x", [1], ["not-a-uuid"], {B: 1}, [B] * (limits.members_max + 1)):
        assert "expels_heard" in (greeting_error(base | {"expels_heard": bad}) or ""), bad
    assert greeting_error(base | {"expels_heard": [B] * limits.members_max}) is None
    # the first error found is the one told
    assert "host:port" in greeting_error(base | {"address": "no port", "expels_heard": "x"})
    assert m.decode(m.encode(m.GREETING, **(base | {"expels_heard": [B]})))["expels_heard"] == [B]


# --- the relay's side --------------------------------------------------------------------------
def test_a_relay_expels_what_a_fenced_subscriber_heard_on_disk_before_its_greeting_says_so():
    host = PeeringHost(core())
    mach = relay(host)
    mach.step(m.Message(m.GREETING, greeting(SUB, expels_heard=[B])), NOW)
    rd = mach.ready()
    assert [type(p) for p in rd.persist] == [Persist] and [o.key for t in rd.persist[0].entry.txns
                                                           for o in t.ops] == [B]
    assert rd.persist[0].entry.txns[0].timestamp >= int(NOW * 1e6)        # stamped at the step's time
    reply = rd.send[0]
    assert reply.mtype == m.GREETING and [r[3] for r in reply.body["cluster"] if r[0] == B] == [STATE_EXPELLED]
    assert mach.state is RelayState.REQUEST


def test_a_fenced_relay_has_a_subscriber_that_spoke_unknowing_greet_again_once_per_news():
    host = PeeringHost(core(fenced=True))
    host.core.fence.expelled.add(B)
    for attempt in range(2):
        mach = relay(host)
        mach.step(m.Message(m.GREETING, greeting(SUB, vclock_uuid={SELF: 3})), NOW)
        rd = mach.ready()
        assert rd.send[0].body["expels_heard"] == [B]            # told
        mach.advance(rd)
        assert host.core.fence.unaware(host.core.table, SELF) == {SUB: [B]}
        mach.step(subscribe({1: 3, 2: 4}), NOW)
        rd = mach.ready()
        if attempt == 0:
            assert [s.body.get("code") for s in rd.send] == [GREET_AGAIN] and mach.state is RelayState.CLOSED
        else:                                                      # told the same before: no loop
            assert rd.send[-1].mtype == m.SUBSCRIBED and mach.state is RelayState.STREAMING
    mach = relay(host)
    mach.step(m.Message(m.GREETING, greeting(SUB, vclock_uuid={SELF: 3},
                                             cluster=[[B, 3, "b.example:1", STATE_EXPELLED, 0, 6]])), NOW)
    assert host.core.fence.unaware(host.core.table, SELF) == {}


def test_a_streaming_link_whose_greeting_did_not_state_an_expel_the_fence_now_relies_on_greets_again():
    host = PeeringHost(core(fenced=True))
    mach = relay(host)
    mach.step(m.Message(m.GREETING, greeting(SUB, vclock_uuid={SELF: 3})), NOW)
    mach.advance(mach.ready())
    mach.step(subscribe({1: 3, 2: 4}), NOW)
    mach.advance(mach.ready())
    assert mach.state is RelayState.STREAMING and mach.rows_may_go()
    host.core.fence.expelled.add(B)                               # heard since, past a gap
    assert news_for(host.core.fence, host.core.table, SELF, SUB, mach.mine) == [B]
    assert not mach.rows_may_go()
    rd = mach.ready()
    assert rd.send == (Send(m.ERROR, rd.send[0].body),) and rd.send[0].body["code"] == GREET_AGAIN


# --- the applier's side -------------------------------------------------------------------------
def _applier(fenced: bool) -> tuple[NodeCore, ApplierMachine]:
    c = core(fenced=fenced)
    c.observe_peer(SUB, {}, [])                      # SUB speaks first, knowing nothing
    return c, ApplierMachine(c, AHost(), "2.example:1", authenticated=SUB)


def test_an_applier_whose_greeting_did_not_state_an_expel_its_fence_now_relies_on_greets_again():
    c, mach = _applier(fenced=True)
    rows = [mem.to_row() for mem in c.table.members()]
    mach.start(agreeting(SELF))                      # sent before the fence heard of B's expel
    mach.advance(mach.ready())
    mach.step(m.Message(m.GREETING, agreeting(SUB, rows)), NOW)
    mach.advance(mach.ready())
    mach.step(m.Message(m.SUBSCRIBED, {"vclock": {}}), NOW)
    mach.advance(mach.ready())
    mach.tick(NOW)
    mach.advance(mach.ready())
    assert mach.state is ApplierState.FOLLOW
    c.fence.expelled.add(B)                          # heard since
    mach.tick(NOW + 60)                              # (an ACK would be due by now)
    rd = mach.ready()
    assert mach.state is ApplierState.STOPPED and isinstance(rd.stop.error, Resubscribe)
    assert rd.send == ()                             # nothing more goes on a stopped link
    assert "greeting it again" in str(rd.stop.error)


def test_an_applier_that_stated_the_expel_does_not_greet_again_for_it():
    c, mach = _applier(fenced=True)
    c.fence.expelled.add(B)
    rows = [mem.to_row() for mem in c.table.members()]
    mach.start(agreeting(SELF, expels_heard=c.expels_heard()))
    mach.advance(mach.ready())
    mach.step(m.Message(m.GREETING, agreeting(SUB, rows)), NOW)
    mach.advance(mach.ready())
    mach.step(m.Message(m.SUBSCRIBED, {"vclock": {}}), NOW)
    mach.advance(mach.ready())
    mach.tick(NOW + 1)
    assert mach.state is ApplierState.FOLLOW          # told: its next greeting is its own business


def test_an_unfenced_applier_expels_what_its_fenced_upstream_heard_before_it_subscribes():
    c = core()
    mach = ApplierMachine(c, AHost(), "2.example:1", authenticated=SUB)
    mach.start(agreeting(SELF))
    mach.advance(mach.ready())
    mach.step(m.Message(m.GREETING, agreeting(SUB, [mem.to_row() for mem in c.table.members()],
                                              expels_heard=[B])), NOW)
    rd = mach.ready()
    assert [o.key for p in rd.persist for t in p.entry.txns for o in t.ops] == [B] and c.table.expelled(B)
    # our greeting went before we knew: the link greets again (the upstream's fence waits for a
    # word of ours that knows), and the next one, stating B, subscribes
    assert rd.send == () and mach.state is ApplierState.STOPPED
    mach.advance(rd)
    again = ApplierMachine(c, AHost(), "2.example:1", authenticated=SUB)
    again.start(agreeting(SELF, [mem.to_row() for mem in c.table.members()]))
    again.advance(again.ready())
    again.step(m.Message(m.GREETING, agreeting(SUB, [mem.to_row() for mem in c.table.members()],
                                               expels_heard=[B])), NOW)
    assert [s.mtype for s in again.ready().send] == [m.SUBSCRIBE]


# --- edges the mutation run found unguarded ------------------------------------------------------
def test_a_fenced_node_never_names_itself_among_the_expels_it_states():
    c = core(fenced=True)
    c.fence.expelled |= {SELF, B}
    assert c.expels_heard() == [B]


def test_heard_expels_skip_ourselves_and_members_already_expelled_and_go_on_past_them():
    c = core()
    c.table.upsert(Member(SUB, 2, "2.example:1", STATE_EXPELLED, 0, 4))
    txn = c.adopt_expels(SUB, [SELF, SUB, B], WALL)
    assert txn is not None and [o.key for o in txn.ops] == [B]


def test_an_expelled_node_expels_nobody_from_a_greeting():
    c = core()
    c.table.upsert(Member(SELF, 1, "1.example:1", STATE_EXPELLED, 0, 9))
    assert c.adopt_expels(SUB, [B], WALL) is None and not c.table.expelled(B)


def test_a_heard_expels_bound_is_stated_only_as_far_as_this_nodes_disk_backs_it():
    """Adopted, B's bound is the rows of it we claimed (6); a greeting states it as far as they
    are on disk (none yet), as for every bound this node raised (NodeCore.greeting_rows)."""
    c = core()
    c.synced = VClock({1: 9, 2: 4})
    c.adopt_expels(SUB, [B], WALL)
    assert c.table.get(B).expelled_lsn == 6
    assert [r[5] for r in c.greeting_rows() if r[0] == B] == [0]


def test_a_member_listed_as_a_member_in_a_greeting_is_not_known_expelled_by_its_sender():
    c = core(fenced=True)
    c.fence.expelled.add(B)
    c.observe_peer(SUB, {}, [mem.to_row() for mem in c.table.members()])     # B is a member there
    assert c.fence.unaware(c.table, SELF) == {SUB: [B]}
    c.observe_peer(SUB, {}, [[B, 3, "b.example:1", STATE_EXPELLED, 0, 6]])
    assert c.fence.unaware(c.table, SELF) == {}


def test_the_expels_a_fence_hears_are_capped_at_members_max(monkeypatch):
    c = core(fenced=True)
    monkeypatch.setattr("node.limits.members_max", 2)
    c.observe_peer(SUB, {}, [], expels_heard=[f"{i:08x}-0000-4000-8000-000000000000" for i in range(4)])
    assert len(c.fence.expelled) == 2


def test_a_fenced_relays_greeting_states_the_expels_a_subscribers_greeting_just_told_it():
    host = PeeringHost(core(fenced=True))
    mach = relay(host)
    mach.step(m.Message(m.GREETING, greeting(SUB, expels_heard=[B])), NOW)
    rd = mach.ready()
    assert rd.persist == () and rd.send[0].body["expels_heard"] == [B]      # heard, not written


def test_a_fenced_relay_whose_greeting_did_not_state_an_expel_streams_and_then_greets_again_for_it():
    """Our greeting on this link told the subscriber nothing: a greet_again at its SUBSCRIBE
    would bring the same word back; the link streams, and its first read ends it (news_for)."""
    host = Host(core(fenced=True))                    # a greeting without expels_heard
    host.core.fence.expelled.add(B)
    host.core.observe_peer(SUB, {}, [])
    mach = relay(host)
    mach.step(m.Message(m.GREETING, greeting(SUB)), NOW)
    mach.advance(mach.ready())
    mach.step(subscribe({1: 3, 2: 4}), NOW)
    rd = mach.ready()
    assert rd.send[-1].mtype == m.SUBSCRIBED and mach.state is RelayState.STREAMING
    mach.advance(rd)
    assert not mach.rows_may_go() and mach.ready().send[0].body["code"] == GREET_AGAIN
