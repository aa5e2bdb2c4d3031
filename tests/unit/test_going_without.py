"""Going without an expelled member's rows that live in a snapshot only (docs/replication.md,
"A rejoin discards nothing"): the rejoin machine names them once an attempt finds no donor
(RejoinMachine.going_without), the applier's SUBSCRIBE says so (`without`), and a relay that
collected only those components serves the rest instead of telling the subscriber to rejoin.
The run that needed it is tests/sim/test_fixed_bugs.py test_rows_in_two_snapshots_only_do_not_stall_the_members."""
from __future__ import annotations

import pytest

from node import limits
from node.cluster_space.table import STATE_EXPELLED
from node.core import messages as m
from node.core.lifecycle_rejoin import RejoinState
from node.core.lifecycle_rejoin_events import ProbeDonor, Probed, Rebuilt
from node.core.link.applier import ApplierState
from node.core.link.relay import RelayState
from node.core.membership import OwnRowsFence
from node.core.replicaset import relay_wanted
from node.core.vclock import VClock
from node.errors import RemoteProtocolError
from node.process.views import rejoin_info
from tests.unit import test_link_applier_machine as am
from tests.unit import test_link_relay_machine as rm
from tests.unit import test_lifecycle_rejoin as rj
from tests.unit.helpers import UUID_B

# --- the rejoin machine: what an attempt that found no donor goes without ------------------------


def _blocked(collected: dict, vclock=None, expelled_d: int | None = 9):
    mc, host = rj.machine(vclock, expelled_d=expelled_d)
    rj.told(mc, collected)
    rj._blocked_attempt(mc, 100.0)
    return mc, host


def test_an_attempt_that_finds_no_donor_goes_without_the_expelled_members_rows_only():
    """B is a member: it writes on, and its next row needs the ones before it, so its rows are
    never gone without (the links keep asking for a rejoin). D is expelled, with bound 9."""
    mc, _ = _blocked({UUID_B: 8, rj.UUID_D: 6})
    assert mc.going_without() == {rj.UUID_D: 6}


def test_nothing_is_gone_without_before_an_attempt_ends_blocked():
    mc, _ = rj.machine(expelled_d=9)
    rj.told(mc, {rj.UUID_D: 6})
    mc.tick(100.0)
    assert mc.state is RejoinState.PROBING and mc.going_without() == {}


def test_a_donor_that_lacks_only_this_nodes_rows_blocks_too_and_the_expelled_rows_are_gone_without():
    mc, _ = rj.machine({1: 4, 2: 7, 3: 2}, expelled_d=9)
    rj.told(mc, {rj.UUID_D: 6})
    mc.tick(100.0)
    for addr in (rj.ADDR_C, rj.ADDR_B, rj.ADDR_D):
        rj.take(mc)
        # it has D's rows but lacks this node's own (A 4): a snapshot of it would discard them
        mc.step(Probed(addr, {rj.UUID_A: 3, UUID_B: 7, rj.UUID_C: 2, rj.UUID_D: 6}), 100.0)
    assert mc.state is RejoinState.IDLE and "would discard" in mc.blocked
    assert mc.going_without() == {rj.UUID_D: 6}


@pytest.mark.parametrize("d_has, gone", [(5, {rj.UUID_D: 6}), (6, {}), (7, {})])
def test_rows_gone_without_are_no_longer_named_once_they_came(d_has, gone):
    mc, host = _blocked({rj.UUID_D: 6}, {1: 4, 2: 7, 3: 2, 4: 0})
    host.the_core.vclock = VClock({1: 4, 2: 7, 3: 2, 4: d_has})
    assert mc.going_without() == gone


def test_a_member_this_node_has_no_row_of_is_gone_without_from_its_first_row():
    mc, host = _blocked({rj.UUID_D: 1}, {1: 4, 2: 7, 3: 2})
    assert mc.going_without() == {rj.UUID_D: 1}


