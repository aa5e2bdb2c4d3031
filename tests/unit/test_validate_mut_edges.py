"""Edges of node/core/validate.py that its mutation score showed unpinned: input of the wrong
type where a rule first tests membership (an unhashable conflict name, a `_cluster` value that
is a list holding the field names) gets the rule's message, never a TypeError."""
from __future__ import annotations

from node.core import validate as v


def test_a_space_definition_whose_conflict_is_a_list_is_refused_by_its_message():
    assert v.space_def_error({"conflict": ["lww"]}) == "'conflict' is one of " + ", ".join(sorted(v.DATA_RESOLVERS))
    assert v.space_def_error({"conflict": 1}) == "'conflict' is one of " + ", ".join(sorted(v.DATA_RESOLVERS))


def test_a_cluster_value_that_is_a_list_of_its_field_names_is_refused_by_its_message():
    assert v.cluster_value_error(["id", "state"]) == '_cluster rows are {"id", "address", "state"[, "expelled_lsn"]}'


def test_a_small_flat_decoded_list_is_sure_to_pass_as_a_map_is():
    assert v.decoded_value_ok([1, "a", None, 2.5]) is True
    assert v.decoded_value_ok({"a": 1}) is True
    assert v.decoded_value_ok([float("nan")]) is False


def test_a_row_of_an_integer_kind_no_op_has_is_refused_as_unknown_not_read_as_a_nop():
    assert v.op_error(99, "kv", "k", None) == "unknown op kind 99"
    assert v.op_error(-1, "kv", "", None) == "unknown op kind -1"


def test_a_transaction_of_an_integer_group_no_group_has_is_refused_naming_it():
    ops = [[1, "kv", "k", 1]]
    assert v.txn_envelope_error(1, 1, 99, 0, ops) == "row 1:1: group 99"
    assert v.txn_envelope_error(1, 1, "0", 0, ops) == "row 1:1: group 0"
