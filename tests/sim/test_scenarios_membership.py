"""Scripted simulation scenarios for issue 16: membership paths never lose or fork an
acknowledged write. One scenario per defect of the issue (the sixth, a must-match option,
is a start-up matter the simulation does not model), plus a rejoin under collection pressure,
and the join machine's status exchange (issue 18): one founder, the lowest uuid, even while
two members are cut apart; a joiner asks its running peers in turn; a member with an empty
store and no peers stops.

Each runs the real rules (NodeCore, node.core.membership) through the harness, under the
invariants checked after every tick (tests/sim/checkers.py: 1 one history, 2 vclocks never
go back, 11 one link per member, 12 WAL holds) and the end-of-run checks
(tests/sim/liveness.py: convergence, every acknowledged write kept), and asserts what its
name says. `test_each_scenario_catches_the_rule_it_guards` runs each one again with its
rule turned back (a Cluster.rules switch, or, for a rule that lives in node/, its production
function monkeypatched) and checks that it fails, and on which invariant (or, for the
founding rule, the simulation's one-cluster check: tests/sim/joins.py).
"""
from __future__ import annotations

import pytest

from node.core import anon_followers, lifecycle_fence, lifecycle_join, lifecycle_rejoin
from node.core.holds import Holds
from tests.sim.harness import LOC, Cluster, SimFailure
from tests.sim.liveness import check_acknowledged, check_converged
from tests.sim.steps import a_and_its_follower, flushed, form, own_lsn, ready, rows_only_r_has
from tests.sim.workload import churn_peers


def finish(c: Cluster) -> None:
    c.settle()
    check_converged(c)
    check_acknowledged(c)


# --- 1: a rejoin never wipes rows that no donor has -------------------------------------------
def rejoin_keeps_uncovered_rows(c: Cluster) -> None:
    """C learns nothing from A (it follows nobody), so it never hears of B, which joins through A
    and follows nobody either: C holds no WAL for B. C writes, A takes C's rows, C collects
    them. B writes rows of its own (acknowledged; only B has them), then is pointed at C."""
    c.mesh = False
    for n in "ABC":
        c.add_node(n)
    c.bootstrap("A")
    c.run_until_quiet()
    c.join("C", via="A")
    c.run_until(lambda: ready(c, "C"), what="C joined")
    c.configure_peers("A", ["C"])
    c.join("B", via="A")
    c.run_until(lambda: ready(c, "B"), what="B joined")
    c.run_until_quiet()
    for i in range(6):
        c.put("C", f"c{i}")
        assert c.put("B", f"b{i}") and c.txn("B", [("put", LOC, f"l{i}")])
        c.run(1)
    c.run(15)
    assert c.checkpoint(c.nodes["C"]) > 0    # below A's hold; B it does not know
    b_rows = flushed(c, "B")
    c.configure_peers("B", ["C"])            # B is pointed at C, which lacks B's rows
    c.run_until(lambda: c.stats["rejoins_blocked"] >= 2, what="B asked for a covering donor twice")
    assert own_lsn(c, "B", "B") == b_rows and c.stats["rejoins"] == 0
    assert c.nodes["B"].appliers["C"].status == "need_rejoin"
    assert c.put("B", "b-while-blocked")     # B keeps serving, and writing
    c.configure_peers("C", ["A", "B"])       # C follows B: now it can cover it
    c.run_until(lambda: c.stats["rejoins"] == 1, max_ticks=400, what="B rebuilt from C")
    assert own_lsn(c, "B", "B") == b_rows + 1
    assert sorted(c.nodes["B"].state.data[LOC]) == [f"l{i}" for i in range(6)]
    for n in "ABC":
        c.configure_peers(n, [x for x in "ABC" if x != n])
    finish(c)


def test_a_node_told_to_rejoin_keeps_rows_no_donor_has_and_rebuilds_once_a_donor_covers_them(make_cluster):
    rejoin_keeps_uncovered_rows(make_cluster(31))


