"""node/core/link/filter.py `rows_batches`: how the frames a subscriber gets become ROWS messages,
at each bound. Frames share a message up to relay_batch_bytes_max (exactly at it they still
share); a frame of up to relay_frame_alone_bytes_max goes alone as stored; a larger one is split
into payloads of whole txns, in order, under the frame's written time, each up to
relay_batch_bytes_max; a txn too large for any message (only a version before txn_bytes_max was
checked could have written it) stops the link naming it."""
from __future__ import annotations

import msgpack
import pytest

from node import limits
from node.core import codec
from node.core.link.filter import rows_batches
from node.core.rows import GROUP_DEFAULT, OP_PUT, Op, Txn
from node.errors import PeerRefused

W = 7                                     # written_us: one byte, so a frame of one txn is its txn + 3


def _txn(lsn: int, size: int) -> Txn:
    """A txn of one put whose encoding is exactly `size` bytes (up to value_bytes_max), or of as
    many puts as that takes."""
    value = "v" * min(size, limits.value_bytes_max - 16)
    ops = []
    while len(codec.pack(Txn(1, lsn, GROUP_DEFAULT, 5, tuple(ops)))) + len(codec.pack(value)) + 16 < size:
        ops.append(Op(OP_PUT, "s", f"k{len(ops)}", value))
    t = Txn(1, lsn, GROUP_DEFAULT, 5, tuple(ops) + (Op(OP_PUT, "s", "k" * 16, ""),))
    short = size - len(codec.pack(t))
    t = t._replace(ops=t.ops[:-1] + (t.ops[-1]._replace(value="v" * short),))
    short = size - len(codec.pack(t))    # the value's str head grew: the key (a fixstr) gives it back
    t = t._replace(ops=t.ops[:-1] + (t.ops[-1]._replace(key="k" * (16 + short)),))
    assert len(codec.pack(t)) == size, (len(codec.pack(t)), size)
    return t


def _frame(*txns: Txn) -> bytes:
    return codec.pack([W, list(txns)])


def _frame_of(size: int, lsn: int = 1) -> bytes:
    f = _frame(_txn(lsn, size - 3))
    assert len(f) == size
    return f


def _txns_of(payloads) -> list:
    out = []
    for p in payloads:
        written_us, txns = msgpack.unpackb(p, raw=False)
        assert written_us == W
        out += txns
    return out


def test_no_frames_make_no_messages():
    assert rows_batches([]) == []


def test_frames_share_a_message_up_to_the_batch_bound_and_one_byte_more_starts_another():
    half = limits.relay_batch_bytes_max // 2
    a, b = _frame_of(half, 1), _frame_of(limits.relay_batch_bytes_max - half, 2)
    assert rows_batches([a, b]) == [[a, b]]
    c = _frame_of(limits.relay_batch_bytes_max - half + 1, 2)
    assert rows_batches([a, c]) == [[a], [c]]
    small = [_frame_of(100, i) for i in range(1, 4)]
    assert rows_batches(small) == [small]


def test_a_frame_of_exactly_the_alone_bound_goes_alone_as_stored():
    big = _frame_of(limits.relay_frame_alone_bytes_max)
    before, after = _frame_of(100, 1), _frame_of(100, 3)
    out = rows_batches([before, big, after])
    assert out == [[before], [big], [after]]
    assert out[1][0] is big


def test_a_frame_past_the_alone_bound_is_split_into_whole_txns_in_order_each_payload_within_the_batch_bound():
    each = limits.relay_batch_bytes_max // 3 + 1         # three do not fit a batch: two per payload
    n = limits.relay_frame_alone_bytes_max // each + 1
    txns = [_txn(i + 1, each) for i in range(n)]
    txns.append(Txn(1, n + 1, GROUP_DEFAULT, 5, (Op(OP_PUT, "s", "bin", b"\x00\xff"),)))   # bytes stay bytes
    frame = _frame(*txns)
    assert len(frame) > limits.relay_frame_alone_bytes_max
    out = rows_batches([frame])
    payloads = [p for group in out for p in group]
    assert len(out) == len(payloads)                     # each payload is over half the batch bound
    assert _txns_of(payloads) == msgpack.unpackb(frame, raw=False)[1]
    sizes = [[len(codec.pack(t)) for t in _txns_of([p])] for p in payloads]
    assert all(sum(s) <= limits.relay_batch_bytes_max for s in sizes)
    assert all(sum(s) + nxt[0] > limits.relay_batch_bytes_max for s, nxt in zip(sizes, sizes[1:]))
    assert _txns_of(payloads[-1:])[-1][4][0][3] == b"\x00\xff"


