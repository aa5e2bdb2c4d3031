"""node/core/validate.py's rules other than the value walk, each at its edge: the largest accepted
and one past it, each kind of row by its own rule, the error code a client gets, and the
sure-without-walking checks the fast paths take values by (decoded_flat_ok, decoded_value_ok)."""
import pytest

from node import limits
from node.core import validate as v
from node.core.kinds import CLUSTER_SPACE, GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_CLUSTER, OP_DELETE, OP_NOP, \
    OP_PUT, OP_SPACE

UUID = "0000000a-0000-4000-8000-00000000000b"
DEF = {"local": False, "conflict": "lww"}


@pytest.mark.parametrize("check, bad, code", [
    (v.check_uuid, "x", "bad_uuid"), (v.check_address, "x", "bad_address"), (v.check_key, "", "bad_key"),
    (v.check_space_name, "1x", "bad_space_name"),
])
def test_each_check_raises_the_code_of_its_rule_and_returns_what_it_accepts(check, bad, code):
    with pytest.raises(v.Invalid) as e:
        check(bad)
    assert e.value.code == code and e.value.message == str(e.value)
    good = {v.check_uuid: UUID, v.check_address: "h:1", v.check_key: "k", v.check_space_name: "s"}[check]
    assert check(good) == good


def test_a_uuid_names_what_it_is_for_when_refused():
    with pytest.raises(v.Invalid, match="member uuid is not a canonical uuid"):
        v.check_uuid(5, "member uuid")


@pytest.mark.parametrize("port, ok", [(1, True), (65535, True), (0, False), (65536, False), (99999, False)])
def test_a_port_is_1_to_65535(port, ok):
    assert (v.address_error(f"h:{port}") is None) == ok


def test_an_address_of_exactly_the_byte_bound_is_accepted():
    a = "h" * (limits.address_bytes_max - 6) + ":65535"
    assert len(a) == limits.address_bytes_max and v.address_error(a) is None
    assert "at most" in v.address_error("h" + a)


