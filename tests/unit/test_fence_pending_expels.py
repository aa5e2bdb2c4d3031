"""An expel the operator asked of a fenced node is written when its fence lifts
(node/core/lifecycle_fence.py `expels_after_lift`, used by node/process/node.py after_fence and
the simulation), also for a member the node has no `_cluster` row for: a fenced node registers
nobody, so a member it heard of only in greetings (one it waits for) has none, and dropping its
expel left every other fenced member waiting for it for ever (the simulation's full mix, seed
5514). The new row states it expelled with bound 0; every node holding its rows raises the bound
to what it holds (node/cluster_space/resolver.py)."""
from __future__ import annotations

from node.cluster_space.table import STATE_EXPELLED
from node.core.lifecycle_fence import expels_after_lift
from tests.unit.test_link_relay_machine import GONE, SUB, new_core

NEVER_SEEN = "00000000-0000-4000-8000-000000000009"
WALL_US = 1_700_000_000_000_000


def test_each_member_given_up_and_not_expelled_yet_is_expelled_at_the_lift_with_its_address():
    core = new_core()                                   # SUB a member, GONE expelled already
    assert expels_after_lift(core, [SUB, GONE]) == [(SUB, "2.example:1")]
    assert expels_after_lift(core, []) == []


def test_a_member_given_up_that_this_node_has_no_row_for_is_expelled_too():
    core = new_core()
    assert expels_after_lift(core, [NEVER_SEEN]) == [(NEVER_SEEN, "")]
    local_id, txn = core.register_member(NEVER_SEEN, "", WALL_US, state=STATE_EXPELLED)
    mem = core.table.get(NEVER_SEEN)
    assert txn is not None and mem.state == STATE_EXPELLED and mem.expelled_lsn == 0 and mem.id == local_id
    assert expels_after_lift(core, [NEVER_SEEN]) == []   # written once
