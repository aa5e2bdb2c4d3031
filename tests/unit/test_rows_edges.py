"""node/core/rows.py at its edges: what a Txn answers (its last lsn, the vclock component it
advances, its wire form), what the exact decoder refuses and how it names the row, what the fast
frame decoder leaves to the exact path at each bound it checks (check_fast), and the vclock-only
stand-in recovery applies for a txn --force-recovery skips (nop_of)."""
import msgpack
import pytest

from node import limits
from node.core import codec, validate
from node.core.rows import (CLUSTER_SPACE, GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_CLUSTER, OP_DELETE, OP_NOP,
                            OP_PUT, OP_SPACE, Op, Txn, check_fast, exact_frame, frame_txns_upto, nop_of,
                            op_from_wire, txn_from_wire, unpack_frame_txns, Unusual)
from node.errors import RemoteProtocolError

UUID = "0000000a-0000-4000-8000-00000000000b"
SPACE_DEF = {"local": False, "conflict": "lww"}


def _put(key="k", value="v"):
    return [OP_PUT, "s", key, value]


def test_a_txn_answers_its_last_lsn_and_the_component_it_advances():
    t = Txn(3, 10, GROUP_DEFAULT, 5, (Op(OP_PUT, "s", "a", 1), Op(OP_PUT, "s", "b", 2), Op(OP_NOP, "s", "")))
    assert t.last_lsn == 12 and t.component == 3
    assert t._replace(group=GROUP_LOCAL).component == 0
    assert t._replace(group=GROUP_CLUSTER).component == 3


def test_a_txn_under_another_id_keeps_every_other_field():
    t = Txn(3, 10, GROUP_LOCAL, 5, (Op(OP_PUT, "s", "a", 1),))
    u = t.with_replica_id(7)
    assert type(u) is Txn and u == Txn(7, 10, GROUP_LOCAL, 5, t.ops)


def test_the_wire_form_of_a_txn_and_an_op_reads_back_as_them():
    t = Txn(3, 10, GROUP_DEFAULT, 5, (Op(OP_PUT, "s", "a", [1]), Op(OP_DELETE, "s", "b")))
    assert t.to_wire() == [3, 10, GROUP_DEFAULT, 5, [[OP_PUT, "s", "a", [1]], [OP_DELETE, "s", "b", None]]]
    assert Op(OP_PUT, "s", "a", 1).to_wire() == [OP_PUT, "s", "a", 1]
    assert txn_from_wire(t.to_wire()) == t
    assert txn_from_wire(tuple(t.to_wire())) == t


@pytest.mark.parametrize("raw, says", [
    ([OP_PUT, "s", "k"], "op is not a 4-element list"),
    ("junk", "op is not a 4-element list"),
    ([OP_PUT, "s", "", "v"], "keys are 1.."),
    ([OP_DELETE, "s", "k", "v"], "a delete carries no value"),
])
def test_an_op_the_rules_refuse_is_a_malformed_row_naming_why(raw, says):
    with pytest.raises(RemoteProtocolError, match="malformed row: " + says):
        op_from_wire(raw)


def test_an_op_of_a_tuple_is_read_as_a_list_is():
    assert op_from_wire((OP_PUT, "s", "k", "v")) == Op(OP_PUT, "s", "k", "v")


def test_a_legacy_value_is_read_only_from_this_nodes_own_wal():
    raw = [1, 1, GROUP_DEFAULT, 5, [_put(value=b"bin")]]
    with pytest.raises(RemoteProtocolError, match="binary data"):
        txn_from_wire(raw)
    assert txn_from_wire(raw, legacy=True).ops[0].value == b"bin"
    payload = codec.pack([1, [raw]])
    assert unpack_frame_txns(payload, legacy=True)[1][0].ops[0].value == b"bin"
    with pytest.raises(RemoteProtocolError):
        unpack_frame_txns(payload)


@pytest.mark.parametrize("raw, says", [
    ([1, 1, GROUP_DEFAULT, 5], "txn is not a 5-element list"),
    ({"a": 1}, "txn is not a 5-element list"),
    ([1, 0, GROUP_DEFAULT, 5, [_put()]], "lsns are 1.."),
    ([1, 4, GROUP_DEFAULT, 5, [_put(), [OP_PUT, "s", "", 1]]], r"keys are 1.*\(row 1:4\)"),
    ([1, 4, GROUP_DEFAULT, 5, [[OP_CLUSTER, CLUSTER_SPACE, UUID, {"id": 1, "state": "member"}]]],
     "row 1:4: _cluster rows travel alone, in group cluster"),
    ([1, 4, GROUP_CLUSTER, 5, [_put()]], "row 1:4: _cluster rows travel alone"),
])
def test_a_txn_the_rules_refuse_is_a_malformed_row_naming_the_row(raw, says):
    with pytest.raises(RemoteProtocolError, match="malformed row: .*" + says):
        txn_from_wire(raw)


def test_a_cluster_txn_and_a_space_txn_are_read_exactly():
    c = [1, 4, GROUP_CLUSTER, 5, [[OP_CLUSTER, CLUSTER_SPACE, UUID, {"id": 1, "state": "member"}]]]
    assert txn_from_wire(c).ops[0].kind == OP_CLUSTER
    s = [1, 5, GROUP_DEFAULT, 5, [[OP_SPACE, "s", "", SPACE_DEF]]]
    payload = codec.pack([9, [c, s]])
    assert frame_txns_upto(payload) == (9, [txn_from_wire(c), txn_from_wire(s)], None)


# --- check_fast: what the fast decoder leaves to the exact path ----------------------------
def _fast(ops, lsn=1) -> list[Txn]:
    return [Txn(1, lsn, GROUP_DEFAULT, 5, tuple(Op(*o) for o in ops))]


