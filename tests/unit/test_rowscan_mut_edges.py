"""Edges of node/core/rowscan.py that its mutation score showed unpinned: the native scanner is
given immutable bytes only (a scan keeps pointers into them: a bytearray or memoryview takes the
exact path), and a build without the native module takes the exact paths everywhere."""
from __future__ import annotations

import pytest

from node.core import rowscan
from node.core.rows import GROUP_DEFAULT, OP_PUT, Op, Txn
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
