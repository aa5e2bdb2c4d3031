"""node/core/receive.py at the edges mutation testing found unpinned with unit tests alone:
which duplicate `_cluster` rows still teach the peer's ids (only the peer's own, above its
history), an expelled member's `_cluster` txn at and past its bound, an expelled member with
bound 0 on the run path, a scanned run wholly past a bound, the scanner's clock check at its
limit, and the store's space capacity counted once per new space, with nops counting none."""
from __future__ import annotations

import pytest

from node import limits
from node.core import codec, rowscan
from node.core import messages as m
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, OP_CLUSTER, OP_NOP, OP_PUT, OP_SPACE, Op, Txn
from node.errors import RemoteProtocolError
from tests.unit.test_receive_run import AHEAD, OTHER, PEER, SELF, WALL, _core


def _cluster_txn(their_rid: int, lsn: int, member: str, their_id: int, **value) -> Txn:
    return Txn(their_rid, lsn, GROUP_CLUSTER, WALL,
               (Op(OP_CLUSTER, "_cluster", member, {"id": their_id, "address": "", "state": "member", **value}),))


def test_a_duplicate_of_the_peers_own_cluster_row_still_teaches_its_ids():
    core = _core(None)
    assert core.receive(PEER, _cluster_txn(7, 5, SELF, 9), WALL) == []
    assert core.peers[PEER].map.to_local.get(9) == 1


@pytest.mark.parametrize("history", [5, 6])
def test_a_duplicate_of_the_peers_own_cluster_row_at_or_below_its_history_teaches_nothing(history):
    core = _core(None)
    core.peers[PEER].history_lsn = history
    assert core.receive(PEER, _cluster_txn(7, 5, SELF, 9), WALL) == []
    assert core.peers[PEER].map.to_local.get(9) is None


def test_a_duplicate_cluster_row_of_another_origin_teaches_nothing_of_the_peers_ids():
    core = _core(None)
    assert core.receive(PEER, _cluster_txn(3, 5, SELF, 9), WALL) == []
    assert core.peers[PEER].map.to_local.get(9) is None and core.peers[PEER].stats.duplicates == 1


def test_an_expelled_members_cluster_txn_past_its_bound_is_skipped_unclaimed():
    core = _core(6)
    past = Txn(3, 6, GROUP_CLUSTER, WALL, _cluster_txn(3, 6, OTHER, 3).ops * 2)     # lsns 6..7
    assert core.receive(PEER, past, WALL) == []
    assert core.claimed.get(3) == 5 and core.peers[PEER].stats.expelled == 1


def test_an_expelled_members_cluster_txn_up_to_its_bound_is_taken():
    core = _core(6)
    out = core.receive(PEER, _cluster_txn(3, 6, OTHER, 3, state="expelled", expelled_lsn=6), WALL)
    assert out and out[0].lsn == 6 and core.claimed.get(3) == 6 and core.peers[PEER].stats.expelled == 0


def test_a_member_expelled_with_bound_0_has_every_plain_row_skipped():
    core = _core(0)
    out: list = []
    core.receive_run(PEER, [Txn(3, 6, GROUP_DEFAULT, WALL, (Op(OP_PUT, "s", "k", 1),))], 0, out, WALL)
    assert out == [] and core.claimed.get(3) == 5 and core.peers[PEER].stats.expelled == 1


def _scan(*txns: Txn):
    return rowscan.scan_rows_py(m.encode_rows([codec.pack([WALL, [t.to_wire() for t in txns]])]))


def test_a_scanned_run_wholly_past_an_expelled_bound_claims_nothing():
    core = _core(5)
    ranges: list = []
    scan = _scan(Txn(3, 6, GROUP_DEFAULT, WALL, (Op(OP_PUT, "s", "k", 1),)))
    assert core.receive_scan(PEER, scan, ranges, WALL) == 0
    assert ranges == [] and core.claimed.get(3) == 5


def test_the_scanner_path_takes_a_timestamp_exactly_at_the_clock_limit():
    core = _core(None)
    ranges: list = []
    scan = _scan(Txn(7, 6, GROUP_DEFAULT, AHEAD, (Op(OP_PUT, "s", "k", 1),)))
    assert core.receive_scan(PEER, scan, ranges, WALL) == 1
    assert core.claimed.get(2) == 6


def _plain(*ops: Op) -> Txn:
    return Txn(7, 6, GROUP_DEFAULT, WALL, ops)


def _space(name: str) -> Op:
    return Op(OP_SPACE, name, "", {"local": False, "conflict": "lww"})


def _core_one_space_short():
    core = _core(None)
    core.spaces.update({f"x{i}": False for i in range(limits.store_spaces_max - 1 - len(core.spaces))})
    assert len(core.spaces) == limits.store_spaces_max - 1
    return core


def test_a_nop_names_no_space_to_create():
    core = _core(None)
    before = dict(core.spaces)
    core.receive_run(PEER, [_plain(Op(OP_NOP, "_skipped", "", None))], 0, [], WALL)
    assert core.spaces == before and core.claimed.get(2) == 6


def test_one_space_short_of_the_stores_capacity_a_new_space_is_taken_even_twice_in_one_txn():
    core = _core_one_space_short()
    out: list = []
    core.receive_run(PEER, [_plain(_space("a"), _space("a"))], 0, out, WALL)
    assert len(out) == 1 and core.spaces["a"] is False and len(core.spaces) == limits.store_spaces_max


def test_one_space_short_of_the_stores_capacity_a_second_new_space_is_refused_naming_it():
    core = _core_one_space_short()
    with pytest.raises(RemoteProtocolError, match=f"space 'b' would be this node's space number "
                                                  f"{limits.store_spaces_max + 1}"):
        core.receive_run(PEER, [_plain(_space("a"), _space("b"))], 0, [], WALL)
    assert "a" not in core.spaces and core.claimed.get(2) == 5


def test_a_scanned_run_wholly_past_a_bound_does_not_end_the_message_for_the_next_origin():
    core = _core(5)
    ranges: list = []
    scan = _scan(Txn(3, 6, GROUP_DEFAULT, WALL, (Op(OP_PUT, "s", "k", 1),)),
                 Txn(7, 6, GROUP_DEFAULT, WALL, (Op(OP_PUT, "s", "k", 2),)))
    assert core.receive_scan(PEER, scan, ranges, WALL) == 1
    assert ranges == [(1, 2, 2)] and core.claimed.get(3) == 5 and core.claimed.get(2) == 6
