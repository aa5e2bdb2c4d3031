"""spark.walread and spark.generate without Spark: id translation through each node's own
`_cluster` history, splitting, positions, damage, determinism."""
from __future__ import annotations

import os
import re
import shutil

import pytest

from node.core.rows import OP_CLUSTER
from spark import generate, oracle, walcols, walread
from tests.spark.conftest import SPLIT_BYTES, flip_a_middle_byte, node_dirs

NODE, POSITION, ORIGIN = (walread.ROW_COLUMNS.index(c) for c in ("node_uuid", "position", "origin_uuid"))


def _final_vclocks(rows: list[tuple], bases: dict) -> dict[str, dict]:
    hist = oracle.vclock_history(rows, bases)
    last = {}
    for h in hist:
        last[h[0]] = (h[8], h[9])
    return last


def test_generated_cluster_gives_one_uuid_different_ids_on_different_nodes(healthy):
    _root, m = healthy
    ids_of = {}
    for n in m["nodes"]:
        for u, i in n["ids"].items():
            ids_of.setdefault(u, set()).add(i)
    assert any(len(s) > 1 for s in ids_of.values()), "the generator must remap some id"
    anon = next(n for n in m["nodes"] if n["anon"])
    masters = [n for n in m["nodes"] if not n["anon"]]
    # The anonymous replica's own id is an id the masters gave somebody else.
    assert any(n["ids"].get(anon["uuid"]) is None and anon["own_id"] in n["ids"].values() for n in masters)


def test_translated_vclocks_equal_the_generators_ground_truth(healthy):
    root, m = healthy
    rows, bases = oracle.read_rows(node_dirs(root, m))
    last = _final_vclocks(rows, bases)
    for n in m["nodes"]:
        want = {u: lsn for u, lsn in n["vclock"].items() if u != "local"}
        assert last[n["uuid"]] == (want, n["vclock"].get("local", 0)), n["name"]


def test_every_row_translates_to_a_known_member(healthy):
    root, m = healthy
    rows, _ = oracle.read_rows(node_dirs(root, m))
    members = {n["uuid"] for n in m["nodes"]}
    origins = {r[ORIGIN] for r in rows}
    assert None not in origins
    assert origins <= members
    # The anonymous replica is the origin of its own rows only, on its own node.
    anon = next(n["uuid"] for n in m["nodes"] if n["anon"])
    assert {r[NODE] for r in rows if r[ORIGIN] == anon} == {anon}


def test_followed_remote_cluster_row_does_not_change_the_table():
    me, other, member = "u-me", "u-other", "u-member"
    t = walread.NodeTable(me, [(1, me), (2, other)])
    assert t.own_id == 1
    claim = [[OP_CLUSTER, "_cluster", member, {"id": 3, "address": "", "state": "member"}]]
    t.follow(2, claim)                       # the other node's row: ITS id for the member
    assert 3 not in t.ids
    own = [[OP_CLUSTER, "_cluster", member, {"id": 4, "address": "", "state": "member"}]]
    t.follow(1, own)                         # our own row: our id for the member
    assert t.ids[4] == member and t.by_uuid[member] == 4


def test_a_node_without_itself_in_the_header_learns_its_id_from_self_registration():
    t = walread.NodeTable("u-me", [(1, "u-boot")])
    assert t.own_id is None
    t.follow(2, [[OP_CLUSTER, "_cluster", "u-me", {"id": 2, "address": "", "state": "member"}]])
    assert t.own_id == 2 and t.ids[2] == "u-me"


def test_splits_read_exactly_the_frames_of_whole_segments(healthy):
    root, m = healthy
    multi = 0
    for d in node_dirs(root, m):
        segs = walread.node_segments(d)
        splits = [s for seg in segs for s in walread.plan_segment(seg, SPLIT_BYTES)]
        per_seg = {}
        for s in splits:
            per_seg.setdefault(s.path, []).append(s)
        for seg in segs:
            parts = per_seg[seg.path]
            multi += len(parts) > 1
            assert parts[-1].end == os.path.getsize(seg.path)
            assert all(a.end == b.start for a, b in zip(parts, parts[1:]))
        from_splits = [rec for s in splits for rec in walread.read_split(s)]
        assert from_splits == list(walread.read_node_frames(d))
    assert multi > 0, "some segment must be cut into several splits"


