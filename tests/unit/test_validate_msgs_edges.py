"""node/core/validate_msgs.py at each bound: the largest `_cluster` table, vclock, greeting field,
snapshot and snapshot chunk accepted and one past each refused; each optional field null or of
its shape; a `_cluster` tuple of 4, 5 or 6 fields read by its length; and the first bad item of a
list is what is named, whatever follows it."""
import pytest

from node import limits
from node.core import validate_msgs as vm

UUID = "0000000a-0000-4000-8000-00000000000b"
OTHER = "0000000c-0000-4000-8000-00000000000d"


def _uuid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-000000000000"


# --- _cluster rows and tables ------------------------------------------------------------------
@pytest.mark.parametrize("row, ok", [
    ([UUID, 1, ""], False),
    ([UUID, 1, "", "member"], True),
    ([UUID, 1, "", "member", 3], True),
    ([UUID, 1, "", "member", 3, 2], True),
    ([UUID, 1, "", "member", 3, 2, 0], False),
    ((UUID, 1, "", "member"), False),
    ([UUID, 1, "", "member", limits.lsn_max], True),
    ([UUID, 1, "", "member", -1], False),
    ([UUID, 1, "", "member", "3"], False),
    ([UUID, 1, "", "expelled", 3, limits.lsn_max], True),
    ([UUID, 1, "", "expelled", 3, -1], False),
    ([UUID, 1, "", "expelled", 3, None], True),           # an expel that states no bound
    (["x", 1, "", "member"], False),
])
def test_a_cluster_row_has_four_to_six_fields_each_read_by_its_position(row, ok):
    assert (vm.cluster_row_error(row) is None) == ok


def test_a_cluster_row_with_a_bad_state_and_a_bad_lsn_names_the_state():
    err = vm.cluster_row_error([UUID, 1, "", "boss", -1])
    assert "state" in err and "lsn" not in err
    assert vm.cluster_row_error([UUID, 1, "", "member", -1]).startswith("_cluster lsn: ")


def test_a_cluster_table_of_members_max_rows_is_accepted_and_one_more_is_refused():
    rows = [[_uuid(i), i, "", "member"] for i in range(1, limits.members_max + 1)]
    assert vm.cluster_rows_error(rows) is None
    assert "at most" in vm.cluster_rows_error(rows + [[_uuid(0), limits.members_max + 1, "", "member"]])
    assert vm.cluster_rows_error("junk") is not None


def test_a_cluster_table_names_its_first_bad_row_and_its_first_repeat():
    assert "state" in vm.cluster_rows_error([[UUID, 1, "", "member"], [OTHER, 2, "", "boss"], [UUID, 1, "", "x"]])
    assert "twice" in vm.cluster_rows_error([[UUID, 1, "", "member"], [OTHER, 1, "", "member"]])
    assert "twice" in vm.cluster_rows_error([[UUID, 1, "", "member"], [UUID, 2, "", "member"]])


# --- vclocks -------------------------------------------------------------------------------------
def test_a_vclock_of_every_id_and_component_zero_is_accepted_and_one_component_more_is_refused():
    full = {i: 1 for i in range(limits.members_max + 1)}
    assert vm.vclock_error(full) is None
    assert "at most" in vm.vclock_error({**full, limits.members_max + 1: 1})


@pytest.mark.parametrize("v, ok", [({0: 0}, True), ({limits.replica_id_max: 1}, True),
                                   ({limits.replica_id_max + 1: 1}, False), ({True: 1}, False), ([1], False)])
def test_a_vclocks_ids_are_ints_from_zero_to_the_id_bound(v, ok):
    assert (vm.vclock_error(v) is None) == ok


def test_a_vclock_by_uuid_holds_at_most_members_max_components_of_canonical_uuids():
    full = {_uuid(i): i for i in range(limits.members_max)}
    assert vm.vclock_uuid_error(full) is None
    assert "at most" in vm.vclock_uuid_error({**full, _uuid(limits.members_max): 1})
    assert vm.vclock_uuid_error({"x": 1}) is not None
    assert vm.vclock_uuid_error({UUID: -1}) is not None
    assert vm.vclock_uuid_error({UUID: limits.lsn_max}) is None
    assert vm.vclock_uuid_error([UUID]) is not None


# --- a greeting's store field ------------------------------------------------------------------
INITIAL = {"cluster_uuid": UUID, "created_s": 1, "founders": [UUID]}
FINAL = {"vclock_by_uuid": {UUID: 3}, "shutdown_id": UUID}


