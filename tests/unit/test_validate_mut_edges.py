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
