"""The rejoin's driver (node/rejoin.py Rejoiner) acting on its machine's Ready
(node/core/lifecycle_rejoin.py): an attempt may probe donors and wait for cover a long while,
and meanwhile another upstream may stream the collected rows this node lacked. A node that
caught up past every upstream's `needed` keeps its store (a rebuild would empty its WAL and
take the donor's ids); one still lacking them takes its links down and asks for a snapshot.

The node is a stand-in holding the real parts the rebuild reads first: a NodeCore over a real
table and vclock, a real Store (LMDB) in a temporary directory; its links and the donor's JOIN
are recorded, and the network is a stand-in too: a probe answers the greeting the test gives
(the stand-in donor answers no JOIN, so a rebuild that goes on stops cleanly at the JOIN,
keeping the store, as when a real donor refuses)."""
from __future__ import annotations

import asyncio
import os
import time
from types import SimpleNamespace

import pytest

from node.cluster_space.table import STATE_MEMBER, ClusterTable, Member
from node.core.rows import OP_PUT, Op
from node.core.replicaset import NodeCore
from node.core.vclock import VClock
from node import limits, rejoin
from node.core.lifecycle_rejoin import RejoinState
from node.rejoin import REJOIN_DIR, Rejoiner
from node.storage.store import Store
from tests.unit.helpers import STORE_MAP_BYTES, UUID_A, UUID_B, UUID_C
from tests.unit.test_nospace import DEADLINE_S, Pieces
from tests.waiting import until

ADDR_B, ADDR_C = "127.0.0.1:7302", "127.0.0.1:7303"
COLLECTED = {UUID_B: 8}          # what C said it collected: B's rows up to lsn 8
WAITING = "waiting for 127.0.0.1:7303 to receive this node's rows"
ROWS = limits.journal_inline_rows_max + 1      # a batch an executor thread persists


class _Life:
    uses_identity_files = False


class _Join:
    def __init__(self) -> None:
        self.joins: list[str] = []

    async def apply_once(self, address: str, kind, code, extra):
        self.joins.append(address)
        return None, "the stand-in donor answers nothing"


class _Journal:
    pending = 0


class _Relay:
    """A subscriber's link: its machine says whether it asked for its own rows only (fenced) and
    which members' rows it goes without."""
    def __init__(self, uuid: str, own_rows_only: bool = False, without: tuple = (), closed: bool = False) -> None:
        self.uuid = uuid
        self.machine = SimpleNamespace(own_rows_only=own_rows_only, without=list(without))
        self.conn = SimpleNamespace(closed=closed)


class _Node:
    """What Rejoiner touches before the JOIN, A's view: B is id 2 here; C subscribes to A."""

    def __init__(self, tmp_path, b_lsn: int) -> None:
        table = ClusterTable([Member(UUID_A, 1, "127.0.0.1:7301", STATE_MEMBER),
                              Member(UUID_B, 2, ADDR_B, STATE_MEMBER), Member(UUID_C, 3, ADDR_C, STATE_MEMBER)])
        self.core = NodeCore(UUID_A, table, VClock({1: 4, 2: b_lsn, 3: 2}), spaces={"kv": False})
        self.life = _Life()
        self.join = _Join()
        self.journal = _Journal()
        self.data_dir = str(tmp_path)
        self.store = Store(str(tmp_path / "store"), map_size=STORE_MAP_BYTES)
        self.peers = [ADDR_B, ADDR_C]
        self.appliers: dict = {ADDR_C: _Applier(ADDR_C)}
        self.relays = [_Relay(UUID_C)]
        self.http_session = None
        self.links: list[list[str]] = []              # each set_peers call
        self.status, self.status_reason = "running", ""

    def set_peers(self, peers: list[str]) -> list:
        self.links.append(list(peers))
        return []                                     # no link tasks to wait for


class _Applier:
    def __init__(self, address: str) -> None:
        self.address, self.status, self.peer_vclock, self.error = address, "need_rejoin", {}, ""
        self.conn = None


@pytest.fixture
def make_node(tmp_path):
    made: list[_Node] = []

    def make(b_lsn: int) -> _Node:
        made.append(_Node(tmp_path, b_lsn))
        return made[-1]
    yield make
    for n in made:
        n.store.close()


