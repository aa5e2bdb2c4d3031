"""The operator's view of the anonymous followers a node remembers, and forgetting those gone for
good (node/process/followers.py, GET and DELETE /v1/admin/followers): the report, which ones an
`unseen_s` takes, the bounded list of forgotten ones, the refusals (fenced, linked, unknown, not
running), and the refusal of a forgotten replica's greeting (node/process/peering.py). Real
NodeCore and Retention; the followers' files on a real directory."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from node import limits, retention
from node.core.holds import Hold
from node.core.anon_followers import Follower, FollowerReach, followers_report, followers_unseen, with_forgotten
from node.core.membership import OwnRowsFence
from node.errors import ClientError, PeerRefused
from node.fence import anonymous_followers, forgotten_followers
from node.process.followers import FollowerAdmin
from node.process.peering import Peering
from node.retention import Retention
from tests.unit.test_anonymous_holder import ANON, ANON_ADDR, fenced_core
from tests.unit.test_replicaset import OTHER, PEER

QUIET = "00000000-0000-4000-8000-0000000000aa"
LINKED = "00000000-0000-4000-8000-0000000000bb"
RECENT = "00000000-0000-4000-8000-0000000000cc"


def table_and_holds(peer_own: int, other_own: int):
    """SELF 1 (own lsn 5), PEER 2 and OTHER 3 holding our own rows up to the given lsns."""
    core = fenced_core()
    core.fence = None
    holds = {PEER: Hold({1: peer_own}, 0.0, False), OTHER: Hold({1: other_own}, 0.0, False)}
    return core, holds


def test_the_report_says_when_each_follower_was_heard_what_it_may_hold_and_whether_it_is_kept_for_that():
    core, holds = table_and_holds(4, 5)                 # members hold our rows up to 4
    followers = {QUIET: Follower("q:1", 100.0), LINKED: Follower("l:1", 100.0), RECENT: Follower("r:1", 950.0)}
    holds[RECENT] = Hold({1: 5}, 990.0, True)           # an ACK after its entry: heard at 990
    reach = FollowerReach(5)                            # each may hold what we had at the start
    reach.opened(LINKED)
    rows = {r["uuid"]: r for r in followers_report(followers, holds, core.table, reach, 1, 1000.0, 60.0)}
    assert list(rows) == sorted(followers)
    assert rows[QUIET] == {"uuid": QUIET, "address": "q:1", "last_seen_s": 100.0, "unseen_s": 900.0,
                           "linked": False, "may_hold_own_lsn": 5, "kept_for_rows": True}
    assert rows[LINKED]["linked"] and rows[LINKED]["may_hold_own_lsn"] is None and not rows[LINKED]["kept_for_rows"]
    assert rows[RECENT]["last_seen_s"] == 990.0 and rows[RECENT]["unseen_s"] == 10.0
    assert not rows[RECENT]["kept_for_rows"]            # within its TTL: kept for that alone
    core2, holds2 = table_and_holds(5, 5)               # every member holds all our rows
    rows2 = followers_report(followers, holds2, core2.table, reach, 1, 1000.0, 60.0)
    assert not any(r["kept_for_rows"] for r in rows2)   # the next checkpoint forgets QUIET by itself


def test_the_report_rounds_times_to_the_millisecond_and_a_follower_unseen_for_exactly_its_ttl_is_not_quiet():
    core, holds = table_and_holds(4, 5)
    rows = followers_report({QUIET: Follower("q:1", 100.1234567)}, holds, core.table, FollowerReach(5), 1, 160.5, 60.0)
    assert (rows[0]["last_seen_s"], rows[0]["unseen_s"], rows[0]["kept_for_rows"]) == (100.123, 60.377, True)
    rows = followers_report({QUIET: Follower("q:1", 100.0)}, holds, core.table, FollowerReach(5), 1, 160.0, 60.0)
    assert rows[0]["unseen_s"] == 60.0 and not rows[0]["kept_for_rows"]   # within its TTL still (followers_to_forget: <=)


def test_unseen_s_takes_the_followers_not_heard_for_that_long_and_never_a_linked_one():
    holds = {RECENT: Hold({1: 5}, 990.0, True)}
    followers = {QUIET: Follower("q:1", 100.0), LINKED: Follower("l:1", 100.0), RECENT: Follower("r:1", 100.0)}
    reach = FollowerReach(0)
    reach.opened(LINKED)
    assert followers_unseen(followers, holds, reach, 1000.0, 900.0) == ([QUIET], [LINKED, RECENT])
    assert followers_unseen(followers, holds, reach, 1000.0, 900.001) == ([], [QUIET, LINKED, RECENT])
    assert followers_unseen(followers, holds, reach, 1000.0, 0.0) == ([QUIET, RECENT], [LINKED])


def test_the_forgotten_list_is_bounded_dropping_the_one_forgotten_longest_ago(monkeypatch):
    monkeypatch.setattr(limits, "forgotten_followers_max", 2)
    f = with_forgotten({}, ["a"], 1.0)
    f = with_forgotten(f, ["b"], 2.0)
    assert with_forgotten(f, ["a"], 3.0) == {"b": 2.0, "a": 3.0}        # forgotten again: the latest time
    assert with_forgotten(f, ["c"], 3.0) == {"b": 2.0, "c": 3.0}
    assert f == {"a": 1.0, "b": 2.0}                                   # not changed in place


def admin(tmp_path, monkeypatch, now: float = 1000.0):
    core, holds = table_and_holds(4, 5)
    node = SimpleNamespace(data_dir=str(tmp_path), cfg=SimpleNamespace(anon_ttl_s=60.0), core=core,
                           status="running")
    monkeypatch.setattr(retention.time, "time", lambda: now)
    r = node.retention = Retention(node)
    r.book.by_uuid.update(holds)
    monkeypatch.setattr(retention.time, "time", lambda: 100.0)
    for uuid in (ANON, QUIET):
        r.follower(uuid, ANON_ADDR)
        r.follower_link_ended(uuid)
    r.follower(LINKED, "l:1")                              # its link stays open
    monkeypatch.setattr(retention.time, "time", lambda: now)
    import node.process.followers as followers_mod
    monkeypatch.setattr(followers_mod.time, "time", lambda: now)
    return node, FollowerAdmin(node)


def test_forgetting_one_follower_writes_the_refusal_first_then_drops_it(tmp_path, monkeypatch):
    node, fa = admin(tmp_path, monkeypatch)
    view = fa.view()
    assert [f["uuid"] for f in view["followers"]] == sorted([ANON, QUIET, LINKED])
    assert view["max"] == limits.anon_followers_max and view["forgotten"] == 0
    assert fa.forget(QUIET, None) == {"forgotten": [QUIET], "kept": []}
    assert QUIET not in anonymous_followers(str(tmp_path)) and QUIET in forgotten_followers(str(tmp_path))
    assert QUIET not in node.retention.followers and node.retention.reach.may_hold(QUIET) == 0
    assert fa.view()["forgotten"] == 1
    reopened = Retention(node)                              # a restart reads both files
    assert QUIET in reopened.forgotten and QUIET not in reopened.followers and ANON in reopened.followers


def test_forgetting_by_unseen_s_takes_the_quiet_ones_and_names_those_kept(tmp_path, monkeypatch):
    node, fa = admin(tmp_path, monkeypatch)
    assert fa.forget(None, 900.0) == {"forgotten": sorted([ANON, QUIET]), "kept": [LINKED]}
    assert set(node.retention.followers) == {LINKED}
    assert fa.forget(None, 0.0) == {"forgotten": [], "kept": [LINKED]}


@pytest.mark.parametrize("case, status, code", [
    ("unknown", 404, "no_such_follower"), ("not a uuid", 404, "no_such_follower"),
    ("linked", 409, "follower_linked"), ("fenced", 409, "fenced"), ("not running", 503, "not_ready")])
def test_what_cannot_be_forgotten_is_refused_with_a_code_and_nothing_is_written(tmp_path, monkeypatch, case, status,
                                                                                 code):
    node, fa = admin(tmp_path, monkeypatch)
    uuid = {"unknown": OTHER, "not a uuid": "x" * 200, "linked": LINKED}.get(case, QUIET)
    if case == "fenced":
        node.core.fence = OwnRowsFence("lost")
    if case == "not running":
        node.status = "joining"
    before = anonymous_followers(str(tmp_path))
    with pytest.raises(ClientError) as e:
        fa.forget(uuid, None)
    assert (e.value.status, e.value.code) == (status, code)
    assert anonymous_followers(str(tmp_path)) == before and forgotten_followers(str(tmp_path)) == {}


def test_a_forgotten_replicas_greeting_is_refused_and_any_other_is_heard(tmp_path, monkeypatch):
    node, fa = admin(tmp_path, monkeypatch)
    fa.forget(QUIET, None)
    heard = []
    node.lease, node.uuid = None, node.core.uuid
    node.life = SimpleNamespace(observe_greeting=lambda theirs: heard.append(theirs["uuid"]))
    peering = Peering(node, [])
    greeting = {"uuid": QUIET, "anon": True, "address": "q:1", "vclock_uuid": {}, "cluster": []}
    with pytest.raises(PeerRefused) as e:
        peering.check_peer_greeting(greeting)
    assert e.value.code == "forgotten" and "new data directory" in e.value.message and heard == []
    peering.check_peer_greeting(dict(greeting, uuid=ANON))
    peering.check_peer_greeting(dict(greeting, anon=False))     # registered since: a member, not refused here
    assert heard == [ANON, QUIET]
