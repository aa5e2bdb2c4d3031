"""Scripted simulation scenarios for issue 16: membership paths never lose or fork an
acknowledged write. One scenario per defect of the issue (the sixth, a must-match option,
is a start-up matter the simulation does not model), plus a rejoin under collection pressure.

Each runs the real rules (NodeCore, node.core.membership) through the harness, under the
invariants checked after every tick (tests/sim/checkers.py: 1 one history, 2 vclocks never
go back, 11 one link per member, 12 WAL holds) and the end-of-run checks
(tests/sim/liveness.py: convergence, every acknowledged write kept), and asserts what its
name says. `test_each_scenario_catches_the_rule_it_guards` runs each one again with its
rule turned back (a Cluster.rules switch, or, for a rule that lives in node/, its production
function monkeypatched) and checks that it fails, and on which invariant.
"""
from __future__ import annotations

import pytest

from node.core.holds import Holds
from tests.sim.harness import LOC, Cluster, SimFailure
from tests.sim.liveness import check_acknowledged, check_converged
from tests.sim.steps import flushed, form, own_lsn, ready
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


# --- each scenario catches the rule it guards -------------------------------------------------------
def holds_from_the_first_ack(monkeypatch) -> None:
    """The hold rule before issue 16, turned back where it lives now (node/core/holds.py, which
    node/retention.py and the simulation both drive): a subscriber holds the WAL only from its
    first ACK; nothing from its JOIN or its SUBSCRIBE, nothing for a member that never subscribed."""
    monkeypatch.setattr(Holds, "hold_all", lambda self, *args: None)
    monkeypatch.setattr(Holds, "on_subscribe", lambda self, *args: None)
    monkeypatch.setattr(Holds, "hold_for_new_members", lambda self, *args: ([], {}))


FLIPS = [
    # (scenario, rule turned back: a Cluster.rules switch, or a production function patched, the
    # invariant that must fail)
    (rejoin_keeps_uncovered_rows, ("cover", False), "invariant 2"),
    (lost_store_waits_for_every_member, ("fence", False), "invariant 1"),
    (peer_churn, ("one_link", False), "invariant 11"),
    (briefly_down_member, ("ack", "applied"), "invariant 12"),
    (registration_then_collection, holds_from_the_first_ack, "invariant 12"),
    (rejoin_under_gc_pressure, ("keep_local", False), "invariant 2"),
]


@pytest.mark.parametrize("scenario,rule,caught", FLIPS, ids=[f[0].__name__ for f in FLIPS])
def test_each_scenario_catches_the_rule_it_guards(make_cluster, monkeypatch, scenario, rule, caught):
    seed = {rejoin_keeps_uncovered_rows: 31, lost_store_waits_for_every_member: 32, peer_churn: 34,
            briefly_down_member: 35, registration_then_collection: 36, rejoin_under_gc_pressure: 37}[scenario]
    c = make_cluster(seed)
    if callable(rule):
        rule(monkeypatch)
    else:
        c.rules[rule[0]] = rule[1]
    with pytest.raises((SimFailure, AssertionError)) as e:
        scenario(c)
    assert caught in str(e.value), str(e.value)[:2000]
