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