def test_rows_gone_without_do_not_stop_a_streaming_upstream_from_feeding_other_rows():
    """Only what is gone without is not fed by a following upstream: B's row 8, which it has,
    is still left to it (no attempt)."""
    mc, host = _blocked({rj.UUID_D: 6})
    rj.take(mc)
    host.links[rj.ADDR_B] = (True, {UUID_B: 8, rj.UUID_D: 6})
    assert mc.fed({UUID_B: 8}) and not mc.fed({UUID_B: 8, rj.UUID_D: 6})


def test_while_the_store_is_swapped_nothing_is_gone_without():
    """A rebuild reopens the node with no core for a moment; /v1/info may ask meanwhile."""
    mc, host = _blocked({rj.UUID_D: 6})
    host.core = lambda: None
    assert mc.going_without() == {}


def test_the_most_an_attempt_lacked_is_kept_and_a_rebuild_forgets_it():
    mc, host = _blocked({rj.UUID_D: 6})
    mc.needed[rj.ADDR_C] = {rj.UUID_D: 4}
    rj._blocked_attempt(mc, 100.0 + rj.RETRY)
    assert mc.going_without() == {rj.UUID_D: 6}
    mc.state = RejoinState.REBUILDING
    mc.step(Rebuilt(rj.ADDR_C), 200.0)
    assert mc.going_without() == {} and mc.without == {}


def test_a_node_going_without_asks_again_every_retry_interval_and_rebuilds_once_a_donor_covers_it():
    """Its links follow again (no need is left), yet it still looks for a donor: every peer
    may since have taken the rows that kept one from covering it (full seed 1597: A went
    without D's row 5 while only A held its own row 6; then every peer had both, in snapshots).
    An upstream that follows and has the rows does not hold the attempt: it may have them in
    its snapshot only, and it serves this node without them."""
    mc, host = _blocked({rj.UUID_D: 6})
    rj.take(mc)                                      # (the first attempt's Blocked)
    mc.note_follow(rj.ADDR_C)
    host.links = {rj.ADDR_B: (True, {rj.UUID_D: 6}), rj.ADDR_C: (True, {rj.UUID_D: 6})}
    assert mc.need == {} and mc.wanted() == {rj.UUID_D: 6} and not mc.fed(mc.wanted())
    mc.tick(100.0 + rj.RETRY - 0.001)
    assert mc.state is RejoinState.IDLE and mc.attempts == 1
    mc.tick(100.0 + rj.RETRY)
    assert mc.state is RejoinState.PROBING and mc.attempts == 2
    assert rj.take(mc) == ([], [ProbeDonor(rj.ADDR_B)])
    mc.step(Probed(rj.ADDR_B, {rj.UUID_A: 4, UUID_B: 7, rj.UUID_C: 2, rj.UUID_D: 6}), 200.0)
    assert mc.state is RejoinState.REBUILDING


def test_a_node_going_without_pauses_no_writes_for_a_donor_that_receives_its_rows():
    """Its links serve, so a donor that lacks rows of this node's is passed over, receiving
    them or not: a cover wait every retry interval would pause writes most of the time (a real
    process did: tests/integration/test_going_without.py). A node told to rejoin waits for one."""
    lacking = {rj.UUID_A: 3, UUID_B: 7, rj.UUID_C: 2, rj.UUID_D: 6}      # it lacks A's row 4
    mc, host = _blocked({rj.UUID_D: 6})
    rj.take(mc)
    mc.note_follow(rj.ADDR_C)
    mc.tick(100.0 + rj.RETRY)
    assert rj.take(mc) == ([], [ProbeDonor(rj.ADDR_B)])
    mc.step(Probed(rj.ADDR_B, lacking, receiving=True), 200.0)
    assert mc.state is RejoinState.PROBING and rj.take(mc) == ([], [ProbeDonor(rj.ADDR_C)])
    mc, _ = rj.machine(expelled_d=9)
    rj.told(mc, {rj.UUID_D: 6})
    mc.tick(100.0)
    rj.take(mc)
    mc.step(Probed(rj.ADDR_C, lacking, receiving=True), 100.0)
    assert mc.state is RejoinState.COVER_WAIT


