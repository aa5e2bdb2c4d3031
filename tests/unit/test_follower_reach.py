"""How far of a node's own rows a remembered anonymous follower may hold, kept on disk beside the
identity (node.core.anon_followers Follower, node/fence.py, node/retention.py), and the fence
that lets go of a follower once a word heard reaches that (OwnRowsFence.reach): a replica whose
disk was replaced comes back under a new uuid, and a master that lost its store afterwards
waited for its old uuid for ever (the nemesis, seed 5). Real NodeCore and fence; the followers
file on a real directory."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from node import fence, limits, retention
from node.cluster_space.table import STATE_MEMBER, Member
from node.core.anon_followers import (Follower, FollowerReach, follower_link_end, follower_seen, follower_unlinked,
                                      followers_at_start, followers_to_forget)
from node.core.lifecycle_fence import hear_greeting, may_lift, take_up_fence
from node.core.holds import Hold
from node.core.rows import GROUP_DEFAULT, OP_PUT, Op
from node.fence import anonymous_followers, append_follower
from node.retention import Retention
from tests.unit.test_anonymous_holder import ANON, ANON_ADDR, anon_greeting, fenced_core
from tests.unit.test_replicaset import OTHER, PEER, SELF, WALL

GONE = "dddddddd-0000-4000-8000-00000000000d"      # a follower whose disk was replaced: never heard again


# --- the entry ------------------------------------------------------------------------------------
def test_a_follower_whose_last_link_ended_is_bounded_by_the_own_lsn_claimed_then():
    linked = Follower(ANON_ADDR, 1.0, 4, True)
    assert linked.bound() is None                                   # while linked: any
    assert follower_unlinked(linked, 9, fenced=False) == Follower(ANON_ADDR, 1.0, 9, False)
    assert follower_unlinked(linked._replace(reach=None), 9, fenced=False).bound() == 9
    # not fenced, the own lsn bounds all it holds of ours, even below an earlier bound
    assert follower_unlinked(linked._replace(reach=12), 9, fenced=False).bound() == 9


def test_while_fenced_an_ended_link_keeps_the_earlier_bound_and_an_unknown_one_stays_unknown():
    """Fenced, this node's own lsn is back at what the loss left: a follower may hold rows of
    the earlier incarnation past it."""
    assert follower_unlinked(Follower(ANON_ADDR, 1.0, 12, True), 3, fenced=True).bound() == 12
    assert follower_unlinked(Follower(ANON_ADDR, 1.0, 2, True), 3, fenced=True).bound() == 3
    assert follower_unlinked(Follower(ANON_ADDR, 1.0, None, True), 3, fenced=True).bound() is None


def test_a_start_that_is_not_fenced_bounds_the_entries_left_linked_or_unknown_by_its_own_lsn():
    followers = {"linked": Follower("l:1", 1.0, 2, True), "old": Follower("o:1", 1.0),
                 "bounded": Follower("b:1", 1.0, 3, False)}
    assert followers_at_start(followers, 7, fenced=False) == {"linked": Follower("l:1", 1.0, 7, False),
                                                              "old": Follower("o:1", 1.0, 7, False)}
    # a loss: no bound known for them, and one left linked stays unknown when it links again
    assert followers_at_start(followers, 7, fenced=True) == {"linked": Follower("l:1", 1.0, None, False)}


def test_what_a_link_end_leaves_in_memory_is_what_the_entry_bounds():
    """FollowerReach outlives a fence's lift, and a quiet follower is forgotten by it: while
    fenced, the own lsn at a link's end is no bound for rows of the earlier incarnation."""
    assert follower_link_end(None, 9, fenced=False) == (None, 9)                  # not remembered
    entry = Follower(ANON_ADDR, 1.0, 12, True)
    assert follower_link_end(entry, 3, fenced=False) == (Follower(ANON_ADDR, 1.0, 3, False), 3)
    assert follower_link_end(entry, 3, fenced=True) == (Follower(ANON_ADDR, 1.0, 12, False), 12)
    assert follower_link_end(entry._replace(reach=None), 3, fenced=True) == \
        (Follower(ANON_ADDR, 1.0, None, False), limits.lsn_max)


