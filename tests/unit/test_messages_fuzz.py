"""Fuzzing what a peer or a damaged file can hand us (node/core/messages.py, node/core/rows.py).

`messages.decode` turns any bytes into a Message or raises RemoteProtocolError, nothing
else; `rows.txn_from_wire` does the same for any msgpack-able structure; valid messages
and transactions survive a round trip unchanged."""

import msgpack
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from node import limits
from node.core import codec, messages as m
from node.core.rows import (CLUSTER_SPACE, GROUPS, OP_CLUSTER, OP_DELETE, OP_NOP, OP_PUT, OP_SPACE, OPS, Op,
                            Txn, frame_txns_upto, txn_from_wire)
from node.errors import RemoteProtocolError

FUZZ = settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)

# --- strategies -------------------------------------------------------------------------------

INTS = st.one_of(st.integers(-3, 40), st.integers(-(2 ** 63), 2 ** 64 - 1))
SCALARS = st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=True), st.text(max_size=20),
                    st.binary(max_size=20))
KEYS = st.one_of(st.text(max_size=10), INTS, st.booleans(), st.none(), st.binary(max_size=4))


def msgpackable(leaves=SCALARS):
    return st.recursive(leaves, lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.dictionaries(KEYS, inner, max_size=6)), max_leaves=25)


ANY = msgpackable()
# values that compare equal to themselves after a round trip (no nan)
EQ = msgpackable(st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=False), st.text(max_size=20),
                           st.binary(max_size=20)))
SCHEMA_VALUES = {
    (int,): INTS, (str,): st.text(max_size=12), (bytes,): st.binary(max_size=12), (bool,): st.booleans(),
    (str, type(None)): st.one_of(st.none(), st.text(max_size=12)), (list,): st.lists(EQ, max_size=4),
    (dict,): st.dictionaries(KEYS, EQ, max_size=4),
}


def valid_body(mtype: int):
    fields = {k: SCHEMA_VALUES[types] for k, types in m.SCHEMA[mtype].items()}
    extra = st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in m.SCHEMA[mtype]),
                            EQ, max_size=2)
    return st.tuples(st.fixed_dictionaries(fields), extra).map(lambda p: {**p[1], **p[0]})


VALID_MESSAGES = st.sampled_from(sorted(m.SCHEMA)).flatmap(lambda t: st.tuples(st.just(t), valid_body(t)))


def mutated_body(mtype: int):
    """A valid body with one field dropped or replaced by anything."""
    body = valid_body(mtype)
    fields = sorted(m.SCHEMA[mtype])
    if not fields:
        return body
    return st.tuples(body, st.sampled_from(fields), st.one_of(st.just(None), ANY), st.booleans()).map(
        lambda p: ({k: v for k, v in p[0].items() if k != p[1]} if p[3] else {**p[0], p[1]: p[2]}))


NEAR_MESSAGES = st.one_of(
    VALID_MESSAGES.map(list),
    st.tuples(st.one_of(st.sampled_from(sorted(m.SCHEMA)), INTS, st.booleans(), ANY),
              st.sampled_from(sorted(m.SCHEMA)).flatmap(mutated_body)).map(list),
    st.lists(ANY, max_size=3),
    ANY,
)


def decode_or_refuse(data: bytes):
    try:
        msg = m.decode(data)
    except RemoteProtocolError:
        return None
    assert isinstance(msg, m.Message)
    return msg


# --- messages.decode --------------------------------------------------------------------------

@FUZZ
@given(st.binary(max_size=256))
def test_any_bytes_decode_to_a_message_or_a_remote_protocol_error(data):
    decode_or_refuse(data)