def test_a_node_that_goes_without_nothing_any_more_has_nothing_to_ask():
    mc, host = _blocked({rj.UUID_D: 6})
    mc.note_follow(rj.ADDR_C)
    host.the_core.vclock = VClock({1: 4, 2: 7, 3: 2, 4: 6})
    mc.tick(1000.0)
    assert mc.state is RejoinState.IDLE and mc.attempts == 1



# --- a donor for the rest: rows gone without are not asked of it (full+replace seed 200350) ------


def _going_without_d_then_told_for_b(d_bound=9):
    """A goes without D's rows to 6 (expelled, in one snapshot only), and C then tells it to
    rejoin for B's rows to 8 (a member's: never gone without)."""
    mc, host = _blocked({rj.UUID_D: 6}, expelled_d=d_bound)
    rj.take(mc)
    rj.told(mc, {UUID_B: 8})
    mc.tick(100.0 + rj.RETRY)
    assert mc.wanted() == {UUID_B: 8, rj.UUID_D: 6} and mc.state is RejoinState.PROBING
    rj.take(mc)
    return mc, host


def test_a_donor_that_lacks_only_the_rows_this_node_goes_without_is_taken_for_the_rest():
    """It has B's rows and covers A; D's rows, which it lacks, A lacks too and goes without
    either way. Before, a donor had to hold them as well, and no node did: every member stayed
    told to rejoin for B's rows for ever."""
    mc, _ = _going_without_d_then_told_for_b()
    mc.step(Probed(rj.ADDR_C, {rj.UUID_A: 4, UUID_B: 8, rj.UUID_C: 2, rj.UUID_D: 0}), 200.0)
    assert mc.state is RejoinState.REBUILDING
    assert rj.take(mc)[1] == [rj.Rebuild(rj.ADDR_C, rj.WHY)]


@pytest.mark.parametrize("theirs", [
    {rj.UUID_A: 4, UUID_B: 7, rj.UUID_C: 2, rj.UUID_D: 6},      # has D's rows but lacks B's row 8
    {rj.UUID_A: 4, UUID_B: 7, rj.UUID_C: 2, rj.UUID_D: 0},      # lacks both
])
def test_a_donor_that_lacks_a_row_this_node_does_not_go_without_is_passed_over(theirs):
    mc, _ = _going_without_d_then_told_for_b()
    mc.step(Probed(rj.ADDR_C, theirs), 200.0)
    assert mc.state is RejoinState.PROBING and rj.take(mc) == ([], [ProbeDonor(rj.ADDR_B)])


def test_an_attempt_only_for_rows_gone_without_passes_over_a_donor_that_lacks_them():
    """With no need left, the attempt looks for the rows gone without alone: a donor without
    them would give nothing."""
    mc, host = _blocked({rj.UUID_D: 6})
    rj.take(mc)
    mc.note_follow(rj.ADDR_C)
    mc.tick(100.0 + rj.RETRY)
    assert mc.wanted() == {rj.UUID_D: 6}
    rj.take(mc)
    mc.step(Probed(rj.ADDR_B, {rj.UUID_A: 4, UUID_B: 7, rj.UUID_C: 2, rj.UUID_D: 5}), 200.0)
    assert mc.state is RejoinState.PROBING and rj.take(mc) == ([], [ProbeDonor(rj.ADDR_C)])


def _probed_blocked(bounds: dict | None, expelled_b: bool = False, **probe) -> dict:
    """A, which holds D as a member, is told to rejoin for D's rows to 6; every donor lacks A's
    own row 4 (no rebuild) and says `bounds` of its expelled members: what A goes without.
    `expelled_b`: A's table has B expelled."""
    mc, host = rj.machine({1: 4, 2: 7, 3: 2})
    if expelled_b:
        host.the_core.table.upsert(rj.Member(UUID_B, 2, rj.ADDR_B, STATE_EXPELLED, expelled_lsn=7))
    rj.told(mc, {rj.UUID_D: 6})
    mc.tick(100.0)
    for addr in (rj.ADDR_C, rj.ADDR_B, rj.ADDR_D):
        rj.take(mc)
        mc.step(Probed(addr, {rj.UUID_A: 3, UUID_B: 7, rj.UUID_C: 2, rj.UUID_D: 6}, bounds=bounds, **probe), 100.0)
    assert mc.state is RejoinState.IDLE and mc.blocked
    return mc.going_without()


