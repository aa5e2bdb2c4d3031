"""Edges of node/core/validate.py's value walk (value_size) that its mutation score showed
unpinned: a value of exactly value_bytes_max is accepted even when the last thing the walk
adds is an empty container's head (the walk then tests the size on opening it), and one
byte more is refused there."""
from __future__ import annotations

import pytest

from node import limits
from node.core import codec, validate


@pytest.mark.parametrize("empty", [[], {}])
def test_a_value_of_exactly_the_bound_ending_in_an_empty_container_is_accepted(empty):
    v = ["v" * (limits.value_bytes_max - 7), empty]        # fixarray 1 + str32 5 + the str + 1
    assert len(codec.pack(v)) == limits.value_bytes_max
    assert validate.value_size(v) == limits.value_bytes_max
    assert validate.value_error(v) is None


@pytest.mark.parametrize("empty", [[], {}])
def test_a_value_one_byte_past_the_bound_at_an_empty_container_is_refused(empty):
    v = ["v" * (limits.value_bytes_max - 6), empty]
    assert len(codec.pack(v)) == limits.value_bytes_max + 1
    with pytest.raises(validate.Invalid) as e:
        validate.value_size(v)
    assert e.value.code == "value_too_large"
