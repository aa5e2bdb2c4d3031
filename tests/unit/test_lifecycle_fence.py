"""The own-rows fence's rules and the claims on a node's own rows (node/core/lifecycle_fence.py),
with a real NodeCore and no IO: which start is a loss, what a greeting tells a fence and the
claims, a claim the stream belied, which claim holds writes, and the lift at its edge."""
from __future__ import annotations

import pytest

from node import limits
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.lifecycle_fence import (LOSS_NO_WAL, LOSS_POWER, claim_of, claims_unheeded, disprove_claim, fence_from_meta, hear_greeting,
                                       lift, loss_at_open, may_lift, own_rows_awaited)
from node.core.membership import OwnRowsFence
from node.core.replicaset import NodeCore
from node.core.rows import GROUP_CLUSTER
from node.core.vclock import VClock
from tests.unit.helpers import UUID_A, UUID_B, UUID_C

ADDR_B, ADDR_C = "b.example:1", "c.example:1"


def core(own: int = 5, fence: OwnRowsFence | None = None) -> NodeCore:
    table = ClusterTable([Member(UUID_A, 1, "a.example:1", STATE_MEMBER), Member(UUID_B, 2, ADDR_B, STATE_MEMBER),
                          Member(UUID_C, 3, ADDR_C, STATE_MEMBER)])
    c = NodeCore(UUID_A, table, VClock({1: own, 2: 3}), spaces={"kv": False})
    c.fence = fence
    return c


def greeting(uuid: str, ours: int | None, cluster=(), **kw) -> dict:
    vu = {UUID_B: 3} if ours is None else {UUID_A: ours, UUID_B: 3}
    return {"uuid": uuid, "address": ADDR_B if uuid == UUID_B else ADDR_C, "vclock_uuid": vu,
            "cluster": [list(r) for r in cluster], **kw}


# --- a loss at start ---------------------------------------------------------------------------
def start(**kw) -> str | None:
    args = dict(fenced=False, wal_mode="write", wal_present=True, was_running=True, boot_before="b1", boot_now="b1")
    args.update(kw)
    return loss_at_open(**args)


def test_a_machine_restart_while_running_with_wal_mode_write_is_a_loss():
    assert start(boot_now="b2") == LOSS_POWER


@pytest.mark.parametrize("kw", [dict(boot_now="b1"), dict(boot_now="b2", was_running=False),
                                dict(boot_now="b2", wal_mode="fsync"), dict(boot_now="b2", wal_mode="none"),
                                dict(boot_before="", boot_now="b2"), dict(boot_now=""),
                                dict(boot_now="b2", fenced=True), dict(wal_present=False, fenced=True)],
                         ids=["same boot", "stopped in order", "fsync", "no wal", "boot unknown before",
                              "boot unknown now", "already fenced", "already fenced without a wal"])
def test_a_start_that_lost_nothing_it_must_fence_against_is_no_loss(kw):
    assert start(**kw) is None


@pytest.mark.parametrize("before,loss",
                         [("none", None), ("write", LOSS_NO_WAL), ("fsync", LOSS_NO_WAL), ("", LOSS_NO_WAL)],
                         ids=["ran without a wal", "ran with write", "ran with fsync", "unknown"])
def test_a_missing_wal_is_no_loss_only_for_a_store_that_last_ran_without_one(before, loss):
    assert start(wal_present=False, wal_mode="write", was_running=False, wal_mode_before=before) == loss


@pytest.mark.parametrize("wal_mode,loss", [("write", LOSS_NO_WAL), ("fsync", LOSS_NO_WAL), ("none", None)])
def test_a_store_whose_wal_directory_is_gone_is_a_loss_unless_it_keeps_no_wal(wal_mode, loss):
    assert start(wal_present=False, wal_mode=wal_mode, was_running=False) == loss


def test_a_stored_fence_comes_back_with_registered_and_given_up_members():
    f = fence_from_meta({"reason": "lost", "rebuilt": True, "given_up": [UUID_C]}, {UUID_B})
    assert (f.reason, f.rebuilt, f.known, f.given_up) == ("lost", True, {UUID_B}, {UUID_C})
    assert fence_from_meta(None, {UUID_B}) is None and fence_from_meta({}, set()) is None
    assert fence_from_meta({"reason": ""}, set()).reason == "an earlier loss"


# --- greetings and claims ----------------------------------------------------------------------
def test_a_members_greeting_tells_the_fence_how_many_of_our_rows_it_holds_and_whom_it_knows():
    c = core(fence=OwnRowsFence("lost"))
    claims: dict = {}
    hear_greeting(c, claims, set(), greeting(UUID_B, 7, cluster=[["d-uuid", 4, "d:1", STATE_MEMBER],
                                                                  ["e-uuid", 5, "e:1", STATE_EXPELLED]]), UUID_A)
    assert c.fence.heard[UUID_B] == 7 and "d-uuid" in c.fence.known and "e-uuid" in c.fence.expelled
    assert claims == {UUID_B: (7, ADDR_B)}


def test_an_anonymous_replicas_greeting_feeds_the_fence_as_anonymous_and_its_claim_is_noted():
    c = core(fence=OwnRowsFence("lost"))
    claims: dict = {}
    hear_greeting(c, claims, set(), greeting(UUID_B, 7, anon=True), UUID_A)
    assert c.fence.heard[UUID_B] == 7 and c.fence.anonymous == {UUID_B: ADDR_B} and claims == {UUID_B: (7, ADDR_B)}


def test_a_peer_whose_claim_was_disproved_is_not_heard_again():
    c = core(fence=OwnRowsFence("lost"))
    claims: dict = {}
    hear_greeting(c, claims, {UUID_B}, greeting(UUID_B, 9), UUID_A)
    assert claims == {} and UUID_B not in c.fence.heard


