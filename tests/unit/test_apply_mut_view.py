"""node/core/apply.py over the least a StateView may be (only the protocol's methods: no
`replacer`, no `own_history_lsn`) and on the `_cluster` rows it builds members from: the edges
mutation testing found pinned only by the simulation (issue 18). A view without a replacer
resolves through get-then-put; one without own_history_lsn has no history; this node's own
`_cluster` row becomes the member it states, field by field; a peer's is knowledge whatever its
lsn; a resolver sees a local row as this node's own."""
from __future__ import annotations

import pytest

from node.cluster_space.resolver import DATA_RESOLVERS, register_resolver
from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.apply import apply_txns
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_CLUSTER, OP_PUT, Op, Txn
from node.core.vclock import VClock

SELF, PEER, NEW = ("aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002",
                   "cccccccc-0000-4000-8000-000000000003")
SEEN: list[tuple] = []
RECORDING = "test-apply-mut-recording"


def _recording(old, new) -> bool:
    SEEN.append((old, new))
    return True


if RECORDING not in DATA_RESOLVERS:
    register_resolver(RECORDING, _recording)


class MinimalView:
    """A StateView with the protocol's methods and nothing optional."""

    def __init__(self, spaces: dict[str, tuple[bool, str]]):
        self.table = ClusterTable([Member(SELF, 1, "", STATE_MEMBER), Member(PEER, 2, "", STATE_MEMBER)])
        self.vclock = VClock({})
        self.spaces = dict(spaces)
        self.data: dict[str, dict[str, list]] = {s: {} for s in spaces}
        self.members: list[Member] = []
        self.knowledge: list[tuple] = []

    def space(self, name):
        return self.spaces.get(name)

    def create_space(self, name, local, conflict):
        self.spaces[name] = (local, conflict)
        self.data[name] = {}

    def get(self, space, key):
        r = self.data[space].get(key)
        return None if r is None else list(r)

    def put(self, space, key, rec):
        self.data[space][key] = list(rec)

    def delete(self, space, key):
        self.data[space].pop(key, None)

    def put_member(self, m):
        self.members.append(m)

    def put_knowledge(self, origin_uuid, member_uuid, their_id):
        self.knowledge.append((origin_uuid, member_uuid, their_id))


def _put(rid: int, lsn: int, ts: int, value, space: str = "kv", group: int = GROUP_DEFAULT) -> Txn:
    return Txn(rid, lsn, group, ts, (Op(OP_PUT, space, "k", value),))


def _cluster_row(rid: int, lsn: int, value: dict) -> Txn:
    return Txn(rid, lsn, GROUP_CLUSTER, 1, (Op(OP_CLUSTER, "_cluster", NEW, value),))


def test_a_view_without_a_replacer_resolves_each_row_against_the_record_it_held():
    v = MinimalView({"kv": (False, "lww")})
    apply_txns(v, [_put(2, 1, 10, "first")], SELF)
    assert v.data["kv"]["k"] == ["first", 2, 1, 10, False]
    apply_txns(v, [_put(2, 2, 5, "older clock")], SELF)          # loses: the held record stays
    assert v.data["kv"]["k"] == ["first", 2, 1, 10, False]
    apply_txns(v, [_put(2, 3, 20, "newer clock")], SELF)         # wins: it replaces the held one
    assert v.data["kv"]["k"] == ["newer clock", 2, 3, 20, False]
    assert v.vclock.get(2) == 3


def test_a_view_without_own_history_lsn_takes_this_nodes_first_cluster_row_as_live():
    v = MinimalView({})
    apply_txns(v, [_cluster_row(1, 1, {"id": 3, "address": "h:1", "state": STATE_MEMBER})], SELF)
    assert v.table.get(NEW) == Member(NEW, 3, "h:1", STATE_MEMBER, 1, 0)
    assert v.members == [v.table.get(NEW)]


def test_this_nodes_own_cluster_row_becomes_the_member_it_states_field_by_field():
    v = MinimalView({})
    apply_txns(v, [_cluster_row(1, 7, {"id": 3, "address": "h:1", "state": STATE_EXPELLED, "expelled_lsn": 4})],
               SELF)
    assert v.table.get(NEW) == Member(NEW, 3, "h:1", STATE_EXPELLED, 7, 4)


@pytest.mark.parametrize("value", [{"id": 3, "state": STATE_MEMBER},
                                   {"id": 3, "address": None, "state": STATE_MEMBER, "expelled_lsn": None}])
def test_a_cluster_row_stating_no_address_or_bound_makes_a_member_with_an_empty_address_and_bound_0(value):
    v = MinimalView({})
    apply_txns(v, [_cluster_row(1, 7, value)], SELF)
    assert v.table.get(NEW) == Member(NEW, 3, "", STATE_MEMBER, 7, 0)


def test_a_peers_cluster_row_at_or_below_this_nodes_own_history_is_still_learned_as_its_knowledge():
    v = MinimalView({})
    v.own_history_lsn = 10
    apply_txns(v, [_cluster_row(2, 5, {"id": 9, "address": "h:1", "state": STATE_MEMBER})], SELF)
    assert v.knowledge == [(PEER, NEW, 9)]
    assert v.table.get(NEW) is None
    assert v.vclock.get(2) == 5


def test_a_resolver_sees_a_local_rows_new_record_under_this_nodes_uuid():
    v = MinimalView({"loc": (True, RECORDING)})
    SEEN.clear()
    apply_txns(v, [_put(1, 1, 10, "a", "loc", GROUP_LOCAL), _put(1, 2, 11, "b", "loc", GROUP_LOCAL)], SELF)
    assert SEEN == [(("a", SELF, 1, 10, False), ("b", SELF, 2, 11, False))]
    assert v.vclock.get(0) == 2 and v.vclock.get(1) == 0


def test_an_op_of_no_kind_the_protocol_knows_is_a_callers_bug_and_asserts():
    v = MinimalView({})
    with pytest.raises(AssertionError):
        apply_txns(v, [Txn(2, 1, GROUP_DEFAULT, 1, (Op(9, "kv", "k", None),))], SELF)