def test_a_start_that_lost_rows_takes_any_lsn_for_a_follower_whose_entry_bounds_nothing():
    followers = {"bounded": Follower("b:1", 1.0, 4, False), "unknown": Follower("u:1", 1.0)}
    reach = FollowerReach.load(followers, 7, fenced=True)
    assert (reach.may_hold("bounded"), reach.may_hold("unknown")) == (4, limits.lsn_max)
    reach = FollowerReach.load(followers, 7, fenced=False)
    assert (reach.may_hold("bounded"), reach.may_hold("unknown")) == (4, 7)


# --- the file -------------------------------------------------------------------------------------
def test_the_file_keeps_each_entrys_bound_and_reads_an_earlier_versions_lines_as_unknown(tmp_path):
    d = str(tmp_path)
    append_follower(d, ANON, Follower(ANON_ADDR, 10.0, 0, True))
    append_follower(d, ANON, Follower(ANON_ADDR, 10.0, 2 ** 40, False), sync=False)
    append_follower(d, PEER, Follower("b:1", 11.0, None, True))
    assert anonymous_followers(d) == {ANON: Follower(ANON_ADDR, 10.0, 2 ** 40, False),
                                      PEER: Follower("b:1", 11.0, None, True)}
    path = tmp_path / "anonymous_followers"
    path.write_text(f"{ANON} {ANON_ADDR} 10.000\n")                  # an earlier version's line
    assert anonymous_followers(d) == {ANON: Follower(ANON_ADDR, 10.0, None, False)}
    assert anonymous_followers(d)[ANON].bound() is None


def test_a_release_before_this_one_still_reads_every_follower_and_a_torn_second_line_knows_no_bound(tmp_path):
    """Going back a release (docs/upgrade.md) must not forget the followers: it reads the first
    line of each entry (`uuid address seen`, three fields) and skips the second."""
    d = str(tmp_path)
    append_follower(d, ANON, Follower(ANON_ADDR, 10.0, 0, True))
    append_follower(d, ANON, Follower(ANON_ADDR, 10.0, 7, False), sync=False)
    append_follower(d, PEER, Follower("b:1", 11.0, None, True))
    before = {p[0]: (p[1], t) for p, t in fence._timed_lines(d, fence.FOLLOWERS_FILE, 3)}   # that release's reader
    assert before == {ANON: (ANON_ADDR, 10.0), PEER: ("b:1", 11.0)}
    path = tmp_path / "anonymous_followers"
    path.write_text(path.read_text()[:-len(" - 1\n")])              # PEER's second line torn
    assert anonymous_followers(d)[PEER] == Follower("b:1", 11.0) and anonymous_followers(d)[PEER].bound() is None
    assert anonymous_followers(d)[ANON].bound() == 7


@pytest.mark.parametrize("bad", ["-1 0", f"{limits.lsn_max + 1} 0", "x 0", "3 2", "3", "3 0 extra"])
def test_a_damaged_line_is_skipped_and_the_one_before_it_stands(tmp_path, bad):
    path = tmp_path / "anonymous_followers"
    path.write_text(f"{ANON} {ANON_ADDR} 10.000 - 1\n{ANON} {ANON_ADDR} 12.000 {bad}\n")
    assert anonymous_followers(str(tmp_path)) == {ANON: Follower(ANON_ADDR, 10.0, None, True)}


# --- the fence ------------------------------------------------------------------------------------
def lost_store(followers: dict) -> tuple:
    """SELF lost its store: fenced with nothing heard yet, remembering `followers`."""
    core = fenced_core(own=0)
    core.fence = None
    take_up_fence(core, {"reason": "lost", "rebuilt": True}, set(), followers)
    return core, core.fence


def test_a_lost_store_stops_waiting_for_a_follower_once_a_word_heard_reaches_its_bound():
    core, fence = lost_store({GONE: Follower("g:1", 1.0, 6, False)})
    assert fence.reach == {GONE: 6}
    fence.hear(PEER, 5)
    fence.hear(OTHER, 5)
    assert GONE in fence.waiting_for(core.table, SELF)               # it may hold row 6, nobody said so
    assert f"{GONE} to lsn 6" in core.fence_state()[1]
    fence.hear(OTHER, 6)
    assert fence.waiting_for(core.table, SELF) == []
    assert not may_lift(core)                                        # rows to 6 must come back first
    core.vclock = core.vclock.__class__({1: 6, 2: 3})
    core.claimed = core.vclock.copy()
    assert may_lift(core)


