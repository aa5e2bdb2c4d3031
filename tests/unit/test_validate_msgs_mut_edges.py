"""Edges of node/core/validate_msgs.py that its mutation score showed unpinned: a `_cluster` table
that is not a list (an empty map passes no length test), a store's `initial` whose founders are
not a list, and in a snapshot chunk the first error found is the one named: a bad space before
an oversized chunk, a bad key before a bad origin, a bad second row after a good first."""
from __future__ import annotations

import pytest

from node import limits
from node.core import validate_msgs as vm

UUID = "0000000a-0000-4000-8000-00000000000b"
GOOD = ["k", [1, 1, 1, 5, False]]                  # [key, [value, origin id, lsn, hlc, deleted]]


@pytest.mark.parametrize("rows", [{}, "", ()])
def test_a_cluster_table_that_is_not_a_list_is_refused_even_when_empty(rows):
    assert vm.cluster_rows_error(rows) == f"a _cluster table is a list of at most {limits.members_max} rows"


@pytest.mark.parametrize("founders", [{UUID: 1}, None])
def test_a_store_initial_whose_founders_are_not_a_list_is_refused(founders):
    st = {"initial": {"cluster_uuid": UUID, "created_s": 1.0, "founders": founders}}
    assert vm.store_field_error(st) == "store.initial is {cluster_uuid, created_s, founders: [uuid, ...]}"
    assert vm.store_field_error({"initial": {"cluster_uuid": UUID, "created_s": 1.0, "founders": [UUID]}}) is None


def test_a_snapshot_chunk_with_a_bad_space_name_is_refused_for_it_whatever_its_size():
    body = {"space": "1bad", "rows": [GOOD] * (limits.snapshot_chunk_rows_max + 1)}
    assert vm.snapshot_rows_error(body) == vm.space_name_error("1bad")


def test_a_snapshot_row_with_a_bad_key_and_a_bad_origin_is_refused_for_its_key():
    assert vm.snapshot_rows_error({"space": "kv", "rows": [["", [1, -1, 1, 5, False]]]}) == vm.key_error("")


def test_a_snapshot_chunk_whose_second_row_is_bad_is_refused():
    assert vm.snapshot_rows_error({"space": "kv", "rows": [GOOD, GOOD]}) is None
    bad = ["k", [1, limits.replica_id_max + 1, 1, 5, False]]
    assert vm.snapshot_rows_error({"space": "kv", "rows": [GOOD, bad]}) == \
        "a snapshot record's origin id, hlc or deleted flag is out of bounds"