@pytest.fixture
def greetings(monkeypatch):
    """address -> the greeting its probe answers (the network's stand-in); each probe recorded."""
    answers: dict[str, dict] = {}
    asked: list[str] = []

    async def probe(node, session, address, timeout):
        asked.append(address)
        return answers[address]
    monkeypatch.setattr(rejoin, "probe", probe)
    return answers, asked


def _greeting(uuid: str, vclock_uuid: dict[str, int]) -> dict:
    return {"uuid": uuid, "cluster_uuid": "c-1", "status": "running", "vclock_uuid": vclock_uuid}


def _told_to_rejoin(node: _Node, collected: dict[str, int]) -> Rejoiner:
    rj = Rejoiner(node)
    rj.on_need_rejoin(ADDR_C, "C collected rows this node needs", collected)
    return rj


async def _in_cover_wait(node: _Node, rj: Rejoiner, greetings) -> None:
    """C lacks A's row 4 and receives A's rows: writes pause while it catches up."""
    answers, _ = greetings
    answers[ADDR_C] = _greeting(UUID_C, {UUID_A: 3, UUID_B: 8, UUID_C: 2})
    rj.machine.tick(time.monotonic())
    await rj._act()
    assert rj.machine.state is RejoinState.COVER_WAIT and (node.status, node.status_reason) == ("rejoining", WAITING)
    answers[ADDR_C] = _greeting(UUID_C, {UUID_A: 4, UUID_B: 11, UUID_C: 2})   # it has A's rows now
    rj.machine.tick(time.monotonic() + limits.rejoin_cover_poll_s)   # the driver's clock
    await rj._act()


@pytest.mark.parametrize("b_lsn", [8, 11])
async def test_a_node_that_caught_up_past_what_was_collected_while_its_attempt_ran_keeps_its_store(
        make_node, greetings, b_lsn):
    node = make_node(7)
    rj = _told_to_rejoin(node, COLLECTED)
    node.core.vclock = VClock({1: 4, 2: 7, 3: 2})
    answers, asked = greetings
    answers[ADDR_C] = _greeting(UUID_C, {UUID_A: 3, UUID_B: 8, UUID_C: 2})
    rj.machine.tick(time.monotonic())
    await rj._act()
    assert rj.machine.state is RejoinState.COVER_WAIT
    node.core.vclock = VClock({1: 4, 2: b_lsn, 3: 2})    # B's rows came from another upstream meanwhile
    answers[ADDR_C] = _greeting(UUID_C, {UUID_A: 4, UUID_B: 11, UUID_C: 2})
    rj.machine.tick(time.monotonic() + limits.rejoin_cover_poll_s)   # the driver's clock
    await rj._act()
    assert asked == [ADDR_C, ADDR_C]
    assert node.links == []                           # its links were never taken down
    assert node.join.joins == []                      # no JOIN: no snapshot asked for
    assert (node.status, node.status_reason) == ("running", "")
    assert not os.path.exists(os.path.join(node.data_dir, REJOIN_DIR))
    assert node.core.vclock.get(2) == b_lsn and rj.blocked == "" and not rj.running


@pytest.mark.parametrize("b_lsn,collected", [(7, COLLECTED), (11, {})],
                         ids=["it still lacks the collected rows", "the upstream did not say what it collected"])
async def test_a_node_still_lacking_what_was_collected_goes_on_to_rebuild(make_node, greetings, b_lsn, collected,
                                                                         caplog):
    caplog.set_level("INFO", logger="replog.rejoin")
    node = make_node(b_lsn)
    rj = _told_to_rejoin(node, collected)
    await _in_cover_wait(node, rj, greetings)
    assert node.links[0] == []                        # links down for the rebuild
    assert node.join.joins == [ADDR_C]                # it asked the donor for a snapshot
    # the stand-in donor answered nothing: the store is kept and the links come back
    assert node.links[-1] == node.peers and (node.status, node.status_reason) == ("running", "")
    assert rj.blocked.startswith(f"rebuilding from {ADDR_C} failed") and not rj.running
    assert node.appliers[ADDR_C].error == ""          # a failed rebuild is not shown on the link
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "failed" in r.getMessage()]
    assert said == [("WARNING", f"rejoin: {rj.blocked}; the store is kept and the rejoin is tried again")], \
        "a donor's failure is tried again: a warning, not an error"


