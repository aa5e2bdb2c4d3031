"""The WAL (node/wal/): segments written by WalWriter and read back by the reader,
rotation by size with self-describing headers, torn tails and torn headers cut off by
recovery, damage before the end refused (or skipped under force_recovery), and the
`replog wal verify` / `replog wal dump` commands."""

import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from helpers import (ADDR_A, UUID_A, UUID_B, UUID_C, WalBuilder, cluster_txn, local_put_txn, open_store,
                     put_txn, segment_paths, space_txn, wal_txns)
from node.core.rows import GROUP_LOCAL, OP_SPACE, Op, Txn, txn_from_wire
from node.errors import RecoveryError
from node.wal import format as fmt
from node.wal.reader import SegmentScan, iter_segment, iter_wal, list_segments, read_header
from node.wal.recovery import recover
from node.wal.writer import WalWriter

REPO = pathlib.Path(__file__).resolve().parents[2]
REPLOG = str(REPO / ".venv" / "bin" / "replog")


def base_txns(n_puts: int) -> list[Txn]:
    """The bootstrap `_cluster` row, a space, then n_puts single-row puts (lsns 3..)."""
    out = [cluster_txn(1, 1, (UUID_A, 1)), space_txn(1, 2, "data")]
    out += [put_txn(1, 3 + i, "data", (f"k{i}", f"v{i}")) for i in range(n_puts)]
    return out


def write_wal(wal_dir, txns, **kw) -> WalBuilder:
    b = WalBuilder(wal_dir, **kw)
    for t in txns:
        b.write(t)
    b.close()
    return b


def truncate(path, size) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def flip_bit(path, offset, bit) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


# --- writing and reading back ------------------------------------------------------------

def test_frames_written_by_the_writer_read_back_in_order(tmp_path):
    txns = base_txns(5) + [Txn(1, 8, 0, 5, (Op(1, "data", "multi", [1, {"x": None}]),
                                           Op(2, "data", "k0", None)))]
    b = write_wal(tmp_path, txns)
    assert wal_txns(tmp_path) == txns
    [seg] = list_segments(str(tmp_path))
    scan = SegmentScan(seg, None)
    refs = list(iter_segment(os.path.join(tmp_path, seg), is_last=True, scan=scan))
    assert [(r.offset, r.end) for r in refs] == [(s, e) for _, s, e in b.frames]
    assert scan.frames == len(txns) and scan.torn_at is None and scan.skipped == []
    assert scan.valid_end == os.path.getsize(os.path.join(tmp_path, seg)) == b.frames[-1][2]


def test_write_batch_of_several_frames_is_read_as_several_frames(tmp_path):
    w = WalWriter(str(tmp_path), "write", UUID_A)
    w.rotate({}, [[UUID_A, 1, ADDR_A, "member", 0]])
    txns = base_txns(3)
    data = b"".join(fmt.encode_frame([t.to_wire()], 7) for t in txns)
    seg, start, end = w.write_batch(data)
    w.close()
    assert end - start == len(data) and end == os.path.getsize(tmp_path / seg)
    refs = [ref for _, ref in iter_wal(str(tmp_path))]
    assert len(refs) == len(txns)
    assert [fmt.unpack_frame(r.body)[0] for r in refs] == [7] * len(txns)
    assert wal_txns(tmp_path) == txns