def test_positions_are_unique_and_increase_per_node(healthy):
    root, m = healthy
    rows, _ = oracle.read_rows(node_dirs(root, m))
    by_node: dict[str, list[int]] = {}
    for r in rows:
        by_node.setdefault(r[NODE], []).append(r[POSITION])
    for pos in by_node.values():
        assert all(a < b for a, b in zip(pos, pos[1:]))


def test_torn_last_frame_ends_the_input_and_damage_before_the_end_is_an_error(healthy, tmp_path):
    root, m = healthy
    src = os.path.join(root, m["nodes"][0]["dir"])
    d = str(tmp_path / "node")
    shutil.copytree(src, d)
    segs = walread.node_segments(d)
    whole = list(walread.read_node_frames(d))
    last = segs[-1].path
    size = os.path.getsize(last)

    def by_splits() -> list:
        return [r for seg in walread.node_segments(d) for s in walread.plan_segment(seg, SPLIT_BYTES)
                for r in walread.read_split(s)]

    with open(last, "r+b") as f:
        f.seek(size - 1)
        b = f.read(1)
        f.seek(size - 1)
        f.write(bytes([b[0] ^ 0xFF]))         # whole length, bad checksum: torn data
    assert list(walread.read_node_frames(d)) == whole[:-1]
    assert by_splits() == whole[:-1]
    with open(last, "r+b") as f:
        f.truncate(size - 3)                 # torn inside the last frame
    torn = list(walread.read_node_frames(d))
    assert torn == whole[:-1]
    assert by_splits() == torn
    first = segs[0].path
    flip_a_middle_byte(first)
    with pytest.raises(walread.WalInputError, match=os.path.basename(first)):
        list(walread.read_node_frames(d))
    with pytest.raises(walread.WalInputError, match=os.path.basename(first)):
        for s in walread.plan_segment(walread.node_segments(d)[0], SPLIT_BYTES):
            list(walread.read_split(s))


def test_a_segment_read_as_one_split_is_not_walked_and_its_damage_is_the_readers_to_report(healthy, tmp_path):
    """A segment that is not a node's last and fits in one split is planned from its header
    alone; the split's reader (both of them) still finds the damage, by file and offset, and
    the `_cluster` rows inside it still move the table."""
    root, m = healthy
    d = str(tmp_path / "node")
    shutil.copytree(os.path.join(root, m["nodes"][0]["dir"]), d)
    segs = walread.node_segments(d)
    assert len(segs) > 1
    one = [walread.plan_segment(seg, 1 << 30) for seg in segs]
    assert all(len(p) == 1 for p in one)
    whole = list(walread.read_node_frames(d))
    assert [r for p in one for s in p for r in walread.read_split(s)] == whole
    first = segs[0].path
    flip_a_middle_byte(first)
    split, = walread.plan_segment(walread.node_segments(d)[0], 1 << 30)     # no frame is read here
    for pure in (False, True):
        with pytest.raises(walread.WalInputError, match=re.escape(first) + r": .* at byte \d+"):
            walcols.read_split_columns(split, pure=pure)


def test_wal_dir_of_accepts_a_data_dir_or_a_wal_dir_and_refuses_others(healthy, tmp_path):
    root, m = healthy
    d = os.path.join(root, m["nodes"][0]["dir"])
    assert walread.wal_dir_of(d) == os.path.join(d, "wal")
    assert walread.wal_dir_of(os.path.join(d, "wal")) == os.path.join(d, "wal")
    with pytest.raises(walread.WalInputError, match="no WAL segments"):
        walread.wal_dir_of(str(tmp_path))


def _generated_frames(out: str, seed: int) -> tuple[dict, list]:
    m = generate.generate(out, nodes=5, rows=400, seed=seed, segment_bytes=8192)
    return m, [list(walread.read_node_frames(os.path.join(out, n["dir"]))) for n in m["nodes"]]


def test_generator_is_deterministic_from_the_seed(tmp_path):
    a = _generated_frames(str(tmp_path / "a"), 3)
    assert a == _generated_frames(str(tmp_path / "b"), 3)
    assert a != _generated_frames(str(tmp_path / "c"), 4)