# --- 2: a node that lost its store does not reuse its own lsns -----------------------------------
def lost_store_waits_for_every_member(c: Cluster) -> None:
    form(c, "A", "B", "C")
    for i in range(4):
        c.put("C", f"c{i}")
        c.run(1)
    c.run_until_quiet()
    c.cut("C", "A")
    for i in range(4, 7):                    # these reach B, not A
        assert c.put("C", f"c{i}")
        c.run(1)
    want = flushed(c, "C")
    c.run_until(lambda: own_lsn(c, "B", "C") == want, what="B holds all of C's rows")
    assert own_lsn(c, "A", "C") < want
    c.crash("B")                             # the one member with all of C's rows is down
    c.heal()
    c.lose_disk("C")                         # C keeps its identity, loses its store
    c.restart("C")
    c.run_until(lambda: ready(c, "C"), what="C joined again through A")
    c.run(10)                                # A has greeted C: A holds fewer of C's rows than B
    early = c.put("C", "too-early")          # unfenced, this would fork (C, lsn) with B's row
    c.run(30)
    assert early is None and c.nodes["C"].core.fence is not None
    assert c.txn("C", [("put", LOC, "local-is-fine")])
    assert c.nodes["C"].core.fence.waiting_for(c.nodes["C"].core.table, c.nodes["C"].uuid) == [c.nodes["B"].uuid]
    c.restart("B")
    c.run_until(lambda: c.nodes["C"].core.fence is None, what="C's fence lifted")
    assert own_lsn(c, "C", "C") >= want      # its own rows came back from B first
    assert c.put("C", "after")
    assert c.stats["fenced_joins"] == 1 and c.stats["refused_fenced_writes"] >= 1
    finish(c)


def test_a_node_that_lost_its_store_writes_under_its_id_only_after_every_member_gave_its_rows_back(make_cluster):
    lost_store_waits_for_every_member(make_cluster(32))


def test_expelling_a_member_gone_for_good_lifts_the_fence_and_gives_up_only_the_rows_it_alone_held(make_cluster):
    c = make_cluster(33)
    form(c, "A", "B", "C")
    c.cut("C", "A")
    for i in range(3):
        assert c.put("C", f"c{i}")
        c.run(1)
    want = flushed(c, "C")
    c.run_until(lambda: own_lsn(c, "B", "C") == want, what="B holds all of C's rows")
    c.retire("B")
    c.heal()
    c.lose_disk("C")
    c.restart("C")
    c.run_until(lambda: ready(c, "C"), what="C joined again through A")
    c.run(30)
    assert c.nodes["C"].core.fence is not None and c.put("C", "too-early") is None
    assert c.expel("B", via="A")
    c.run_until(lambda: c.nodes["C"].core.fence is None, what="C's fence lifted after B's expel")
    assert c.put("C", "after")
    lost = {k: why for k, why in c.checker.lost_ok.items() if k[0] == c.nodes["C"].uuid}
    assert lost and set(lost.values()) == {"expel of B"}     # only what B alone held
    finish(c)


# --- 3: peer-list churn keeps one link per member ------------------------------------------------
def peer_churn(c: Cluster) -> None:
    form(c, "A", "B", "C")
    rng = c.rng
    for step in range(80):
        churn_peers(c, rng.choice("ABC"))
        c.put(rng.choice("ABC"), f"k{step % 5}")
        c.run(rng.randint(0, 3))
    for n in "ABC":                          # every member, twice spelled, and the node itself
        others = [x for x in "ABC" if x != n]
        c.configure_peers(n, others + [x + "'" for x in others] + [n])
    c.run_until_quiet()
    check_converged(c)
    assert c.stats["refused_duplicate"] > 0 and c.stats["refused_self"] > 0
    c.configure_peers("B", [])               # the README's "cut the link"
    c.run(3)
    a_rows = own_lsn(c, "B", "A")
    c.put("A", "after-the-cut")
    c.run(20)
    assert own_lsn(c, "B", "A") == a_rows
    assert not [x for x in c.conns.values() if x.client == "B"]
    c.configure_peers("B", ["A", "C"])
    finish(c)