@pytest.mark.parametrize("entry", [Follower("g:1", 1.0, 0, True), Follower("g:1", 1.0)], ids=["linked", "unknown"])
def test_a_follower_with_no_bound_is_waited_for_whatever_was_heard(entry):
    core, fence = lost_store({GONE: entry})
    fence.hear(PEER, 10 ** 6)
    fence.hear(OTHER, 10 ** 6)
    assert fence.reach == {} and fence.waiting_for(core.table, SELF) == [GONE]
    assert "may hold its rows" not in core.fence_state()[1]          # nothing said of a bound it lacks


def test_a_follower_that_registered_since_is_waited_for_as_a_member_whatever_its_entry_says():
    core, fence = lost_store({GONE: Follower("g:1", 1.0, 0, False), ANON: Follower(ANON_ADDR, 1.0, 0, False)})
    fence.hear(PEER, 5)
    fence.hear(OTHER, 5)
    assert fence.waiting_for(core.table, SELF) == []
    core.table.upsert(Member(GONE, 4, "g:1", STATE_MEMBER))           # the table knows it as a member
    assert fence.waiting_for(core.table, SELF) == [GONE]
    greeting = {"uuid": PEER, "address": "b:1", "vclock_uuid": {SELF: 5}, "cluster": [[ANON, 5, ANON_ADDR, STATE_MEMBER]]}
    hear_greeting(core, {}, set(), greeting, SELF)                    # a member lists it as one
    assert ANON not in fence.reach and fence.waiting_for(core.table, SELF) == sorted([GONE, ANON])


def test_a_bounded_follower_heard_after_all_counts_by_its_word():
    core, fence = lost_store({ANON: Follower(ANON_ADDR, 1.0, 3, False)})
    fence.hear(PEER, 1)
    fence.hear(OTHER, 1)
    hear_greeting(core, {}, set(), anon_greeting(3), SELF)
    assert fence.waiting_for(core.table, SELF) == [] and fence.target() == 3


# --- retention: the entries as links open and end -------------------------------------------------
@pytest.fixture(autouse=True)
def clock(monkeypatch):
    monkeypatch.setattr(retention, "time", SimpleNamespace(time=lambda: 100.0))


def node_at(tmp_path, own: int, fenced: bool = False) -> SimpleNamespace:
    core = fenced_core(own=own)
    if not fenced:
        core.fence = None
    return SimpleNamespace(data_dir=str(tmp_path), cfg=SimpleNamespace(anon_ttl_s=60.0), core=core,
                           store=SimpleNamespace(get_meta=lambda key: None))


def test_a_link_opening_is_on_disk_linked_and_the_last_one_ending_writes_the_own_lsn(tmp_path, monkeypatch):
    synced = []
    real = retention.append_follower
    monkeypatch.setattr(retention, "append_follower",
                        lambda d, u, e, sync=True: (synced.append((e.linked, sync)), real(d, u, e, sync)))
    node = node_at(tmp_path, own=6)
    r = Retention(node)
    r.follower(ANON, ANON_ADDR)
    r.follower(ANON, ANON_ADDR)                                      # a second link, within its TTL
    assert anonymous_followers(node.data_dir)[ANON] == Follower(ANON_ADDR, r.followers[ANON].seen, 0, True)
    node.core.local_txn([Op(OP_PUT, "kv", "k", 1)], GROUP_DEFAULT, WALL)     # claimed 7
    r.follower_link_ended(ANON)
    assert anonymous_followers(node.data_dir)[ANON].linked          # one still open
    r.follower_link_ended(ANON)
    assert anonymous_followers(node.data_dir)[ANON].bound() == 7
    assert synced == [(True, True), (False, False)]                 # the opening synced, the end not
    r.follower(ANON, ANON_ADDR)                                      # linked again: written, synced
    assert anonymous_followers(node.data_dir)[ANON] == Follower(ANON_ADDR, r.followers[ANON].seen, 7, True)
    assert synced[-1] == (True, True)


