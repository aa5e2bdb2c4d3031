"""node/core/link/claims.py: one link per member, and what a peer's claim on this node's own rows
holds. The applier's host (node/applier/applier.py), Peering (node/process/peering.py) and the
simulation (tests/sim/links.py, shell.py) all run these."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from node import limits
from node.core.link import claims
from node.errors import PeerRefused

ME = "00000000-0000-4000-8000-000000000001"
P = "00000000-0000-4000-8000-000000000002"
Q = "00000000-0000-4000-8000-000000000003"


@dataclass(eq=False)
class Link:
    address: str
    stopping: bool = False


@dataclass
class Fence:
    heard: dict = field(default_factory=dict)


def greeting(uuid: str, own: object, address: str = "p:1") -> dict:
    return {"uuid": uuid, "address": address, "vclock_uuid": {ME: own} if own is not None else {}}


def test_the_first_link_to_reach_a_member_keeps_it_and_another_address_of_it_is_refused_as_duplicate():
    followers: dict = {}
    a, b = Link("p:1"), Link("p-other:1")
    claims.claim_link(followers, P, a)
    claims.claim_link(followers, P, a)             # the same link again: still its own
    with pytest.raises(PeerRefused) as e:
        claims.claim_link(followers, P, b)
    assert e.value.code == "duplicate" and "p-other:1" in e.value.message and "p:1" in e.value.message
    assert followers == {P: a}


def test_a_new_link_waits_for_a_removed_link_to_the_same_member_to_finish_closing():
    followers: dict = {}
    old, new = Link("p:1"), Link("p:1")
    claims.claim_link(followers, P, old)
    old.stopping = True
    with pytest.raises(ConnectionError):
        claims.claim_link(followers, P, new)
    claims.release_link(followers, P, old)
    claims.claim_link(followers, P, new)
    assert followers == {P: new}


def test_releasing_a_link_that_does_not_follow_the_member_leaves_the_one_that_does():
    followers: dict = {}
    a, b = Link("p:1"), Link("p2:1")
    claims.claim_link(followers, P, a)
    claims.release_link(followers, P, b)
    claims.release_link(followers, None, a)
    assert followers == {P: a}
    claims.release_link(followers, P, a)
    assert followers == {}


def test_a_claim_on_our_own_rows_only_grows_and_is_ignored_from_a_peer_that_was_disproved():
    own: dict = {}
    claims.note_claim(own, set(), greeting(P, 5), ME)
    claims.note_claim(own, set(), greeting(P, 3), ME)            # smaller: kept at 5
    claims.note_claim(own, set(), greeting(P, "7"), ME)          # not an int: ignored
    assert own == {P: (5, "p:1")} and claims.own_claim(own, P) == 5 and claims.own_claim(own, Q) == 0
    claims.note_claim(own, {Q}, greeting(Q, 9), ME)
    assert Q not in own


def test_claims_are_bounded_by_members_max_so_invented_uuids_cannot_grow_them():
    own = {f"00000000-0000-4000-8000-{i:012x}": (1, "x:1") for i in range(100, 100 + limits.members_max)}
    claims.note_claim(own, set(), greeting(P, 5), ME)
    assert P not in own and len(own) == limits.members_max
    first = next(iter(own))
    claims.note_claim(own, set(), greeting(first, 5), ME)         # a known one still grows
    assert own[first] == (5, "p:1")


def test_a_disproved_claim_is_dropped_remembered_and_lowers_what_the_fence_heard():
    own = {P: (9, "p:1")}
    disproved: set = set()
    fence = Fence({P: 12})
    assert claims.disprove_claim(own, disproved, fence, P, 4) == 12
    assert own == {} and disproved == {P} and fence.heard == {P: 4}
    assert claims.disprove_claim({}, disproved, None, Q, 4) == 0 and Q in disproved


def test_only_an_upstreams_claim_holds_writes_and_claims_that_came_back_are_forgotten():
    own = {P: (9, "p:1"), Q: (20, "q:1")}
    assert claims.own_rows_awaited(own, 5, {P}) == (9, f"p:1 ({P[:8]})")
    assert claims.own_rows_awaited(own, 5, {"q:1"}) == (20, f"q:1 ({Q[:8]})")   # by its address too
    assert claims.own_rows_awaited(own, 5, set()) is None
    assert claims.own_rows_awaited(own, 9, {P, Q}) == (20, f"q:1 ({Q[:8]})") and P not in own
