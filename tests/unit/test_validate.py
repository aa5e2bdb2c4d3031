"""The data rules (node/core/validate.py) and what reads make of values from before them
(node/http/render.py). The value walk sizes exactly what the encoder writes, accepts exactly the
domain both JSON and msgpack read back, and never recurses; the rules about members, addresses,
vclocks and greetings refuse what once reached an assert or LMDB."""
import json
import math

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from node import limits
from node.core import codec, validate
from node.core.hlc import HLC
from node.http import render

UUID = "0000000a-0000-4000-8000-00000000000b"
scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=6) | st.dictionaries(st.text(max_size=8), c, max_size=6),
                      max_leaves=40)
legacy_scalars = scalars | st.floats() | st.binary(max_size=40) | st.builds(
    msgpack.Timestamp, st.integers(0, 2**34 - 1), st.integers(0, 999_999_999))
legacy_values = st.recursive(legacy_scalars, lambda c: st.lists(c, max_size=6) | st.dictionaries(
    st.text(max_size=8) | st.integers(-5, 5) | st.binary(max_size=3), c, max_size=6), max_leaves=40)


def _nested(depth: int):
    v: list = []
    for _ in range(depth - 1):
        v = [v]
    return v


@settings(max_examples=300, deadline=None)
@given(values)
def test_a_storable_value_is_sized_as_the_encoder_writes_it_and_reads_back_the_same_in_json(v):
    assert validate.value_size(v) == len(codec.pack(v))
    assert json.loads(json.dumps(v, allow_nan=False)) == v
    assert msgpack.unpackb(codec.pack(v), raw=False) == v


@settings(max_examples=300, deadline=None)
@given(legacy_values)
def test_legacy_values_are_sized_too_and_always_render_as_json(v):
    assert validate.value_size(v, legacy=True) == len(codec.pack(v))
    json.loads(render.dumps({"value": v}))          # never raises: the fallback


@pytest.mark.parametrize("value, code", [
    (float("nan"), "bad_value"), ([float("inf")], "bad_value"), ({"x": -math.inf}, "bad_value"),
    (b"\x00", "bad_value"), (msgpack.Timestamp(1, 0), "bad_value"), (msgpack.ExtType(3, b"x"), "bad_value"),
    ({1: 2}, "bad_value"), ({b"k": 1}, "bad_value"), ({None: 1}, "bad_value"), (2**64, "bad_value"),
    (-(2**63) - 1, "bad_value"), ("\ud800", "bad_value"), ({"\udfff": 1}, "bad_value"), ((1, 2), "bad_value"),
    (_nested(limits.value_depth_max + 1), "value_too_deep"), ({"a": _nested(limits.value_depth_max)}, "value_too_deep"),
    ("v" * (limits.value_bytes_max - 4), "value_too_large"), (["v" * 1000] * 1100, "value_too_large"),
])
def test_values_outside_the_domain_are_refused_with_the_rule_they_break(value, code):
    with pytest.raises(validate.Invalid) as e:
        validate.value_size(value)
    assert e.value.code == code


