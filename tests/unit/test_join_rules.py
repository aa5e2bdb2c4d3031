"""Qpid join rules: options, initialization over the sets I, C, D, E, T, joining, and the
store comparison behind `replog admin compare`, concurrent stores included."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:   # tests/unit has no __init__.py and replog is not pip-installed
    sys.path.insert(0, str(REPO))

from node.core.vclock import Order
from node.identity.signature import (
    MUST_MATCH_OPTIONS, NO_CLEAN_STORE, FinalSignature, InitialSignature, MemberStatus, Outcome,
    StoreInfo, StoreStatus, compare_stores, compare_vclocks_by_uuid, decide_initialization,
    decide_join, first_mismatch, options_digest,
)

A, B, C, D = (f"{c * 8}-{c * 4}-4{c * 3}-8{c * 3}-{c * 12}" for c in "abcd")
SIG = InitialSignature("11111111-1111-4111-8111-111111111111", 100.0, (B, A))
OTHER_SIG = InitialSignature("22222222-2222-4222-8222-222222222222", 200.0, (C,))
FINAL = FinalSignature({A: 10, B: 7}, "shutdown-1")
OPTS = {"cluster_name": "prod", "identity": "local", "listen": "127.0.0.1:7301"}
DIGEST = options_digest(OPTS)


def member(uuid, status, initial=None, final=None, digest=DIGEST, proposal=None):
    return MemberStatus(uuid, status, initial, final, digest, proposal)


def clean(uuid, final=FINAL, initial=SIG):
    return member(uuid, StoreStatus.CLEAN, initial, final)


def dirty(uuid, initial=SIG):
    return member(uuid, StoreStatus.DIRTY, initial)


# --- options ---------------------------------------------------------------------------------

def test_digest_covers_only_must_match_options_and_is_stable():
    assert options_digest(OPTS) == options_digest({**OPTS, "listen": "10.0.0.5:7301", "wal_mode": "fsync"})
    assert options_digest(OPTS) == options_digest(dict(reversed(list(OPTS.items()))))
    assert options_digest(OPTS) != options_digest({**OPTS, "cluster_name": "staging"})
    assert options_digest({"lease_duration_s": 15}) == options_digest({"lease_duration_s": 15.0})


def test_first_mismatch_names_the_first_differing_option():
    assert first_mismatch(OPTS, {**OPTS, "listen": "elsewhere"}) is None
    assert first_mismatch(OPTS, {**OPTS, "identity": "lease", "cluster_size": 3}) == "identity"
    assert first_mismatch(OPTS, {**OPTS, "lease_duration_s": 9}) == "lease_duration_s"
    assert "cluster_name" in MUST_MATCH_OPTIONS


def test_option_mismatch_aborts_initialization():
    d = decide_initialization([member(A, StoreStatus.EMPTY, proposal=(SIG.cluster_uuid, 1.0)),
                               member(B, StoreStatus.EMPTY, digest=options_digest({"cluster_name": "x"}))])
    assert d.outcome is Outcome.ABORT and d.code == "options_mismatch"
    assert A in d.message and B in d.message and d.active == ()


# --- initialization --------------------------------------------------------------------------

def test_fewer_than_wait_for_members_wait():
    d = decide_initialization([member(A, StoreStatus.EMPTY, proposal=("x", 1.0))], wait_for=2)
    assert d.outcome is Outcome.WAIT and d.active == ()


def test_all_empty_or_transient_go_active_and_empty_stores_set_one_initial_signature():
    members = [member(C, StoreStatus.TRANSIENT, proposal=(OTHER_SIG.cluster_uuid, 9.0)),
               member(B, StoreStatus.EMPTY, proposal=(SIG.cluster_uuid, 5.0)),
               member(A, StoreStatus.EMPTY)]
    d = decide_initialization(members, wait_for=3)
    assert d.outcome is Outcome.ACTIVATE
    assert d.active == (A, B, C) and d.set_initial == (A, B)
    # the smallest uuid that proposed wins, and every member computes the same
    assert d.initial == InitialSignature(SIG.cluster_uuid, 5.0, (A, B, C))
    assert decide_initialization(list(reversed(members)), wait_for=3) == d


def test_new_cluster_without_a_proposal_is_a_wiring_bug():
    with pytest.raises(ValueError):
        decide_initialization([member(A, StoreStatus.EMPTY)])


def test_stores_of_different_clusters_abort():
    d = decide_initialization([clean(A), dirty(B, initial=OTHER_SIG)])
    assert d.outcome is Outcome.ABORT and d.code == "different_clusters"
    assert d.message.startswith("stores belong to different clusters")
    assert SIG.cluster_uuid in d.message and OTHER_SIG.cluster_uuid in d.message


def test_clean_stores_from_different_shutdowns_abort():
    later = FinalSignature({A: 12, B: 7}, "shutdown-2")
    d = decide_initialization([clean(A), clean(B, final=later)])
    assert d.outcome is Outcome.ABORT and d.code == "different_shutdowns"
    assert d.message.startswith("clean stores from different shutdowns")
    assert "shutdown-1" in d.message and "shutdown-2" in d.message


def test_every_store_dirty_cannot_recover_and_points_at_the_tools():
    d = decide_initialization([dirty(A), dirty(B), member(C, StoreStatus.EMPTY)])
    assert d.outcome is Outcome.ABORT and d.code == "no_clean_store"
    assert d.message == NO_CLEAN_STORE == "Cannot recover, no clean store"
    assert "replog admin compare" in d.hint and "mark-clean" in d.hint


def test_members_without_a_clean_store_catch_up_from_one_with_it():
    members = [clean(A), clean(B), dirty(C), member(D, StoreStatus.EMPTY),
               member("eeeeeeee-eeee-4eee-8eee-eeeeeeeeeeee", StoreStatus.TRANSIENT)]
    d = decide_initialization(members, wait_for=5)
    assert d.outcome is Outcome.CATCH_UP and d.initial == SIG
    assert d.sources == (A, B) and d.active == (A, B)
    assert d.set_initial == (D,)
    assert [m for m, _ in d.catch_up] == [C, D, "eeeeeeee-eeee-4eee-8eee-eeeeeeeeeeee"]
    assert {src for _, src in d.catch_up} == {A, B}     # updates spread over the sources
    assert d.source_for(C) in (A, B) and d.source_for(A) is None


def test_all_clean_stores_from_one_shutdown_go_active_without_updates():
    d = decide_initialization([clean(A), clean(B)], wait_for=2)
    assert d.outcome is Outcome.CATCH_UP and d.active == (A, B) and d.catch_up == ()


def test_inconsistent_statuses_are_refused_when_built():
    with pytest.raises(ValueError):
        member(A, StoreStatus.CLEAN, SIG, None)
    with pytest.raises(ValueError):
        member(A, StoreStatus.DIRTY, None)
    with pytest.raises(ValueError):
        member(A, StoreStatus.EMPTY, SIG)
    with pytest.raises(ValueError):
        decide_initialization([dirty(A), dirty(A)])


# --- joining ---------------------------------------------------------------------------------

@pytest.mark.parametrize("status,sets", [(StoreStatus.EMPTY, True), (StoreStatus.TRANSIENT, False)])
def test_joiner_without_a_store_takes_an_update(status, sets):
    d = decide_join(SIG, status, None)
    assert d.update and d.set_initial is sets


@pytest.mark.parametrize("status", [StoreStatus.CLEAN, StoreStatus.DIRTY])
def test_joiner_with_this_clusters_store_takes_an_update(status):
    d = decide_join(SIG, status, InitialSignature(SIG.cluster_uuid, SIG.created_s, (A, B)))
    assert d.update and not d.set_initial


@pytest.mark.parametrize("status", [StoreStatus.CLEAN, StoreStatus.DIRTY])
def test_joiner_with_another_clusters_store_aborts_wrong_store(status):
    d = decide_join(SIG, status, OTHER_SIG)
    assert not d.update and d.code == "wrong_store" and d.message.startswith("wrong store")


def test_join_with_inconsistent_store_arguments_is_refused():
    with pytest.raises(ValueError):
        decide_join(SIG, StoreStatus.DIRTY, None)
    with pytest.raises(ValueError):
        decide_join(SIG, StoreStatus.EMPTY, SIG)


# --- compare ---------------------------------------------------------------------------------

@pytest.mark.parametrize("a,b,order", [
    ({A: 1, B: 2}, {A: 1, B: 2}, Order.EQUAL),
    ({A: 1}, {A: 1, B: 2}, Order.BEFORE),
    ({A: 3, B: 2}, {A: 1, B: 2}, Order.AFTER),
    ({A: 3}, {B: 2}, Order.CONCURRENT),
    ({A: 3, B: 1}, {A: 1, B: 3}, Order.CONCURRENT),
])
def test_vclock_by_uuid_compares_both_ways(a, b, order):
    flip = {Order.BEFORE: Order.AFTER, Order.AFTER: Order.BEFORE}.get(order, order)
    assert compare_vclocks_by_uuid(a, b) is order
    assert compare_vclocks_by_uuid(b, a) is flip


def test_compare_finds_the_latest_store_of_one_cluster():
    r = compare_stores([("n1", SIG, None, {A: 5, B: 3}), ("n2", SIG, FINAL, {A: 10, B: 7}),
                        ("n3", SIG, None, {A: 10})])
    assert r.same_cluster and r.latest == ("n2",) and r.maximal == ("n2",)
    assert r.concurrent == (("n1", "n3"),)    # below the latest, still never ordered
    assert ("n1", "n2", Order.BEFORE) in r.relations and ("n2", "n3", Order.AFTER) in r.relations
    assert "mark-clean" in r.summary and "n2" in r.summary


def test_compare_reports_equal_latest_stores_together():
    r = compare_stores([StoreInfo("n1", SIG, FINAL, {A: 10, B: 7}), StoreInfo("n2", SIG, FINAL, {A: 10, B: 7}),
                        StoreInfo("n3", SIG, None, {A: 1})])
    assert r.latest == ("n1", "n2")


def test_compare_never_orders_concurrent_stores():
    r = compare_stores([("n1", SIG, None, {A: 10, B: 1}), ("n2", SIG, None, {A: 4, B: 9}),
                        ("n3", SIG, None, {A: 1})])
    assert r.same_cluster and r.latest == ()
    assert r.maximal == ("n1", "n2") and r.concurrent == (("n1", "n2"),)
    assert "concurrent" in r.summary and "n1 and n2" in r.summary


def test_compare_tells_stores_of_different_clusters_apart():
    r = compare_stores([("n1", SIG, None, {A: 10}), ("n2", OTHER_SIG, None, {A: 99}),
                        ("n3", SIG, None, {A: 3}), ("n4", None, None, {})])
    assert not r.same_cluster and r.latest == ()
    assert dict((names, sig) for sig, names in r.clusters) == {("n1", "n3"): SIG, ("n2",): OTHER_SIG, ("n4",): None}
    assert r.relations == (("n1", "n3", Order.AFTER),)   # only within one cluster
    assert r.summary.startswith("stores belong to different clusters")


def test_compare_of_one_store_and_bad_input():
    assert compare_stores([("n1", SIG, None, {A: 1})]).latest == ("n1",)
    with pytest.raises(ValueError):
        compare_stores([])
    with pytest.raises(ValueError):
        compare_stores([("n1", SIG, None, {}), ("n1", SIG, None, {})])
