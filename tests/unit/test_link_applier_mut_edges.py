"""The applier machine (node/core/link/applier.py) at the edges mutation testing found unpinned:
what a machine says before any greeting, what the greeting leaves (the greeting, the core's
peer, the upstream's history bound, the expel epoch, the registration's time), refusals other
than need_rejoin, the rejoin answer with nothing to add, resubscribing noticed at rows and at
tick without an ACK after the Stop, a fence that stays, nothing taken after the link stopped,
lag and the last row's time from the last txn only, the ACK interval at its edge, row counts,
and the WAL entries a cluster txn splits a message into."""
from __future__ import annotations

import pytest

from node import limits
from node.core import codec, rowscan
from node.core import messages as m
from node.core.link.applier import ApplierState, DisproveClaim, Followed, Resubscribe
from node.core.membership import OwnRowsFence
from node.cluster_space.table import STATE_MEMBER, Member
from node.core.replicaset import cluster_op
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, OP_PUT, Op, Txn
from node.errors import PeerRefused, RemoteProtocolError
from tests.unit.test_link_applier_machine import (NOW, SELF, UP, UP_ROWS, WALL_US, _persisted, following,
                                                  greeted, greeting, machine, new_core, put, rows)


def _acks(rd) -> list:
    return [s.body for s in rd.send if s.mtype == m.ACK]


def test_a_new_machine_has_no_peer_greeting_rows_or_lag_yet():
    mach = machine()
    assert (mach.peer_uuid, mach.greeting, mach.core_peer, mach.mine) == (None, None, None, {})
    assert (mach.peer_vclock, mach.subscribed_from, mach.fenced, mach.expel_epoch) == ({}, {}, False, 0)
    assert (mach.rows, mach.lag_s, mach.last_row_at) == (0, 0.0, 0.0)
    assert (mach.messages_scanned, mach.messages_decoded) == (0, 0)


def test_a_greeting_leaves_the_upstreams_greeting_the_cores_peer_and_its_history_bound():
    mach = greeted(machine(), own_history_lsn=limits.lsn_max)
    assert mach.greeting == greeting(UP, UP_ROWS, own_history_lsn=limits.lsn_max)
    assert mach.core_peer is mach.core.peers[UP] and mach.core_peer.history_lsn == limits.lsn_max


@pytest.mark.parametrize("history", [-1, limits.lsn_max + 1, "7", 2.0, None])
def test_a_history_bound_that_is_no_lsn_is_read_as_none(history):
    mach = greeted(machine(), own_history_lsn=history)
    assert mach.core_peer.history_lsn == 0


def test_a_history_bound_of_0_and_of_1_are_taken_as_said():
    assert greeted(machine(), own_history_lsn=1).core_peer.history_lsn == 1
    assert greeted(machine(), own_history_lsn=0).core_peer.history_lsn == 0


def test_the_registration_a_greeting_makes_carries_the_time_it_came_in_microseconds():
    mach = machine()
    mach.start(greeting(SELF))
    mach.advance(mach.ready())
    mach.step(m.Message(m.GREETING, greeting(UP, UP_ROWS, own_history_lsn=3)), NOW)
    rd = mach.ready()
    (p,) = rd.persist
    assert p.entry.txns[0].group == GROUP_CLUSTER and p.entry.txns[0].timestamp == WALL_US


def test_a_link_that_greets_after_an_expel_grew_a_bound_is_not_told_to_resubscribe_for_it():
    core = new_core()
    core.expel_epoch = 3
    mach = following(machine(core))
    assert mach.expel_epoch == 3
    mach.step(rows(put(1, 6)), NOW)
    assert mach.ready().stop is None and mach.state is ApplierState.FOLLOW


@pytest.mark.parametrize("state", ["greeting", "subscribing"])
def test_a_refusal_other_than_need_rejoin_ends_the_link_with_it_unchanged(state):
    mach = machine()
    mach.start(greeting(SELF))
    mach.advance(mach.ready())
    if state == "subscribing":
        mach = greeted(machine())
    e = PeerRefused("options", "different")
    mach.step(e, NOW)
    assert mach.ready().stop.error is e and e.message == "different" and not hasattr(e, "needed")


def test_a_need_rejoin_while_following_is_passed_on_unchanged():
    mach = following()
    e = PeerRefused("need_rejoin", "collected")
    mach.step(e, NOW)
    assert mach.ready().stop.error is e and e.message == "collected" and not hasattr(e, "needed")


