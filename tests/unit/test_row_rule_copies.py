"""Every copy of the row rules agrees with node/core/validate.py, at each bound.

The rules are written once, in validate.py: txn_envelope_error, op_error (with key_error,
space_name_error and value_size), txn_group_error, txn_bytes_error. The decoders that keep subsets
of them for speed must give the same verdict, and the same txns, on every input: the exact decoder
(rows.txn_from_wire), msgspec's frame decoder (rows.frame_txns_upto: _WireTxn/_WireOp and
check_fast), the ROWS decoder (messages.decode), the native scanner (node/core/_rowscan.c) and its
reference (rowscan.scan_rows_py, _plain_txn), and the client paths (clientrules, and the session's
sure-without-walking checks validate.KEY_CHARS_SAFE and decoded_value_ok).

The oracle is validate.py itself, asked rule by rule (`rules_verdict`). A table names each bound's
edge on its own (the largest accepted, one past it); hypothesis draws every field of a txn from its
edge values at once, so the copies are also compared on combinations the table does not list."""
import math

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from node import clientrules, limits
from node.core import rowscan, validate
from node.core import messages as m
from node.core.rows import frame_txns_upto, txn_from_wire
from node.errors import ClientError, RemoteProtocolError

UUID = "0000000a-0000-4000-8000-00000000000b"


def _nested(depth: int):
    v: list = []
    for _ in range(depth - 1):
        v = [v]
    return v


SURE_ITEMS, SURE_STR = limits.value_sure_items_max, limits.value_sure_str_chars_max


def _flat(items: int, chars: int) -> dict:
    """A flat map of `items` strings of `chars` characters (decoded_flat_ok's bounds)."""
    return {f"k{i}": "v" * chars for i in range(items)}


def rules_verdict(raw) -> tuple[bool, bool]:
    """(accepted as a txn, accepted in a ROWS message) by validate.py's rules alone."""
    if type(raw) is not list or len(raw) != 5:
        return False, False
    rid, lsn, group, ts, ops = raw
    if validate.txn_envelope_error(rid, lsn, group, ts, ops) is not None:
        return False, False
    for o in ops:
        if type(o) is not list or len(o) != 4 or validate.op_error(*o) is not None:
            return False, False
    if validate.txn_group_error(group, [o[0] for o in ops]) is not None:
        return False, False
    return True, validate.txn_bytes_error(len(msgpack.packb(raw, use_bin_type=True))) is None


KB, VB = limits.key_bytes_max, limits.value_bytes_max
RID, LSN, TS = limits.replica_id_max, limits.lsn_max, limits.timestamp_us_max


def _txn(rid=1, lsn=1, group=0, ts=5, ops=None):
    return [rid, lsn, group, ts, ops if ops is not None else [[1, "kv", "k", 1]]]


def _put(space="kv", key="k", value=1, kind=1):
    return _txn(ops=[[kind, space, key, value]])