@pytest.mark.parametrize("ops, lsn", [
    ([_put()], limits.lsn_max),
    ([_put("a"), _put("b")], limits.lsn_max - 1),
    ([_put(value="v" * validate.STR_CHARS_SAFE)], 1),
    ([_put(value={"a": 1})], 1),
    ([_put(value=[1, "x"])], 1),
    ([_put(value=None)], 1),
    ([_put(value=1.5)], 1),
    ([[OP_DELETE, "s", "k", None]], 1),
    ([[OP_NOP, "s", "", None]], 1),
    ([[OP_NOP, "s", "k", None]], 1),
])
def test_check_fast_takes_what_the_rules_accept_without_walking(ops, lsn):
    check_fast(_fast(ops, lsn))


@pytest.mark.parametrize("ops, lsn", [
    ([_put("a"), _put("b")], limits.lsn_max),                  # the last lsn past lsn_max
    ([_put("")], 1),                                            # a put's empty key
    ([_put(value=b"x")], 1),                                    # a value outside the rule
    ([_put(value=[b"x"] * (limits.value_sure_items_max + 1))], 1),
    ([_put(value="v" * limits.value_bytes_max)], 1),           # a str too long to be sure, then too large
    ([[OP_DELETE, "s", "k", "v"]], 1),                          # a delete's value
    ([[OP_DELETE, "s", "", None]], 1),                          # a delete's empty key
    ([[OP_NOP, "s", "", 1]], 1),                                # a nop's value
])
def test_check_fast_leaves_to_the_exact_path_what_it_cannot_be_sure_of(ops, lsn):
    with pytest.raises(Unusual):
        check_fast(_fast(ops, lsn))


def test_check_fast_walks_a_value_it_cannot_take_on_sight_and_takes_it_if_the_rules_do():
    deep = [[[1]]] * (limits.value_sure_items_max + 1)          # not flat, not small: walked, and fine
    check_fast(_fast([_put(value=deep)]))
    check_fast(_fast([_put(value="é" * (limits.value_bytes_max // 4 + 1))]))


def test_check_fast_checks_every_txn_and_every_op():
    good = _fast([_put()])[0]
    with pytest.raises(Unusual):
        check_fast([good, _fast([_put(), _put("")])[0]])


def test_the_fast_frame_decoder_and_the_exact_path_read_a_plain_frame_alike():
    raws = [[1, 1, GROUP_DEFAULT, 5, [_put()]], [2, 3, GROUP_LOCAL, 6, [[OP_DELETE, "s", "k", None]]]]
    payload = codec.pack([9, raws])
    w, txns, err = frame_txns_upto(payload)
    assert (w, err) == (9, None) and txns == [txn_from_wire(r) for r in raws]
    assert exact_frame(msgpack.unpackb(payload)) == (9, txns, None)


def test_a_frame_keeps_its_txns_up_to_the_first_bad_one():
    raws = [[1, 1, GROUP_DEFAULT, 5, [_put()]], [1, 2, GROUP_DEFAULT, 5, [_put("")]], [1, 3, GROUP_DEFAULT, 5, [_put()]]]
    w, txns, err = frame_txns_upto(codec.pack([9, raws]))
    assert w == 9 and txns == [txn_from_wire(raws[0])] and isinstance(err, RemoteProtocolError)
    with pytest.raises(RemoteProtocolError):
        unpack_frame_txns(codec.pack([9, raws]))


@pytest.mark.parametrize("d", [[1], [1, [], 3], ["w", []], [1, {}], {"a": 1}])
def test_a_frame_payload_of_another_shape_is_undecodable(d):
    with pytest.raises(ValueError, match="frame payload is not"):
        exact_frame(d)


# --- nop_of ---------------------------------------------------------------------------------
def test_a_skipped_txn_stands_in_the_vclock_as_nops_of_its_lsns():
    raw = [2, 7, GROUP_DEFAULT, 123, [_put(value=b"bad"), _put("")]]
    nop = nop_of(raw)
    assert nop == Txn(2, 7, GROUP_DEFAULT, 123, (Op(OP_NOP, "_skipped", "", None),) * 2)
    assert nop.last_lsn == 8
    assert txn_from_wire(nop.to_wire()) == nop


def test_a_skipped_local_txn_stays_local_and_a_skipped_cluster_txn_becomes_a_plain_one():
    raw = [2, 7, GROUP_LOCAL, 5, ["junk"]]
    assert nop_of(raw).group == GROUP_LOCAL and nop_of(raw).component == 0
    raw = [2, 7, GROUP_CLUSTER, 5, ["junk"]]
    assert nop_of(raw).group == GROUP_DEFAULT


@pytest.mark.parametrize("ts, kept", [(0, 0), (limits.timestamp_us_max, limits.timestamp_us_max),
                                      (limits.timestamp_us_max + 1, 0), (-1, 0), ("x", 0)])
def test_a_skipped_txns_timestamp_is_kept_only_if_it_is_within_bounds(ts, kept):
    assert nop_of([2, 7, GROUP_DEFAULT, ts, ["junk"]]).timestamp == kept


@pytest.mark.parametrize("raw", [None, 5, [1, 2, 3], [1, 0, GROUP_DEFAULT, 5, ["x"]], [1, 1, GROUP_DEFAULT, 5, []],
                                 ["a", 1, GROUP_DEFAULT, 5, ["x"]], [1, 1, 9, 5, ["x"]]])
def test_a_txn_whose_envelope_is_unusable_has_no_stand_in(raw):
    assert nop_of(raw) is None