def test_a_claim_only_grows():
    claims: dict = {UUID_B: (7, ADDR_B)}
    hear_greeting(core(), claims, set(), greeting(UUID_B, 6), UUID_A)
    assert claims[UUID_B] == (7, ADDR_B)
    hear_greeting(core(), claims, set(), greeting(UUID_B, 8), UUID_A)
    assert claims[UUID_B] == (8, ADDR_B)
    hear_greeting(None, claims, set(), greeting(UUID_C, None), UUID_A)     # no claim; no core yet
    assert UUID_C not in claims


def test_claims_past_what_this_node_has_from_peers_that_are_not_upstreams_are_the_unheeded_ones():
    """Shown by /v1/health (only an upstream's claim holds writes: own_rows_awaited)."""
    claims = {UUID_B: (9, "b:1"), UUID_C: (9, "c:1"), "dddddddd-0000-4000-8000-000000000004": (5, "d:1"),
              "eeeeeeee-0000-4000-8000-000000000005": (6, "e:1")}
    assert claims_unheeded(claims, 5, {UUID_B, "c:1"}) == [("eeeeeeee-0000-4000-8000-000000000005", 6, "e:1")]
    assert claims_unheeded(claims, 6, set()) == [(UUID_B, 9, "b:1"), (UUID_C, 9, "c:1")]
    assert len(claims) == 4                                  # (it drops nothing: own_rows_awaited does)


def test_claims_are_bounded_by_members_max():
    claims = {f"u{i}": (1, "") for i in range(limits.members_max)}
    hear_greeting(core(), claims, set(), greeting(UUID_B, 9), UUID_A)
    assert UUID_B not in claims
    claims["u0"] = (1, "")
    hear_greeting(core(), claims, set(), {**greeting(UUID_B, 9), "uuid": "u0"}, UUID_A)
    assert claims["u0"] == (9, ADDR_B)              # a peer it knows may raise its claim


def test_a_claim_the_stream_belied_is_dropped_and_the_fence_counts_only_what_came():
    fence = OwnRowsFence("lost")
    fence.heard[UUID_B] = 9
    claims, disproved = {UUID_B: (8, ADDR_B)}, set()
    assert claim_of(claims, fence, UUID_B) == 9 and claim_of(claims, None, UUID_B) == 8
    assert disprove_claim(claims, disproved, fence, UUID_B, 5) == 9
    assert claims == {} and disproved == {UUID_B} and fence.heard[UUID_B] == 5
    assert disprove_claim({}, set(), None, UUID_C, 5) == 0


@pytest.mark.parametrize("have,awaited", [(7, (8, f"{ADDR_B} ({UUID_B[:8]})")), (8, None), (9, None)])
def test_writes_wait_for_an_upstreams_claim_until_the_rows_are_back(have, awaited):
    claims = {UUID_B: (8, ADDR_B)}
    assert own_rows_awaited(claims, have, {UUID_B}) == awaited
    assert (UUID_B in claims) is (awaited is not None)    # a claim met is dropped


def test_only_an_upstreams_claim_holds_writes_by_its_uuid_or_address_and_the_largest_wins():
    claims = {UUID_B: (8, ADDR_B), UUID_C: (12, ADDR_C)}
    assert own_rows_awaited(claims, 5, set()) is None
    assert own_rows_awaited(claims, 5, {UUID_B}) == (8, f"{ADDR_B} ({UUID_B[:8]})")
    assert own_rows_awaited(claims, 5, {UUID_B, ADDR_C}) == (12, f"{ADDR_C} ({UUID_C[:8]})")


# --- the lift ----------------------------------------------------------------------------------
def _heard_all(fence: OwnRowsFence, b: int, c: int) -> OwnRowsFence:
    fence.hear(UUID_B, b)
    fence.hear(UUID_C, c)
    return fence


@pytest.mark.parametrize("own,lifts", [(7, True), (6, False)])
def test_the_fence_lifts_once_every_member_is_heard_and_our_rows_are_back(own, lifts):
    assert may_lift(core(own, _heard_all(OwnRowsFence("lost"), 7, 4))) is lifts


def test_the_fence_waits_for_a_member_not_heard_from():
    fence = OwnRowsFence("lost")
    fence.hear(UUID_B, 5)
    assert not may_lift(core(5, fence))


def test_a_lifted_rebuilt_fence_states_the_table_again_and_carries_the_expels_given_up():
    c = core(7, _heard_all(OwnRowsFence("lost", rebuilt=True), 7, 0))
    lifted = lift(c, 1_700_000_000_000_000, [UUID_C, UUID_B, UUID_C])
    assert c.fence is None and lifted.target == 7 and lifted.given_up == [UUID_B, UUID_C]
    assert lifted.restate is not None and lifted.restate.group == GROUP_CLUSTER and lifted.restate.lsn == 8
    assert lifted.own_history_lsn == 7 == c.own_history_lsn


def test_a_lifted_fence_over_the_nodes_own_store_writes_nothing():
    c = core(7, _heard_all(OwnRowsFence("lost"), 7, 0))
    lifted = lift(c, 1_700_000_000_000_000, None)
    assert lifted.restate is None and lifted.given_up == [] and c.fence is None


def test_an_anonymous_member_is_not_restated():
    table = ClusterTable([Member(UUID_A, 1, "a:1", STATE_MEMBER), Member(UUID_B, 2, ADDR_B, STATE_ANON)])
    c = NodeCore(UUID_A, table, VClock({1: 3}), spaces={})
    c.fence = OwnRowsFence("lost", rebuilt=True)
    lifted = lift(c, 1_700_000_000_000_000, ())
    assert [op.key for op in lifted.restate.ops] == [UUID_A]