def test_the_bounds_themselves_are_accepted():
    assert validate.value_size(_nested(limits.value_depth_max)) == limits.value_depth_max
    assert validate.value_size("v" * (limits.value_bytes_max - 5)) == limits.value_bytes_max
    assert validate.key_error("k" * limits.key_bytes_max) is None
    assert validate.key_error("k" * (limits.key_bytes_max + 1)) and validate.key_error("")
    assert validate.key_error("é" * (limits.key_bytes_max // 2)) is None and validate.key_error("é" * 256)


def test_a_value_nested_far_past_any_recursion_limit_is_refused_without_recursing():
    deep: list = []
    for _ in range(200_000):
        deep = [deep]
    with pytest.raises(validate.Invalid) as e:
        validate.value_size(deep)
    assert e.value.code == "value_too_deep"
    render.json_safe(deep)                          # the read fallback does not recurse either


@pytest.mark.parametrize("address, ok", [
    ("127.0.0.1:7301", True), ("node-1.example.com:1", True), ("[::1]:65535", True), ("localhost:0", False),
    ("host", False), ("host:70000", False), (":80", False), ("a b:1", False), ("h" * 250 + ":1234", True),
    ("h" * 251 + ":1234", False), ("h\n:1", False), ("hé:1", False), (5, False),
])
def test_an_address_is_a_bounded_host_port(address, ok):
    assert (validate.address_error(address) is None) == ok


@pytest.mark.parametrize("u, ok", [(UUID, True), (UUID.upper(), False), ("u" * 600, False), (UUID + "0", False),
                                   ("0" * 36, False), (None, False)])
def test_a_uuid_is_canonical(u, ok):
    assert validate.is_uuid(u) == ok


@pytest.mark.parametrize("rows, ok", [
    ([[UUID, 1, "", "member", 0, 0]], True),
    ([[UUID, 1, "127.0.0.1:1", "expelled", 5, 9]], True),
    ([[UUID, 0, "", "member"]], False),
    ([[UUID, limits.replica_id_max + 1, "", "member"]], False),
    ([[UUID, 1, "", "boss"]], False),
    ([[UUID, 1, "x" * 300, "member"]], False),
    ([[UUID, 1, "", "member", limits.lsn_max + 1]], False),
    ([[UUID, 1, "", "member"], [UUID, 2, "", "member"]], False),
    ([[UUID, 1, "", "member"], [UUID.replace("a", "c"), 1, "", "member"]], False),
    ([["x", "y"]], False),
    ([[UUID, 1, "", "member"]] * (limits.members_max + 1), False),
])
def test_a_cluster_table_has_one_row_per_uuid_and_per_id_within_bounds(rows, ok):
    assert (validate.cluster_rows_error(rows) is None) == ok


@pytest.mark.parametrize("v, ok", [({1: 5, 0: 3}, True), ({1: limits.lsn_max}, True), ({1: limits.lsn_max + 1}, False),
                                   ({-1: 1}, False), ({"1": 1}, False), ({1: True}, False), ({1: -1}, False)])
def test_a_vclock_on_the_wire_is_bounded(v, ok):
    assert (validate.vclock_error(v) is None) == ok


def test_the_hybrid_clock_cannot_pass_its_bound():
    h = HLC(limits.timestamp_us_max - 1)
    assert h.now(0) == limits.timestamp_us_max
    with pytest.raises(AssertionError):
        h.now(0)
    with pytest.raises(AssertionError):
        HLC(0).observe(limits.timestamp_us_max + 1)
    with pytest.raises(AssertionError):
        HLC(2**64 - 1)


def test_a_remote_timestamp_ahead_by_more_than_the_offset_bound_is_named():
    wall = 1_700_000_000_000_000
    ok = wall + int(limits.hlc_offset_max_s * 1e6)
    assert validate.timestamp_ahead_error(ok, wall) is None
    assert "ahead of this node's clock" in validate.timestamp_ahead_error(ok + 1, wall)


_STORE = {"status": "dirty", "initial": {"cluster_uuid": UUID, "created_s": 1.5, "founders": [UUID]},
          "final": {"vclock_by_uuid": {UUID: 3}, "shutdown_id": UUID}, "proposal": [UUID, 2.0]}


@pytest.mark.parametrize("store, ok", [
    (None, True), ({}, True), (_STORE, True), ({**_STORE, "final": None, "proposal": None}, True),
    ("junk", False), (["dirty"], False), ({"status": 7}, False), ({"initial": "junk"}, False),
    ({"initial": {**_STORE["initial"], "created_s": float("nan")}}, False),
    ({"initial": {**_STORE["initial"], "founders": ["x"]}}, False),
    ({"final": {"vclock_by_uuid": {UUID: limits.lsn_max + 1}, "shutdown_id": UUID}}, False),
    ({"proposal": ["not a uuid", 1.0]}, False), ({"proposal": [UUID]}, False),
])
def test_a_greetings_store_field_is_null_or_of_the_shape_the_join_protocol_reads(store, ok):
    """A junk `store` made a restarting member's start-up (and a joiner, after the donor's
    snapshot) die on an AttributeError (tests/integration/test_malicious_peer.py)."""
    assert (validate.store_field_error(store) is None) == ok


def test_a_real_nodes_greeting_passes_and_optional_fields_of_another_type_are_refused():
    from tests.integration.fakepeer import FakePeer
    g = {**FakePeer(b"s").greeting(), "store": _STORE, "vclock_uuid": {UUID: 1}, "wait_for": 0}
    assert validate.greeting_error(g) is None
    for name, junk in (("options", "x"), ("lease", [1]), ("wait_for", "3"), ("store", 5)):
        assert validate.greeting_error({**g, name: junk}), name


@pytest.mark.parametrize("body, ok", [
    ({"phase": "quiesce", "shutdown_id": UUID}, True),
    ({"phase": "final", "shutdown_id": UUID, "final": {"vclock_by_uuid": {UUID: 4}, "shutdown_id": UUID}}, True),
    ({"phase": "final", "shutdown_id": UUID, "final": None}, True),
    ({"phase": "quiesce", "shutdown_id": "s" * 100_000}, False), ({"phase": "explode", "shutdown_id": UUID}, False),
    ({"phase": "final", "shutdown_id": UUID, "final": {"vclock_by_uuid": {"x": 1}, "shutdown_id": UUID}}, False),
    ({"phase": "final", "shutdown_id": UUID, "final": "junk"}, False),
])
def test_a_shutdown_step_names_a_known_phase_and_a_uuid(body, ok):
    """A member's SHUTDOWN: its id went into this node's status reason whatever its size."""
    from node.core import messages as m
    from node.errors import RemoteProtocolError
    data = m.encode(m.SHUTDOWN, **body)
    if ok:
        assert m.decode(data).body == body
    else:
        with pytest.raises(RemoteProtocolError, match="SHUTDOWN"):
            m.decode(data)
