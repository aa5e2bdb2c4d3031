"""A gap in a peer's own rows (node/core/receive.py `_own_gap`): logged once per gap and link, with
the peer and the lsns, on each of the three paths (one txn: a `_cluster` one; a run; a scanned message); not logged
for a gap in rows the peer relays, nor for the two gaps this node causes itself (fenced, it
asks a peer for its own rows from where the peer is; an expelled member's rows past its bound
are not taken). A row past the gap is still not applied, and the link goes on.
Same table and peer map as tests/unit/test_replicaset.py: this node calls PEER 2 and holds
PEER's rows up to 5; PEER calls itself 1 and OTHER 5."""
from __future__ import annotations

import logging

import pytest

from node.cluster_space.table import STATE_EXPELLED
from node.core import codec, rowscan
from node.core import messages as m
from node.core.membership import OwnRowsFence
from node.core.rows import Txn
from tests.unit.test_replicaset import OTHER, PEER, WALL, _core, cluster, put


def _scan(*txns: Txn):
    return rowscan.scan_rows_py(m.encode_rows([codec.pack([WALL, [t.to_wire() for t in txns]])]))


def by_receive(core, *txns: Txn) -> None:
    """The exact path, one txn at a time: a `_cluster` txn (a plain one goes on as a run) of
    the same origin and lsn, restating what the peer's greeting said of OTHER."""
    for t in txns:
        core.receive(PEER, cluster(t.replica_id, t.lsn, (OTHER, 5, "c:1")), WALL)


def by_run(core, *txns: Txn) -> None:
    core.receive_run(PEER, list(txns), 0, [], WALL)


def by_scan(core, *txns: Txn) -> None:
    core.receive_scan(PEER, _scan(*txns), [], WALL)


PATHS = [by_receive, by_run, by_scan]


def own_gap_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "of its own" in r.getMessage()]


@pytest.mark.parametrize("path", PATHS)
def test_a_peer_that_skips_lsns_of_its_own_is_logged_with_the_peer_and_the_lsns(path, caplog):
    core = _core()
    path(core, put(1, 8))
    assert own_gap_lines(caplog) == [
        f"replication: {PEER} sent its own row 8 while this node holds its rows up to 5: it skipped lsns 6..7 "
        "of its own (its WAL lost rows it had, or it is broken or lying); its rows past the gap wait for a "
        "route that has those (docs/replication.md)"]
    assert core.claimed.get(2) == 5 and core.peers[PEER].stats.gaps == 1


@pytest.mark.parametrize("path", PATHS)
def test_the_rows_after_a_gap_in_a_peers_own_rows_are_logged_once_for_that_gap(path, caplog):
    core = _core()
    path(core, put(1, 8))
    path(core, put(1, 9), put(1, 10))
    assert len(own_gap_lines(caplog)) == 1


@pytest.mark.parametrize("path", PATHS)
def test_a_new_gap_in_a_peers_own_rows_after_the_first_was_filled_is_logged_again(path, caplog):
    core = _core()
    path(core, put(1, 8))
    path(core, put(1, 6), put(1, 7), put(1, 8))          # the rows before it came after all
    assert core.claimed.get(2) == 8
    path(core, put(1, 11))
    lines = own_gap_lines(caplog)
    assert len(lines) == 2 and "own row 11 while this node holds its rows up to 8: it skipped lsns 9..10" in lines[1]


def test_a_gap_still_there_on_the_peers_next_link_is_logged_once_more_for_that_link(caplog):
    core = _core()
    by_receive(core, put(1, 8))
    by_receive(core, put(1, 9))
    core.drop_peer(PEER)                                 # the link ends; the next one greets
    core.greeting(PEER, [[PEER, 1, "b:1", "member"], [OTHER, 5, "c:1", "member"]], WALL)
    by_receive(core, put(1, 8))
    by_receive(core, put(1, 9))
    assert len(own_gap_lines(caplog)) == 2


@pytest.mark.parametrize("path", PATHS)
def test_a_gap_in_rows_the_peer_relays_for_another_origin_is_not_logged(path, caplog):
    core = _core()
    path(core, put(5, 9))                                # OTHER's rows: this node holds 7
    assert own_gap_lines(caplog) == [] and core.peers[PEER].stats.gaps == 1


@pytest.mark.parametrize("path", PATHS)
def test_a_fenced_node_logs_no_gap_in_a_peers_own_rows_since_it_asked_from_where_the_peer_is(path, caplog):
    core = _core()
    core.fence = OwnRowsFence("a test loss")
    path(core, put(1, 8))
    assert own_gap_lines(caplog) == [] and core.peers[PEER].stats.gaps == 1


@pytest.mark.parametrize("path", PATHS)
def test_an_expelled_peers_rows_after_those_past_its_bound_log_no_gap(path, caplog):
    core = _core()
    core.receive(PEER, cluster(1, 6, (PEER, 1, "b:1", STATE_EXPELLED, 6)), WALL)
    assert core.table.get(PEER).state == STATE_EXPELLED and core.claimed.get(2) == 6
    path(core, put(1, 7), put(1, 8))                     # 7 is past the bound, 8 follows it
    assert own_gap_lines(caplog) == [] and core.peers[PEER].stats.expelled == 1


@pytest.mark.parametrize("path", PATHS)
def test_rows_of_a_link_subscribed_while_fenced_log_no_gap_once_the_fence_lifted(path, caplog):
    """The fence lifts between two messages of a link subscribed while fenced (a nemesis run
    on real processes met it): that link still carries the peer's own rows from where the peer
    was, so the gap is this node's doing. The next subscription, unfenced, asks for every row
    again, and a gap on it is the peer's."""
    core = _core()
    core.fence = OwnRowsFence("a test loss")
    core.subscribe_vclock(PEER, {PEER: 7}, [])
    core.fence = None
    path(core, put(1, 8))
    assert own_gap_lines(caplog) == [] and core.peers[PEER].stats.gaps == 1
    core.subscribe_vclock(PEER, None)
    path(core, put(1, 9))
    assert [line.split(":")[1] for line in own_gap_lines(caplog)] == [
        f" {PEER} sent its own row 9 while this node holds its rows up to 5"]