def test_the_largest_txn_a_split_frame_carries_goes_in_a_payload_of_its_own():
    largest = limits.txn_bytes_max
    frame = _frame(_txn(1, 100), _txn(2, largest))
    assert len(frame) > limits.relay_frame_alone_bytes_max
    out = rows_batches([frame])
    assert [[len(codec.pack(t)) for t in _txns_of(g)] for g in out] == [[100], [largest]]


def test_a_txn_no_message_can_carry_stops_the_link_naming_it():
    frame = _frame(_txn(1, 100), _txn(2, limits.txn_bytes_max + 1))
    with pytest.raises(PeerRefused) as e:
        rows_batches([frame])
    assert e.value.code == "txn_too_large"
    assert e.value.message.startswith(f"txn 1:2 in this node's WAL encodes to {limits.txn_bytes_max + 1} bytes")


def test_a_frame_of_one_txn_of_exactly_txn_bytes_max_goes_alone_as_stored():
    frame = _frame(_txn(1, limits.txn_bytes_max))
    assert rows_batches([frame]) == [[frame]]
    assert _txns_of(p for g in rows_batches([frame]) for p in g) == msgpack.unpackb(frame, raw=False)[1]


def _filler(lsn: int) -> list[Txn]:
    """Txns enough to take a frame past the alone bound, each a third of a batch and a byte."""
    each = limits.relay_batch_bytes_max // 3 + 1
    return [_txn(lsn + i, each) for i in range(limits.relay_frame_alone_bytes_max // each + 1)]


def _payload_sizes(frame: bytes) -> list[list[int]]:
    return [[len(codec.pack(t)) for t in _txns_of([p])] for g in rows_batches([frame]) for p in g]


def test_a_first_frame_over_the_batch_bound_goes_alone_with_no_empty_message_before_it():
    big = _frame_of(limits.relay_batch_bytes_max + 1)
    assert rows_batches([big, _frame_of(100, 2)]) == [[big], [_frame_of(100, 2)]]


def test_after_a_message_is_cut_the_next_holds_exactly_the_batch_bound_and_no_byte_more():
    b, h = limits.relay_batch_bytes_max, limits.relay_batch_bytes_max // 2
    a = _frame_of(b)
    assert rows_batches([a, _frame_of(h, 2), _frame_of(b - h, 3)]) == [[a], [_frame_of(h, 2), _frame_of(b - h, 3)]]
    assert rows_batches([a, _frame_of(h, 2), _frame_of(b - h + 1, 3)]) == [[a], [_frame_of(h, 2)],
                                                                            [_frame_of(b - h + 1, 3)]]


def test_a_split_frames_payloads_hold_exactly_the_batch_bound_of_txns_and_no_byte_more():
    b, h = limits.relay_batch_bytes_max, limits.relay_batch_bytes_max // 2
    exact_first = _frame(_txn(1, h), _txn(2, b - h), _txn(3, h), _txn(4, b - h + 1), _txn(5, h), _txn(6, b - h),
                         *_filler(7))
    assert _payload_sizes(exact_first)[:4] == [[h, b - h], [h], [b - h + 1], [h, b - h]]
    over_first = _frame(_txn(1, h), _txn(2, b - h + 1), *_filler(3))
    sizes = _payload_sizes(over_first)
    assert sizes[0] == [h] and sizes[1][0] == b - h + 1


def test_a_split_frame_whose_first_txn_is_over_the_batch_bound_makes_no_empty_payload():
    b = limits.relay_batch_bytes_max
    sizes = _payload_sizes(_frame(_txn(1, b + 1), _txn(2, 100), *_filler(3)))
    assert sizes[0] == [b + 1] and all(sizes)
