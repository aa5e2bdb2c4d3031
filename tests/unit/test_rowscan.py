"""The row scanner (node.core.rowscan, node/core/_rowscan.c) and everything built on it.

- The native scanner takes exactly the messages the reference takes and answers every method
  the same, on generated messages, other encoders' output and damaged bytes; and what the
  reference takes, the exact decoder (node.core.messages.decode) reads as the same txns.
- `NodeCore.receive_scan` decides a scanned message as the one-by-one rules decide its txns.
- A PackedEntry's WAL frame, relay filtering and store records are those of its txns, and
  applying it to a real LMDB store leaves exactly what apply_txns leaves."""
from __future__ import annotations

import random

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node import limits
from node.cluster_space.table import STATE_MEMBER, ClusterTable, Member
from node.core import codec, rowscan
from node.core import messages as m
from node.core.replicaset import relay_wants
from node.core.rows import (CLUSTER_SPACE, GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_CLUSTER, OP_DELETE, OP_NOP,
                            OP_PUT, OP_SPACE, Op, Txn)
from node.core.entry import PackedEntry, TxnEntry
from node.core.rowscan import scan_rows_py
from node.errors import RemoteProtocolError, StorageError
from node.storage.store import Store
from test_receive_run import AHEAD, PEER, WALL, _core, _ref_all

SCANNERS = {"native": rowscan.scan_rows, "reference": scan_rows_py}


def test_the_native_scanner_is_built():
    """`pip install -e .` builds it (setup.py); without it replicas fall back to the exact
    path, correct but several times slower, which nothing else would notice."""
    assert rowscan.native is not None


def message(frames: list[list[Txn]], pack=codec.pack, written_us: int = 1_700_000_000_000_000) -> bytes:
    return m.encode_rows([pack([written_us + i, txns]) for i, txns in enumerate(frames)])


def methods(scan, ranges) -> tuple:
    """Everything a scan answers, for comparing two of them."""
    n = scan.ntxn
    return (n, scan.nops, scan.runs(), scan.lasts(), [scan.lsn(i) for i in range(n)],
            [scan.txn_bytes(i) for i in range(n)], scan.ts_max(0, n) if n else None, scan.spaces(),
            scan.frame_txns(ranges), scan.records(ranges))


def check_same(data: bytes) -> object:
    a, r = rowscan.scan_rows(data), scan_rows_py(data)
    assert (a is None) == (r is None), (a, r, data[:120])
    if r is None:
        return None
    ranges = [(x, y, rid % 5000 + 1) for rid, x, y in r.runs()]
    assert methods(a, ranges) == methods(r, ranges)
    # what the fast path takes, the exact path reads the same way (and finds nothing wrong)
    exact = m.decode(data)
    assert exact["error"] is None and exact["txns"] == r.txns
    return r


# --- generated messages -----------------------------------------------------------------
scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=True)
           | st.text(max_size=40) | st.binary(max_size=300))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=8), c, max_size=5)
                      | st.dictionaries(st.integers(-5, 5), c, max_size=3), max_leaves=25) \
    | st.integers(limits.value_depth_max - 1, limits.value_depth_max + 1).map(lambda d: _nested(d))
keys = (st.text(min_size=0, max_size=30) | st.text(min_size=250, max_size=400) | st.just("k")
        | st.sampled_from(["k" * limits.key_bytes_max, "k" * (limits.key_bytes_max + 1), "é" * 256]))
ops = st.tuples(st.sampled_from([OP_PUT, OP_PUT, OP_DELETE, OP_NOP, OP_SPACE, OP_CLUSTER]),
                st.sampled_from(["kv", "data", "ключи", "x" * 64, "x" * 65, "", "_s", "9a", "a-b"]), keys,
                st.none() | values)


