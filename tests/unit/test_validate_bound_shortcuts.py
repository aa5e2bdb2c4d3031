"""The shortcuts of node/core/validate.py's bounds are sure: a key or str value of at most
KEY_CHARS_SAFE / STR_CHARS_SAFE characters is within its byte bound whatever its characters
(UTF-8 takes at most 4 bytes each), and TXN_HEAD_BYTES_MAX covers the largest envelope a
transaction can have, so a client transaction check_txn_bytes accepts always fits in one ROWS
message (the API's bound and the wire's agree). Mutation testing found these unpinned
(docs/testing.md, session 27)."""
from __future__ import annotations

import msgpack

from node import limits
from node.core import validate as v
from node.core.kinds import GROUP_CLUSTER

WIDEST = "\U0001F600"          # four bytes in UTF-8


def test_a_key_of_key_chars_safe_characters_is_within_key_bytes_max_whatever_they_are():
    assert len((WIDEST * v.KEY_CHARS_SAFE).encode()) <= limits.key_bytes_max
    assert v.key_error(WIDEST * v.KEY_CHARS_SAFE) is None


def test_a_str_value_of_str_chars_safe_characters_is_within_value_bytes_max_whatever_they_are():
    widest = WIDEST * v.STR_CHARS_SAFE
    assert len(widest.encode()) <= limits.value_bytes_max
    assert v.decoded_value_ok(widest) and v.value_error(widest) is None
    # a third of the bound in such characters is over it: taken on sight it would pass unchecked
    over = WIDEST * (limits.value_bytes_max // 3)
    assert not v.decoded_value_ok(over) and v.value_error(over) is not None


def test_the_txn_head_bound_covers_the_largest_envelope_so_an_accepted_client_txn_fits_a_rows_message():
    ops = [None] * limits.txn_ops_max                  # one byte each: what is left is the envelope
    envelope = len(msgpack.packb([limits.replica_id_max, limits.lsn_max, GROUP_CLUSTER,
                                  limits.timestamp_us_max, ops])) - len(ops)
    assert envelope <= v.TXN_HEAD_BYTES_MAX
    # the largest ops check_txn_bytes accepts, under the largest envelope, encode within the bound
    v.check_txn_bytes(limits.txn_bytes_max - v.TXN_HEAD_BYTES_MAX)
    assert envelope + limits.txn_bytes_max - v.TXN_HEAD_BYTES_MAX <= limits.txn_bytes_max
