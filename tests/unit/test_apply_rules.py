"""node/core/apply.py's rules that mutation testing found unpinned (issue 18), on the simulation's
StateView (the LMDB store's in-memory twin): a space row for a space that exists changes nothing,
and a txn the state's vclock already covers moves no component (and is no error)."""
from __future__ import annotations

from node.cluster_space.table import STATE_MEMBER
from node.core.apply import apply_txns
from node.core.rows import GROUP_DEFAULT, OP_PUT, OP_SPACE, Op, Txn
from tests.sim.simnode import Base, SimState

SELF, PEER = "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002"


def _state() -> SimState:
    return SimState(Base([[SELF, 1, "", STATE_MEMBER], [PEER, 2, "", STATE_MEMBER]], {1: 3, 2: 5},
                         {"kv": (False, "lww")}, {"kv": {}}))


def test_a_space_row_for_a_space_that_exists_changes_neither_its_kind_nor_its_resolver():
    s = _state()
    apply_txns(s, [Txn(2, 6, GROUP_DEFAULT, 1, (Op(OP_SPACE, "kv", "", {"local": True, "conflict": "apply"}),))], SELF)
    assert s.spaces["kv"] == (False, "lww") and s.vclock.get(2) == 6


def test_a_txn_the_state_already_covers_moves_no_component():
    s = _state()
    tops = apply_txns(s, [Txn(2, 5, GROUP_DEFAULT, 1, (Op(OP_PUT, "kv", "k", 1),))], SELF)
    assert tops == {2: 5} and s.vclock.to_dict() == {1: 3, 2: 5}