def test_rotation_by_size_names_segments_by_signature_and_headers_describe_their_start(tmp_path):
    seg_max = 400
    b = WalBuilder(tmp_path, segment_bytes_max=seg_max)
    txns = [cluster_txn(1, 1, (UUID_A, 1)), space_txn(1, 2, "data")]
    for t in txns:
        b.write(t)
    t = cluster_txn(1, 3, (UUID_B, 2))            # this node registers B as id 2
    b.write(t)
    txns.append(t)
    b.cluster.append([UUID_B, 2, "", "member", 3])
    lsn1, lsn2 = 4, 1
    for i in range(30):
        if i % 3 == 2:
            t = put_txn(2, lsn2, "data", (f"b{i}", i))
            lsn2 += 1
        elif i % 5 == 4:
            t = local_put_txn(1, i, "data", (f"l{i}", i))   # component 0
        else:
            t = put_txn(1, lsn1, "data", (f"a{i}", "x" * 20))
            lsn1 += 1
        b.write(t)
        txns.append(t)
    b.close()

    names = list_segments(str(tmp_path))
    assert len(names) >= 4
    assert names == [seg for seg, _, _ in b.rotations]
    assert names == sorted(names)
    # Every header states the vclock that the segments before it end at, and the
    # segment is named by that vclock's signature.
    seen: dict[int, int] = {}
    paths = segment_paths(tmp_path)
    for i, path in enumerate(paths):
        hdr = read_header(path)
        assert hdr.version == fmt.FORMAT_VERSION
        assert hdr.uuid == UUID_A
        assert hdr.vclock == seen
        assert os.path.basename(path) == fmt.segment_name(sum(hdr.vclock.values()))
        # the node's own `_cluster` at the segment's start
        assert [r[:2] for r in hdr.cluster] == ([[UUID_A, 1]] if i == 0 else [[UUID_A, 1], [UUID_B, 2]])
        for ref in iter_segment(path, is_last=i == len(paths) - 1):
            for raw in fmt.unpack_frame(ref.body)[1]:
                t = txn_from_wire(raw)
                seen[t.component] = t.last_lsn
    assert 0 in seen and seen[1] == lsn1 - 1 and seen[2] == lsn2 - 1
    # rotation by size: a segment is closed by the first frame that takes it past the limit
    for path in segment_paths(tmp_path)[:-1]:
        refs = list(iter_segment(path, is_last=False))
        assert refs[-1].end >= seg_max > refs[-1].offset
    assert wal_txns(tmp_path) == txns


def test_iter_wal_from_a_signature_skips_segments_that_end_before_it(tmp_path):
    b = write_wal(tmp_path, base_txns(20), segment_bytes_max=300)
    sigs = [sum(vc.values()) for _, vc, _ in b.rotations]
    assert len(sigs) >= 3
    frames = [ref for _, ref in iter_wal(str(tmp_path), first_signature=sigs[2])]
    assert {r.segment for r in frames} == set(list_segments(str(tmp_path))[2:])


def test_rotating_an_empty_segment_reuses_its_name(tmp_path):
    w = WalWriter(str(tmp_path), "write", UUID_A)
    w.rotate({1: 2}, [])
    w.rotate({1: 2}, [[UUID_A, 1, ADDR_A, "member", 0]])
    w.close()
    assert list_segments(str(tmp_path)) == [fmt.segment_name(2)]
    assert read_header(segment_paths(tmp_path)[0]).cluster == [[UUID_A, 1, ADDR_A, "member", 0]]


# --- torn tail ---------------------------------------------------------------------------------

def test_a_torn_last_frame_is_cut_at_every_byte_offset(tmp_path, caplog):
    base = tmp_path / "base"
    txns = base_txns(3)
    b = write_wal(base, txns)
    [seg] = list_segments(str(base))
    start, end = b.frames[-1][1], b.frames[-1][2]
    assert end - start > fmt.FRAME_OVERHEAD
    replacement = put_txn(1, txns[-1].lsn, "data", ("after", "cut"))
    for cut in range(start + 1, end):
        caplog.clear()
        wal_dir = tmp_path / f"cut{cut}" / "wal"
        shutil.copytree(base, wal_dir)
        path = str(wal_dir / seg)
        truncate(path, cut)
        store = open_store(tmp_path / f"cut{cut}" / "store")
        with caplog.at_level(logging.WARNING, logger="replog.recovery"):
            res = recover(store, str(wal_dir), UUID_A)
        # recovery cuts it and says where
        assert res.torn == [(seg, start)], cut
        assert res.last_segment == seg and res.last_valid_end == start
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(path in m and f"byte {start}" in m for m in warnings), warnings
        # every earlier frame is intact and applied; the torn one is not
        assert res.replayed_txns == len(txns) - 1
        assert store.vclock.to_dict() == {1: txns[-2].last_lsn}
        assert store.get("data", "k0").value == "v0"
        assert store.get("data", "k1").value == "v1"
        assert store.get("data", "k2") is None
        # the writer continues after the last whole frame
        w = WalWriter(str(wal_dir), "write", UUID_A)
        w.open_last(res.last_valid_end)
        assert os.path.getsize(path) == start
        assert not w.needs_rotation
        w.write_batch(fmt.encode_frame([replacement.to_wire()], 1))
        w.close()
        assert wal_txns(wal_dir) == txns[:-1] + [replacement]
        again = recover(store, str(wal_dir), UUID_A)
        assert again.torn == [] and again.replayed_txns == 1
        assert store.get("data", "after").value == "cut"
        store.close()