@FUZZ
@given(NEAR_MESSAGES)
def test_any_msgpack_structure_decodes_to_a_message_or_a_remote_protocol_error(raw):
    msg = decode_or_refuse(msgpack.packb(raw, use_bin_type=True))
    if msg is not None and msg.type == m.ROWS:
        # ROWS: the valid txns up to the first bad one, and that one's error
        assert all(isinstance(t, Txn) for t in msg["txns"])
        assert msg["error"] is None or isinstance(msg["error"], RemoteProtocolError)
    elif msg is not None:
        # what is accepted has every field of its schema with the right type
        assert msg.type in m.SCHEMA
        for k, types in m.SCHEMA[msg.type].items():
            assert isinstance(msg.body[k], types)
            assert not (types == (int,) and isinstance(msg.body[k], bool))


@FUZZ
@given(VALID_MESSAGES, st.integers(0, 10_000), st.integers(0, 255))
def test_a_damaged_valid_message_still_decodes_or_is_refused(msg, pos, byte):
    data = bytearray(m.encode(msg[0], **msg[1]))
    data[pos % len(data)] = byte
    decode_or_refuse(bytes(data))
    decode_or_refuse(bytes(data[: pos % len(data)]))


@FUZZ
@given(VALID_MESSAGES)
def test_valid_messages_round_trip(msg):
    mtype, body = msg
    # ROWS are decoded into txns (the ROWS tests below); fields some types check past their
    # types (greetings, vclocks, snapshots) are drawn here only by type: tests/unit/test_validate.py
    assume(mtype != m.ROWS and mtype not in m._CHECKS)
    out = m.decode(m.encode(mtype, **body))
    assert out.type == mtype and out.name == m.NAMES[mtype]
    assert out.body == msgpack.unpackb(msgpack.packb(body, use_bin_type=True), raw=False, strict_map_key=False)
    for k in m.SCHEMA[mtype]:
        assert out[k] == body[k]


@pytest.mark.parametrize("data", [
    b"", b"\xc1", b"\x92\x01", b"\x92\x01\x80\x00", b"\x91" * 100_000, b"\xdd\xff\xff\xff\xff",
    msgpack.packb([99, {}]), msgpack.packb([m.HELLO, {"version": True, "nonce": b"n"}]),
    msgpack.packb([m.HELLO, {"version": 1, "nonce": "not-bytes"}]), msgpack.packb({"type": 1}),
    msgpack.packb([m.SUBSCRIBE, {"vclock": [1, 2]}]), msgpack.packb([m.HELLO, {"version": 1}, 3]),
])
def test_known_garbage_is_refused(data):
    with pytest.raises(RemoteProtocolError):
        m.decode(data)


def test_a_message_over_the_size_limit_is_refused_before_decoding():
    with pytest.raises(RemoteProtocolError):
        m.decode(b"\x00" * (limits.message_bytes_max + 1))


@pytest.mark.parametrize("data", ["text", None, 12, memoryview(b"\x92\x01\x80")])
def test_non_bytes_frames_are_refused(data):
    with pytest.raises(RemoteProtocolError):
        m.decode(data)


@FUZZ
@given(ANY)
def test_vclock_from_wire_returns_a_vclock_or_refuses(raw):
    if not isinstance(raw, dict):
        return
    try:
        out = m.vclock_from_wire(raw)
    except RemoteProtocolError:
        return
    assert all(isinstance(k, int) and k >= 0 and isinstance(v, int) and v > 0 for k, v in out.items())


# --- rows.txn_from_wire ---------------------------------------------------------------------------

TEXT = st.text(max_size=12)
KEY = st.text(min_size=1, max_size=12)
JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1),
                                 st.floats(allow_nan=False, allow_infinity=False), TEXT),
                       lambda inner: st.one_of(st.lists(inner, max_size=4),
                                               st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)
SPACE = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
ADDRESS = st.one_of(st.just(""), st.tuples(st.from_regex(r"\A[a-z0-9.-]{1,30}\Z"), st.integers(1, 65535)).map(
    lambda p: f"{p[0]}:{p[1]}"))


def valid_data_op():
    return st.one_of(
        st.builds(Op, st.just(OP_PUT), SPACE, KEY, JSONISH),
        st.builds(Op, st.just(OP_DELETE), SPACE, KEY, st.none()),
        st.builds(Op, st.just(OP_NOP), SPACE, TEXT, st.none()),
        st.builds(Op, st.just(OP_SPACE), SPACE, st.just(""),
                  st.fixed_dictionaries({"local": st.booleans(), "conflict": st.sampled_from(["lww", "apply"])})),
    )


