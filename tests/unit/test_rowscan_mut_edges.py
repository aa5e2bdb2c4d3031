"""Edges of node/core/rowscan.py that its mutation score showed unpinned: the native scanner is
given immutable bytes only (a scan keeps pointers into them: a bytearray or memoryview takes the
exact path), a build without the native module takes the exact paths everywhere, and the relay
scan gets the frame bound and the own cut each in its place."""
from __future__ import annotations

import pytest

from node.core import codec, rowscan
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
