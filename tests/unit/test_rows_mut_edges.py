"""Edges of node/core/rows.py that its mutation score showed unpinned: a plain frame is read by
the fast decoder (never the exact one), the values check_fast can be sure of on sight are taken
without walking the value rule (the fast path's point), and a value taken on sight does not end
the check of its transaction's later rows, and op_from_wire read alone takes no legacy value
unless told."""
from __future__ import annotations

import pytest

from node.core import codec, rows, validate
from node.core.rows import GROUP_DEFAULT, GROUP_LOCAL, OP_DELETE, OP_NOP, OP_PUT, Op, Txn, Unusual, check_fast
from node.errors import RemoteProtocolError


def _no_exact(*_a, **_k):
    raise AssertionError("the exact path was taken")


def _no_walk(*_a, **_k):
    raise AssertionError("the value rule walked a value check_fast can be sure of")


def _txn(*ops, lsn=1) -> Txn:
    return Txn(1, lsn, GROUP_DEFAULT, 5, tuple(Op(*o) for o in ops))


def test_a_plain_frame_is_read_by_the_fast_decoder_and_never_by_the_exact_path(monkeypatch):
    raws = [[1, 1, GROUP_DEFAULT, 5, [[OP_PUT, "s", "k", {"a": 1}], [OP_NOP, "s", "", None]]],
            [2, 3, GROUP_LOCAL, 6, [[OP_DELETE, "s", "k", None]]]]
    payload = codec.pack([9, raws])
    want = [rows.txn_from_wire(r) for r in raws]
    monkeypatch.setattr(rows, "exact_frame", _no_exact)
    assert rows.frame_txns_upto(payload) == (9, want, None)
    assert rows.unpack_frame_txns(payload) == (9, want)


@pytest.mark.parametrize("value", [
    "v", "v" * validate.STR_CHARS_SAFE, "", 7, -1, True, None,          # (a float is walked: finite?)
    {"a": 1, "b": "x"}, [1, "x", None], {}, [],
])
def test_a_value_check_fast_is_sure_of_on_sight_is_taken_without_walking_the_value_rule(monkeypatch, value):
    monkeypatch.setattr(validate, "value_error", _no_walk)
    check_fast([_txn([OP_PUT, "s", "k", value], [OP_PUT, "s", "k2", value])])


def test_a_str_one_past_what_check_fast_is_sure_of_is_walked_by_the_value_rule(monkeypatch):
    walked = []
    monkeypatch.setattr(validate, "value_error", lambda v: walked.append(v))
    check_fast([_txn([OP_PUT, "s", "k", "v" * (validate.STR_CHARS_SAFE + 1)])])
    assert walked == ["v" * (validate.STR_CHARS_SAFE + 1)]


@pytest.mark.parametrize("value", [{"a": 1}, [1, 2], 5, "v"])
@pytest.mark.parametrize("later", [
    [OP_PUT, "s", "", 1],                 # a put's empty key
    [OP_DELETE, "s", "k", 1],             # a delete's value
    [OP_NOP, "s", "", 1],                 # a nop's value
    [OP_PUT, "s", "k", b"x"],             # a value outside the rule
])
def test_a_value_taken_on_sight_does_not_end_the_check_of_its_txns_later_rows(value, later):
    with pytest.raises(Unusual):
        check_fast([_txn([OP_PUT, "s", "k", value], later)])


def test_a_frame_whose_second_row_breaks_a_rule_after_a_flat_value_is_read_as_the_exact_path_reads_it():
    raws = [[1, 1, GROUP_DEFAULT, 5, [[OP_PUT, "s", "k", {"a": 1}], [OP_DELETE, "s", "k2", 3]]]]
    w, txns, err = rows.frame_txns_upto(codec.pack([9, raws]))
    assert (w, txns) == (9, []) and "row 1:1" in str(err)


def test_an_op_read_alone_holds_a_legacy_value_only_when_told_it_comes_from_this_nodes_wal():
    with pytest.raises(RemoteProtocolError, match="binary data"):
        rows.op_from_wire([OP_PUT, "s", "k", b"bin"])
    assert rows.op_from_wire([OP_PUT, "s", "k", b"bin"], legacy=True) == Op(OP_PUT, "s", "k", b"bin")