def valid_cluster_op():
    return st.builds(Op, st.just(OP_CLUSTER), st.just(CLUSTER_SPACE), st.uuids().map(str),
                     st.fixed_dictionaries({"id": st.integers(1, 4096), "address": ADDRESS,
                                            "state": st.sampled_from(["member", "anonymous", "expelled"])}))


def _valid_txn(rid, lsn, group, ts, data_ops, cluster_ops):
    ops = cluster_ops if group == GROUPS[2] else data_ops       # _cluster rows travel alone
    return Txn(rid, min(lsn, limits.lsn_max - len(ops) + 1), group, ts, tuple(ops))


VALID_TXNS = st.builds(_valid_txn, st.integers(0, limits.replica_id_max), st.integers(1, 2 ** 62),
                       st.sampled_from(GROUPS), st.integers(0, limits.timestamp_us_max),
                       st.lists(valid_data_op(), min_size=1, max_size=5),
                       st.lists(valid_cluster_op(), min_size=1, max_size=3))


def mutate(wire, path_choice, replacement):
    """Replace one element of a txn's wire form (or of one of its ops) by anything."""
    wire = [list(x) if isinstance(x, list) else x for x in wire]
    wire[4] = [list(o) for o in wire[4]]
    i = path_choice % 9
    if i < 5:
        wire[i] = replacement
    else:
        op = wire[4][path_choice % len(wire[4])]
        op[i - 5] = replacement
    return wire


NEAR_TXNS = st.one_of(
    VALID_TXNS.map(lambda t: t.to_wire()),
    st.tuples(VALID_TXNS, st.integers(0, 1000), ANY).map(lambda p: mutate(p[0].to_wire(), p[1], p[2])),
    st.lists(ANY, min_size=5, max_size=5),
    st.tuples(INTS, INTS, st.one_of(st.sampled_from(GROUPS), ANY), INTS,
              st.lists(st.one_of(st.lists(ANY, min_size=4, max_size=4),
                                 st.tuples(st.sampled_from(OPS), TEXT, TEXT, ANY).map(list), ANY),
                       max_size=3)).map(list),
    ANY,
)


def from_wire_or_refuse(raw):
    try:
        txn = txn_from_wire(raw)
    except RemoteProtocolError:
        return None
    assert isinstance(txn, Txn)
    return txn