def test_peer_list_churn_keeps_exactly_one_link_per_member_in_effect(make_cluster):
    peer_churn(make_cluster(34))


# --- 4: a member briefly down holds the WAL it has not on disk ------------------------------------
def briefly_down_member(c: Cluster) -> None:
    c.add_node("A")
    c.add_node("B", wal_mode="write")
    form(c, "A", "B", "C")
    b = c.nodes["B"]
    b.sync_p = 0.0                           # B's written WAL is not on disk for a while
    for i in range(10):
        c.put("A", f"a{i}")
        c.run(1)
    c.run_until(lambda: own_lsn(c, "B", "A") == own_lsn(c, "A", "A"), what="B applied A's rows")
    c.run(30)                                # B's ACKs reach A
    c.checkpoint(c.nodes["A"])
    c.checkpoint(c.nodes["C"])
    c.crash("B", power=True)                 # B loses what it had not on disk
    c.restart("B")
    b.sync_p = None
    c.run_until_quiet()
    assert c.stats["refused_need_rejoin"] == 0
    finish(c)


def test_a_member_briefly_down_is_never_told_to_rejoin_for_rows_it_had_not_on_disk(make_cluster):
    briefly_down_member(make_cluster(35))


# --- 5: a member holds its donor's WAL from its registration ---------------------------------------
def registration_then_collection(c: Cluster) -> None:
    form(c, "A", "B")
    c.add_node("J")
    c.join("J", via="A")
    c.run_until(lambda: ready(c, "J"), what="J joined")
    c.partition(["J"], ["A", "B"])           # J has its snapshot and has subscribed nowhere yet
    for i in range(8):
        c.put("A", f"a{i}")
        c.put("B", f"b{i}")
        c.run(1)
    c.run(10)
    c.checkpoint(c.nodes["A"])
    c.crash("A")                             # the donor restarts in between
    c.restart("A")
    c.run_until(lambda: c.nodes["A"].queue == [] and len(c.nodes["A"].wal) == c.nodes["A"].durable)
    c.run(10)
    c.checkpoint(c.nodes["A"])
    collected = c.nodes["A"].wal_gc
    c.heal()
    c.run_until_quiet()
    # J holds all of A's WAL until it subscribes (Retention.hold_all): nothing was collected; with
    # the rule turned back (no hold before the first ACK), what J needs was, and invariant 12 failed
    assert collected == 0
    assert c.stats["refused_need_rejoin"] == 0
    finish(c)


def test_a_joiner_holds_its_donors_wal_from_registration_through_a_donor_restart(make_cluster):
    registration_then_collection(make_cluster(36))


# --- 6: rejoin under collection pressure ----------------------------------------------------------------
def rejoin_under_gc_pressure(c: Cluster) -> None:
    form(c, "A", "B")
    c.add_node("R", anon=True)
    c.fetch_anon("R", via="A")
    c.run_until(lambda: ready(c, "R"), what="R fetched")
    c.run_until_quiet()
    for i in range(4):
        assert c.txn("R", [("put", LOC, f"l{i}")])
        c.run(1)
    c.run_until_quiet()
    r_id = c.nodes["R"].core.self_id
    c.anon_ttl = 20                          # R's holds lapse while it is down
    c.checkpoint_every = 3
    c.crash("R", power=False)
    for i in range(30):
        c.put(c.rng.choice("AB"), f"k{i % 4}")
        c.run(1)
        if i == 12:
            c.crash("A")
        if i == 15:
            c.restart("A")
    c.run(30)
    c.restart("R")
    c.run_until(lambda: c.nodes["R"].status == "rejoining", what="R rebuilds")
    c.crash("B")                             # a donor restarts during the rebuild
    c.run(5)
    c.restart("B")
    c.run_until(lambda: c.stats["rejoins"] >= 1, max_ticks=600, what="R rebuilt")
    c.checkpoint_every = 0
    r = c.nodes["R"]
    assert sorted(r.state.data[LOC]) == [f"l{i}" for i in range(4)] and r.core.self_id == r_id
    finish(c)


