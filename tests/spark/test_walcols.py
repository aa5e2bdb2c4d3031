"""spark.walcols: the native split reader (spark._walcols) against the pure-Python reference,
on generated WALs, on damaged files and on hand-made frames: the same columns, the same
`_cluster` moves, the same errors (file and byte offset)."""
from __future__ import annotations

import os
import re
import shutil
import zlib

import msgpack
import pytest
from crc32c import crc32c

from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_CLUSTER, OP_PUT
from node.wal import format as fmt
from spark import walcols, walread
from tests.spark.conftest import SPLIT_BYTES, node_dirs

native = walcols.native()
pytestmark = pytest.mark.skipif(native is None, reason="spark._walcols is not built (pip install -e .)")


def _plain(c: walcols.SplitColumns) -> dict:
    """Columns as lists, origins as uuids (the two readers may number origins differently)."""
    d = {f: (v.tolist() if hasattr(v, "tolist") else v.to_pylist() if hasattr(v, "to_pylist") else v)
         for f, v in zip(c._fields, c)}
    d["t_origin"] = [c.origins[k] if k >= 0 else None for k in d.pop("t_origin")]
    del d["origins"]
    return d


def _outcome(split: walread.Split, pure: bool):
    """The reader's columns, or its error cut after the byte offset it names."""
    try:
        return _plain(walcols.read_split_columns(split, pure=pure))
    except walread.WalInputError as e:
        m = re.match(r"(.*? at byte \d+)", str(e))
        return ("error", m.group(1) if m else str(e))


def _splits(d: str, split_bytes: int) -> list[walread.Split]:
    return [s for seg in walread.node_segments(d) for s in walread.plan_segment(seg, split_bytes)]


@pytest.mark.parametrize("split_bytes", [SPLIT_BYTES, 1 << 30])
def test_native_and_python_readers_give_the_same_columns(healthy, corrupted, split_bytes):
    for root, m in (healthy, corrupted):
        for d in node_dirs(root, m):
            for s in _splits(d, split_bytes):
                a, b = _outcome(s, pure=False), _outcome(s, pure=True)
                assert isinstance(a, dict) and a == b, s


def test_native_content_hash_is_the_hash_of_the_op_as_packed():
    for data in (b"", b"a", b"123456789", bytes(range(256)) * 5):
        assert native.crc32c(data) == crc32c(data)
        assert native.crc32(data) == zlib.crc32(data)


def test_crc32c_by_the_cpu_instruction_equals_the_tables_at_every_length_and_alignment():
    """Where the CPU has a CRC32 instruction the native reader uses it (checked at import);
    the tables stay its fallback: both agree with the crc32c package."""
    data = bytes(range(256)) * 3
    for start in range(8):
        for n in (0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 300):
            piece = data[start:start + n]
            assert native.crc32c(piece) == native.crc32c_table(piece) == crc32c(piece), (start, n)


def test_damaged_segments_give_the_same_error_from_both_readers(healthy, tmp_path):
    root, m = healthy
    src = os.path.join(root, m["nodes"][1]["dir"])
    seg = walread.node_segments(src)[0]
    size = os.path.getsize(seg.path)
    splits = walread.plan_segment(seg, SPLIT_BYTES)
    frame = splits[1].start                       # a frame boundary inside the segment
    damages = {
        "flipped body byte": lambda b: b.__setitem__(frame + 20, b[frame + 20] ^ 0x40),
        "bad magic": lambda b: b.__setitem__(frame, 0),
        "impossible length": lambda b: b.__setitem__(slice(frame + 4, frame + 8), b"\xff\xff\xff\x7f"),
        "longer length": lambda b: b.__setitem__(frame + 4, (b[frame + 4] + 1) % 256),
        "flipped crc": lambda b: b.__setitem__(frame + 8, b[frame + 8] ^ 1),
        "cut short": lambda b: b.__delitem__(slice(size - 5, size)),
        "cut in a header": lambda b: b.__delitem__(slice(frame + 6, size)),
    }
    for name, damage in damages.items():
        with open(seg.path, "rb") as f:
            data = bytearray(f.read())
        damage(data)
        path = str(tmp_path / f"{name.replace(' ', '-')}.wal")
        with open(path, "wb") as f:
            f.write(data)
        errors = 0
        for s in splits:                            # planned on the whole file: read as given
            s = s._replace(path=path)
            a, b = _outcome(s, pure=False), _outcome(s, pure=True)
            assert a == b, (name, s.start)
            errors += isinstance(a, tuple)
        assert errors, name


# --- hand-made frames: valid checksums, payloads that are not what replog writes -------------------
ME, OTHER, NEW = "u-me", "u-other", "u-new"


def _op(kind=OP_PUT, space="s", key="k", value=None) -> list:
    return [kind, space, key, {"v": 1} if value is None else value]


def _txn(rid=2, lsn=5, group=GROUP_DEFAULT, ts=100, ops=None) -> list:
    return [rid, lsn, group, ts, [_op()] if ops is None else ops]


def _claim(uuid: str, rid: int) -> list:
    return [OP_CLUSTER, "_cluster", uuid, {"id": rid, "address": "", "state": "member"}]


def _nested_value(depth: int) -> bytes:
    """A frame whose op value is `depth` arrays around an int: the int sits at nesting depth
    5 + depth of the payload (payload, txns, txn, ops, op, then the value's own arrays)."""
    head = msgpack.packb([7, [_txn(ops=[_op(value=0)])]])[:-1]      # up to the value (the 0)
    return head + b"\x91" * depth + b"\x01"