@st.composite
def messages(draw) -> bytes:
    rids = draw(st.lists(st.sampled_from([1, 2, 3, 200, 1 << 31, (1 << 31) + 1]), min_size=1, max_size=3))
    nxt = {rid: draw(st.sampled_from([1, 2, 1000, 2**40, limits.lsn_max - 2, 2**63 - 3])) for rid in rids}
    frames = []
    for _ in range(draw(st.integers(1, 4))):
        txns = []
        for _ in range(draw(st.integers(0, 5))):
            rid = draw(st.sampled_from(rids))
            raw_ops = draw(st.lists(ops, min_size=1, max_size=4))
            tops = []
            for kind, space, key, value in raw_ops:
                if kind == OP_DELETE and draw(st.booleans()):
                    value = None                       # what clients send
                if kind == OP_CLUSTER:
                    space, value = CLUSTER_SPACE, {"id": 4, "address": "", "state": STATE_MEMBER}
                tops.append(Op(kind, space, key, value))
            group = draw(st.sampled_from([GROUP_DEFAULT] * 8 + [GROUP_LOCAL, GROUP_CLUSTER]))
            lsn = nxt[rid] + draw(st.sampled_from([0] * 8 + [1, -1]))       # now and then a gap
            ts = draw(st.integers(0, 2**63 - 1) | st.sampled_from([limits.timestamp_us_max, limits.timestamp_us_max + 1]))
            txns.append(Txn(rid, max(1, lsn), group, ts, tuple(tops)))
            nxt[rid] = max(1, lsn) + len(tops)
        frames.append(txns)
    return message(frames)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages())
def test_native_and_reference_agree_on_generated_messages(data):
    check_same(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255), st.sampled_from("fid")),
                            min_size=1, max_size=3))
def test_native_and_reference_agree_on_damaged_messages(data, edits):
    b = bytearray(data)
    for at, byte, how in edits:
        i = at % (len(b) + 1)
        if how == "f" and i < len(b):
            b[i] = byte
        elif how == "i":
            b.insert(i, byte)
        elif i < len(b):
            del b[i]
    check_same(bytes(b))


def test_plain_messages_take_the_fast_path():
    txns = [Txn(1, 10, GROUP_DEFAULT, 5, (Op(OP_PUT, "kv", "a", {"x": [1, 2.5, "z", -0.0, 2**64 - 1]}),
                                          Op(OP_DELETE, "kv", "b", None), Op(OP_NOP, "kv", "", None))),
            Txn(1, 13, GROUP_DEFAULT, 6, (Op(OP_PUT, "kv", "ключ" * 60, -7),)),
            Txn(2, 1, GROUP_DEFAULT, 7, (Op(OP_PUT, "kv", "c", None),))]
    r = check_same(message([txns[:2], txns[2:]]))
    assert r is not None and r.runs() == [(1, 0, 2), (2, 2, 3)]