@pytest.mark.parametrize("store, ok", [
    ({"status": None}, True),
    ({"status": "s" * limits.greeting_field_chars_max}, True),
    ({"status": "s" * (limits.greeting_field_chars_max + 1)}, False),
    ({"initial": INITIAL}, True),
    ({"initial": {**INITIAL, "created_s": 1.5}}, True),
    ({"initial": {**INITIAL, "created_s": float("inf")}}, False),
    ({"initial": {**INITIAL, "created_s": "1"}}, False),
    ({"initial": {**INITIAL, "created_s": True}}, False),
    ({"initial": {**INITIAL, "cluster_uuid": "x"}}, False),
    ({"initial": {**INITIAL, "founders": UUID}}, False),
    ({"initial": {**INITIAL, "founders": [_uuid(i) for i in range(limits.members_max)]}}, True),
    ({"initial": {**INITIAL, "founders": [_uuid(i) for i in range(limits.members_max + 1)]}}, False),
    ({"initial": [INITIAL]}, False),
    ({"final": FINAL}, True),
    ({"final": {**FINAL, "shutdown_id": "x"}}, False),
    ({"final": {**FINAL, "vclock_by_uuid": None}}, False),
    ({"final": [FINAL]}, False),
    ({"proposal": [UUID, 2]}, True),
    ({"proposal": [UUID, 2.5]}, True),
    ({"proposal": [UUID, 2, 3]}, False),
    ({"proposal": [UUID, "2"]}, False),
    ({"proposal": (UUID, 2)}, False),
])
def test_each_part_of_a_greetings_store_field_is_null_or_of_its_shape(store, ok):
    assert (vm.store_field_error(store) is None) == ok


# --- a greeting ------------------------------------------------------------------------------------
def _greeting(**kw) -> dict:
    g = {"uuid": UUID, "cluster_uuid": OTHER, "cluster_name": "c", "options_digest": "d", "anon": False,
         "address": "127.0.0.1:7301", "cluster": [[UUID, 1, "127.0.0.1:7301", "member"]], "status": "running"}
    g.update(kw)
    return g


@pytest.mark.parametrize("field, value, ok", [
    ("uuid", "x", False), ("cluster_uuid", None, True), ("cluster_uuid", "x", False),
    ("cluster_name", "", False), ("cluster_name", "c" * limits.cluster_name_chars_max, True),
    ("cluster_name", "c" * (limits.cluster_name_chars_max + 1), False),
    ("options_digest", "d" * limits.greeting_field_chars_max, True),
    ("options_digest", "d" * (limits.greeting_field_chars_max + 1), False),
    ("status", "s" * limits.greeting_field_chars_max, True),
    ("status", "s" * (limits.greeting_field_chars_max + 1), False),
    ("address", "nowhere", False), ("cluster", [["x"]], False),
    ("vclock_uuid", None, True), ("vclock_uuid", {UUID: 2}, True), ("vclock_uuid", {UUID: -2}, False),
    ("options", None, True), ("options", {}, True), ("options", [], False),
    ("lease", {"a": 1}, True), ("lease", "x", False),
    ("wait_for", 3, True), ("wait_for", 3.0, False), ("wait_for", True, False),
    ("store", {"status": "x"}, True), ("store", {"status": 1}, False),
])
def test_each_field_of_a_greeting_is_checked_by_its_rule(field, value, ok):
    assert vm.greeting_error(_greeting()) is None
    assert (vm.greeting_error(_greeting(**{field: value})) is None) == ok


def test_a_greeting_names_its_first_bad_field():
    assert vm.greeting_error(_greeting(options=[], lease="x")) == "options is dict or null"
    assert vm.greeting_error(_greeting(wait_for="x")) == "wait_for is int or null"
    assert vm.greeting_error(_greeting(address="x", vclock_uuid={"y": 1})).startswith("expected host:port")
    assert "vclock" in vm.greeting_error(_greeting(vclock_uuid={"y": 1}, options=[]))
    assert vm.greeting_error(_greeting(options=[], store=5)) == "options is dict or null"


# --- shutdown ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("phase", ["quiesce", "final", "resume"])
def test_each_shutdown_phase_is_a_known_one(phase):
    assert vm.shutdown_error({"phase": phase, "shutdown_id": UUID}) is None