def test_a_rejoin_under_collection_pressure_keeps_local_rows_and_converges(make_cluster):
    rejoin_under_gc_pressure(make_cluster(37))


# --- 7: the status exchange founds one cluster; a joiner asks its running peers in turn ----------------
def formation_while_cut(c: Cluster) -> None:
    """A, B and C start fresh with each other as peers (node/join.py join_or_bootstrap: the join
    machine's rounds). The lowest uuid is cut off from the middle one: neither hears every peer
    answer, so neither founds (and the highest is not the lowest); healed, the lowest founds
    the cluster and the other two join it."""
    for n in "ABC":
        c.add_node(n)
    low, mid, _ = sorted("ABC", key=lambda n: c.nodes[n].uuid)
    c.cut(low, mid)
    c.start_fresh("A", "B", "C")
    c.run(40)
    assert c.stats["join polls"] >= 6 and not any(c.nodes[n].base for n in "ABC"), "founded while cut"
    c.heal()
    c.run_until(lambda: all(ready(c, n) for n in "ABC"), what="the cluster formed")
    assert c.stats["clusters founded by the exchange"] == 1 and c.nodes[low].core.self_id == 1


def test_a_cluster_started_fresh_while_two_of_its_members_are_cut_apart_has_one_founder_the_lowest_uuid(make_cluster):
    c = make_cluster(38)
    formation_while_cut(c)
    finish(c)


def test_a_joiner_whose_first_peer_is_down_joins_through_the_next_running_one(make_cluster):
    c = make_cluster(39)
    form(c, "A", "B", "C")
    c.add_node("J")
    c.crash("A")
    c.join("J")                               # started with the members as its peers: A (first), B, C
    c.run_until(lambda: ready(c, "J"), what="J joined")
    assert c.stats["polls of a peer down or cut off"] >= 1
    assert c.nodes["J"].donor_uuid == c.nodes["B"].uuid
    finish(c)


def test_a_member_that_lost_its_store_and_has_no_peers_stops_and_joins_again_once_given_peers(make_cluster):
    """Join's start-up stops (Abort: the process exits with one line) when a member with an
    identity and an empty store has no peer to join again through; the operator gives it
    its peers and starts it: it joins again, fenced (its identity went active before)."""
    c = make_cluster(40)
    form(c, "A", "B", "C")
    c.configure_peers("C", [])
    c.lose_disk("C")
    c.restart("C")
    c.run(5)
    assert not c.nodes["C"].up and c.stats["joins_aborted"] == 1
    c.configure_peers("C", ["A", "B"])
    c.restart("C")
    c.run_until(lambda: ready(c, "C"), what="C joined again")
    assert c.stats["fenced_joins"] == 1
    finish(c)


def test_a_new_node_whose_only_peer_lost_its_store_does_not_found_a_second_cluster(make_cluster):
    """C loses its store and starts again, cut off from A and B (it keeps its identity and
    waits to join again). J, with a lower uuid, is started with C alone as its peer: C greets
    without a store but `member_of` its cluster, so J does not take it for a fresh node and
    waits; once the cut heals C rejoins and J joins through it. (Before, J founded a second
    cluster, which the simulation's one-cluster check refuses; C, polling J, then stopped.)"""
    c = make_cluster(40)
    form(c, "A", "B", "C")
    c.add_node("J")
    assert c.nodes["J"].uuid < c.nodes["C"].uuid
    c.partition(["A", "B"], ["C", "J"])
    c.lose_disk("C")
    c.restart("C")
    c.nodes["J"].peers = ["C"]                # the operator starts J with --peers C
    c.join("J")
    c.run(60)
    c.heal()
    c.run_until(lambda: ready(c, "J") and ready(c, "C"), what="J and C joined")
    finish(c)


