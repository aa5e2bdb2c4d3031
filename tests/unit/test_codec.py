"""node.core.codec.pack writes exactly what msgpack's Packer(use_bin_type=True) writes for
every storable value: WAL frames and store records written by either read the same
everywhere (the WAL reader, `wal dump`, Spark and the oracle decode with msgpack). Other
extension types than timestamps are refused where outside input is decoded."""

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from node.core import codec
from node.core.rows import Op, Txn

packb = msgpack.Packer(use_bin_type=True).pack

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 64 - 1), st.floats(allow_nan=False),
    st.text(), st.binary(), st.integers(0, 2 ** 34 - 1).map(lambda s: msgpack.Timestamp(s, 0)),
    st.tuples(st.integers(-(2 ** 40), 2 ** 40), st.integers(0, 999_999_999)).map(lambda p: msgpack.Timestamp(*p)))
KEYS = st.one_of(st.text(max_size=8), st.integers(-(2 ** 63), 2 ** 63 - 1), st.binary(max_size=4), st.none())
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=20), st.tuples(inner, inner), st.dictionaries(KEYS, inner, max_size=20)), max_leaves=60)


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_pack_writes_what_msgpack_writes(value):
    assert codec.pack(value) == packb(value)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2 ** 31), st.integers(1, 2 ** 62), st.integers(0, 2), st.integers(0, 2 ** 63),
                          st.lists(st.tuples(st.integers(1, 5), st.text(min_size=1, max_size=8), st.text(max_size=8),
                                             VALUES), min_size=1, max_size=4)), max_size=5),
       st.integers(0, 2 ** 63))
def test_frames_of_named_tuples_pack_as_msgpack_does(txns, written_us):
    rows = [Txn(r, lsn, g, ts, tuple(Op(*o) for o in ops)) for r, lsn, g, ts, ops in txns]
    assert codec.pack([written_us, rows]) == packb([written_us, rows])


@pytest.mark.parametrize("value", [2 ** 64, -(2 ** 63) - 1])
def test_out_of_range_integers_are_refused_as_by_msgpack(value):
    with pytest.raises(OverflowError):
        packb(value)
    with pytest.raises(OverflowError):
        codec.pack(value)


def test_an_unstorable_object_is_refused():
    with pytest.raises(TypeError):
        codec.pack({"k": object()})


def test_extension_types_other_than_timestamps_are_refused_on_decode():
    data = msgpack.packb({"v": [msgpack.ExtType(5, b"ab")]})
    with pytest.raises(codec.ExtTypeRefused, match="extension type 5"):
        msgpack.unpackb(data, ext_hook=codec.refuse_ext)
    ts = msgpack.packb({"v": msgpack.Timestamp(7, 9)})
    assert msgpack.unpackb(ts, ext_hook=codec.refuse_ext) == {"v": msgpack.Timestamp(7, 9)}