@pytest.mark.parametrize("final", [{"vclock_by_uuid": {UUID: 1}, "shutdown_id": OTHER},
                                   {"vclock_by_uuid": {UUID: -1}, "shutdown_id": UUID},
                                   {"shutdown_id": UUID}])
def test_a_shutdowns_final_step_is_of_this_shutdown_with_a_bounded_vclock(final):
    assert vm.shutdown_error({"phase": "final", "shutdown_id": UUID, "final": final}) is not None
    assert vm.shutdown_error({"phase": "final", "shutdown_id": UUID,
                              "final": {"vclock_by_uuid": {}, "shutdown_id": UUID}}) is None


# --- snapshots ---------------------------------------------------------------------------------------
DEF = {"local": False, "conflict": "lww"}


def _snapshot(**kw) -> dict:
    b = {"vclock": {1: 3}, "cluster": [[UUID, 1, "", "member"]], "spaces": {"kv": DEF}}
    b.update(kw)
    return b


def test_a_snapshot_of_store_spaces_max_spaces_is_accepted_and_one_more_is_refused():
    spaces = {f"s{i}": DEF for i in range(limits.store_spaces_max)}
    assert vm.snapshot_error(_snapshot(spaces=spaces)) is None
    assert "at most" in vm.snapshot_error(_snapshot(spaces={**spaces, "one_more": DEF}))


@pytest.mark.parametrize("kw", [{"vclock": {-1: 1}}, {"cluster": [["x"]]}, {"spaces": {"9bad": DEF}},
                                {"spaces": {"kv": {"local": 1}}}, {"spaces": {"kv": DEF, "bad name": DEF}}])
def test_a_snapshot_with_a_bad_vclock_table_or_space_is_refused(kw):
    assert vm.snapshot_error(_snapshot()) is None
    assert vm.snapshot_error(_snapshot(**kw)) is not None


def test_a_snapshot_names_its_first_bad_space_whatever_follows():
    assert vm.snapshot_error(_snapshot(spaces={"bad name": DEF, "kv": DEF})) is not None
    too_many = {f"s{i}": DEF for i in range(limits.store_spaces_max + 1)}
    assert vm.snapshot_error(_snapshot(vclock={-1: 1}, spaces=too_many)).startswith("vclock component")


REC = [{"a": 1}, 2, 3, 4, False]


@pytest.mark.parametrize("item, ok", [
    (["k", REC], True),
    (["k", [b"legacy", 0, 0, 0, True]], True),
    (["k", [None, limits.replica_id_max, limits.lsn_max, limits.timestamp_us_max, False]], True),
    (("k", REC), False), (["k"], False), (["k", REC, 1], False), (["k", tuple(REC)], False),
    (["k", REC[:4]], False), (["k", REC + [0]], False),
    (["", REC], False), (["k", [{1.5: {1, 2}}, 2, 3, 4, False]], False),
    (["k", [1, 2, -1, 4, False]], False), (["k", [1, 2, limits.lsn_max + 1, 4, False]], False),
    (["k", [1, -1, 3, 4, False]], False), (["k", [1, limits.replica_id_max + 1, 3, 4, False]], False),
    (["k", [1, "2", 3, 4, False]], False),
    (["k", [1, 2, 3, -1, False]], False), (["k", [1, 2, 3, limits.timestamp_us_max + 1, False]], False),
    (["k", [1, 2, 3, 4.0, False]], False), (["k", [1, 2, 3, 4, 0]], False),
])
def test_a_snapshot_row_is_a_key_and_a_record_within_bounds(item, ok):
    assert (vm.snapshot_rows_error({"space": "kv", "rows": [item]}) is None) == ok
    if not ok:     # a bad row is named whatever follows it
        assert vm.snapshot_rows_error({"space": "kv", "rows": [item, ["k", REC]]}) is not None


def test_a_snapshot_chunk_holds_at_most_its_bound_of_rows_of_a_named_space():
    rows = [["k", REC]] * limits.snapshot_chunk_rows_max
    assert vm.snapshot_rows_error({"space": "kv", "rows": rows}) is None
    assert "at most" in vm.snapshot_rows_error({"space": "kv", "rows": rows + [["k", REC]]})
    assert vm.snapshot_rows_error({"space": "bad name", "rows": []}) is not None
    assert vm.snapshot_rows_error({"space": "bad name", "rows": [["", REC]] * 2}) is not None
