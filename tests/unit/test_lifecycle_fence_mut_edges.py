"""node/core/lifecycle_fence.py at the edges mutation testing found unpinned: a greeting that
states no vclock by uuid (an older peer's) claims nothing; a peer holding none of our rows makes
no claim and one holding one does; a peer that claimed nothing has a claim of 0, fence or not;
the peers not believed again are bounded by members_max, exactly; the largest upstream claim
wins wherever it sits among the claims, and on a tie the first heard is named."""
from __future__ import annotations

from node import limits
from node.core.lifecycle_fence import claim_of, disprove_claim, hear_greeting, own_rows_awaited
from node.core.membership import OwnRowsFence

SELF, B, C = ("aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002",
              "cccccccc-0000-4000-8000-000000000003")


def _greeting(uuid: str, **kw) -> dict:
    return {"uuid": uuid, "address": "b:1", "cluster": [], **kw}


def test_a_greeting_stating_no_vclock_by_uuid_claims_nothing():
    claims: dict = {}
    hear_greeting(None, claims, set(), _greeting(B), SELF)
    hear_greeting(None, claims, set(), _greeting(B, vclock_uuid=None), SELF)
    assert claims == {}


def test_a_peer_holding_none_of_our_rows_makes_no_claim_and_one_holding_one_does():
    claims: dict = {}
    hear_greeting(None, claims, set(), _greeting(B, vclock_uuid={SELF: 0}), SELF)
    assert claims == {}
    hear_greeting(None, claims, set(), _greeting(B, vclock_uuid={SELF: 1}), SELF)
    assert claims == {B: (1, "b:1")}


def test_a_peer_that_claimed_nothing_has_a_claim_of_0_with_a_fence_or_without():
    assert claim_of({}, None, B) == 0
    assert claim_of({}, OwnRowsFence("lost"), B) == 0
    assert claim_of({B: (4, "b:1")}, None, B) == 4
    assert claim_of({B: (4, "b:1")}, OwnRowsFence("lost", heard={B: 6}), B) == 6


def test_the_peers_not_believed_again_are_bounded_by_members_max_exactly():
    disproved = {f"{i:08x}-0000-4000-8000-000000000000" for i in range(limits.members_max - 1)}
    disprove_claim({}, disproved, None, B, 3)
    assert B in disproved and len(disproved) == limits.members_max
    disprove_claim({}, disproved, None, C, 3)
    assert C not in disproved and len(disproved) == limits.members_max


def test_the_largest_upstream_claim_wins_wherever_it_sits_and_a_tie_names_the_first_heard():
    assert own_rows_awaited({B: (12, "b:1"), C: (8, "c:1")}, 5, {B, C}) == (12, f"b:1 ({B[:8]})")
    assert own_rows_awaited({B: (9, "b:1"), C: (9, "c:1")}, 5, {B, C}) == (9, f"b:1 ({B[:8]})")