def test_a_member_the_donors_say_is_expelled_is_gone_without_though_this_node_never_heard_it():
    """Every upstream told A to rejoin, so no row reaches it, the expel's neither: without the
    donors' word it waited for D's rows for ever (full+replace seed 200350, node E)."""
    assert _probed_blocked({rj.UUID_D: 6}) == {rj.UUID_D: 6}


@pytest.mark.parametrize("bounds, kw", [
    (None, {}),                                           # nobody says D is expelled: a member's rows
    ({rj.UUID_C: 3}, {}),                                 # another member is
    ({rj.UUID_D: 6}, {"serving": False}),                 # said by nodes that are no running members
    ({rj.UUID_D: 6}, {"uuid": UUID_B, "expelled_b": True}),   # ... or by one expelled here
])
def test_only_a_serving_donors_word_makes_a_member_gone_without(bounds, kw):
    assert _probed_blocked(bounds, **kw) == {}


# --- the applier: SUBSCRIBE says what it goes without --------------------------------------------


def _subscribe(core=None, without=()):
    host = am.Host()
    host.without = list(without)
    mach = am.machine(core or am.new_core(), host)
    mach.start(am.greeting(am.SELF))
    mach.advance(mach.ready())
    mach.step(m.Message(m.GREETING, am.greeting(am.UP, am.UP_ROWS)), am.NOW)
    rd = mach.ready()
    assert mach.state is ApplierState.SUBSCRIBING
    (sub,) = rd.send
    return mach, sub.body


def test_a_subscribe_names_what_the_node_goes_without_and_nothing_when_it_goes_without_nothing():
    mach, body = _subscribe(without=[am.OTHER])
    assert body["without"] == [am.OTHER] and mach.without == [am.OTHER]
    _, body = _subscribe()
    assert "without" not in body


def test_a_fenced_subscribe_goes_without_nothing():
    """A fenced link asks for its own rows only: there is nothing to go without."""
    core = am.new_core(vclock={1: 3, 2: 5})
    core.fence = OwnRowsFence("a test loss")
    mach, body = _subscribe(core, without=[am.OTHER])
    assert body["own_rows"] is True and "without" not in body and mach.without == []


# --- the wire ------------------------------------------------------------------------------------


@pytest.mark.parametrize("without, ok", [
    ([], True),
    ([rm.GONE], True),
    ([rm.GONE] * limits.members_max, True),
    ([rm.GONE] * (limits.members_max + 1), False),
    ([rm.GONE.replace("-", "")], False),
    (["x" * 36], False),
    ([7], False),
    (rm.GONE, False),
    (None, True),
])
def test_a_subscribe_names_at_most_members_max_canonical_uuids_it_goes_without(without, ok):
    body = {"vclock": {1: 2}} if without is None else {"vclock": {1: 2}, "without": without}
    data = m.encode(m.SUBSCRIBE, **body)
    if ok:
        assert m.decode(data).body == body
    else:
        with pytest.raises(RemoteProtocolError, match="SUBSCRIBE: without is a list of at most"):
            m.decode(data)


def test_a_subscribe_says_its_first_wrong_field():
    for body, first in (({"vclock": {1: -2}, "own_rows": 1, "without": 7}, "vclock"),
                        ({"vclock": {1: 2}, "durable": {1: -1}, "own_rows": 1}, "vclock"),
                        ({"vclock": {1: 2}, "own_rows": 1, "without": 7}, "own_rows"),
                        ({"vclock": {1: 2}, "own_rows": True, "without": 7}, "without")):
        with pytest.raises(RemoteProtocolError) as e:
            m.decode(m.encode(m.SUBSCRIBE, **body))
        assert str(e.value).startswith(f"SUBSCRIBE: {first}"), (body, str(e.value))


# --- the relay: it serves the rest -----------------------------------------------------------------


