"""A member whose store was lost greets `member_of` its cluster (node/lifecycle.py
greeting_fields, from its identity files), and a fresh node polling it does not count it fresh
(node/core/lifecycle_join.py is_fresh): it waits for that cluster instead of founding one of its
own. The field is checked on the wire like the greeting's cluster_uuid. (On real processes:
tests/integration/test_join_beside_a_lost_store.py; in the simulation:
tests/sim/test_scenarios_membership.py.)"""
from __future__ import annotations

import pytest

from node.core import messages as m
from node.core.lifecycle_join import JoinState
from node.core.lifecycle_join_rules import founders, is_fresh
from node.core.lifecycle_join_events import Bootstrap, Status
from node.errors import RemoteProtocolError
from tests.unit.helpers import UUID_A, UUID_B, UUID_C
from tests.unit.test_lifecycle_join import ADDR_B, ADDR_C, CLUSTER, fresh, machine, polled_with


def lost_store(uuid: str, cluster: str = CLUSTER) -> dict:
    return {**fresh(uuid), "member_of": cluster}


def greeting(**fields) -> dict:
    return {"uuid": UUID_B, "cluster_uuid": None, "cluster_name": "c", "options_digest": "d", "address": "b.x:1",
            "status": "joining", "cluster": [], "anon": False, **fields}


def test_a_peer_without_a_store_but_member_of_a_cluster_is_not_fresh():
    assert is_fresh(fresh(UUID_B))
    assert not is_fresh(lost_store(UUID_B))
    assert not is_fresh({**fresh(UUID_B), "cluster_uuid": CLUSTER})
    assert not is_fresh(ConnectionError("refused"))


def test_the_lowest_fresh_node_does_not_found_while_a_peer_is_a_member_that_lost_its_store():
    assert founders(UUID_A, {ADDR_B: fresh(UUID_B), ADDR_C: fresh(UUID_C)}, [ADDR_B, ADDR_C]) == (UUID_B, UUID_C, UUID_A)
    assert founders(UUID_A, {ADDR_B: fresh(UUID_B), ADDR_C: lost_store(UUID_C)}, [ADDR_B, ADDR_C]) is None


def test_a_fresh_node_whose_only_peer_lost_its_store_waits_and_says_why():
    rd = polled_with(j := machine(peers=(ADDR_B,)), {ADDR_B: lost_store(UUID_B)})
    assert j.state is JoinState.WAITING and not any(type(e) is Bootstrap for e in rd.effects)
    assert rd.apply[-1] == Status(None, f"waiting for a booted peer (0 of 1 peers fresh); {ADDR_B} lost its store "
                                        f"(a member of cluster {CLUSTER}): waiting for it to rejoin")


def test_once_the_member_has_rejoined_the_newcomer_asks_it_to_join():
    rd = polled_with(j := machine(peers=(ADDR_B,)), {ADDR_B: {**fresh(UUID_B), "cluster_uuid": CLUSTER,
                                                              "status": "running"}})
    assert j.state is JoinState.ASKING and rd.effects[0].address == ADDR_B


@pytest.mark.parametrize("member_of,ok", [(None, True), (CLUSTER, True), ("not-a-uuid", False), (7, False),
                                          (CLUSTER.upper(), False)])
def test_member_of_on_the_wire_is_null_or_a_canonical_uuid(member_of, ok):
    data = m.encode_body(m.GREETING, greeting(member_of=member_of))
    if ok:
        assert m.decode(data).body["member_of"] == member_of
    else:
        with pytest.raises(RemoteProtocolError, match="member_of is not a canonical uuid"):
            m.decode(data)
