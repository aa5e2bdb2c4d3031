"""A node that lost rows and an anonymous replica that holds some of them (session 28; the
simulation's full-mix seeds 5108 and 5782): the fence counts the replica's word though it never
waits for one, says how the rows come back, goes on past any row given up, and a member that
replicates from the replica to get them back neither registers it nor is sent its private rows;
and a node remembers the anonymous replicas that follow it beside its identity, so a lost store
waits to hear from them. Real NodeCore, relay machine and WAL frame filter; the followers file
on a real directory."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from node import limits, retention
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core import messages as m
from node.core.entry import txns_relay_frame
from node.core.holds import Hold
from node.core.anon_followers import Follower, FollowerReach, follower_seen, followers_to_forget, members_hold_own
from node.core.lifecycle_fence import hear_greeting, lift, may_lift, take_up_fence
from node.core.link.relay import RelayState
from node.core.membership import OwnRowsFence, greeting_expel_bounds
from node.core.replicaset import NodeCore
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, OP_PUT, Op, Txn
from node.core.vclock import VClock
from node.errors import PeerRefused, RemoteProtocolError
from node.fence import anonymous_followers
from node.retention import Retention
from tests.unit.test_link_relay_machine import NOW, Host, greeted, relay
from tests.unit.test_replicaset import OTHER, PEER, PEER_ROWS, SELF, THIRD, WALL

ANON = THIRD
ANON_ADDR = "r.example:1"


def fenced_core(own: int = 5, rebuilt: bool = False) -> NodeCore:
    """SELF 1, PEER 2, OTHER 3; fenced, with PEER and OTHER heard holding no more than we do."""
    table = ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER), Member(PEER, 2, "b:1", STATE_MEMBER),
                          Member(OTHER, 3, "c:1", STATE_MEMBER)])
    core = NodeCore(SELF, table, VClock({1: own, 2: 3}), spaces={"kv": False})
    core.fence = OwnRowsFence("lost", rebuilt=rebuilt)
    core.fence.hear(PEER, own)
    core.fence.hear(OTHER, own - 1)
    return core


def anon_greeting(ours: int) -> dict:
    return {"uuid": ANON, "address": ANON_ADDR, "anon": True, "vclock_uuid": {SELF: ours, PEER: 3},
            "cluster": [[ANON, 7, ANON_ADDR, STATE_ANON], [SELF, 1, "a:1", STATE_MEMBER]]}


def test_an_anonymous_replicas_word_on_our_rows_holds_the_fence_though_it_is_never_waited_for():
    core = fenced_core()
    assert may_lift(core)                          # every member heard, none holds more than we do
    claims: dict = {}
    hear_greeting(core, claims, set(), anon_greeting(7), SELF)
    assert core.fence.heard[ANON] == 7 and core.fence.anonymous == {ANON: ANON_ADDR}
    assert claims == {ANON: (7, ANON_ADDR)}
    assert ANON not in core.fence.waiting_for(core.table, SELF)
    assert not may_lift(core)                      # rows 6-7 are only on the replica
    why = core.fence_state()[1]
    assert "up to lsn 7" in why and f"{ANON} at {ANON_ADDR} is an anonymous replica" in why
    assert "add its address to this node's peers" in why
    core.vclock.follow(1, 7)                       # they came back from it
    assert may_lift(core)


def test_an_anonymous_replica_holding_no_more_than_we_do_holds_nothing_up():
    core = fenced_core()
    hear_greeting(core, {}, set(), anon_greeting(5), SELF)
    assert may_lift(core) and "anonymous" not in core.fence_state()[1]


def test_after_the_operator_gives_up_an_anonymous_holder_the_next_lsn_follows_the_nodes_own():
    """Not past the given-up rows: members wait at a gap in a peer's own rows for a route that
    has them, and nothing has them but the replica given up (expelled, it keeps rows that differ)."""
    core = fenced_core()
    hear_greeting(core, {}, set(), anon_greeting(9), SELF)
    assert not may_lift(core)
    core.fence.given_up.add(ANON)                  # expelled on this node while fenced
    assert may_lift(core)
    lifted = lift(core, WALL, [ANON])
    assert core.fence is None and lifted.target == 5 and lifted.given_up == [ANON] and lifted.restate is None
    assert core.local_txn([Op(OP_PUT, "kv", "k", 1)], GROUP_DEFAULT, WALL).lsn == 6


def test_a_rebuilt_stores_restated_table_follows_its_own_rows_when_a_holder_was_given_up():
    core = fenced_core(rebuilt=True)
    hear_greeting(core, {}, set(), anon_greeting(9), SELF)
    core.fence.given_up.add(ANON)
    lifted = lift(core, WALL, [ANON])
    assert lifted.restate.lsn == 6 and lifted.own_history_lsn == 5


def test_a_fence_hears_no_more_peers_than_members_and_anonymous_followers_together(monkeypatch):
    core = fenced_core()
    monkeypatch.setattr(limits, "members_max", 2)
    monkeypatch.setattr(limits, "anon_followers_max", 1)       # PEER and OTHER heard already: room for one
    hear_greeting(core, {}, set(), anon_greeting(9), SELF)
    g = anon_greeting(9)
    g["uuid"] = "ffffffff-0000-4000-8000-000000000009"
    hear_greeting(core, {}, set(), g, SELF)
    assert ANON in core.fence.heard and g["uuid"] not in core.fence.heard
    hear_greeting(core, {}, set(), anon_greeting(11), SELF)    # one already heard is heard again
    assert core.fence.heard[ANON] == 11


# --- a member replicating from an anonymous replica ------------------------------------------------
def test_a_member_greeted_by_an_anonymous_upstream_neither_registers_it_nor_maps_its_private_id():
    core = fenced_core()
    core.fence = None
    rows = PEER_ROWS + [[ANON, 7, ANON_ADDR, STATE_ANON]]
    assert core.greeting(ANON, rows, WALL) == []
    assert ANON not in core.table and 7 not in core.peers[ANON].map.to_local
    assert core.peers[ANON].map.as_dict() == {1: 2, 2: 1, 5: 3}


def test_an_anonymous_replica_following_another_maps_the_upstreams_private_id():
    table = ClusterTable([Member(SELF, 4, "a:1", STATE_ANON), Member(PEER, 2, "b:1", STATE_MEMBER),
                          Member(OTHER, 3, "c:1", STATE_MEMBER)])
    core = NodeCore(SELF, table, VClock({2: 3}), spaces={"kv": False})
    regs = core.greeting(ANON, [[PEER, 1, "b:1", STATE_MEMBER], [ANON, 7, ANON_ADDR, STATE_ANON]], WALL)
    assert ANON in core.table and regs and core.peers[ANON].map.to_local[7] == core.table.get(ANON).id


def test_an_anonymous_nodes_relay_never_sends_its_own_private_rows():
    table = ClusterTable([Member(ANON, 7, ANON_ADDR, STATE_ANON), Member(PEER, 2, "b:1", STATE_MEMBER),
                          Member(SELF, 1, "a:1", STATE_MEMBER)])
    core = NodeCore(ANON, table, VClock({7: 3, 1: 9, 2: 4}), spaces={"kv": False})
    mach = greeted(relay(Host(core), who=SELF), who=SELF)
    mach.step(m.Message(m.SUBSCRIBE, {"vclock": {1: 5, 2: 4}, "own_rows": True}), NOW)
    mach.advance(mach.ready())
    assert mach.sub[7] == limits.lsn_max
    assert mach.acked == mach.durable == {1: 5, 2: 4}         # what the subscriber said stays as it said
    private = Txn(7, 4, GROUP_CLUSTER, WALL, (Op(OP_PUT, "_cluster", PEER, [PEER, 2, "b:1", STATE_MEMBER]),))
    theirs = Txn(1, 6, GROUP_DEFAULT, WALL, (Op(OP_PUT, "kv", "k", 1),))
    payload, rows = txns_relay_frame([private, theirs], b"", WALL, mach.sub, mach.own)
    assert rows == 1                               # the subscriber's own row 6 goes back, the note does not


def test_a_subscriber_behind_an_anonymous_nodes_collected_private_rows_is_not_told_to_rejoin():
    table = ClusterTable([Member(ANON, 7, ANON_ADDR, STATE_ANON), Member(PEER, 2, "b:1", STATE_MEMBER),
                          Member(SELF, 1, "a:1", STATE_MEMBER)])
    host = Host(NodeCore(ANON, table, VClock({7: 3, 1: 9, 2: 4}), spaces={"kv": False}))
    host.gc = {7: 3}                                 # its private rows 1-3 collected
    mach = greeted(relay(host, who=SELF), who=SELF)
    mach.step(m.Message(m.SUBSCRIBE, {"vclock": {1: 5, 2: 4}}), NOW)
    mach.advance(mach.ready())
    assert mach.state is RelayState.STREAMING


def test_a_members_relay_sends_its_own_rows():
    mach = greeted(relay())
    mach.step(m.Message(m.SUBSCRIBE, {"vclock": {1: 5, 2: 4}}), NOW)
    mach.advance(mach.ready())
    assert mach.sub == {1: 5, 2: 4}



# --- the anonymous replicas a node remembers beside its identity -----------------------------------
def test_a_fence_taken_up_after_a_loss_waits_for_the_anonymous_replicas_that_followed_the_node():
    core = fenced_core()
    core.fence = None
    take_up_fence(core, {"reason": "lost", "rebuilt": True}, set(), {ANON: Follower(ANON_ADDR, 1.0), SELF: Follower("a:1", 1.0)})
    fence = core.fence
    assert ANON in fence.waiting_for(core.table, SELF) and fence.anonymous == {ANON: ANON_ADDR}
    assert SELF not in fence.known                     # never itself
    why = core.fence_state()[1]
    assert ANON in why.split("not heard from ")[1] and f"{ANON} is an anonymous replica that followed this node" in why
    hear_greeting(core, {}, set(), anon_greeting(0), SELF)
    assert ANON not in fence.waiting_for(core.table, SELF)


def test_an_anonymous_replica_has_no_fence_to_take_up_and_remembers_nobody():
    table = ClusterTable([Member(SELF, 4, "a:1", STATE_ANON), Member(PEER, 2, "b:1", STATE_MEMBER)])
    core = NodeCore(SELF, table, VClock({2: 3}), spaces={"kv": False})
    assert take_up_fence(core, {"reason": "lost"}, set(), {ANON: Follower(ANON_ADDR, 1.0)}) is False and core.fence is None


def test_a_follower_is_written_when_new_linked_or_not_written_for_half_its_ttl_and_not_past_the_bound(monkeypatch):
    assert follower_seen({}, ANON, ANON_ADDR, 100.0, 60.0) == Follower(ANON_ADDR, 100.0, 0, True)   # new: sent none yet
    linked = Follower(ANON_ADDR, 80.0, 4, True)
    assert follower_seen({ANON: linked}, ANON, ANON_ADDR, 100.0, 60.0) is None       # linked, 20 s < 30 s
    assert follower_seen({ANON: linked._replace(seen=70.0)}, ANON, "moved:1", 100.0, 60.0) == \
        Follower("moved:1", 100.0, 4, True)
    # its last link ended (the entry bounds it): a new link must say so before it is answered
    assert follower_seen({ANON: linked._replace(linked=False)}, ANON, ANON_ADDR, 81.0, 60.0) == \
        Follower(ANON_ADDR, 81.0, 4, True)
    monkeypatch.setattr(limits, "anon_followers_max", 2)
    two = {"f1": Follower("x:1", 1.0), "f2": Follower("x:2", 1.0)}
    assert follower_seen(two, ANON, ANON_ADDR, 100.0, 60.0) is None                             # full: not a new one
    assert follower_seen(two, "f1", "x:1", 100.0, 60.0) == Follower("x:1", 100.0, None, True)   # a known one, yes


def test_a_follower_is_forgotten_once_unseen_past_its_ttl_or_once_the_table_knows_it():
    table = ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER), Member(PEER, 2, "b:1", STATE_MEMBER),
                          Member(OTHER, 3, "c:1", STATE_EXPELLED, 0, 0)])
    holds = {"acked": Hold({}, 95.0, True), "stale": Hold({}, 10.0, True)}
    remembered = {"acked": Follower("x:1", 1.0),        # subscribed long ago, acknowledged just now
                  "stale": Follower("x:2", 20.0), "recent": Follower("x:3", 80.0), "gone": Follower("x:4", 60.0), "edge": Follower("x:5", 70.0),
                  PEER: Follower("b:1", 99.0), OTHER: Follower("c:1", 99.0)}
    assert followers_to_forget(remembered, holds, table, 100.0, 30.0, FollowerReach(0), 1) == \
        (["stale", "gone", PEER, OTHER], {})


def three_members(b_holds: int, c_holds: int | None) -> tuple[ClusterTable, dict]:
    """SELF 1, PEER 2 and OTHER 3 members; PEER's and OTHER's holds of our own rows (None: none)."""
    table = ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER), Member(PEER, 2, "b:1", STATE_MEMBER),
                          Member(OTHER, 3, "c:1", STATE_MEMBER), Member(ANON, 4, ANON_ADDR, STATE_ANON)])
    holds = {PEER: Hold({1: b_holds, 2: 9}, 99.0, False), SELF: Hold({1: 0}, 99.0, False)}
    if c_holds is not None:
        holds[OTHER] = Hold({1: c_holds}, 99.0, False)
    return table, holds


@pytest.mark.parametrize("b_holds,c_holds,forgotten", [
    (7, 7, True),                # every member holds what it may hold
    (9, 8, True),
    (7, 6, False),               # OTHER holds less: R may be the only holder of row 7
    (6, 9, False),
    (9, None, False),            # OTHER has no hold here: nothing says it holds our rows
], ids=["both-hold-it", "both-hold-more", "one-holds-less", "the-other-holds-less", "one-has-no-hold"])
def test_a_quiet_follower_is_forgotten_only_once_every_member_holds_the_rows_it_may_hold(b_holds, c_holds, forgotten):
    table, holds = three_members(b_holds, c_holds)
    reach = FollowerReach(7)                       # no link since this process started at own lsn 7
    followers = {"quiet": Follower("x:1", 10.0)}
    assert followers_to_forget(followers, holds, table, 100.0, 30.0, reach, 1) == \
        ((["quiet"], {}) if forgotten else ([], {"quiet": 7}))
    assert members_hold_own(holds, table, 1) == (min(b_holds, c_holds) if c_holds is not None else 0)


@pytest.mark.parametrize("reach,forgotten", [(0, True), (1, False)], ids=["may-hold-none", "may-hold-one"])
def test_a_members_hold_that_names_none_of_our_rows_holds_none_of_them(reach, forgotten):
    table, holds = three_members(5, 5)
    holds[OTHER] = Hold({2: 5}, 99.0, False)      # OTHER acknowledged rows of PEER's only
    out, kept = followers_to_forget({"quiet": Follower("x:1", 10.0)}, holds, table, 100.0, 30.0, FollowerReach(reach), 1)
    assert (out, kept) == ((["quiet"], {}) if forgotten else ([], {"quiet": 1}))


def test_a_follower_the_table_knows_is_forgotten_once_however_long_unseen_and_whatever_it_may_hold():
    table, holds = three_members(0, 0)
    table.upsert(Member(ANON, 4, ANON_ADDR, STATE_MEMBER))      # registered since
    followers = {ANON: Follower(ANON_ADDR, 1.0)}
    assert followers_to_forget(followers, holds, table, 100.0, 30.0, FollowerReach(9), 1) == ([ANON], {})


def test_a_followers_reach_is_any_lsn_while_a_link_is_open_and_the_own_lsn_when_the_last_one_ended():
    reach = FollowerReach(5)
    assert reach.may_hold("r") == 5                # what an earlier process may have sent
    reach.opened("r")
    reach.opened("r")                              # a second link before the first ended
    assert reach.may_hold("r") == limits.lsn_max
    reach.closed("r", 8)
    assert reach.may_hold("r") == limits.lsn_max  # one still open
    reach.closed("r", 9)
    assert reach.may_hold("r") == 9
    reach.closed("r", 12)                          # a link that never opened sent nothing
    assert reach.may_hold("r") == 9
    reach.forget("r")
    assert reach.may_hold("r") == 5


def test_no_other_member_holds_our_rows_when_we_are_the_only_member():
    table = ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER), Member(OTHER, 3, "c:1", STATE_EXPELLED, 0, 0)])
    holds = {OTHER: Hold({1: 9}, 99.0, False)}
    assert members_hold_own(holds, table, 1) == 0
    assert followers_to_forget({"quiet": Follower("x:1", 10.0)}, holds, table, 100.0, 30.0, FollowerReach(0), 1) == \
        (["quiet"], {})
    assert followers_to_forget({"quiet": Follower("x:1", 10.0)}, holds, table, 100.0, 30.0, FollowerReach(1), 1) == \
        ([], {"quiet": 1})


def test_the_followers_file_remembers_each_replica_durably_and_forgets_atomically(tmp_path, monkeypatch):
    d = str(tmp_path)
    clock = [0.0]
    monkeypatch.setattr(retention.time, "time", lambda: clock[0])
    r = Retention(SimpleNamespace(data_dir=d, cfg=SimpleNamespace(anon_ttl_s=60.0)))

    def remember_follower(uuid: str, address: str, now: float) -> None:
        clock[0] = now
        r.follower(uuid, address)
    assert anonymous_followers(d) == {}
    remember_follower(ANON, ANON_ADDR, 100.0)
    remember_follower(ANON, ANON_ADDR, 110.0)                 # within half its ttl: nothing written
    remember_follower(PEER, "b:1", 120.0)
    assert anonymous_followers(d) == {ANON: Follower(ANON_ADDR, 100.0, 0, True), PEER: Follower("b:1", 120.0, 0, True)}
    remember_follower(ANON, ANON_ADDR, 140.0)                 # past it: seen again, the later line wins
    assert anonymous_followers(d)[ANON] == Follower(ANON_ADDR, 140.0, 0, True)
    assert len((tmp_path / "anonymous_followers").read_text().splitlines()) == 6     # two lines an entry
    r._forget_followers([PEER])
    assert anonymous_followers(d) == {ANON: Follower(ANON_ADDR, 140.0, 0, True)}
    assert (tmp_path / "anonymous_followers").read_text() == f"{ANON} {ANON_ADDR} 140.000\n{ANON} {ANON_ADDR} 140.000 0 1\n"
    assert not (tmp_path / "anonymous_followers.tmp").exists()
    r._forget_followers([])
    (tmp_path / "anonymous_followers").write_text(f"{ANON} {ANON_ADDR} 140.000 0 1\ntorn-line\n{PEER} b:1 notatime\n")
    assert anonymous_followers(d) == {ANON: Follower(ANON_ADDR, 140.0, 0, True)}     # a torn or bad line is skipped


# --- what a fence's status says, and a peer's expel bounds ------------------------------------------
@pytest.mark.parametrize("given_up_said", [7, 9], ids=["as much as the holder named", "more"])
def test_a_holder_given_up_is_not_named_as_one_the_rows_come_back_from(given_up_said):
    core = fenced_core()
    hear_greeting(core, {}, set(), anon_greeting(given_up_said), SELF)
    core.fence.hear(PEER, 7)
    core.fence.given_up.add(ANON)
    why = core.fence_state()[1]
    assert "up to lsn 7" in why and f"{PEER} said it holds them" in why and ANON not in why


def test_an_anonymous_holder_a_peer_says_is_expelled_gets_the_expelled_way_out_only():
    core = fenced_core()
    hear_greeting(core, {}, set(), anon_greeting(9), SELF)
    core.fence.expelled.add(ANON)
    why = core.fence_state()[1]
    assert f"{ANON} is expelled" in why and "anonymous replica" not in why


def test_a_greetings_expel_bounds_read_rows_of_four_five_and_six_fields():
    rows = [[PEER, 2, "b:1", STATE_EXPELLED], [OTHER, 3, "c:1", STATE_EXPELLED, 4],
            [ANON, 5, "r:1", STATE_EXPELLED, 4, 9], [SELF, 1, "a:1", STATE_MEMBER, 3, 0]]
    assert greeting_expel_bounds({"cluster": rows}) == {PEER: 0, OTHER: 0, ANON: 9}
    assert greeting_expel_bounds({}) == {}


# --- the members_max guard counts only what a greeting would register -------------------------------
def test_a_full_table_still_greets_a_peer_that_lists_only_members_it_knows_and_anonymous_entries(monkeypatch):
    core = fenced_core()
    core.fence = None
    monkeypatch.setattr(limits, "members_max", len(core.table))
    rows = PEER_ROWS + [[ANON, 7, ANON_ADDR, STATE_ANON]]
    assert core.greeting(PEER, rows, WALL) == []                # another node's anonymous entry
    assert core.greeting(ANON, rows, WALL) == []                # an anonymous upstream's own entry


def test_an_anonymous_replica_with_a_full_table_is_refused_the_upstream_it_would_register(monkeypatch):
    table = ClusterTable([Member(SELF, 4, "a:1", STATE_ANON), Member(PEER, 2, "b:1", STATE_MEMBER)])
    core = NodeCore(SELF, table, VClock({2: 3}), spaces={"kv": False})
    monkeypatch.setattr(limits, "members_max", 2)
    with pytest.raises(RemoteProtocolError, match="members_max"):
        core.greeting(ANON, [[PEER, 1, "b:1", STATE_MEMBER], [ANON, 7, ANON_ADDR, STATE_ANON]], WALL)


def test_an_anonymous_replica_takes_its_upstreams_own_entry_but_no_other_anonymous_one():
    table = ClusterTable([Member(SELF, 4, "a:1", STATE_ANON), Member(PEER, 2, "b:1", STATE_MEMBER)])
    core = NodeCore(SELF, table, VClock({2: 3}), spaces={"kv": False})
    stranger = "ffffffff-0000-4000-8000-000000000009"
    core.greeting(ANON, [[PEER, 1, "b:1", STATE_MEMBER], [ANON, 7, ANON_ADDR, STATE_ANON],
                         [stranger, 8, "s:1", STATE_ANON]], WALL)
    assert ANON in core.table and stranger not in core.table


def test_a_members_greeting_marks_no_peer_anonymous():
    core = fenced_core()
    hear_greeting(core, {}, set(), {"uuid": PEER, "address": "b:1", "anon": False, "vclock_uuid": {SELF: 9},
                                    "cluster": []}, SELF)
    assert core.fence.heard[PEER] == 9 and core.fence.anonymous == {}
    assert "anonymous" not in core.fence_state()[1]


def test_an_anonymous_replica_with_room_for_one_counts_only_its_upstreams_own_anonymous_entry(monkeypatch):
    table = ClusterTable([Member(SELF, 4, "a:1", STATE_ANON), Member(PEER, 2, "b:1", STATE_MEMBER)])
    core = NodeCore(SELF, table, VClock({2: 3}), spaces={"kv": False})
    monkeypatch.setattr(limits, "members_max", 3)
    stranger = "ffffffff-0000-4000-8000-000000000009"
    regs = core.greeting(ANON, [[stranger, 8, "s:1", STATE_ANON], [PEER, 1, "b:1", STATE_MEMBER],
                                [ANON, 7, ANON_ADDR, STATE_ANON]], WALL)
    assert regs and ANON in core.table and stranger not in core.table


def test_a_greeting_maps_the_members_listed_after_an_anonymous_entry_it_skips():
    core = fenced_core()
    core.fence = None
    core.greeting(ANON, [[ANON, 7, ANON_ADDR, STATE_ANON]] + PEER_ROWS, WALL)
    assert core.peers[ANON].map.as_dict() == {1: 2, 2: 1, 5: 3}


def test_retention_opens_a_remembered_followers_link_and_notes_our_own_lsn_when_it_ends(tmp_path, monkeypatch):
    core = fenced_core(own=6)
    core.fence = None
    r = Retention(SimpleNamespace(data_dir=str(tmp_path), cfg=SimpleNamespace(anon_ttl_s=60.0), core=core))
    r.follower(ANON, ANON_ADDR)
    assert r.reach.may_hold(ANON) == limits.lsn_max            # any of our rows while its link is open
    core.local_txn([Op(OP_PUT, "kv", "k", 1)], GROUP_DEFAULT, WALL)   # claimed 7, sent or not
    r.follower_link_ended(ANON)
    assert r.reach.may_hold(ANON) == 7
    monkeypatch.setattr(limits, "anon_followers_max", 1)
    with pytest.raises(PeerRefused) as e:                      # not remembered: refused, nothing to end
        r.follower(PEER, "b:1")
    assert e.value.code == "followers_full" and "DELETE /v1/admin/followers" in e.value.message
    assert PEER not in r.followers and PEER not in anonymous_followers(str(tmp_path))
    r.follower_link_ended(PEER)
    assert PEER not in r.reach.ended
    r.follower(ANON, ANON_ADDR)                                # one remembered already: served as before
    r._forget_followers([ANON])
    assert ANON not in r.reach.ended


def test_a_fence_that_may_lift_waits_while_a_rebuild_is_under_way():
    """Full-mix seed 23372: the lift's rows (the restated table, pending expels) went into the
    store a rebuild then replaced, and the node's own vclock went back."""
    core = fenced_core()
    assert may_lift(core) and may_lift(core, rebuilding=False)
    assert not may_lift(core, rebuilding=True)