async def test_an_attempt_with_no_donor_shows_why_on_the_refusing_link(make_node, greetings, caplog):
    node = make_node(7)
    rj = _told_to_rejoin(node, COLLECTED)
    answers, asked = greetings
    answers[ADDR_C] = _greeting(UUID_C, {UUID_A: 4, UUID_B: 7, UUID_C: 2})    # lacks what it collected
    answers[ADDR_B] = {"uuid": UUID_B, "cluster_uuid": "", "status": "joining", "vclock_uuid": {}}
    rj.machine.tick(time.monotonic())
    await rj._act()
    assert asked == [ADDR_C, ADDR_B] and node.links == [] and node.join.joins == []
    assert rj.blocked == "no reachable peer has the collected rows this node lacks, to give a snapshot of"
    assert node.appliers[ADDR_C].error == f"C collected rows this node needs; {rj.blocked}"
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "replog.rejoin"]
    assert said == [("WARNING", f"rejoin: {rj.blocked}")], "for a moment (a start, peers not following yet): a warning"
    rj.machine.tick(time.monotonic() + limits.rejoin_retry_s)   # the next attempt, as blocked: no second line yet
    await rj._act()
    assert asked == [ADDR_C, ADDR_B] * 2 and len([r for r in caplog.records if r.name == "replog.rejoin"]) == 1


async def test_an_attempt_with_no_donor_is_an_error_once_attempts_have_found_none_for_a_while(
        make_node, greetings, caplog, monkeypatch):
    monkeypatch.setattr(limits, "rejoin_blocked_error_s", 0.0)
    node = make_node(7)
    rj = _told_to_rejoin(node, COLLECTED)
    answers, _ = greetings
    answers[ADDR_C] = _greeting(UUID_C, {UUID_A: 4, UUID_B: 7, UUID_C: 2})
    answers[ADDR_B] = {"uuid": UUID_B, "cluster_uuid": "", "status": "joining", "vclock_uuid": {}}
    rj.machine.tick(time.monotonic())
    await rj._act()
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "replog.rejoin"] == \
        [("ERROR", f"rejoin: {rj.blocked}")]


def test_no_donor_is_said_as_a_warning_then_an_error_each_at_most_once_per_interval(make_node, caplog):
    rj = Rejoiner(make_node(7))
    e, every = limits.rejoin_blocked_error_s, limits.link_retry_log_interval_s
    for at, why in [(0.0, "a"), (5.0, "b"), (e - 1, "c"), (e, "d"), (e + 5, "e"), (e + every, "f"), (e + every + 1, "g")]:
        rj._say_blocked(why, 1000.0 + at)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == \
        [("WARNING", "rejoin: a"), ("ERROR", "rejoin: d"), ("ERROR", "rejoin: f")]


async def test_a_watch_that_fails_mid_attempt_resumes_writes_and_leaves_the_machine_ready_to_try_again(
        make_node, greetings, monkeypatch):
    node = make_node(7)
    rj = _told_to_rejoin(node, COLLECTED)
    await _in_cover_wait(node, rj, greetings)       # the stand-in donor refuses the JOIN: running again
    rj.on_need_rejoin(ADDR_C, "C collected rows this node needs", COLLECTED)
    answers, _ = greetings
    answers[ADDR_C] = _greeting(UUID_C, {UUID_A: 3, UUID_B: 8, UUID_C: 2})
    monkeypatch.setattr(limits, "rejoin_watch_s", 0.0)
    monkeypatch.setattr(limits, "rejoin_cover_poll_s", 0.0)
    rj.machine.retry_s = 0.0                         # the second attempt at once

    calls = []

    async def probe_then_break(node_, session, address, timeout):
        calls.append(address)
        if len(calls) > 1:
            raise RuntimeError("a bug in the probe")
        return answers[address]
    monkeypatch.setattr(rejoin, "probe", probe_then_break)
    with pytest.raises(RuntimeError, match="a bug in the probe"):
        await rj.watch()
    assert not rj.running and (node.status, node.status_reason) == ("running", "")