def test_values_at_every_bound_take_the_fast_path():
    """The largest value, key, depth, lsn and timestamp the rules accept: the scanner takes them."""
    big = "v" * (limits.value_bytes_max - 5)             # a str8..32 header + the bytes: exactly the bound
    assert len(codec.pack(big)) == limits.value_bytes_max
    for op, lsn, ts in [(Op(OP_PUT, "kv", "a", _nested(limits.value_depth_max)), 1, 1),
                        (Op(OP_PUT, "kv", "k" * limits.key_bytes_max, big), 1, 1),
                        (Op(OP_PUT, "x" * 64, "é" * (limits.key_bytes_max // 2), {"a": [1.5, None, True]}),
                         limits.lsn_max, limits.timestamp_us_max)]:
        assert check_same(message([[Txn(1, lsn, 0, ts, (op,))]])), op[:3]


@pytest.mark.parametrize("why, frames, pack", [
    ("float32: another encoder's choice", [[Txn(1, 1, 0, 1, (Op(OP_PUT, "kv", "a", 1.5),))]],
     lambda o: msgpack.packb(o, use_single_float=True)),
    ("a map with a non-string key", [[Txn(1, 1, 0, 1, (Op(OP_PUT, "kv", "a", {1: 2}),))]], codec.pack),
    ("a delete carrying a value", [[Txn(1, 1, 0, 1, (Op(OP_DELETE, "kv", "a", 1),))]], codec.pack),
    ("a space definition", [[Txn(1, 1, 0, 1, (Op(OP_SPACE, "kv", "", {"local": False}),))]], codec.pack),
    ("a _cluster row", [[Txn(1, 1, GROUP_CLUSTER, 1, (Op(OP_CLUSTER, CLUSTER_SPACE, "u", {"id": 2}),))]],
     codec.pack),
    ("a local row", [[Txn(1, 1, GROUP_LOCAL, 1, (Op(OP_PUT, "kv", "a", 1),))]], codec.pack),
    ("one origin's rows with a gap", [[Txn(1, 1, 0, 1, (Op(OP_PUT, "kv", "a", 1),)),
                                       Txn(1, 3, 0, 1, (Op(OP_PUT, "kv", "b", 1),))]], codec.pack),
])
def test_what_the_fast_path_leaves_to_the_exact_path(why, frames, pack):
    data = message(frames, pack)
    assert check_same(data) is None, why
    assert m.decode(data, rowscan.scan_rows).body.get("scan") is None


def _nested(depth: int) -> list:
    """`depth` arrays, one in the other: [] is 1."""
    v: list = []
    for _ in range(depth - 1):
        v = [v]
    return v


def _one(op: Op, lsn: int = 1, ts: int = 1) -> list:
    return [[Txn(1, lsn, 0, ts, (op,))]]


@pytest.mark.parametrize("why, frames", [
    ("nesting deeper than value_depth_max", _one(Op(OP_PUT, "kv", "a", _nested(limits.value_depth_max + 1)))),
    ("a value larger than value_bytes_max", _one(Op(OP_PUT, "kv", "a", "v" * (limits.value_bytes_max - 4)))),
    ("NaN", _one(Op(OP_PUT, "kv", "a", [float("nan")]))),
    ("Infinity", _one(Op(OP_PUT, "kv", "a", {"x": float("-inf")}))),
    ("binary data", _one(Op(OP_PUT, "kv", "a", b"\x00"))),
    ("a map with a non-string key", _one(Op(OP_PUT, "kv", "a", {1: 2}))),
    ("an empty key", _one(Op(OP_PUT, "kv", "", 1))),
    ("a key past key_bytes_max", _one(Op(OP_DELETE, "kv", "k" * (limits.key_bytes_max + 1), None))),
    ("a space name outside the pattern", _one(Op(OP_PUT, "9kv", "a", 1))),
    ("a nop carrying a value", _one(Op(OP_NOP, "kv", "", 1))),
    ("an lsn past lsn_max", _one(Op(OP_PUT, "kv", "a", 1), lsn=limits.lsn_max + 1)),
    ("a timestamp past timestamp_us_max", _one(Op(OP_PUT, "kv", "a", 1), ts=limits.timestamp_us_max + 1)),
    ("a timestamp of 2^64 - 1", _one(Op(OP_PUT, "kv", "a", 1), ts=2**64 - 1)),
])
def test_what_no_path_accepts(why, frames):
    """The scanner leaves these to the exact path, and the exact path refuses them."""
    data = message(frames)
    assert check_same(data) is None, why
    assert rowscan.scan_rows(data) is None
    got = m.decode(data)
    assert got["txns"] == [] and isinstance(got["error"], RemoteProtocolError), why


def test_non_canonical_ints_and_headers_take_the_exact_path():
    good = message([[Txn(1, 1, 0, 1, (Op(OP_PUT, "kv", "a", 5),))]])
    assert check_same(good) is not None
    for old, new in [(b"\xa1a\x05", b"\xa1a\xcc\x05"),        # 5 as uint8
                     (b"\xa1a\x05", b"\xa1a\xd0\x05"),        # 5 as int8
                     (b"\xa1a\x05", b"\xa1a\xd1\xff\xfb"),    # -5 as int16 (value differs: still exact)
                     (b"\xa2kv\xa1a", b"\xd9\x02kv\xa1a")]:   # a short str in a str8 header
        assert good.count(old) == 1
        assert check_same(good.replace(old, new)) is None


# --- the core ---------------------------------------------------------------------------------
def _scan_txns(rng: random.Random, n: int, refusable: bool = False) -> list[Txn]:
    """Txns the scanner takes (each run of one origin contiguous), each run starting anywhere
    near what the core has (5): runs hold duplicates, an overlap, a gap or an expel bound."""
    out: list[Txn] = []
    for _ in range(n):
        prev = out[-1] if out else None
        rid = rng.choice((7, 3)) if rng.random() < 0.3 else (prev.replica_id if prev else 7)
        lsn = prev.last_lsn + 1 if prev and prev.replica_id == rid else rng.choice((1, 3, 5, 6, 6, 6, 7, 9, 12))
        odd = refusable and rng.random() < 0.05                # a row the core must refuse
        space = rng.choice(("nope", "loc")) if odd and rng.random() < 0.6 else "s"
        ops = tuple(Op(OP_PUT, space, f"k{lsn}.{j}", j) for j in range(rng.choice((1, 1, 2, 3))))
        ts = AHEAD + 1 if odd and space == "s" else rng.randint(0, 10**6)
        out.append(Txn(rid, lsn, GROUP_DEFAULT, ts, ops))
    return out


@pytest.mark.parametrize("scanner", sorted(SCANNERS))
@pytest.mark.parametrize("seed", range(150))
def test_receive_scan_decides_as_one_by_one(seed, scanner):
    rng = random.Random(seed)
    expelled = None if seed % 3 else rng.randint(5, 40)
    txns = _scan_txns(rng, rng.randint(1, 40), refusable=True)
    scan = SCANNERS[scanner](message([txns]))
    assert scan is not None
    a, b = _core(expelled), _core(expelled)
    ranges: list = []
    refused = ""
    try:
        rows = a.receive_scan(PEER, scan, ranges, WALL)
        if rows is None:                # the core wants it decided exactly: nothing claimed
            assert not ranges and a.claimed == b.claimed
            assert any(t.timestamp > AHEAD or op.space != "s" for t in txns for op in t.ops)
            return
    except RemoteProtocolError:
        refused = "refused"
    got = PackedEntry(scan, ranges).txns if ranges else []
    if refused:
        rows = sum(len(t.ops) for t in got)
    assert (got, rows, refused) == _ref_all(b, txns), f"seed {seed}"
    assert a.claimed == b.claimed
    assert a.hlc.last == b.hlc.last
    assert a.peers[PEER].stats == b.peers[PEER].stats


# --- the journal entry ------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(40))
def test_packed_entry_is_its_txns(seed):
    rng = random.Random(seed)
    txns = _scan_txns(rng, rng.randint(1, 20))
    cuts = sorted(rng.sample(range(1, len(txns)), min(len(txns) - 1, rng.randint(0, 3))))
    frames = [txns[a:b] for a, b in zip([0] + cuts, cuts + [len(txns)])]
    scan = rowscan.scan_rows(message(frames))
    runs = scan.runs()
    ranges = []
    for rid, a, b in runs:                     # a part of each run, as the core may take
        x = rng.randint(a, b - 1)
        ranges.append((x, rng.randint(x + 1, b), rid * 10))
    entry = PackedEntry(scan, ranges)
    every = scan_rows_py(message(frames)).txns
    txns = [t.with_replica_id(rid) for a, b, rid in ranges for t in every[a:b]]
    assert entry.txns == txns
    assert entry.frame_payload(123) == codec.pack([123, txns])
    assert entry.rows == sum(len(t.ops) for t in txns) and entry.ntxn == len(txns)
    for c, last in entry.tops.items():
        assert last == max(t.last_lsn for t in txns if t.replica_id == c)
    for sub, own in subscribers(rng, txns):     # relay filtering
        want = [relay_wants(t, sub, own) for t in txns]
        assert entry.wanted(sub, own) == (True if all(want) else False if not any(want) else None), (sub, own)


def subscribers(rng: random.Random, txns: list[Txn], n: int = 40):
    """(sub vclock, own cut) of `n` subscribers anywhere around `txns`."""
    for _ in range(n):
        sub = {t.replica_id: rng.randint(0, t.last_lsn + 1) for t in txns if rng.random() < 0.8}
        own = None
        if rng.random() < 0.6:                 # the subscriber is one origin; its cut a txn boundary
            o = rng.choice(txns)
            own = (o.replica_id, rng.choice([t.last_lsn for t in txns if t.replica_id == o.replica_id]
                                            + [o.lsn - 1, 0, 10**9]))
        yield sub, own


# --- the store --------------------------------------------------------------------------------
SELF = "u-self"
ORIGINS = {1: SELF, 2: "u-two", 3: "u-three"}


def _store(path: str) -> Store:
    s = Store(path)
    for rid, u in ORIGINS.items():
        s.put_cluster_member(Member(u, rid, "", STATE_MEMBER))
    s.apply([TxnEntry([Txn(1, 1, GROUP_DEFAULT, 1, (Op(OP_SPACE, "lww", "", {"local": False, "conflict": "lww"}),
                                                    Op(OP_SPACE, "arr", "", {"local": False, "conflict": "apply"})))])],
            SELF, 1)
    return s


def _dump(s: Store) -> dict:
    out = {}
    with s.env.begin() as t:
        for name in ("lww", "arr"):
            out[name] = list(t.cursor(db=s._dbs[name]))
        out["vclock"] = s.vclock.to_dict()
    return out


@pytest.mark.parametrize("seed", range(30))
def test_applying_a_packed_entry_leaves_what_apply_txns_leaves(tmp_path, seed):
    rng = random.Random(seed)
    a, b = _store(str(tmp_path / "a")), _store(str(tmp_path / "b"))
    keys = [f"k{i}" for i in range(12)]

    def ops(n: int) -> tuple:
        return tuple(Op(rng.choice((OP_PUT, OP_PUT, OP_DELETE, OP_NOP)), rng.choice(("lww", "arr")),
                        rng.choice(keys), None) for _ in range(n))

    # existing records from several origins and times, so LWW has old records to weigh
    lsn = {2: 1, 3: 1}
    before = []
    for _ in range(10):
        rid = rng.choice((2, 3))
        o = tuple(x._replace(value=rng.randint(0, 9)) if x.kind == OP_PUT else x for x in ops(rng.randint(1, 3)))
        before.append(Txn(rid, lsn[rid], GROUP_DEFAULT, rng.randint(1, 100), o))
        lsn[rid] += len(o)
    for s in (a, b):
        s.apply([TxnEntry(before)], SELF, 100)
    wire = []
    for _ in range(rng.randint(1, 12)):        # then a message: same keys again, older and newer
        rid = rng.choice((2, 3))
        o = tuple(x._replace(value={"v": rng.randint(0, 9)}) if x.kind == OP_PUT else x for x in ops(rng.randint(1, 3)))
        wire.append(Txn(rid, lsn[rid], GROUP_DEFAULT, rng.randint(1, 100), o))
        lsn[rid] += len(o)
    scan = rowscan.scan_rows(message([wire]))
    ranges = [(x, y, rid) for rid, x, y in scan.runs()]
    tops_a = a.apply([PackedEntry(scan, ranges)], SELF, 100)
    tops_b = b.apply([TxnEntry(wire)], SELF, 100)
    assert tops_a == tops_b
    assert _dump(a) == _dump(b)


def test_a_packed_entry_for_an_unknown_space_fails_as_apply_txns_does(tmp_path):
    s = _store(str(tmp_path / "s"))
    wire = [Txn(2, 1, GROUP_DEFAULT, 5, (Op(OP_PUT, "nope", "a", 1),))]
    scan = rowscan.scan_rows(message([wire]))
    with pytest.raises(StorageError, match="row 2:1 writes unknown space 'nope'"):
        s.apply([PackedEntry(scan, [(0, 1, 2)])], SELF, 5)
    with pytest.raises(StorageError, match="row 2:1 writes unknown space 'nope'"):
        s.apply([TxnEntry(wire)], SELF, 5)
    assert s.vclock.get(2) == 0, "nothing of a failed batch stays"


def test_a_subscriber_gets_its_own_rows_back_only_up_to_the_cut():
    t = Txn(4, 10, GROUP_DEFAULT, 1, (Op(OP_PUT, "kv", "a", 1), Op(OP_PUT, "kv", "b", 1)))    # lsns 10-11
    assert relay_wants(t, {4: 9}, (4, 11)), "before the cut: what it may have lost"
    assert not relay_wants(t, {4: 9}, (4, 9)), "past the cut: it wrote that itself since"
    assert not relay_wants(t, {4: 11}, (4, 11)), "it has them"
    assert relay_wants(t, {4: 9}, (5, 0)), "another member's cut says nothing of origin 4"
