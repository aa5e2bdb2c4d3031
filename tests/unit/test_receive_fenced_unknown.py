"""Rows of a member a fenced node could not register (node/core/cluster_rows.py `_translate`,
node/core/receive.py), on each of the three paths (one `_cluster` txn; a run; a scanned
message). A fenced node registers nobody, so a member its peer knows and it does not has no id
here; NodeCore.subscribe_vclock asks that member's rows from where the peer is. The rows it
writes after that still come on the link: they are not taken now (counted with the gaps) and
the link goes on, so this node's own rows, which the fence waits for, keep coming. Before, each
such row ended the link as a protocol error ("refusing to guess"): a nemesis run on real
processes saw a fenced node's links end 20 times in 3 s while a member that joined after its
snapshot wrote. On a link not subscribed while fenced, such a row is still refused: there it
means a map gone wrong. The peer's map here (tests/unit/test_replicaset.py): it calls itself
1, this node 2 and OTHER 5; id 9 is a member of the peer's this node has never heard of."""
from __future__ import annotations

import pytest

from node.cluster_space.table import STATE_EXPELLED
from node.core.membership import OwnRowsFence
from node.core.rows import GROUP_LOCAL, OP_PUT, Op, Txn
from node.errors import RemoteProtocolError
from tests.unit.test_receive_own_gaps import PATHS, _scan
from tests.unit.test_replicaset import OTHER, PEER, WALL, _core, cluster, put

UNKNOWN = 9


def fenced_subscription():
    core = _core()
    core.fence = OwnRowsFence("a test loss")
    core.subscribe_vclock(PEER, {PEER: 5}, [])
    return core


@pytest.mark.parametrize("path", PATHS)
def test_a_fenced_subscription_passes_over_rows_of_a_member_it_could_not_register(path):
    core = fenced_subscription()
    path(core, put(UNKNOWN, 1), put(UNKNOWN, 2))
    assert core.claimed.get(UNKNOWN) == 0 and UNKNOWN not in core.peers[PEER].map.to_local
    assert core.peers[PEER].stats.gaps == 2 and core.peers[PEER].stats.applied == 0


def test_the_peers_own_rows_after_them_in_one_message_are_taken():
    core = fenced_subscription()
    out: list = []
    i, rows = core.receive_run(PEER, [put(UNKNOWN, 1), put(UNKNOWN, 2), put(1, 6), put(1, 7)], 0, out, WALL)
    assert (i, rows, out) == (2, 0, [])
    core.receive_run(PEER, [put(UNKNOWN, 1), put(UNKNOWN, 2), put(1, 6), put(1, 7)], i, out, WALL)
    assert [(t.replica_id, t.lsn) for t in out] == [(2, 6), (2, 7)] and core.claimed.get(2) == 7

    ranges: list = []
    core = fenced_subscription()
    assert core.receive_scan(PEER, _scan(put(UNKNOWN, 1), put(1, 6), put(UNKNOWN, 2), put(1, 7)), ranges, WALL) == 2
    assert [origin for _, _, origin in ranges] == [2, 2] and core.claimed.get(2) == 7


def test_an_expel_in_such_a_row_is_still_heard_by_the_fence():
    """As for a `_cluster` row that came past a gap while fenced (OwnRowsFence.hear_expels):
    without it, a member expelled on a peer while this node's links stay up holds the fence."""
    core = fenced_subscription()
    assert core.receive(PEER, cluster(UNKNOWN, 1, (OTHER, 5, "c:1", STATE_EXPELLED, 7)), WALL) == []
    assert core.fence.expelled == {OTHER} and core.table.get(OTHER).state != STATE_EXPELLED


@pytest.mark.parametrize("path", PATHS)
def test_on_a_link_not_subscribed_while_fenced_such_a_row_is_still_refused(path):
    core = _core()
    core.subscribe_vclock(PEER, None)
    with pytest.raises(RemoteProtocolError, match=f"id {UNKNOWN} is unknown to this node's map of that peer"):
        path(core, put(UNKNOWN, 1))


def test_a_row_of_a_local_space_is_refused_whoever_its_origin():
    core = fenced_subscription()
    with pytest.raises(RemoteProtocolError, match="row of a local space"):
        core.receive(PEER, Txn(UNKNOWN, 1, GROUP_LOCAL, WALL, (Op(OP_PUT, "loc", "k", 1),)), WALL)