GOOD = _txn()
FRAMES = {
    "good": [msgpack.packb([7, [GOOD, _txn(group=GROUP_LOCAL, rid=0)]])],
    "cluster moves the table mid-split": [
        msgpack.packb([7, [_txn(rid=3)]]),
        msgpack.packb([8, [_txn(rid=1, group=GROUP_CLUSTER, ops=[_claim(NEW, 3)]), _txn(rid=3)]]),
        msgpack.packb([9, [_txn(rid=3), _txn(rid=2, group=GROUP_CLUSTER, ops=[_claim("u-x", 4)]), _txn(rid=4)]])],
    "not msgpack": [b"\xc1\x00"],
    "trailing bytes": [msgpack.packb([7, [GOOD]]) + b"\x00"],
    "payload not a pair": [msgpack.packb([7, [GOOD], 1])],
    "written_us bool": [msgpack.packb([True, [GOOD]])],
    "written_us beyond int64": [msgpack.packb([1 << 63, [GOOD]])],
    "txns not a list": [msgpack.packb([7, {"a": 1}])],
    "bad utf-8 in a value": [msgpack.packb([7, [GOOD]])[:-1] + b"\xa1\xff"],
    "truncated msgpack": [msgpack.packb([7, [GOOD]])[:-2]],
    "txn of 4": [msgpack.packb([7, [GOOD[:4]]])],
    "txn a map": [msgpack.packb([7, [{1: 2, 3: 4, 5: 6, 7: 8, 9: 10}]])],
    "no ops": [msgpack.packb([7, [_txn(ops=[])]])],
    "op of 3": [msgpack.packb([7, [_txn(ops=[_op()[:3]])]])],
    "op a map": [msgpack.packb([7, [_txn(ops=[{OP_PUT: 1, "s": 2, "k": 3, "v": 4}])]])],
    "unknown kind": [msgpack.packb([7, [_txn(ops=[_op(kind=99)])]])],
    "kind bool": [msgpack.packb([7, [_txn(ops=[_op(kind=True)])]])],
    "space bytes": [msgpack.packb([7, [_txn(ops=[_op(space=b"s")])]], use_bin_type=True)],
    "key int": [msgpack.packb([7, [_txn(ops=[_op(key=1)])]])],
    "unknown group": [msgpack.packb([7, [_txn(group=7)]])],
    "lsn bool": [msgpack.packb([7, [_txn(lsn=False)]])],
    "lsn float": [msgpack.packb([7, [_txn(lsn=1.0)]])],
    "lsn beyond int64": [msgpack.packb([7, [_txn(lsn=1 << 63)]])],
    "rid str": [msgpack.packb([7, [_txn(rid="2")]])],
    "timestamp nil": [msgpack.packb([7, [_txn(ts=None)]])],
    "second txn bad after a cluster move": [
        msgpack.packb([7, [_txn(rid=1, group=GROUP_CLUSTER, ops=[_claim(NEW, 3)]), _txn(lsn="x")]])],
    "malformed _cluster value": [msgpack.packb([7, [_txn(rid=1, group=GROUP_CLUSTER, ops=[[OP_CLUSTER, "_cluster", NEW, {}]])]])],
    "bad _cluster row before a bad frame": [
        msgpack.packb([7, [_txn(rid=1, group=GROUP_CLUSTER, ops=[[OP_CLUSTER, "_cluster", NEW, {}]])]]), b"\xc1"],
    "bad frame after a good one": [msgpack.packb([7, [GOOD]]), msgpack.packb([8, [GOOD[:2]]])],
    # msgpack's own nesting limit (1024 containers deep), which the native reader keeps too
    "value nested to the limit": [_nested_value(1019)],
    "value nested past the limit": [_nested_value(1020)],
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_hand_made_frames_give_the_same_result_from_both_readers(tmp_path, name):
    header = fmt.SegmentHeader(fmt.FORMAT_VERSION, ME, {1: 0}, [[ME, 1, "", "member"], [OTHER, 2, "", "member"]], 0.0)
    first = header.to_bytes()
    data = first + b"".join(fmt.encode_frame_body(body) for body in FRAMES[name])
    path = str(tmp_path / "00000000000000000000.wal")
    with open(path, "wb") as f:
        f.write(data)
    table = ((1, ME), (2, OTHER))
    split = walread.Split(path, "00000000000000000000.wal", 0, True, len(first), len(data), ME, 1, table)
    a, b = _outcome(split, pure=False), _outcome(split, pure=True)
    assert a == b
    assert isinstance(a, tuple) == (name not in ("good", "cluster moves the table mid-split", "value nested to the limit")), a
    if name == "cluster moves the table mid-split":
        assert a["t_origin"] == [None, ME, NEW, NEW, OTHER, None]
    if isinstance(a, tuple):
        assert a[1].startswith(path + ": ") and "at byte" in a[1], a


def test_a_reader_that_cannot_load_the_extension_falls_back_to_python(healthy, monkeypatch):
    root, m = healthy
    s = _splits(node_dirs(root, m)[0], SPLIT_BYTES)[0]
    monkeypatch.setattr(walcols, "native", lambda: None)
    assert _plain(walcols.read_split_columns(s)) == _outcome(s, pure=False)


def test_an_executor_finds_the_shipped_extension_on_its_path(tmp_path, monkeypatch):
    """A Spark executor imports `spark` from the job's zip: the extension comes as a file of
    Spark's, in a directory on sys.path."""
    import sys
    d = tmp_path / "userFiles"
    d.mkdir()
    shutil.copy(native.__file__, d / os.path.basename(native.__file__))
    monkeypatch.delitem(sys.modules, walcols.NATIVE_MODULE)     # restored after the test
    assert walcols._import_shipped([str(tmp_path), str(d)]).__file__ == str(d / os.path.basename(native.__file__))
    assert walcols._import_shipped([str(tmp_path)]) is None
