"""A rejoin takes the donor's expel bounds for members this node never heard were expelled
(node/core/lifecycle_rejoin.py `uncovered`, Probed.bounds; node/core/membership.py
greeting_expel_bounds): rows of an expelled member past its bound are refused everywhere the
expel is known, so a donor lacking them covers this node. Without it, a node holding such rows
that every peer tells to rejoin never hears the expel (no row reaches it) and never finds a donor:
the simulation's full mix, seed 2370 (D held rows 1-3 of B, expelled with bound 0). A bound this
node knows itself stays its own (mine()), even where the donor's is lower."""
from __future__ import annotations

from node.core.lifecycle_rejoin import RejoinState
from node.core.lifecycle_rejoin_events import Probed, ProbeDonor, Rebuild, Status
from node.core.membership import greeting_expel_bounds
from tests.unit.helpers import UUID_A, UUID_B, UUID_C
from tests.unit.test_lifecycle_rejoin import ADDR_B, ADDR_C, ADDR_D, UUID_D, WHY, by_uuid, machine, take, told


def probing(vclock: dict, **kw):
    mc, host = machine(vclock, **kw)
    told(mc, {UUID_B: 8})
    mc.tick(100.0)
    take(mc)
    return mc, host


def test_a_donor_lacking_only_rows_of_a_member_it_expelled_past_their_bound_covers_this_node():
    mc, _ = probing({1: 4, 2: 7, 3: 2, 4: 3})            # D's rows 1-3, D not expelled here
    mc.step(Probed(ADDR_C, by_uuid(), bounds={UUID_D: 0}), 100.0)
    assert mc.state is RejoinState.REBUILDING
    assert take(mc) == ([Status("rejoining", WHY)], [Rebuild(ADDR_C, WHY)])


def test_a_donor_whose_bound_is_below_rows_it_lacks_of_a_member_is_not_taken_for_the_rows_under_it():
    mc, _ = probing({1: 4, 2: 7, 3: 2, 4: 3})
    mc.step(Probed(ADDR_C, by_uuid(), bounds={UUID_D: 2}), 100.0)   # D's row 2 is accepted there
    assert mc.state is RejoinState.PROBING and take(mc)[1][0].address == ADDR_B


def test_a_donor_that_expelled_nobody_does_not_cover_rows_it_lacks():
    mc, _ = probing({1: 4, 2: 7, 3: 2, 4: 3})
    mc.step(Probed(ADDR_C, by_uuid(), bounds={}), 100.0)
    assert mc.state is RejoinState.PROBING


def test_a_bound_this_node_knows_itself_is_its_own_even_where_the_donors_is_lower():
    mc, _ = probing({1: 4, 2: 7, 3: 2, 4: 3}, expelled_d=3)   # here D is expelled with bound 3
    mc.step(Probed(ADDR_C, by_uuid(), bounds={UUID_D: 0}), 100.0)
    assert mc.state is RejoinState.PROBING                   # D's rows 1-3 are accepted here


def test_a_received_snapshot_covers_this_node_with_its_own_expel_bounds():
    mc, _ = machine()
    mine = {UUID_A: 4, UUID_B: 7, UUID_C: 2, UUID_D: 3}
    assert mc.snapshot_uncovered(mine, by_uuid(b=7), {UUID_D: 0}) is None
    assert mc.snapshot_uncovered(mine, by_uuid(b=7), {UUID_D: 1}) == \
        f"does not cover this node ({UUID_D} up to lsn 1 (it has 0))"
    assert "up to lsn 3" in mc.snapshot_uncovered(mine, by_uuid(b=7))


def test_a_greeting_lists_its_expelled_members_with_their_bounds():
    g = {"cluster": [[UUID_A, 1, "a:1", "member", 1], [UUID_D, 4, "d:1", "expelled", 5, 3],
                     [UUID_C, 3, "c:1", "expelled"], [UUID_B, 2, "b:1", "anon", 0]]}
    assert greeting_expel_bounds(g) == {UUID_D: 3, UUID_C: 0}
    assert greeting_expel_bounds({}) == {} and greeting_expel_bounds({"cluster": None}) == {}


def _probe_d(expelled_d: int | None):
    """The need's upstream (C) and B cannot be donors; D covers this node."""
    mc, _ = probing({1: 4, 2: 7, 3: 2, 4: 3}, expelled_d=expelled_d)
    mc.step(Probed(ADDR_C, None), 100.0)
    mc.step(Probed(ADDR_B, None), 100.0)
    assert take(mc) == ([], [ProbeDonor(ADDR_B), ProbeDonor(ADDR_D)])
    mc.step(Probed(ADDR_D, {**by_uuid(), UUID_D: 3}, uuid=UUID_D), 100.0)
    return mc


def test_a_peer_expelled_here_is_no_donor_though_it_serves_and_covers_this_node():
    """It may not know of its expel yet: a member's row that reached it alone may since have
    been written again by that member (its fence waits for no expelled member)."""
    mc = _probe_d(expelled_d=3)
    assert mc.state is RejoinState.IDLE and "no reachable peer" in mc.blocked
    assert _probe_d(expelled_d=None).state is RejoinState.REBUILDING      # the same peer, a member