@pytest.mark.parametrize("key, ok", [
    ("k", True), ("", False), (5, False), (b"k", False),
    ("k" * limits.key_bytes_max, True), ("k" * (limits.key_bytes_max + 1), False),
    ("é" * v.KEY_CHARS_SAFE, True), ("é" * (limits.key_bytes_max // 2), True),
    ("é" * (limits.key_bytes_max // 2) + "kk", False), ("\ud800", False), ("k" * v.KEY_CHARS_SAFE + "\ud800", False),
])
def test_a_key_is_1_to_key_bytes_max_bytes_of_utf8(key, ok):
    assert (v.key_error(key) is None) == ok


def test_a_key_too_long_says_how_long_it_is():
    assert "(this one is 512)" in v.key_error("k" * 512)
    assert v.key_error("\ud800") == "keys are valid UTF-8"


@pytest.mark.parametrize("name, ok", [
    ("s", True), ("_", True), ("S_9", True), ("9s", False), ("", False), ("s-1", False), ("s\n", False),
    ("s" * limits.space_name_chars_max, True), ("s" * (limits.space_name_chars_max + 1), False), (5, False),
])
def test_a_space_name_is_an_identifier_of_at_most_space_name_chars_max(name, ok):
    assert (v.space_name_error(name) is None) == ok


@pytest.mark.parametrize("d, ok", [
    ({}, True), (DEF, True), ({"local": True}, True), ({"conflict": "lww"}, True),
    ({"local": 1}, False), ({"conflict": "nope"}, False), ({"conflict": 1}, False),
    ({**DEF, "extra": 1}, False), ([DEF], False), (None, False),
])
def test_a_space_definition_names_only_local_and_a_known_resolver(d, ok):
    assert (v.space_def_error(d) is None) == ok


@pytest.mark.parametrize("lsn, ok", [(0, True), (limits.lsn_max, True), (-1, False), (limits.lsn_max + 1, False),
                                     (True, False), (1.0, False)])
def test_an_lsn_is_an_int_from_0_to_lsn_max(lsn, ok):
    assert (v.lsn_error(lsn) is None) == ok
    assert v.lsn_error("x", "expelled_lsn").startswith("expelled_lsn is")


@pytest.mark.parametrize("val, ok", [
    ({"id": 1, "state": "member"}, True),
    ({"id": limits.replica_id_max, "address": "h:1", "state": "expelled", "expelled_lsn": 4}, True),
    ({"id": 1, "address": None, "state": "member"}, True), ({"id": 1, "address": "", "state": "member"}, True),
    ({"id": 1, "address": "nowhere", "state": "member"}, False),
    ({"state": "member"}, False), ({"id": 1}, False), ({"id": 1, "state": "member", "x": 1}, False),
    ({"id": 0, "state": "member"}, False), ({"id": limits.replica_id_max + 1, "state": "member"}, False),
    ({"id": "1", "state": "member"}, False), ({"id": 1, "state": "boss"}, False),
    ({"id": 1, "state": "expelled", "expelled_lsn": -1}, False),
    ({"id": 1, "state": "expelled", "expelled_lsn": None}, True), ([1], False),
])
def test_a_cluster_rows_value_is_an_id_a_state_and_optionally_an_address_and_expel_bound(val, ok):
    assert (v.cluster_value_error(val) is None) == ok


def test_a_cluster_rows_bad_address_and_bound_are_named():
    assert v.cluster_value_error({"id": 1, "address": "x", "state": "member"}).startswith("_cluster address: ")
    assert v.cluster_value_error({"id": 1, "state": "expelled", "expelled_lsn": -1}).startswith(
        "_cluster expelled_lsn: ")


# --- the sure checks the fast paths take values by ---------------------------------------------
ITEMS, KEYC, STRC = limits.value_sure_items_max, limits.value_sure_key_chars_max, limits.value_sure_str_chars_max


@pytest.mark.parametrize("val, ok", [
    ([1] * ITEMS, True), ([1] * (ITEMS + 1), False),
    ({"k" * KEYC: 1}, True), ({"k" * (KEYC + 1): 1}, False), ({1: 1}, False),
    (["s" * STRC], True), (["s" * (STRC + 1)], False), ({"k": "s" * (STRC + 1)}, False),
    ([1.5], True), ([float("inf")], False), ([float("nan")], False), ([b"x"], False), ([[1]], False),
    ([None, True, "x", 1], True),
])
def test_a_flat_value_is_sure_only_within_each_of_its_bounds(val, ok):
    assert v.decoded_flat_ok(val) == ok
    if ok:
        v.value_size(val)            # sure means the rule accepts it


@pytest.mark.parametrize("val, ok", [
    ("s" * v.STR_CHARS_SAFE, True), ("s" * (v.STR_CHARS_SAFE + 1), False), (1, True), (True, True), (None, True),
    (1.5, True), (float("inf"), False), ({"a": 1}, True), ([1] * (ITEMS + 1), False), (b"x", False), ((1,), False),
])
def test_a_decoded_value_is_sure_only_if_a_short_scalar_or_flat(val, ok):
    assert v.decoded_value_ok(val) == ok


# --- rows and transactions -------------------------------------------------------------------------
@pytest.mark.parametrize("op, ok", [
    ((OP_PUT, "s", "k", 1), True), ((OP_PUT, "s", "k", None), True), ((OP_PUT, "s", "k", b"x"), False),
    ((OP_PUT, "9", "k", 1), False), ((OP_PUT, "s", "", 1), False),
    ((OP_DELETE, "s", "k", None), True), ((OP_DELETE, "s", "k", 1), False), ((OP_DELETE, "s", "", None), False),
    ((OP_CLUSTER, CLUSTER_SPACE, UUID, {"id": 1, "state": "member"}), True),
    ((OP_CLUSTER, "s", UUID, {"id": 1, "state": "member"}), False),
    ((OP_CLUSTER, CLUSTER_SPACE, "k", {"id": 1, "state": "member"}), False),
    ((OP_CLUSTER, CLUSTER_SPACE, UUID, {"id": 0, "state": "member"}), False),
    ((OP_SPACE, "s", "", DEF), True), ((OP_SPACE, "s", "k", DEF), False), ((OP_SPACE, "9", "", DEF), False),
    ((OP_SPACE, "s", "", {"conflict": "x"}), False),
    ((OP_NOP, "s", "", None), True), ((OP_NOP, "s", "k", None), True), ((OP_NOP, "s", 5, None), False),
    ((OP_NOP, "9", "", None), False), ((OP_NOP, "s", "", 1), False),
    ((0, "s", "k", 1), False), ((6, "s", "k", 1), False), ((True, "s", "k", 1), False), (("1", "s", "k", 1), False),
])
def test_each_kind_of_row_is_held_to_its_own_rule(op, ok):
    assert (v.op_error(*op) is None) == ok


def test_a_legacy_value_is_a_puts_only_with_legacy():
    assert v.op_error(OP_PUT, "s", "k", b"x", legacy=True) is None
    assert v.op_error(OP_PUT, "s", "k", b"x") is not None


OPS1 = [(OP_PUT, "s", "k", 1)]


@pytest.mark.parametrize("env, ok", [
    ((0, 1, GROUP_DEFAULT, 0, OPS1), True),
    ((limits.replica_id_max, limits.lsn_max, GROUP_LOCAL, limits.timestamp_us_max, OPS1), True),
    ((1, limits.lsn_max - 1, GROUP_DEFAULT, 0, OPS1 * 2), True),
    ((1, limits.lsn_max, GROUP_DEFAULT, 0, OPS1 * 2), False),
    ((-1, 1, GROUP_DEFAULT, 0, OPS1), False), ((limits.replica_id_max + 1, 1, GROUP_DEFAULT, 0, OPS1), False),
    ((1, 0, GROUP_DEFAULT, 0, OPS1), False), ((1, 1, GROUP_DEFAULT, -1, OPS1), False),
    ((1, 1, GROUP_DEFAULT, limits.timestamp_us_max + 1, OPS1), False),
    ((1, 1, 3, 0, OPS1), False), ((1, 1, "0", 0, OPS1), False), ((1, 1, GROUP_CLUSTER, 0, OPS1), True),
    ((1, 1, GROUP_DEFAULT, 0, []), False), ((1, 1, GROUP_DEFAULT, 0, tuple(OPS1)), True),
    ((1, 1, GROUP_DEFAULT, 0, OPS1 * limits.txn_ops_max), True),
    ((1, 1, GROUP_DEFAULT, 0, OPS1 * (limits.txn_ops_max + 1)), False),
    ((1, 1, GROUP_DEFAULT, 0, "ops"), False), (("1", 1, GROUP_DEFAULT, 0, OPS1), False),
    ((1, "1", GROUP_DEFAULT, 0, OPS1), False), ((1, 1, GROUP_DEFAULT, "0", OPS1), False),
])
def test_a_txn_envelope_is_held_to_each_bound(env, ok):
    assert (v.txn_envelope_error(*env) is None) == ok


def test_a_txn_envelope_error_names_the_row():
    assert v.txn_envelope_error(3, 9, GROUP_DEFAULT, -1, OPS1).startswith("row 3:9: timestamps")
    assert v.txn_envelope_error(3, 9, 7, 0, OPS1).startswith("row 3:9: group 7")


@pytest.mark.parametrize("group, kinds, ok", [
    (GROUP_CLUSTER, [OP_CLUSTER], True), (GROUP_CLUSTER, [OP_CLUSTER, OP_CLUSTER], True),
    (GROUP_CLUSTER, [OP_CLUSTER, OP_PUT], False), (GROUP_CLUSTER, [OP_PUT], False),
    (GROUP_DEFAULT, [OP_PUT, OP_CLUSTER], False), (GROUP_DEFAULT, [OP_CLUSTER], False),
    (GROUP_LOCAL, [OP_CLUSTER], False), (GROUP_DEFAULT, [OP_PUT, OP_SPACE, OP_NOP], True),
])
def test_cluster_rows_travel_alone_in_group_cluster(group, kinds, ok):
    assert (v.txn_group_error(group, kinds) is None) == ok


def test_a_txn_of_exactly_txn_bytes_max_fits_and_one_byte_more_does_not():
    assert v.txn_bytes_error(limits.txn_bytes_max) is None
    assert str(limits.txn_bytes_max + 1) in v.txn_bytes_error(limits.txn_bytes_max + 1)


def test_a_clients_txn_is_refused_before_encoding_when_its_ops_and_head_pass_the_bound():
    v.check_txn_bytes(limits.txn_bytes_max - v.TXN_HEAD_BYTES_MAX)
    with pytest.raises(v.Invalid) as e:
        v.check_txn_bytes(limits.txn_bytes_max - v.TXN_HEAD_BYTES_MAX + 1)
    assert e.value.code == "txn_too_large" and f"about {limits.txn_bytes_max + 1})" in e.value.message


def test_the_txn_head_bound_covers_the_largest_envelope():
    from node.core import codec
    head = codec.pack([limits.replica_id_max, limits.lsn_max, GROUP_CLUSTER, limits.timestamp_us_max,
                       [None] * limits.txn_ops_max])
    assert len(head) - limits.txn_ops_max <= v.TXN_HEAD_BYTES_MAX


def test_a_remote_timestamp_behind_the_clock_is_never_refused():
    assert v.timestamp_ahead_error(0, 1 << 50) is None
    assert v.timestamp_ahead_error(int(limits.hlc_offset_max_s * 1e6) + 1, 0) is not None