# --- each scenario catches the rule it guards -------------------------------------------------------
def holds_from_the_first_ack(monkeypatch) -> None:
    """The hold rule before issue 16, turned back where it lives now (node/core/holds.py, which
    node/retention.py and the simulation both drive): a subscriber holds the WAL only from its
    first ACK; nothing from its JOIN or its SUBSCRIBE, nothing for a member that never subscribed."""
    monkeypatch.setattr(Holds, "hold_all", lambda self, *args: None)
    monkeypatch.setattr(Holds, "on_subscribe", lambda self, *args: None)
    monkeypatch.setattr(Holds, "hold_for_new_members", lambda self, *args: ([], {}))


def join_through_any_donor(monkeypatch) -> None:
    """The rebuild before session 29, turned back where it lives (the Rebuild effect as
    node/core/lifecycle_rejoin.py hands it out, which node/rejoin.py and the simulation both act on): a member joins through its
    donor (JOIN) whatever it is, an anonymous replica too, which refuses it."""
    rebuild = lifecycle_rejoin.Rebuild
    monkeypatch.setattr(lifecycle_rejoin, "Rebuild",
                        lambda address, reason, donor_anon=False, discarding=(): rebuild(address, reason))


def founders_of_whoever_answered(monkeypatch) -> None:
    """The founding rule turned back where it lives (node/core/lifecycle_join.py founders,
    which node/join.py's rounds and the simulation's both step): a peer that did not answer is
    not waited for; a fresh node founds when every peer that answered is fresh and has a
    higher uuid."""
    def founders(uuid: str, polled: dict, peers: list[str]) -> tuple[str, ...] | None:
        answered = [g for g in polled.values() if isinstance(g, dict)]
        fresh = [g["uuid"] for g in answered if not g.get("cluster_uuid")]
        if len(fresh) != len(answered) or not all(uuid < u for u in fresh):
            return None
        return tuple(fresh) + (uuid,)
    monkeypatch.setattr(lifecycle_join, "founders", founders)


# --- 7: a member whose only peer is an anonymous replica it is behind ----------------------------
def member_rebuilt_from_an_anonymous_replica(c: Cluster) -> None:
    """B is down while A takes rows; R, an anonymous replica, fetches its snapshot from A after
    them (its WAL starts there). B comes back with R as its only peer: R tells it to rejoin,
    and B, a member, rebuilds from R's snapshot (FETCH: R registers nobody), keeping none of R's
    anonymous entries, then follows both."""
    form(c, "A", "B")
    c.crash("B", power=False)
    for i in range(5):
        assert c.put("A", f"a{i}")
        c.run(1)
    c.add_node("R", anon=True)
    c.fetch_anon("R", via="A")
    c.run_until(lambda: ready(c, "R"), what="R fetched")
    c.run_until(lambda: own_lsn(c, "R", "A") == own_lsn(c, "A", "A"), what="R caught up with A")
    c.configure_peers("B", ["R"])
    c.restart("B")
    c.run_until(lambda: c.stats["members rebuilt from an anonymous replica"] == 1, max_ticks=600,
                what="B rebuilt from R")
    b = c.nodes["B"]
    assert c.nodes["R"].uuid not in b.core.table and b.core.table.get(b.uuid).state == "member"
    assert own_lsn(c, "B", "A") >= 5
    c.configure_peers("B", ["A", "R"])
    assert c.put("B", "after")
    finish(c)


def test_a_member_told_to_rejoin_by_an_anonymous_replica_rebuilds_from_its_snapshot(make_cluster):
    member_rebuilt_from_an_anonymous_replica(make_cluster(39))