def test_a_rejoin_answer_from_an_upstream_that_has_all_this_node_has_adds_nothing_to_its_message():
    mach = greeted(machine(new_core(vclock={})), vclock_uuid={UP: 9})
    e = PeerRefused("need_rejoin", "collected")           # no body: an older relay's
    mach.step(e, NOW)
    assert e.message == "collected" and e.needed == {}


def test_an_expel_bound_growing_is_noticed_at_the_next_rows():
    mach = following()
    mach.core.expel_epoch += 1
    mach.step(rows(put(1, 6)), NOW)
    rd = mach.ready()
    assert isinstance(rd.stop.error, Resubscribe) and _acks(rd) == []


@pytest.mark.parametrize("why", ["expel", "fence"])
def test_a_resubscribe_noticed_at_tick_sends_no_ack_after_the_stop(why):
    core = new_core()
    if why == "fence":
        core.fence = OwnRowsFence("a test loss")
    mach = following(machine(core))
    if why == "fence":
        core.fence = None
    else:
        core.expel_epoch += 1
    mach.tick(NOW + limits.heartbeat_interval_s)
    rd = mach.ready()
    assert isinstance(rd.stop.error, Resubscribe) and rd.send == ()


def test_a_fenced_link_whose_fence_stays_keeps_following():
    core = new_core()
    core.fence = OwnRowsFence("a test loss")
    mach = following(machine(core))
    mach.step(m.Message(m.HEARTBEAT, {"now_us": WALL_US}), NOW)
    mach.tick(NOW + 1)
    assert mach.ready().stop is None and mach.state is ApplierState.FOLLOW


def test_tick_before_following_or_after_the_end_does_nothing():
    mach = greeted(machine())
    mach.core.expel_epoch += 1
    mach.tick(NOW + limits.heartbeat_interval_s)
    assert not mach.ready() and mach.state is ApplierState.SUBSCRIBING
    mach.stop()
    mach.stop()                                            # stopping twice is no error
    mach.tick(NOW + 2 * limits.heartbeat_interval_s)
    assert not mach.ready() and mach.state is ApplierState.STOPPED


def test_rows_refused_on_the_exact_path_move_neither_lag_nor_the_last_rows_time():
    mach = following()
    mach.step(rows(put(9, 1)), NOW + 5)                   # an id the greeting did not map
    rd = mach.ready()
    assert isinstance(rd.stop.error, RemoteProtocolError)
    assert (mach.lag_s, mach.last_row_at, mach.messages_decoded) == (0.0, 0.0, 1)


def test_a_scanned_message_under_an_unmapped_id_stops_the_link_once_and_decodes_nothing():
    mach = following()
    data = m.encode_rows([codec.pack([WALL_US, [put(9, 1).to_wire()]])])
    mach.step(m.decode(data, rowscan.scan_rows_py), NOW)
    rd = mach.ready()
    assert isinstance(rd.stop.error, RemoteProtocolError) and len(rd.effects) == 1
    assert (mach.messages_scanned, mach.messages_decoded, mach.last_row_at) == (0, 0, 0.0)


def test_an_empty_rows_message_moves_neither_lag_nor_the_last_rows_time():
    mach = following()
    mach.step(rows(), NOW)
    mach.step(m.decode(m.encode_rows([]), rowscan.scan_rows_py), NOW)
    assert (mach.lag_s, mach.last_row_at) == (0.0, 0.0)


def test_lag_and_the_last_rows_time_come_from_the_last_txn_of_a_message_on_either_path():
    older = put(1, 7)._replace(timestamp=WALL_US - 3_000_000)
    mach = following()
    mach.step(rows(put(1, 6), older), NOW)
    assert mach.lag_s == pytest.approx(3.0) and mach.last_row_at == NOW and mach.messages_decoded == 1
    mach.advance(mach.ready())
    newer = put(1, 8)._replace(timestamp=WALL_US)
    oldest = put(1, 9)._replace(timestamp=WALL_US - 2_000_000)
    data = m.encode_rows([codec.pack([WALL_US, [newer.to_wire(), oldest.to_wire()]])])
    mach.step(m.decode(data, rowscan.scan_rows_py), NOW + 1)
    assert mach.lag_s == pytest.approx(3.0) and mach.last_row_at == NOW + 1 and mach.messages_scanned == 1
    assert mach.rows == 4


def test_a_heartbeat_while_the_journal_is_busy_leaves_the_lag_alone():
    mach = following()
    mach.host.pending = 1
    mach.step(m.Message(m.HEARTBEAT, {"now_us": WALL_US - 4_000_000}), NOW)
    assert mach.lag_s == 0.0
    mach.host.pending = 0
    mach.step(m.Message(m.HEARTBEAT, {"now_us": WALL_US - 4_000_000}), NOW)
    assert mach.lag_s == pytest.approx(4.0)


