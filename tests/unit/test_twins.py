"""Two processes with one member's uuid (node/core/link/twins.py): a greeting with this node's
uuid and another run is a twin, never this node itself; the younger run is the one named to
stop, the same one from either side; a greeting without a run (an older version) is never a
twin; and a run that is not 24 hex digits is a bad greeting."""
from __future__ import annotations

import pytest

from node.core.link import twins
from node.core.link.greeting import check_greeting
from node.core.validate_msgs import greeting_error
from node.errors import PeerRefused
from tests.unit.test_link_greeting_edges import ME, PEER, _greeting

OLD, NEW = twins.new_run(1_700_000_000_000_000, "0badcafe"), twins.new_run(1_700_000_000_000_001, "00000000")


def _refusal(mine: dict, theirs: dict) -> PeerRefused:
    with pytest.raises(PeerRefused) as e:
        check_greeting(mine, theirs, "b:1", theirs["uuid"])
    return e.value


def test_a_run_sorts_by_its_start_first():
    assert len(OLD) == len(NEW) == 24 and twins.RUN_RE.match(OLD) and OLD < NEW
    assert twins.new_run(1, "f") == "0000000000000001" + "0000000f"


def test_the_same_run_is_this_node_itself():
    assert _refusal(_greeting(ME, run=OLD), _greeting(ME, run=OLD)).code == "self"


@pytest.mark.parametrize("mine, theirs", [(OLD, NEW), (NEW, OLD)])
def test_another_run_is_a_twin_and_both_sides_name_the_younger(mine, theirs):
    e = _refusal(_greeting(ME, run=mine), _greeting(ME, run=theirs))
    assert e.code == "twin" and twins.younger_of(e) == NEW
    assert ME in e.message and "--as-new-member" in e.message
    assert e.body == {"younger": NEW, "met": True}   # what the ERROR answered to the peer carries


@pytest.mark.parametrize("mine, theirs", [(OLD, None), (None, OLD), (None, None), (OLD, "not-a-run")])
def test_a_greeting_without_a_run_on_either_side_is_never_a_twin(mine, theirs):
    assert _refusal(_greeting(ME, run=mine), _greeting(ME, run=theirs)).code == "self"


def test_another_member_with_another_run_is_no_twin():
    check_greeting(_greeting(ME, run=OLD), _greeting(PEER, run=NEW), "b:1", PEER)


def test_a_lease_version_that_differs_is_still_a_stale_holder_first():
    lease = {"slot": 1, "version": 3, "seen": {}}
    e = _refusal(_greeting(ME, run=OLD, lease=lease), _greeting(ME, run=NEW, lease={**lease, "version": 4}))
    assert e.code == "lease_fenced"


def test_younger_of_reads_only_a_twin_refusal_with_a_run():
    e = PeerRefused("twin", "x")
    assert twins.younger_of(e) is None
    e.body = {"younger": "zz"}
    assert twins.younger_of(e) is None
    e.body = {"younger": NEW}
    assert twins.younger_of(e) == NEW
    other = PeerRefused("self", "x")
    other.body = {"younger": NEW}
    assert twins.younger_of(other) is None and twins.younger_of(ValueError()) is None


def _wire_greeting(**kw) -> dict:
    g = {"uuid": ME, "cluster_uuid": None, "cluster_name": "c", "options_digest": "d", "anon": False,
         "address": "a:1", "cluster": [], "status": "running", **kw}
    return g


@pytest.mark.parametrize("run, ok", [(None, True), (OLD, True), (OLD.upper(), False), (OLD + "0", False),
                                     (OLD[:-1], False), (5, False), ("", False)])
def test_a_greetings_run_is_24_hex_digits_or_absent(run, ok):
    g = _wire_greeting(**({} if run is None else {"run": run}))
    assert (greeting_error(g) is None) == ok, greeting_error(g)


def test_met_says_whether_the_two_runs_met_in_one_handshake():
    e = _refusal(_greeting(ME, run=OLD), _greeting(ME, run=NEW))
    assert twins.met(e) is True
    e = twins.refusal(ME, "b:1", NEW, OLD, "a member subscribed here", met=False)
    assert twins.met(e) is False and twins.younger_of(e) == NEW


# --- the node's side: node/process/peering.py -------------------------------------------------
class _Relay:
    def __init__(self, uuid: str, run: str | None, acked_at: float, closed: bool = False):
        from types import SimpleNamespace
        self.uuid, self.address, self.started_at = uuid, "a:1", 0.0
        self.conn = SimpleNamespace(closed=closed)
        self.machine = SimpleNamespace(acked_at=acked_at, greeting={"run": run} if run else {})


class _Node:
    def __init__(self, relays=(), data_dir: str = "/nonexistent", fence: object = "up"):
        from types import SimpleNamespace
        self.relays = set(relays)
        self.fatal: list[BaseException] = []
        self.lease = None
        self.data_dir = data_dir
        self.core = SimpleNamespace(fence=fence)

    def on_fatal(self, e):
        self.fatal.append(e)