def test_a_wal_cut_exactly_between_frames_is_not_torn(tmp_path):
    txns = base_txns(3)
    b = write_wal(tmp_path, txns)
    [path] = segment_paths(tmp_path)
    truncate(path, b.frames[-1][1])
    store = open_store(tmp_path / "store")
    res = recover(store, str(tmp_path), UUID_A)
    assert res.torn == [] and res.replayed_txns == len(txns) - 1
    assert res.last_valid_end == b.frames[-1][1]


def test_a_torn_header_of_a_new_last_segment_is_dropped(tmp_path):
    base = tmp_path / "base"
    txns = base_txns(3)
    b = write_wal(base, txns)
    b.w.rotate(b.vclock.to_dict(), b.cluster)      # a new segment, crash while creating it
    b.close()
    first, second = list_segments(str(base))
    header_len = os.path.getsize(base / second)
    nxt = put_txn(1, txns[-1].last_lsn + 1, "data", ("next", 1))
    # every cut inside the fixed part (magic, length, crc), then a spread of cuts through
    # the msgpack body (each case creates a segment with real fsyncs, so not all of them)
    cuts = sorted(set(range(0, 18)) | set(range(18, header_len, 7)) | {header_len - 1})
    for cut in cuts:
        wal_dir = tmp_path / f"cut{cut}" / "wal"
        shutil.copytree(base, wal_dir)
        truncate(wal_dir / second, cut)
        store = open_store(tmp_path / f"cut{cut}" / "store")
        res = recover(store, str(wal_dir), UUID_A)
        assert res.torn == [(second, 0)], cut
        assert res.last_segment == second and res.last_valid_end == 0
        assert res.replayed_txns == len(txns)
        assert store.vclock.to_dict() == {1: txns[-1].last_lsn}
        w = WalWriter(str(wal_dir), "write", UUID_A)
        w.open_last(res.last_valid_end)
        assert list_segments(str(wal_dir)) == [first]     # the headless file is gone
        assert w.needs_rotation
        w.rotate(store.vclock.to_dict(), store.table.rows())
        w.write_batch(fmt.encode_frame([nxt.to_wire()], 1))
        w.close()
        assert list_segments(str(wal_dir)) == [first, second]
        assert wal_txns(wal_dir) == txns + [nxt]
        store.close()


def test_a_torn_header_in_a_segment_that_is_not_the_last_refuses(tmp_path):
    write_wal(tmp_path, base_txns(12), segment_bytes_max=300)
    paths = segment_paths(tmp_path)
    assert len(paths) >= 3
    truncate(paths[1], 10)
    with pytest.raises(RecoveryError) as e:
        list(iter_wal(str(tmp_path)))
    assert paths[1] in str(e.value)


def test_a_torn_frame_at_the_end_of_a_segment_that_is_not_the_last_refuses(tmp_path):
    b = write_wal(tmp_path, base_txns(12), segment_bytes_max=300)
    paths = segment_paths(tmp_path)
    last_frame_of_first = [f for f in b.frames if f[0] == os.path.basename(paths[0])][-1]
    truncate(paths[0], last_frame_of_first[2] - 1)
    with pytest.raises(RecoveryError) as e:
        list(iter_wal(str(tmp_path)))
    assert paths[0] in str(e.value) and f"byte {last_frame_of_first[1]}" in str(e.value)


# --- damage before the end -----------------------------------------------------------------------

def _damaged_wal(tmp_path):
    txns = base_txns(6)
    b = write_wal(tmp_path / "wal", txns)
    [path] = segment_paths(tmp_path / "wal")
    return txns, b, path