def _relay_subscribed(sub: dict, without, bound_said: int = 6):
    host = rm.Host()
    host.gc = {1: 7, 4: 6}          # GONE (expelled here at 3): rows up to 6 came in this node's snapshot
    mach = rm.greeted(rm.relay(host), cluster=[[rm.GONE, 9, "", STATE_EXPELLED, 0, bound_said]])
    body = {} if without is None else {"without": without}
    mach.step(rm.subscribe(sub, **body), rm.NOW)
    return mach, mach.ready()


def test_a_subscriber_that_goes_without_every_collected_component_it_lacks_is_served_the_rest():
    mach, rd = _relay_subscribed({1: 7, 2: 4, 4: 3}, [rm.GONE])
    assert mach.state is RelayState.STREAMING and [s.mtype for s in rd.send] == [m.SUBSCRIBED]
    assert mach.without == [rm.GONE] and mach.sub[4] == limits.lsn_max
    assert rd.persist == (rm.Hold(rm.SUB, False, {1: 7, 2: 4, 4: 3}),)     # the hold where it is
    # no row of GONE goes on the link; the others' do
    keep, rows = relay_wanted([[4, 7, 0, 0, [["op"]]], [1, 8, 0, 0, [["op"]]]], mach.sub)
    assert [t[0] for t in keep] == [1] and rows == 1


def test_without_it_the_same_subscriber_is_told_to_rejoin():
    mach, rd = _relay_subscribed({1: 7, 2: 4, 4: 3}, None)
    (err,) = rd.send
    assert err.body["code"] == "need_rejoin" and mach.state is RelayState.CLOSED and mach.without == []


def test_a_subscriber_that_lacks_other_collected_rows_too_is_told_to_rejoin_for_them():
    mach, rd = _relay_subscribed({1: 5, 2: 4, 4: 3}, [rm.GONE])
    (err,) = rd.send
    assert err.body["code"] == "need_rejoin" and "components [1] " in err.body["message"]
    assert mach.state is RelayState.CLOSED and mach.without == []


@pytest.mark.parametrize("without", [[rm.GONE], [rm.NEW], [rm.SUB]])
def test_a_component_the_subscriber_does_not_lack_here_is_served_whatever_it_says(without):
    """It goes without only what this relay collected and it lacks: GONE's rows past its
    vclock (6) are sent, and so is everything of a uuid this node does not know (NEW)."""
    mach, rd = _relay_subscribed({1: 7, 2: 4, 4: 6}, without)
    assert mach.state is RelayState.STREAMING and mach.without == [] and mach.sub[4] == 6
    keep, _ = relay_wanted([[4, 7, 0, 0, [["op"]]]], mach.sub)
    assert len(keep) == 1


# --- what the node shows ----------------------------------------------------------------------------


class _Rejoiner:
    def __init__(self, need, blocked, gone, discard=frozenset()):
        self.need, self.blocked, self.gone, self.discard = need, blocked, gone, discard

    def going_without(self):
        return self.gone


def test_info_shows_what_the_node_goes_without_after_its_links_follow_again():
    assert rejoin_info(_Rejoiner({}, "", {})) is None
    assert rejoin_info(_Rejoiner({}, "no donor", {rm.GONE: 6})) == {
        "needed_by": [], "blocked": "no donor", "going_without": {rm.GONE: 6}, "discard": []}
    assert rejoin_info(_Rejoiner({"c:1": "why"}, "", {}, frozenset({rm.GONE}))) == {
        "needed_by": ["c:1"], "blocked": "", "going_without": {}, "discard": [rm.GONE]}


# --- rows the operator lets go (POST /v1/admin/rejoin; full+replace seed 204848) -------------------