def _peering(relays=()):
    from node.process.peering import Peering
    return Peering(_Node(relays), [])


@pytest.fixture
def clock(monkeypatch):
    from node.process import peering
    now = [1000.0]
    monkeypatch.setattr(peering.time, "monotonic", lambda: now[0])
    return now


def test_a_greeting_of_a_live_subscribers_younger_twin_is_refused_and_an_older_one_taken(clock):
    from node import limits
    p = _peering([_Relay(PEER, OLD, acked_at=clock[0] - limits.twin_live_s)])
    with pytest.raises(PeerRefused) as e:
        p._refuse_younger_twin(_greeting(PEER, run=NEW, address="b:1"))
    assert e.value.code == "twin" and twins.younger_of(e.value) == NEW and twins.met(e.value) is False
    p._refuse_younger_twin(_greeting(PEER, run=OLD, address="b:1"))            # itself, reconnecting
    older = twins.new_run(1, "00000000")
    p._refuse_younger_twin(_greeting(PEER, run=older, address="b:1"))          # older than the live one
    p._refuse_younger_twin(_greeting(PEER, address="b:1"))                     # no run: an older version
    p._refuse_younger_twin(_greeting(ME, run=NEW, address="b:1"))              # another member
    p._refuse_younger_twin(_greeting(PEER, run=NEW, address="b:1", lease={"slot": 1, "version": 2}))


@pytest.mark.parametrize("relay", [
    lambda now: _Relay(PEER, OLD, acked_at=now - 3.01),            # silent past twin_live_s: a dead process's
    lambda now: _Relay(PEER, OLD, acked_at=now, closed=True),      # its connection closed
    lambda now: _Relay(PEER, None, acked_at=now),                  # subscribed without a run
])
def test_a_subscriber_link_that_is_not_a_live_run_refuses_nobody(clock, relay):
    _peering([relay(clock[0])])._refuse_younger_twin(_greeting(PEER, run=NEW, address="b:1"))


def test_the_younger_stops_at_once_when_the_two_met(clock):
    p = _peering()
    p.run = OLD
    p.twin_refused(twins.refusal(ME, "b:1", NEW, OLD, "this node", met=True))   # it is the older here
    assert p.node.fatal == []
    p.run = NEW
    p.twin_refused(PeerRefused("self", "x"))
    assert p.node.fatal == []
    p.twin_refused(twins.refusal(ME, "b:1", NEW, OLD, "this node", met=True))
    assert len(p.node.fatal) == 1 and "this process stops" in str(p.node.fatal[0])


def _younger_told_by_a_third_node() -> tuple:
    """A node whose run is the younger, and a third node's refusal naming it."""
    p = _peering()
    p.run = NEW
    return p, twins.refusal(ME, "b:1", NEW, OLD, "a member subscribed here", met=False)


def test_refused_by_a_third_node_the_younger_stops_once_refusals_lasted_twin_confirm_s(clock):
    from node import limits
    p, told = _younger_told_by_a_third_node()
    for _ in range(int(limits.twin_confirm_s)):          # one a second: a live twin's refusals go on
        p.twin_refused(told)
        assert p.node.fatal == []
        clock[0] += 1.0
    p.twin_refused(told)
    assert len(p.node.fatal) == 1


def test_refusals_that_stopped_for_a_while_start_counting_again(clock):
    from node import limits
    p, told = _younger_told_by_a_third_node()
    p.twin_refused(told)
    clock[0] += limits.twin_confirm_s + 0.5               # no refusal meanwhile: a dead process's link, gone
    p.twin_refused(told)
    clock[0] += limits.twin_confirm_s - 0.5
    p.twin_refused(told)
    assert p.node.fatal == []
    clock[0] += 0.5
    p.twin_refused(told)
    assert len(p.node.fatal) == 1


def test_a_younger_twin_with_no_fence_up_leaves_a_note_that_keeps_its_dir_from_serving(tmp_path):
    from node.process.peering import Peering
    p = Peering(_Node(data_dir=str(tmp_path), fence=None), [])
    p.run = NEW
    p.twin_refused(twins.refusal(ME, "b:1", NEW, OLD, "this node", met=True))
    assert len(p.node.fatal) == 1
    note = (tmp_path / twins.STOPPED_FILE).read_text()
    assert NEW in note and "another process with the uuid" in note


def test_a_fenced_younger_twin_leaves_no_note(tmp_path):
    from node.process.peering import Peering
    p = Peering(_Node(data_dir=str(tmp_path), fence=object()), [])
    p.run = NEW
    p.twin_refused(twins.refusal(ME, "b:1", NEW, OLD, "this node", met=True))
    assert len(p.node.fatal) == 1 and not (tmp_path / twins.STOPPED_FILE).exists()
