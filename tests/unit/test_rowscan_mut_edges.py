"""Edges of node/core/rowscan.py that its mutation score showed unpinned: the native scanner is
given immutable bytes only (a scan keeps pointers into them: a bytearray or memoryview takes the
exact path), a build without the native module takes the exact paths everywhere, and the relay
scan gets the frame bound and the own cut each in its place."""
from __future__ import annotations

import pytest

from node.core import codec, rowscan
from node.core import messages as m
from node.core.rows import GROUP_DEFAULT, OP_PUT, Op, Txn
from node.wal import format as fmt
from test_rowscan import message

TXNS = [Txn(2, 1, GROUP_DEFAULT, 5, (Op(OP_PUT, "kv", "a", 1),))]


@pytest.mark.parametrize("wrap", [bytearray, memoryview])
def test_a_message_that_is_not_immutable_bytes_is_not_scanned(wrap):
    data = message([TXNS])
    assert rowscan.scan_rows(data) is not None
    assert rowscan.scan_rows(wrap(data)) is None


def test_without_the_native_module_nothing_is_scanned_and_relays_read_every_frame(monkeypatch):
    data = message([TXNS])
    monkeypatch.setattr(rowscan, "native", None)
    assert rowscan.scan_rows(data) is None
    assert rowscan.relay_scan(b"", 0, {}, 1 << 20) is None
    assert rowscan.relay_scan(b"", 0, {}, 1 << 20, (2, 1)) is None


@pytest.mark.parametrize("own", [None, (2, 5), (2, 0), (7, 1)])
def test_the_relay_scan_takes_frames_of_every_size_up_to_the_bound_whatever_the_own_cut(own):
    """The native relay scan is given the frame bound and the own cut each in its place: a frame
    within frame_bytes_max is read whether or not a cut is given (a cut of origin 2 past its rows
    keeps them all; one at 0 keeps none, and the frame is skipped, not stopped at)."""
    first = Txn(2, 1, GROUP_DEFAULT, 5, (Op(OP_PUT, "kv", "a", 1),))
    second = Txn(2, 2, GROUP_DEFAULT, 5, (Op(OP_PUT, "kv", "b", "x" * 300),))
    frames = [fmt.encode_frame([first], 10), fmt.encode_frame([second], 11)]
    buf = b"".join(frames)
    payloads, rows, pos, status = rowscan.relay_scan(buf, 0, {}, 1 << 20, own)
    assert (pos, status) == (len(buf), rowscan.RS_END)
    if own == (2, 0):
        assert (payloads, rows) == ([], 0), "origin 2's rows past a cut at 0 stay here"
    else:
        assert (payloads, rows) == ([codec.pack([10, [first]]), codec.pack([11, [second]])], 2)


def test_the_relay_scans_statuses_are_the_native_modules():
    assert (rowscan.RS_END, rowscan.RS_BUDGET, rowscan.RS_STOP) == \
        (rowscan.native.RS_END, rowscan.native.RS_BUDGET, rowscan.native.RS_STOP) == (0, 1, 2)


def test_the_relay_scan_says_why_it_stopped_budget_spent_or_a_frame_it_cannot_take():
    frame = fmt.encode_frame([TXNS[0]], 10)
    payloads, rows, pos, status = rowscan.relay_scan(frame + frame, 0, {}, 1)
    assert (len(payloads), pos, status) == (1, len(frame), rowscan.RS_BUDGET)
    damaged = frame[:-1] + bytes([frame[-1] ^ 1])
    assert rowscan.relay_scan(frame + damaged, 0, {}, 1 << 20)[1:] == (1, len(frame), rowscan.RS_STOP)


def test_a_message_whose_own_structure_is_not_canonical_is_not_scanned():
    """A written time in a longer form than needed (uint8 for 5): the txns are canonical, the
    message is not, so splicing its bytes would not give what encoding again gives."""
    data = message([TXNS], written_us=5)
    head = rowscan.ROWS_HEAD + b"\x91\x92\x05"
    assert data.startswith(head) and rowscan.scan_rows_py(data) is not None
    odd = b"".join([rowscan.ROWS_HEAD, b"\x91\x92\xcc\x05", data[len(head):]])
    assert rowscan.scan_rows_py(odd) is None and rowscan.scan_rows(odd) is None
    assert m.decode(odd) == m.decode(data), "the exact path reads it as the same message"


def test_a_build_without_the_native_module_imports_and_scans_nothing(monkeypatch):
    import importlib
    import sys
    try:
        monkeypatch.setitem(sys.modules, "node.core._rowscan", None)     # its import fails
        monkeypatch.delattr(sys.modules["node.core"], "_rowscan")
        importlib.reload(rowscan)
        assert rowscan.native is None
        assert rowscan.scan_rows(message([TXNS])) is None
    finally:
        monkeypatch.undo()
        importlib.reload(rowscan)
    assert rowscan.native is not None