def link_ended_while_fenced(tmp_path, line: str) -> tuple[SimpleNamespace, Retention]:
    """ANON's entry `line` (reach, linked) on disk; the node, fenced at own lsn 2, starts, and
    a link of ANON opens and ends."""
    (tmp_path / "anonymous_followers").write_text(f"{ANON} {ANON_ADDR} 1.000 {line}\n")
    node = node_at(tmp_path, own=2, fenced=True)
    r = Retention(node)
    r.load()
    r.follower(ANON, ANON_ADDR)
    r.follower_link_ended(ANON)
    return node, r


@pytest.mark.parametrize("line,bound", [("9 0", 9), ("9 1", None), ("- 0", None)],
                         ids=["bounded", "linked-when-it-died", "unknown"])
def test_a_link_ending_while_fenced_bounds_a_follower_no_lower_than_before_the_loss(tmp_path, line, bound):
    """A fenced node's own lsn is back at what the loss left; a follower linked when the process
    died may hold any of the earlier incarnation's rows, and so may one of unknown bound."""
    node, _ = link_ended_while_fenced(tmp_path, line)
    assert anonymous_followers(node.data_dir)[ANON].bound() == bound


@pytest.mark.parametrize("fenced", [False, True], ids=["in-order", "fenced"])
def test_a_start_bounds_what_a_dead_process_left_linked_unless_it_is_fenced(tmp_path, fenced):
    (tmp_path / "anonymous_followers").write_text(f"{ANON} {ANON_ADDR} 1.000 2 1\n{PEER} b:1 1.000\n"
                                                  f"{OTHER} c:1 1.000 3 0\n")
    node = node_at(tmp_path, own=5, fenced=fenced)
    r = Retention(node)
    r.load()
    on_disk = anonymous_followers(node.data_dir)
    assert {u: f.bound() for u, f in on_disk.items()} == \
        ({ANON: None, PEER: None, OTHER: 3} if fenced else {ANON: 5, PEER: 5, OTHER: 3})
    assert not on_disk[ANON].linked and (on_disk[ANON].reach is None) == fenced
    assert r.reach.may_hold(OTHER) == 3 and r.reach.may_hold(ANON) == (limits.lsn_max if fenced else 5)


def test_a_follower_whose_link_ended_while_fenced_is_not_forgotten_after_the_lift_by_the_lower_lsn(tmp_path):
    """It may hold the earlier incarnation's rows to 9; the node had 2 when its link ended. After
    the lift, members holding 5 of our rows do not cover it."""
    node, r = link_ended_while_fenced(tmp_path, "9 0")
    node.core.fence = None                                            # lifted
    assert r.reach.may_hold(ANON) == 9
    table, holds = node.core.table, {PEER: Hold({1: 5}, 0.0, False), OTHER: Hold({1: 5}, 0.0, False)}
    assert followers_to_forget(r.followers, holds, table, 10 ** 6, 60.0, r.reach, 1) == ([], {ANON: 9})


def test_the_file_is_written_anew_when_reconnects_have_grown_it(tmp_path):
    node = node_at(tmp_path, own=6)
    r = Retention(node)
    for _ in range(100):
        r.follower(ANON, ANON_ADDR)
        r.follower_link_ended(ANON)
    lines = (tmp_path / "anonymous_followers").read_text().splitlines()
    assert len(lines) <= 2 * (2 * 1 + 66)                          # (two lines an entry)
    assert anonymous_followers(node.data_dir) == r.followers and r.followers[ANON].bound() == 6


def test_a_failed_write_leaves_the_entry_as_it_was_so_the_next_link_writes_again(tmp_path, monkeypatch):
    node = node_at(tmp_path, own=6)
    r = Retention(node)
    r.follower(ANON, ANON_ADDR)
    r.follower_link_ended(ANON)
    before = dict(r.followers)

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(retention, "append_follower", full)
    with pytest.raises(OSError):
        r.follower(ANON, ANON_ADDR)
    assert r.followers == before and not r.followers[ANON].linked


def test_a_link_end_that_cannot_be_written_leaves_the_entry_linked_and_says_so(tmp_path, monkeypatch, caplog):
    node = node_at(tmp_path, own=6)
    r = Retention(node)
    r.follower(ANON, ANON_ADDR)

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(retention, "append_follower", full)
    r.follower_link_ended(ANON)                                      # (the relay's finally: no traceback)
    assert r.followers[ANON].linked and anonymous_followers(node.data_dir)[ANON].linked
    assert "could not note that anonymous follower" in caplog.text and "No space left" in caplog.text