def test_a_flipped_bit_anywhere_in_a_middle_frame_is_refused_naming_file_and_offset(tmp_path):
    txns, b, path = _damaged_wal(tmp_path)
    idx = 4
    _, start, end = b.frames[idx]
    pristine = pathlib.Path(path).read_bytes()
    for pos in range(start, end):
        pathlib.Path(path).write_bytes(pristine)
        flip_bit(path, pos, pos % 8)
        with pytest.raises(RecoveryError) as e:
            list(iter_wal(str(tmp_path / "wal")))
        msg = str(e.value)
        assert path in msg and f"byte {start}" in msg and "force-recovery" in msg, (pos, msg)
        # force_recovery skips exactly that frame and reads every frame after it
        scans = []
        got = [t for _, ref in iter_wal(str(tmp_path / "wal"), force_recovery=True, on_scan=scans.append)
               for t in fmt.unpack_frame(ref.body)[1]]
        assert got == [t.to_wire() for i, t in enumerate(txns) if i != idx], pos
        assert scans[0].skipped == [start]


def test_recovery_refuses_a_damaged_frame_and_force_recovery_skips_it(tmp_path):
    txns, b, path = _damaged_wal(tmp_path)
    idx = 3
    _, start, end = b.frames[idx]
    flip_bit(path, (start + end) // 2, 3)
    store = open_store(tmp_path / "store")
    with pytest.raises(RecoveryError) as e:
        recover(store, str(tmp_path / "wal"), UUID_A)
    assert path in str(e.value) and f"byte {start}" in str(e.value)
    assert store.vclock.to_dict() == {}          # refused before applying anything
    res = recover(store, str(tmp_path / "wal"), UUID_A, force_recovery=True)
    seg = os.path.basename(path)
    assert res.skipped == [(seg, start)] and res.torn == []
    assert res.replayed_txns == len(txns) - 1
    lost = txns[idx].ops[0].key
    assert store.get("data", lost) is None
    for t in txns[idx + 1:]:                     # the frames after the damage are read
        assert store.get("data", t.ops[0].key).value == t.ops[0].value
    assert store.vclock.to_dict() == {1: txns[-1].last_lsn}


def test_damage_in_the_very_last_frame_is_indistinguishable_from_a_torn_write_and_is_cut(tmp_path):
    txns, b, path = _damaged_wal(tmp_path)
    _, start, end = b.frames[-1]
    flip_bit(path, end - 1, 0)
    store = open_store(tmp_path / "store")
    res = recover(store, str(tmp_path / "wal"), UUID_A)
    assert res.torn == [(os.path.basename(path), start)]
    assert res.replayed_txns == len(txns) - 1


# --- replog wal verify / dump ---------------------------------------------------------------------

def run_replog(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLOG_")}
    exe = REPLOG if os.path.exists(REPLOG) else None
    cmd = [exe, *args] if exe else [sys.executable, "-m", "node.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=str(REPO))


def test_wal_verify_exit_codes(tmp_path):
    good = tmp_path / "good" / "wal"
    write_wal(good, base_txns(4), segment_bytes_max=250)
    r = run_replog("wal", "verify", str(tmp_path / "good"))      # a data dir holding wal/
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1].endswith("OK")

    torn = tmp_path / "torn"
    b = write_wal(torn, base_txns(4))
    truncate(segment_paths(torn)[-1], b.frames[-1][2] - 3)
    r = run_replog("wal", "verify", str(torn))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"torn tail at byte {b.frames[-1][1]}" in r.stdout

    bad = tmp_path / "bad"
    b = write_wal(bad, base_txns(4))
    [path] = segment_paths(bad)
    flip_bit(path, b.frames[2][1] + fmt.FRAME_OVERHEAD + 1, 5)
    r = run_replog("wal", "verify", str(bad))
    assert r.returncode == 1, r.stdout + r.stderr
    assert path in r.stdout and f"byte {b.frames[2][1]}" in r.stdout
    assert "Traceback" not in r.stderr

    (tmp_path / "empty").mkdir()
    assert run_replog("wal", "verify", str(tmp_path / "empty")).returncode == 1
    r = run_replog("wal", "verify", str(tmp_path / "missing"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def _node_a_wal(wal_dir) -> WalBuilder:
    """Node A's WAL: its own `_cluster` rows give B id 2 and C id 3; B's own `_cluster`
    rows (replicated, in B's ids: B=1, A=2, C=4) must not change A's table."""
    b = WalBuilder(wal_dir)
    b.write(cluster_txn(1, 1, (UUID_A, 1)))
    b.write(space_txn(1, 2, "data"))
    b.write(Txn(1, 1, GROUP_LOCAL, 5, (Op(OP_SPACE, "notes", "", {"local": True, "conflict": "lww"}),)))
    b.write(put_txn(1, 3, "data", ("a", 1)))
    b.write(cluster_txn(1, 4, (UUID_B, 2)))
    b.write(cluster_txn(2, 1, (UUID_B, 1), (UUID_A, 2)))          # B's rows, B's ids
    b.write(put_txn(2, 2, "data", ("b", 2)))
    b.write(put_txn(1, 5, "data", ("c", 3), ("c2", 4)))
    b.write(cluster_txn(2, 3, (UUID_C, 4)), cluster_txn(1, 6, (UUID_C, 3)))   # one frame
    b.write(put_txn(3, 1, "data", ("d", 5)))
    b.write(local_put_txn(1, 2, "notes", ("n", 6)))
    b.cluster = [[UUID_A, 1, ADDR_A, "member", 1], [UUID_B, 2, "", "member", 4], [UUID_C, 3, "", "member", 6]]
    b.w.rotate(b.vclock.to_dict(), b.cluster)
    b.write(put_txn(2, 4, "data", ("e", 7)))
    b.write(put_txn(3, 2, "data", ("f", 8)))
    b.close()
    return b


def test_wal_dump_prints_json_lines_with_the_origin_resolved_through_this_nodes_cluster(tmp_path):
    b = _node_a_wal(tmp_path / "node" / "wal")
    r = run_replog("wal", "dump", str(tmp_path / "node"))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert all(row["node"] == UUID_A for row in rows)
    puts = {row["key"]: row for row in rows if row["op"] == "put"}
    assert {k: puts[k]["origin"] for k in puts} == {
        "a": UUID_A, "b": UUID_B, "c": UUID_A, "c2": UUID_A, "d": UUID_C, "n": UUID_A, "e": UUID_B, "f": UUID_C}
    assert puts["n"]["group"] == "local" and puts["a"]["group"] == "default"
    # a two-row transaction: consecutive lsns, one commit at its end
    assert (puts["c"]["lsn"], puts["c"]["tsn"], puts["c"]["commit"]) == (5, 5, False)
    assert (puts["c2"]["lsn"], puts["c2"]["tsn"], puts["c2"]["commit"]) == (6, 5, True)
    assert puts["d"]["replica_id"] == 3 and puts["d"]["value"] == 5 and puts["d"]["space"] == "data"
    first, second = list_segments(str(tmp_path / "node" / "wal"))
    assert puts["a"]["segment"] == first and puts["e"]["segment"] == second
    assert puts["a"]["offset"] == b.frames[3][1]
    assert puts["a"]["written_us"] == 1_700_000_000_000_000
    clusters = [row for row in rows if row["op"] == "cluster"]
    assert [(c["replica_id"], c["key"], c["value"]["id"]) for c in clusters] == [
        (1, UUID_A, 1), (1, UUID_B, 2), (2, UUID_B, 1), (2, UUID_A, 2), (2, UUID_C, 4), (1, UUID_C, 3)]


def test_wal_dump_of_a_later_segment_alone_resolves_through_its_header(tmp_path):
    _node_a_wal(tmp_path / "wal")
    os.unlink(segment_paths(tmp_path / "wal")[0])
    r = run_replog("wal", "dump", str(tmp_path / "wal"))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(row["key"], row["origin"]) for row in rows] == [("e", UUID_B), ("f", UUID_C)]


def test_wal_dump_of_a_damaged_wal_fails_with_one_line(tmp_path):
    b = write_wal(tmp_path, base_txns(4))
    [path] = segment_paths(tmp_path)
    flip_bit(path, b.frames[1][1] + 2, 1)
    r = run_replog("wal", "dump", str(tmp_path))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert path in r.stderr