@pytest.mark.parametrize("relay, waits", [
    (_Relay(UUID_C), True),
    (_Relay(UUID_C, own_rows_only=True), False),      # fenced: it takes no row of ours until it lifts
    (_Relay(UUID_C, without=(UUID_A,)), False),       # it never takes the rows C lacks (A's) from us
    (_Relay(UUID_C, without=(UUID_B,)), True),
])
async def test_writes_pause_only_for_a_donor_whose_link_takes_the_rows_it_lacks(make_node, greetings, relay, waits):
    """C lacks A's row 4 (full+replace seed 204848: a fenced donor, and donors going without the
    rows, paused the node's writes every retry interval for nothing)."""
    await _probed_with_relays(make_node, greetings, [relay], waits)


@pytest.mark.parametrize("order", ["old first", "new first"])
@pytest.mark.parametrize("old, new, waits", [
    (_Relay(UUID_C, closed=True), _Relay(UUID_C, own_rows_only=True), False),
    (_Relay(UUID_C, own_rows_only=True, closed=True), _Relay(UUID_C), True),
])
async def test_a_donor_is_judged_by_its_link_not_by_an_older_one_being_replaced(make_node, greetings, old, new,
                                                                                waits, order):
    """C subscribed again (a fenced C lifted its fence, or the reverse): for a moment both links
    are in the relays, the older one closed (Relay.run); what C takes is what the newer asks."""
    await _probed_with_relays(make_node, greetings, [old, new] if order == "old first" else [new, old], waits)


async def _probed_with_relays(make_node, greetings, relays: list, waits: bool) -> None:
    node = make_node(7)                               # it lacks B's row 8, which C collected
    node.relays = relays
    rj = _told_to_rejoin(node, COLLECTED)
    answers, _ = greetings
    answers[ADDR_C] = _greeting(UUID_C, {UUID_A: 3, UUID_B: 8, UUID_C: 2})
    answers[ADDR_B] = _greeting(UUID_B, {UUID_A: 3, UUID_B: 7, UUID_C: 2})    # no donor: it lacks B's row 8
    rj.machine.tick(time.monotonic())
    await rj._act()
    assert (rj.machine.state is RejoinState.COVER_WAIT) is waits
    assert (node.status == "rejoining") is waits


async def test_a_rebuild_takes_the_measure_of_the_store_only_after_a_batch_being_persisted_lands(
        make_node, greetings, monkeypatch, tmp_path):
    """The journal's real parts: a batch of A's own rows is being written by an executor thread when
    the attempt finds C covers A (it has what A's vclock holds so far). The rebuild must wait for
    that batch before it takes what the snapshot must cover (`mine`): the batch is acknowledged as
    soon as it lands, and the swap deletes the WAL. Waiting only for the queue to empty (the CI
    nemesis run of session 49) left it out, and eight acknowledged writes were gone."""
    node = make_node(7)
    p = Pieces(tmp_path / "journal")
    await p.bootstrap()
    node.core, node.journal = p.core, p.journal      # A alone in its table: B's rows are wanted
    entered, release = p.hold_writes(monkeypatch)
    rj = _told_to_rejoin(node, COLLECTED)
    measured: list[dict[str, int]] = []
    real_mine = rj.machine.mine
    monkeypatch.setattr(rj.machine, "mine", lambda: measured.append(real_mine()) or measured[-1])
    before = p.core.vclock.get(1)
    fut = p.journal.submit_nowait([p.txn([Op(OP_PUT, "kv", f"k{i}", i) for i in range(ROWS)])])
    last = before + ROWS
    acting = None
    try:
        assert await asyncio.to_thread(entered.wait, DEADLINE_S), "the batch went to an executor thread"
        answers, _ = greetings
        answers[ADDR_C] = _greeting(UUID_C, {UUID_A: before, UUID_B: 8, UUID_C: 2})
        rj.machine.tick(time.monotonic())
        acting = asyncio.create_task(rj._act())
        await until(lambda: node.links[:1] == [[]], DEADLINE_S, "the rebuild to take the links down")
        assert node.join.joins == [], "a snapshot asked for before the batch landed"
        assert node.status == "rejoining"
    finally:
        release.set()
    await asyncio.wait_for(fut, DEADLINE_S)             # acknowledged
    await asyncio.wait_for(acting, DEADLINE_S)
    assert node.join.joins == [ADDR_C]
    assert measured[-1][UUID_A] == last, "the snapshot must cover the acknowledged batch"
    await p.stop()