# --- 8: a quiet anonymous follower holding rows no member has is not forgotten -------------------
def quiet_follower_holds_rows_no_member_has(c: Cluster) -> None:
    """R, an anonymous replica, follows A alone. A, cut off from B and C, writes; R takes the
    rows and goes down. Past R's TTL, A checkpoints: R may be the only holder of A's last rows,
    so A still remembers it. A loses its store and joins again, fenced: it waits for R too, and
    writes nothing under its id until R is back and its rows came home (the operator adds R to
    A's peers when the fence says so: `settle`). Once every member holds them, A forgets R."""
    a_and_its_follower(c)
    want = rows_only_r_has(c)
    c.crash("R", power=False)
    c.anon_ttl = 20
    c.run(30)
    a, r = c.nodes["A"], c.nodes["R"]
    c.checkpoint(a)
    remembered = r.uuid in a.anon_followers       # unseen past its TTL, yet the only holder
    c.lose_disk("A")
    c.heal()
    c.restart("A")
    c.run_until(lambda: ready(c, "A"), what="A joined again")
    c.run(30)
    waited = a.core.fence is not None and r.uuid in a.core.fence.waiting_for(a.core.table, a.uuid)
    refused = c.put("A", "too-early") is None
    c.restart("R")                           # (forgotten, R would now hold other rows under A's lsns)
    c.settle()
    assert remembered and waited and refused
    assert a.core.fence is None and own_lsn(c, "A", "A") > want
    check_converged(c)
    check_acknowledged(c)
    c.run_until(lambda: all(own_lsn(c, m, "A") == own_lsn(c, "A", "A") for m in "BC") and not a.queue,
                what="B and C hold all of A's rows")
    c.crash("R", power=False)
    c.run(30)
    c.run_until(lambda: a.book.by_uuid[c.nodes["B"].uuid].vclock.get(a.core.self_id, 0) >= own_lsn(c, "A", "A")
                and a.book.by_uuid[c.nodes["C"].uuid].vclock.get(a.core.self_id, 0) >= own_lsn(c, "A", "A"),
                what="B and C acknowledged A's rows on disk")
    c.checkpoint(a)
    assert r.uuid not in a.anon_followers          # now every member holds what R may hold


def test_a_quiet_anonymous_follower_holding_rows_no_member_has_is_waited_for_after_a_loss(make_cluster):
    quiet_follower_holds_rows_no_member_has(make_cluster(40))


def forget_quiet_followers_at_once(monkeypatch) -> None:
    monkeypatch.setattr(anon_followers.FollowerReach, "may_hold", lambda self, uuid: 0)


FLIPS = [
    # (scenario, rule turned back: a Cluster.rules switch, or a production function patched, the
    # invariant that must fail)
    (rejoin_keeps_uncovered_rows, ("cover", False), "invariant 2"),
    (lost_store_waits_for_every_member, ("fence", False), "invariant 1"),
    (peer_churn, ("one_link", False), "invariant 11"),
    (briefly_down_member, ("ack", "applied"), "invariant 12"),
    (registration_then_collection, holds_from_the_first_ack, "invariant 12"),
    (rejoin_under_gc_pressure, ("keep_local", False), "invariant 2"),
    (formation_while_cut, founders_of_whoever_answered, "two clusters"),
    (member_rebuilt_from_an_anonymous_replica, join_through_any_donor, "B rebuilt from R not reached"),
    (quiet_follower_holds_rows_no_member_has, forget_quiet_followers_at_once, "invariant 1"),
]


@pytest.mark.parametrize("scenario,rule,caught", FLIPS, ids=[f[0].__name__ for f in FLIPS])
def test_each_scenario_catches_the_rule_it_guards(make_cluster, monkeypatch, scenario, rule, caught):
    seed = {rejoin_keeps_uncovered_rows: 31, lost_store_waits_for_every_member: 32, peer_churn: 34,
            briefly_down_member: 35, registration_then_collection: 36, rejoin_under_gc_pressure: 37,
            formation_while_cut: 38, member_rebuilt_from_an_anonymous_replica: 39,
            quiet_follower_holds_rows_no_member_has: 40}[scenario]
    c = make_cluster(seed)
    if callable(rule):
        rule(monkeypatch)
    else:
        c.rules[rule[0]] = rule[1]
    with pytest.raises((SimFailure, AssertionError)) as e:
        scenario(c)
    assert caught in str(e.value), str(e.value)[:2000]
