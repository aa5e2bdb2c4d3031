"""node/core/link/claims.py: one link per member. The applier's host (node/applier/applier.py)
and the simulation (tests/sim/links.py, network.py) both run it."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from node.core.lifecycle_fence import claim_of, hear_greeting
from node.core.link import claims
from node.errors import PeerRefused

ME = "00000000-0000-4000-8000-000000000001"
P = "00000000-0000-4000-8000-000000000002"
Q = "00000000-0000-4000-8000-000000000003"


@dataclass(eq=False)
class Link:
    address: str
    stopping: bool = False


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



def test_a_claim_that_is_not_an_integer_is_ignored():
    """The claims themselves are node/core/lifecycle_fence.py's (tests/unit/test_lifecycle_fence.py);
    a greeting's vclock is the peer's word, so a claim of another type is no claim."""
    own: dict = {}
    hear_greeting(None, own, set(), greeting(P, "7"), ME)
    hear_greeting(None, own, set(), greeting(P, 7.5), ME)
    assert own == {} and claim_of(own, None, P) == 0