def _txn_of_bytes(n: int) -> list:
    """A txn of 1 MiB string values that encodes to exactly n bytes."""
    ops = [[1, "kv", f"k{i}", "v" * (VB - 5)] for i in range(n // VB)]
    raw = _txn(ops=ops + [[1, "kv", "last", ""]])
    k = n - len(msgpack.packb(raw))
    for _ in range(3):                         # the last string's header grows with it
        raw[4][-1][3] = "v" * k
        k -= len(msgpack.packb(raw)) - n
    assert len(msgpack.packb(raw)) == n
    return raw


CASES = {   # name: (txn wire form, accepted as a txn, accepted in a ROWS message)
    "replica id 0": (_txn(rid=0), True), "replica id at its bound": (_txn(rid=RID), True),
    "replica id past its bound": (_txn(rid=RID + 1), False), "lsn 0": (_txn(lsn=0), False),
    "lsn at its bound": (_txn(lsn=LSN), True),
    "last lsn past its bound": (_txn(lsn=LSN, ops=[[1, "kv", "a", 1], [1, "kv", "b", 1]]), False),
    "timestamp 0": (_txn(ts=0), True), "timestamp at its bound": (_txn(ts=TS), True),
    "timestamp past its bound": (_txn(ts=TS + 1), False), "unknown group": (_txn(group=3), False),
    "a local row": (_txn(group=1), True), "a data row in group cluster": (_txn(group=2), False),
    "no rows": (_txn(ops=[]), False),
    "txn_ops_max rows": (_txn(ops=[[5, "kv", "", None]] * limits.txn_ops_max), True),
    "one row past txn_ops_max": (_txn(ops=[[5, "kv", "", None]] * (limits.txn_ops_max + 1)), False),
    "unknown op kind": (_put(kind=9), False), "a bool op kind": (_put(kind=True), False),
    "space name at its bound": (_put(space="s" * limits.space_name_chars_max), True),
    "space name past its bound": (_put(space="s" * (limits.space_name_chars_max + 1)), False),
    "space name starting with a digit": (_put(space="9kv"), False), "empty space name": (_put(space=""), False),
    "system space name": (_put(space="_s"), True),
    "key at its bound": (_put(key="k" * KB), True), "key past its bound": (_put(key="k" * (KB + 1)), False),
    "empty key": (_put(key=""), False), "2-byte chars at the key bound": (_put(key="é" * (KB // 2)), True),
    "2-byte chars past the key bound": (_put(key="é" * (KB // 2 + 1)), False),
    "3-byte chars at the key bound": (_put(key="€" * (KB // 3)), True),
    "3-byte chars past the key bound": (_put(key="€" * (KB // 3 + 1)), False),
    "4-byte chars at the key bound": (_put(key="\U0001d11e" * (KB // 4)), True),
    "4-byte chars past the key bound": (_put(key="\U0001d11e" * (KB // 4 + 1)), False),
    "value nested at its bound": (_put(value=_nested(limits.value_depth_max)), True),
    "value nested past its bound": (_put(value=_nested(limits.value_depth_max + 1)), False),
    "value at its byte bound": (_put(value="v" * (VB - 5)), True),
    "value past its byte bound": (_put(value="v" * (VB - 4)), False),
    "flat map at the sure bound": (_put(value=_flat(SURE_ITEMS, SURE_STR)), True),
    "flat map past the sure bound": (_put(value=_flat(SURE_ITEMS, SURE_STR + 1)), True),
    "largest and smallest ints": (_put(value=[2**64 - 1, -(2**63)]), True),
    "NaN": (_put(value=float("nan")), False), "-Infinity": (_put(value={"x": -math.inf}), False),
    "binary data": (_put(value=b"x"), False), "a map with an int key": (_put(value={1: 2}), False),
    "an extension type": (_put(value=msgpack.ExtType(3, b"x")), False),
    "a timestamp (legacy only)": (_put(value=msgpack.Timestamp(1, 0)), False),
    "a delete": (_put(kind=2, value=None), True), "a delete with a value": (_put(kind=2, value=1), False),
    "a nop with a key": (_put(kind=5, value=None), True), "a nop with no key": (_put(kind=5, key="", value=None), True),
    "a nop with a value": (_put(kind=5, key="", value=1), False),
    "a space row": (_put(kind=3, key="", value={"local": False, "conflict": "lww"}), True),
    "a _cluster row": (_txn(group=2, ops=[[4, "_cluster", UUID, {"id": 2, "address": "", "state": "member"}]]), True),
    "a txn of txn_bytes_max bytes": (lambda: _txn_of_bytes(limits.txn_bytes_max), True),
    "a txn one byte past txn_bytes_max": (lambda: _txn_of_bytes(limits.txn_bytes_max + 1), True, False),
}


def _outcome(f):
    """("ok", txns) or ("refused",): what a decoder made of the input."""
    try:
        txns, err = f()
    except (RemoteProtocolError, ValueError):
        return ("refused",)
    return ("refused",) if err is not None else ("ok", [t.to_wire() for t in txns])


@pytest.mark.parametrize("name", list(CASES))
def test_every_copy_of_the_row_rules_agrees_with_the_rules_at_each_bound(name):
    raw, ok_txn, *rest = CASES[name]
    raw = raw() if callable(raw) else raw
    ok_rows = rest[0] if rest else ok_txn
    assert rules_verdict(raw) == (ok_txn, ok_rows), "the table says what validate.py says"
    check_every_copy(raw, ok_txn, ok_rows)


def check_every_copy(raw: list, ok_txn: bool, ok_rows: bool) -> None:
    """Each decoder's verdict on `raw` (sent as one txn of one frame) is (ok_txn, ok_rows), and
    what those that accept it read is the same txn."""
    payload = msgpack.packb([7, [raw]], use_bin_type=True)
    decoded = msgpack.unpackb(payload, raw=False, strict_map_key=False)[1][0]     # what the wire carries
    exact = _outcome(lambda: (([txn_from_wire(decoded)]), None))
    assert exact[0] == ("ok" if ok_txn else "refused"), exact
    assert _outcome(lambda: frame_txns_upto(payload)[1:]) == exact, "msgspec's frame decoder"
    data = m.encode_rows([payload])
    rows = _outcome(lambda: (lambda b: (b["txns"], b["error"]))(m.decode(data).body))
    assert rows == (exact if ok_rows else ("refused",)), "the ROWS decoder"
    ref = rowscan.scan_rows_py(data)           # the scanner's reference (_plain_txn)
    if ref is not None:
        assert rows[0] == "ok" and [t.to_wire() for t in ref.txns] == rows[1], "the scanner's reference"
    plain = raw[2] == 0 and all(o[0] in (1, 2, 5) for o in raw[4])
    if ok_rows and plain:
        assert ref is not None, "the scanner takes a plain txn at the bound, as the exact path does"
    if rowscan.native is not None:             # without it (an install with no compiler) the exact paths serve
        native = rowscan.scan_rows(data)
        assert (native is None) == (ref is None), "the native scanner and its reference"
        if native is not None:
            assert native.frame_txns([(0, 1, 1)]) == ref.frame_txns([(0, 1, 1)])
    kind, space, key, value = decoded[4][0] if decoded[4] else (None,) * 4
    if type(kind) is int and (kind == 1 or (kind == 2 and value is None)) and type(space) is str \
            and not space.startswith("_"):
        client = _client_outcome(space, key, value, put=kind == 1)   # the client paths: the same row rules
        assert client == (validate.op_error(kind, space, key, value) is None), "clientrules"
        if type(key) is str and 0 < len(key) <= validate.KEY_CHARS_SAFE:
            assert validate.key_error(key) is None, "the session's short-key check"
        if validate.decoded_value_ok(value):
            assert validate.value_error(value) is None, "the session's sure-value check"


def _client_outcome(space, key, value, put: bool) -> bool:
    try:
        if put:
            clientrules.put_op(space, key, value)
        else:
            clientrules.delete_op(space, key)
    except ClientError:
        return False
    return True




# --- every field at its edges at once (hypothesis) ------------------------------------------------
SCS, STS = validate.KEY_CHARS_SAFE, validate.STR_CHARS_SAFE
EDGE_KEYS = ["k", "", UUID, "k" * KB, "k" * (KB + 1), "é" * (KB // 2), "é" * (KB // 2 + 1), "€" * (KB // 3),
             "€" * (KB // 3 + 1), "\U0001d11e" * (KB // 4), "\U0001d11e" * (KB // 4 + 1), "k" * SCS, "é" * SCS,
             "k" * (SCS + 1)]
EDGE_SPACES = ["kv", "s" * limits.space_name_chars_max, "s" * (limits.space_name_chars_max + 1), "", "9kv", "_s",
               "_cluster", "a-b", "ключи"]
EDGE_VALUES = [None, 0, True, 1.5, -0.0, "", 2**64 - 1, -(2**63), "v" * (VB - 5), "v" * (VB - 4), "v" * STS,
               "v" * (STS + 1), _nested(limits.value_depth_max), _nested(limits.value_depth_max + 1),
               {"a": _nested(limits.value_depth_max - 1)}, {"a": _nested(limits.value_depth_max)},
               _flat(SURE_ITEMS, SURE_STR), _flat(SURE_ITEMS, SURE_STR + 1), _flat(SURE_ITEMS + 1, 1),
               [1] * SURE_ITEMS, [1] * (SURE_ITEMS + 1), {"k" * limits.value_sure_key_chars_max: 1},
               {"k" * (limits.value_sure_key_chars_max + 1): 1}, float("nan"), math.inf, b"x", {1: 2}, msgpack.ExtType(3, b"x"), msgpack.Timestamp(1, 0),
               {"local": False, "conflict": "lww"}, {"local": 1}, {"id": 2, "address": "", "state": "member"},
               {"id": RID + 1, "address": "", "state": "member"}, {"id": 2, "address": "h:1", "state": "boss"}]
small = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.text(max_size=8)
                     | st.floats(allow_nan=False, allow_infinity=False),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=4),
                     max_leaves=10)


# each field: a usual value most of the time, else one of its edges, so that about half the txns
# are accepted and every copy is compared on both sides of each bound
def _edge(usual, edges: list, usual_weight: int = 3):
    return st.sampled_from([usual] * usual_weight + edges)


@st.composite
def edge_op(draw) -> list:
    kind = draw(_edge(1, [2, 2, 5, 5, 3, 4, 0, 9, True], 16))
    if kind in (2, 5):        # deletes and nops carry no value, now and then one
        value = draw(_edge(None, [1, "x", {}], 12))
    else:
        value = draw(small | st.sampled_from(EDGE_VALUES))
    return [kind, draw(_edge("kv", EDGE_SPACES, 30)), draw(_edge("k", EDGE_KEYS, 20)), value]


@st.composite
def edge_txns(draw) -> list:
    count = draw(st.sampled_from(["few"] * 20 + ["none", "at", "past"]))
    if count == "few":
        ops = draw(st.lists(edge_op(), min_size=1, max_size=3))
    else:     # nops, the cheapest rows, to reach the row count's bound
        ops = [] if count == "none" else [[5, "kv", "", None]] * (limits.txn_ops_max + (count == "past"))
    n = max(len(ops), 1)
    lsn = draw(_edge(1000, [1, 0, -1, LSN - n + 1, LSN - n + 2, LSN], 20))      # the last lsn at, past its bound
    rid = draw(_edge(7, [0, RID, RID + 1, -1], 16))
    ts = draw(_edge(5, [0, TS, TS + 1, -1], 16))
    group = draw(_edge(0, [1, 2, 3], 16))
    return [rid, lsn, group, ts, ops]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(edge_txns())
def test_every_copy_of_the_row_rules_agrees_with_the_rules_on_txns_at_their_edges(raw):
    ok_txn, ok_rows = rules_verdict(raw)
    check_every_copy(raw, ok_txn, ok_rows)