def test_an_upstream_that_claimed_exactly_what_this_node_has_is_not_disproved():
    mach = following()
    mach.host.own[UP] = mach.core.claimed.get(mach.core.self_id)
    mach.step(m.Message(m.HEARTBEAT, {"now_us": WALL_US}), NOW)
    assert not [a for a in mach.ready().apply if isinstance(a, DisproveClaim)]


def test_an_ack_says_the_lag_in_microseconds():
    mach = following()
    mach.step(rows(put(1, 6)._replace(timestamp=WALL_US - 1_500_000)), NOW)
    assert [a["lag_us"] for a in _acks(mach.ready())] == [1_500_000]


def _at(txn: Txn, t: float) -> Txn:
    return txn._replace(timestamp=int(t * 1e6))


def test_an_ack_of_something_changed_goes_exactly_an_ack_interval_after_the_last_and_not_before():
    t0 = limits.ack_interval_s                            # s: (t0 + ack_interval_s) - t0 is exactly it here
    assert (t0 + limits.ack_interval_s) - t0 == limits.ack_interval_s
    mach = following()
    mach.step(rows(_at(put(1, 6), t0)), t0)
    rd = mach.ready()
    assert len(_acks(rd)) == 1
    mach.advance(rd)
    mach.core.commit_tops({2: 6})                         # applied: what an ACK says changed
    mach.step(rows(_at(put(1, 7), t0)), t0 + limits.ack_interval_s * 0.999)
    rd = mach.ready()
    assert _acks(rd) == []                                # too soon, though something changed
    mach.advance(rd)
    mach.step(rows(_at(put(1, 8), t0)), t0 + limits.ack_interval_s)
    rd = mach.ready()
    assert [a["vclock"][1] for a in _acks(rd)] == [6]     # changed: it goes before a heartbeat is due


def _registration(lsn: int) -> Txn:
    new = "00000000-0000-4000-8000-000000000009"
    return Txn(1, lsn, GROUP_CLUSTER, WALL_US, (cluster_op(Member(new, 4, "9.example:1", STATE_MEMBER)),))


def test_a_cluster_txn_already_held_adds_no_entry_and_no_rows():
    mach = following()
    mach.step(rows(put(1, 6), _registration(7)), NOW)
    mach.advance(mach.ready())
    before = mach.rows
    mach.step(rows(_registration(7)), NOW)                 # the same lsn again: held, skipped
    rd = mach.ready()
    assert rd.persist == () and rd.stop is None and mach.rows == before


def test_a_message_that_begins_with_a_cluster_txn_persists_it_with_ours_then_the_plain_ones_with_their_row_count():
    mach = following()
    mach.step(rows(_registration(6), put(1, 7, 2), put(1, 9, 3)), NOW)
    rd = mach.ready()
    frames = [([(t.replica_id, t.lsn) for t in txns], n) for txns, n in _persisted(rd)]
    own = mach.core.self_id
    assert frames[0][0][0] == (2, 6) and frames[0][0][1][0] == own
    assert frames[1] == ([(2, 7), (2, 9)], 5)
    assert len(frames) == 2 and mach.rows == 1 + 5


def test_plain_txns_after_a_cluster_txn_count_their_own_rows_only():
    mach = following()
    mach.step(rows(put(1, 6, 4), _registration(10), put(1, 11, 2)), NOW)
    assert [n for _, n in _persisted(mach.ready())][-1] == 2


def test_the_notes_a_machine_hands_out_are_values_that_cannot_change_on_the_way():
    mach = following()
    mach.host.own[UP] = 99
    mach.step(m.Message(m.HEARTBEAT, {"now_us": WALL_US}), NOW)
    (note,) = mach.ready().apply
    assert isinstance(note, DisproveClaim)
    with pytest.raises(AttributeError):
        note.have = 99
    followed = Followed(UP, {1: 2}, False)
    with pytest.raises(AttributeError):
        followed.fenced = True
    assert hash(note) == hash(DisproveClaim(UP, note.have))


def test_rows_claimed_in_a_run_before_a_refused_txn_are_counted():
    mach = following()
    bad = Txn(1, 8, GROUP_DEFAULT, WALL_US, (Op(OP_PUT, "nope", "k", 1),))    # no such space here
    mach.step(rows(put(1, 6, 2), bad), NOW)
    rd = mach.ready()
    assert isinstance(rd.stop.error, RemoteProtocolError) and mach.rows == 2
    assert [n for _, n in _persisted(rd)] == [2]
