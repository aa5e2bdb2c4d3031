"""node/core/validate.py's value walk sizes every value exactly as the encoder writes it, at every
edge where msgpack's encoding of an int, a string, a container head, a legacy bin or timestamp
grows by a byte; and the value bounds (depth, bytes) hold at their edge. The property test in
test_validate.py draws values at random; these are the edges it may not draw."""
import msgpack
import pytest

from node import limits
from node.core import codec, validate

INT_EDGES = [0, 1, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, 0xffffffff, 0x100000000, (1 << 64) - 1,
             -1, -32, -33, -0x80, -0x81, -0x8000, -0x8001, -0x80000000, -0x80000001, -(1 << 63)]
STR_EDGES = [0, 1, 31, 32, 255, 256, 65535, 65536]
HEAD_EDGES = [0, 15, 16, 65535, 65536]


@pytest.mark.parametrize("n", INT_EDGES)
def test_an_integer_at_each_encoding_edge_is_sized_as_the_encoder_writes_it(n):
    assert validate.value_size(n) == len(codec.pack(n))
    assert validate.value_size({"k": n}) == len(codec.pack({"k": n}))


@pytest.mark.parametrize("n", [1 << 64, -(1 << 63) - 1])
def test_an_integer_one_past_int64_or_uint64_is_refused_as_a_bad_value(n):
    with pytest.raises(validate.Invalid) as e:
        validate.value_size(n)
    assert e.value.code == "bad_value"
    with pytest.raises(validate.Invalid):
        validate.value_size(n, legacy=True)


@pytest.mark.parametrize("n", STR_EDGES)
def test_a_string_at_each_length_edge_is_sized_as_the_encoder_writes_it(n):
    s = "s" * n
    assert validate.value_size(s) == len(codec.pack(s))
    assert validate.value_size({s: 1}) == len(codec.pack({s: 1}))     # as a map key too


def test_a_non_ascii_string_is_sized_by_its_utf8_bytes():
    s = "é" * 20                       # 20 characters, 40 bytes: past fixstr by bytes, not by characters
    assert validate.value_size(s) == len(codec.pack(s)) == 42
    assert validate.value_size({s: s}) == len(codec.pack({s: s}))


@pytest.mark.parametrize("n", HEAD_EDGES)
def test_an_array_and_a_map_at_each_head_edge_are_sized_as_the_encoder_writes_them(n):
    arr = [None] * n
    assert validate.value_size(arr) == len(codec.pack(arr))
    m = {str(i): None for i in range(n)}
    assert validate.value_size(m) == len(codec.pack(m))


@pytest.mark.parametrize("n", [0, 1, 255, 256, 65535, 65536])
def test_legacy_bytes_at_each_length_edge_are_sized_as_the_encoder_writes_them(n):
    b = b"b" * n
    assert validate.value_size(b, legacy=True) == len(codec.pack(b))
    assert validate.value_size({b: 1}, legacy=True) == len(codec.pack({b: 1}))


@pytest.mark.parametrize("ts", [msgpack.Timestamp(1, 0), msgpack.Timestamp(1, 5), msgpack.Timestamp(1 << 34, 5)])
def test_a_legacy_timestamp_of_each_width_is_sized_as_the_encoder_writes_it(ts):
    assert len(ts.to_bytes()) in (4, 8, 12)
    assert validate.value_size(ts, legacy=True) == len(codec.pack(ts))
    assert validate.value_size({ts: 1}, legacy=True) == len(codec.pack({ts: 1}))


@pytest.mark.parametrize("v", [float("inf"), float("nan"), 1.5])
def test_a_legacy_float_of_any_kind_is_nine_bytes(v):
    assert validate.value_size(v, legacy=True) == 9 == len(codec.pack(v))
    assert validate.value_size([v], legacy=True) == 10


@pytest.mark.parametrize("k", [-33, 0, 1 << 40, True, None])
def test_a_legacy_map_key_that_is_an_int_a_bool_or_nil_is_sized_as_the_encoder_writes_it(k):
    assert validate.value_size({k: 1}, legacy=True) == len(codec.pack({k: 1}))
    with pytest.raises(validate.Invalid):
        validate.value_size({k: 1})


def test_a_legacy_float_map_key_is_sized_and_a_key_of_no_storable_kind_is_refused():
    assert validate.value_size({1.5: 1}, legacy=True) == len(codec.pack({1.5: 1}))
    with pytest.raises(validate.Invalid) as e:
        validate.value_size({(1, 2): 1}, legacy=True)
    assert e.value.code == "bad_value" and "map keys are strings" in e.value.message


def test_a_lone_surrogate_in_a_map_key_is_a_bad_value():
    with pytest.raises(validate.Invalid) as e:
        validate.value_size({"\ud800": 1})
    assert e.value.code == "bad_value" and "UTF-8" in e.value.message


def test_a_value_that_is_no_storable_kind_names_what_it_is():
    for v, what in ((b"x", "binary data"), (msgpack.Timestamp(1, 0), "msgpack extension types"),
                    (msgpack.ExtType(1, b"x"), "msgpack extension types"), ({1, 2}, "set values")):
        with pytest.raises(validate.Invalid) as e:
            validate.value_size(v)
        assert e.value.message.startswith(what), (v, e.value.message)
    with pytest.raises(validate.Invalid):
        validate.value_size(msgpack.ExtType(1, b"x"), legacy=True)     # not even a legacy value


def test_values_after_a_nested_container_are_still_counted():
    v = [[1, 2], "x" * 40, {"a": [3]}, 4]
    assert validate.value_size(v) == len(codec.pack(v))


def test_the_value_byte_bound_is_exact_at_every_depth():
    fill = limits.value_bytes_max - len(codec.pack(["", ""])) - 4           # a str8..32 head is 5 bytes
    at = ["", "v" * fill]
    assert validate.value_size(at) == len(codec.pack(at)) == limits.value_bytes_max
    with pytest.raises(validate.Invalid) as e:
        validate.value_size(["", "v" * (fill + 1)])
    assert e.value.code == "value_too_large"
    over = [["v" * fill], "w"]                # the bound is passed only by a later item, one level up
    with pytest.raises(validate.Invalid) as e:
        validate.value_size(over)
    assert e.value.code == "value_too_large"


def test_a_value_too_large_stops_the_walk_before_a_bad_item_after_it():
    v = ["v" * limits.value_bytes_max, b"x"]
    with pytest.raises(validate.Invalid) as e:
        validate.value_size(v)
    assert e.value.code == "value_too_large"


def test_value_error_and_check_value_answer_as_value_size():
    assert validate.value_error([1]) is None and validate.check_value([1]) == [1]
    assert validate.value_error(b"x", legacy=True) is None
    assert validate.check_value(b"x", legacy=True) == b"x"
    assert "binary data" in validate.value_error(b"x")
    with pytest.raises(validate.Invalid):
        validate.check_value(b"x")


def test_the_depth_bound_counts_maps_and_arrays_alike():
    v: dict = {}
    for _ in range(limits.value_depth_max - 1):
        v = {"a": v}
    assert validate.value_size(v) == len(codec.pack(v))
    with pytest.raises(validate.Invalid) as e:
        validate.value_size({"a": v})
    assert e.value.code == "value_too_deep"