@FUZZ
@given(NEAR_TXNS)
def test_any_structure_is_a_txn_or_a_remote_protocol_error(raw):
    # the structure as it arrives: through msgpack, like the wire and the WAL
    try:
        data = msgpack.packb(raw, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        assume(False)
    raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
    txn = from_wire_or_refuse(raw)
    if txn is not None:
        assert 1 <= txn.lsn and 0 <= txn.replica_id <= limits.replica_id_max and txn.group in GROUPS
        assert 1 <= len(txn.ops) <= limits.txn_ops_max
        assert all(op.kind in OPS and isinstance(op.space, str) and isinstance(op.key, str) for op in txn.ops)


@FUZZ
@given(VALID_TXNS)
def test_valid_txns_round_trip_through_msgpack(txn):
    raw = msgpack.unpackb(msgpack.packb(txn.to_wire(), use_bin_type=True), raw=False, strict_map_key=False)
    assert txn_from_wire(raw) == txn


@pytest.mark.parametrize("raw", [
    None, [], [1, 1, 0, 0], [1, 1, 0, 0, []], [1, 0, 0, 0, [[1, "s", "k", 1]]],
    [-1, 1, 0, 0, [[1, "s", "k", 1]]], [limits.replica_id_max + 1, 1, 0, 0, [[1, "s", "k", 1]]],
    [1, 1, 7, 0, [[1, "s", "k", 1]]], [1, 1, 0, -5, [[1, "s", "k", 1]]], [True, 1, 0, 0, [[1, "s", "k", 1]]],
    [1, 1, 0, 0, [[9, "s", "k", 1]]], [1, 1, 0, 0, [[1, "", "k", 1]]], [1, 1, 0, 0, [[1, "s", 5, 1]]],
    [1, 1, 0, 0, [[1, "s" * 65, "k", 1]]], [1, 1, 0, 0, [[1, "s", "k" * (limits.key_bytes_max + 1), 1]]],
    [1, 1, 2, 0, [[OP_CLUSTER, "data", "u", {"id": 1}]]], [1, 1, 2, 0, [[OP_CLUSTER, CLUSTER_SPACE, "u", {}]]],
    [1, 1, 0, 0, [[OP_SPACE, "s", "", None]]], [1, 1, 0, 0, [[1, "s", "k"]]],
    [1, 1, 0, 0, [[1, "s", "k", 1]] * (limits.txn_ops_max + 1)],
])
def test_known_malformed_txns_are_refused(raw):
    with pytest.raises(RemoteProtocolError):
        txn_from_wire(raw)


# --- rows.frame_txns_upto: the fast decoder against the exact path ------------------------------

def exact_frame(body: bytes):
    """What the exact path makes of a frame payload: (written_us, txns, error text) or the
    exception type it raises for an undecodable payload."""
    try:   # stored values hold no extension type but timestamps (node.core.codec)
        d = msgpack.unpackb(body, raw=False, strict_map_key=False, ext_hook=codec.refuse_ext)
    except Exception as e:
        return type(e)
    if type(d) is not list or len(d) != 2 or not isinstance(d[0], int) or type(d[1]) is not list:
        return ValueError
    out = []
    for raw in d[1]:
        try:
            out.append(txn_from_wire(raw))
        except RemoteProtocolError as e:
            return d[0], out, str(e)
    return d[0], out, None


def fast_frame(body: bytes):
    try:
        wus, txns, err = frame_txns_upto(body)
    except Exception as e:
        return type(e)
    return wus, txns, None if err is None else str(err)


def same(a, b) -> bool:
    """Equal and of the same msgpack types (1 == True in Python, not on the wire)."""
    if isinstance(a, type) or isinstance(b, type):
        return a is b or (issubclass(a, ValueError) and issubclass(b, ValueError))
    pack = msgpack.Packer(use_bin_type=True).pack
    return pack(a[0]) == pack(b[0]) and a[2] == b[2] and \
        pack([t.to_wire() for t in a[1]]) == pack([t.to_wire() for t in b[1]])


ODD_VALUES = st.one_of(
    st.just(msgpack.Timestamp(1, 5)), st.just(msgpack.ExtType(3, b"xy")),
    st.just({"a": {"b": [1, {"c": msgpack.Timestamp(2, 0)}]}}),
    st.text(st.characters(min_codepoint=0x800, max_codepoint=0xffff), min_size=250, max_size=400),
)
FRAME_TXNS = st.lists(st.one_of(NEAR_TXNS, VALID_TXNS.map(lambda t: t.to_wire()),
                                st.tuples(VALID_TXNS, st.integers(0, 1000), ODD_VALUES).map(
                                    lambda p: mutate(p[0].to_wire(), p[1], p[2]))), max_size=4)


@FUZZ
@given(st.one_of(INTS, st.booleans(), ANY), FRAME_TXNS)
def test_fast_frame_decoder_agrees_with_the_exact_path(written_us, txns):
    try:
        body = msgpack.packb([written_us, txns], use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        assume(False)
    assert same(fast_frame(body), exact_frame(body))


@FUZZ
@given(st.binary(max_size=64), VALID_TXNS)
def test_fast_frame_decoder_agrees_on_damaged_bytes(junk, txn):
    body = msgpack.packb([7, [txn.to_wire()]], use_bin_type=True)
    for damaged in (junk, body[: len(junk) % max(len(body), 1)], body + junk[:3],
                    bytes(b ^ 0x20 if i == len(junk) % len(body) else b for i, b in enumerate(body))):
        assert same(fast_frame(damaged), exact_frame(damaged))


@pytest.mark.parametrize("op", [[OP_PUT, "s", "k"], [OP_DELETE, "s", "k", None, 1], [OP_NOP, "s", "k", None]])
def test_fast_frame_decoder_takes_ops_of_four_elements_only(op):
    body = msgpack.packb([9, [[1, 1, 0, 5, [op]]]], use_bin_type=True)
    assert same(fast_frame(body), exact_frame(body))
    assert (fast_frame(body)[2] is None) == (len(op) == 4)


@pytest.mark.parametrize("value", [
    {(1,): 2}, [{(1, 2): "x"}], msgpack.Timestamp(1, 0), msgpack.ExtType(1, b"a"), {"k": [msgpack.Timestamp(3, 1)]},
])
def test_fast_frame_decoder_leaves_odd_values_to_the_exact_path(value):
    # an array as a map key (msgspec would make it a tuple) and timestamps (it would make datetimes)
    raw = [1, 1, 0, 5, [[OP_PUT, "s", "k", value]]]
    try:
        body = msgpack.packb([9, [raw]], use_bin_type=True)
    except TypeError:
        body = msgpack.packb([9, [raw[:4] + [[[OP_PUT, "s", "k", None]]]]], use_bin_type=True).replace(
            b"\xc0", b"\x81\x91\x01\x02")          # {[1]: 2} spelled in bytes
    assert same(fast_frame(body), exact_frame(body))


@pytest.mark.parametrize("chars", [limits.key_bytes_max // 4 + 1, limits.key_bytes_max // 3, limits.key_bytes_max // 3 + 1,
                                   limits.key_bytes_max, limits.key_bytes_max + 1])
def test_fast_frame_decoder_leaves_long_keys_to_the_exact_path(chars):
    # three UTF-8 bytes a character: within the 1 KiB bound up to key_bytes_max // 3 characters
    body = msgpack.packb([9, [[1, 1, 0, 5, [[OP_PUT, "s", "\u20ac" * chars, 1]]]]], use_bin_type=True)
    assert same(fast_frame(body), exact_frame(body))
    assert (fast_frame(body)[2] is None) == (chars <= limits.key_bytes_max // 3)


# --- ROWS messages: frames inline, decoded in one call ------------------------------------------

def exact_rows(payloads: list[bytes]):
    """What the exact path makes of a ROWS message of these payloads, frame by frame."""
    out = []
    for body in payloads:
        r = exact_frame(body)
        if isinstance(r, type):
            return out, "undecodable"
        out += r[1]
        if r[2] is not None:
            return out, r[2]
    return out, None


@FUZZ
@given(st.lists(st.tuples(st.one_of(INTS, st.booleans()), FRAME_TXNS), max_size=4))
def test_rows_messages_decode_as_their_frames_one_by_one(frames):
    try:
        payloads = [msgpack.packb([wus, txns], use_bin_type=True) for wus, txns in frames]
    except (OverflowError, ValueError, TypeError):
        assume(False)
    msg = decode_or_refuse(m.encode_rows(payloads))
    if any(isinstance(exact_frame(p), type) for p in payloads):
        assert msg is None                       # an undecodable payload spoils the whole message
        return
    want_txns, want_err = exact_rows(payloads)
    assert msg is not None and msg.type == m.ROWS
    assert same((0, msg["txns"], None), (0, want_txns, None))
    assert (msg["error"] is None) == (want_err is None)
    if want_err is not None:
        assert str(msg["error"]) == want_err


@FUZZ
@given(st.lists(st.lists(VALID_TXNS, min_size=1, max_size=3), max_size=40))
def test_valid_rows_round_trip(frames):
    payloads = [msgpack.packb([1, [t.to_wire() for t in f]], use_bin_type=True) for f in frames]
    msg = m.decode(m.encode_rows(payloads))
    assert msg.type == m.ROWS and msg["error"] is None
    assert [t.to_wire() for t in msg["txns"]] == [t.to_wire() for f in frames for t in f]