async def test_a_node_catching_up_at_start_rejoins_and_is_catching_up_again_after(make_node, greetings):
    """A member that catches up before it goes active (`--cluster-wait-for`, node/lifecycle.py
    catch_up) may be told to rejoin by the member it catches up with: an attempt runs (it used
    to wait for a running node: the catch-up then waited for good), and once it is over the node
    is catching up again, not running: it has not gone active
    (tests/integration/test_catch_up_rejoin.py has the whole start)."""
    node = make_node(7)
    node.status, node.status_reason = "catching_up", "catching up from C"
    rj = _told_to_rejoin(node, COLLECTED)
    await _in_cover_wait(node, rj, greetings)         # writes paused, then a rebuild the donor refuses
    assert node.join.joins == [ADDR_C]
    assert (node.status, node.status_reason) == ("catching_up", "catching up from C")


@pytest.mark.parametrize("status", ["loading", "joining", "waiting", "stopping"])
async def test_no_attempt_runs_on_a_node_that_neither_runs_nor_catches_up(make_node, greetings, status):
    node = make_node(7)
    node.status = status
    rj = _told_to_rejoin(node, COLLECTED)
    rj.machine.tick(time.monotonic())
    await rj._act()
    assert greetings[1] == [] and not rj.running and node.status == status


def test_an_upstream_between_links_is_not_following(make_node):
    """A link that ended with the peer's BYE keeps its status ("follow") through the short wait
    before the next link: the rejoin does not count it as a stream that brings rows (`fed`)."""
    node = make_node(8)
    a = node.appliers[ADDR_C]
    a.status, a.peer_vclock, a.conn = "follow", {UUID_A: 4, UUID_B: 11, UUID_C: 2}, object()
    rj = Rejoiner(node)
    assert rj.upstreams() == {ADDR_C: (True, a.peer_vclock)}
    assert rj.machine.fed({UUID_B: 11})
    a.conn = None                                   # the BYE: the status stays until the next link
    assert rj.upstreams() == {ADDR_C: (False, a.peer_vclock)}
    assert not rj.machine.fed({UUID_B: 11})


@pytest.mark.parametrize("how", ["its link closed", "its task cancelled"])
async def test_a_stop_that_comes_during_a_rebuild_is_not_undone_by_the_rebuilds_end(make_node, greetings, how):
    """The node stops (status "stopping") while a rebuild waits on its donor: the rebuild ends,
    its link closed by the stop or its task cancelled, and must not show the node running again:
    its links would come back in the middle of the stop (nemesis seed 62, session 51: appliers
    subscribed after the stop began, and the HTTP server's drain waited 10 s for the links it
    then accepted again)."""
    node = make_node(7)
    rj = _told_to_rejoin(node, COLLECTED)
    answers, _ = greetings
    answers[ADDR_C] = _greeting(UUID_C, {UUID_A: 3, UUID_B: 8, UUID_C: 2})
    rj.machine.tick(time.monotonic())
    await rj._act()
    assert rj.machine.state is RejoinState.COVER_WAIT
    answers[ADDR_C] = _greeting(UUID_C, {UUID_A: 4, UUID_B: 11, UUID_C: 2})
    asked = asyncio.Event()

    async def apply_once(address, kind, code, extra):
        node.status, node.status_reason = "stopping", "shutting down"      # the stop begins meanwhile
        asked.set()
        if how == "its task cancelled":
            await asyncio.Event().wait()
        raise ConnectionResetError("the link closed: the node stops")
    node.join.apply_once = apply_once
    rj.machine.tick(time.monotonic() + limits.rejoin_cover_poll_s)
    attempt = asyncio.create_task(rj._act())
    await asyncio.wait_for(asked.wait(), DEADLINE_S)
    if how == "its task cancelled":
        attempt.cancel()
        with pytest.raises(asyncio.CancelledError):
            await attempt
    else:
        await asyncio.wait_for(attempt, DEADLINE_S)
    assert (node.status, node.status_reason) == ("stopping", "shutting down")