def _holding_d_alone():
    """A holds expelled D's rows to 6 (bound 9), which no donor has, and lacks B's row 8, which
    C collected: every donor lacks D's rows, so no snapshot covers A."""
    mc, host = rj.machine({1: 4, 2: 7, 3: 2, 4: 6}, expelled_d=9)
    rj.told(mc, {UUID_B: 8})
    mc.tick(100.0)
    for addr in (rj.ADDR_C, rj.ADDR_B, rj.ADDR_D):
        rj.take(mc)
        mc.step(Probed(addr, {rj.UUID_A: 4, UUID_B: 8, rj.UUID_C: 2, rj.UUID_D: 3}), 100.0)
    assert mc.state is RejoinState.IDLE and mc.blocked.startswith(
        f"a snapshot would discard rows no reachable peer has ({rj.UUID_D} up to lsn 6 (it has 3))")
    rj.take(mc)
    return mc, host


def test_rows_the_operator_lets_go_are_discarded_by_the_next_attempt_at_once_and_said():
    mc, _ = _holding_d_alone()
    mc.allow_discard({rj.UUID_D})
    mc.tick(100.001)                                  # not a retry interval later: at once
    assert mc.state is RejoinState.PROBING and mc.attempts == 2
    rj.take(mc)
    mc.step(Probed(rj.ADDR_C, {rj.UUID_A: 4, UUID_B: 8, rj.UUID_C: 2, rj.UUID_D: 3}), 100.001)
    assert mc.state is RejoinState.REBUILDING
    assert rj.take(mc)[1] == [rj.Rebuild(rj.ADDR_C, rj.WHY, discarding=((rj.UUID_D, 6, 3),))]
    # the rebuild's own check of the snapshot lets them go too, and nothing else
    assert mc.snapshot_uncovered(mc.mine(), {rj.UUID_A: 4, UUID_B: 8, rj.UUID_C: 2, rj.UUID_D: 3}) is None
    assert "does not cover" in mc.snapshot_uncovered(mc.mine(), {rj.UUID_A: 3, UUID_B: 8, rj.UUID_C: 2})
    mc.step(Rebuilt(rj.ADDR_C), 101.0)
    assert mc.discard == frozenset()                  # until a rebuild is done: then gone


def test_rows_the_operator_lets_go_are_no_leave_to_lose_any_others():
    """A donor that also lacks A's own row 4 is still passed over: only D's rows may go."""
    mc, _ = _holding_d_alone()
    mc.allow_discard({rj.UUID_D})
    mc.tick(100.001)
    for addr in (rj.ADDR_C, rj.ADDR_B, rj.ADDR_D):
        rj.take(mc)
        mc.step(Probed(addr, {rj.UUID_A: 3, UUID_B: 8, rj.UUID_C: 2, rj.UUID_D: 3}), 100.001)
    assert mc.state is RejoinState.IDLE and f"{rj.UUID_A} up to lsn 4 (it has 3)" in mc.blocked
    assert mc.discard == {rj.UUID_D}                  # it stands for the next attempt


def test_a_rebuild_with_nothing_to_let_go_says_none():
    mc, _ = _holding_d_alone()
    mc.allow_discard({rj.UUID_D})
    mc.tick(100.001)
    rj.take(mc)
    mc.step(Probed(rj.ADDR_C, {rj.UUID_A: 4, UUID_B: 8, rj.UUID_C: 2, rj.UUID_D: 6}), 100.001)
    assert rj.take(mc)[1] == [rj.Rebuild(rj.ADDR_C, rj.WHY)]


def test_rows_let_go_are_let_go_from_the_first_one_and_the_donors_own_bounds_still_count():
    """The donor has none of D's rows (the permission is bound 0, not 1), and lacks C's rows
    3-5, which its greeting says are past C's bound (C expelled there, unknown here): that
    still counts with D let go."""
    mc, _ = rj.machine({1: 4, 2: 7, 3: 5, 4: 6}, expelled_d=9)
    rj.told(mc, {UUID_B: 8})
    mc.allow_discard({rj.UUID_D})
    mc.tick(100.0)
    rj.take(mc)
    mc.step(Probed(rj.ADDR_C, {rj.UUID_A: 4, UUID_B: 8, rj.UUID_C: 2}, bounds={rj.UUID_C: 2}), 100.0)
    assert mc.state is RejoinState.REBUILDING
    assert rj.take(mc)[1] == [rj.Rebuild(rj.ADDR_C, rj.WHY, discarding=((rj.UUID_D, 6, 0),))]
