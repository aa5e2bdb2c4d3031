"""`replog wal dump` filters (origin, lsn range, space), its header view, a directory without WAL
(an error, not an empty dump), and --force-recovery, the option its damage message names."""
from __future__ import annotations

import json

from helpers import UUID_A, UUID_B, UUID_C, segment_paths
from node.wal import format as fmt
from node.wal.reader import list_segments
from test_wal import _node_a_wal, base_txns, flip_bit, run_replog, write_wal


def rows(r) -> list[dict]:
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_dump_filters_by_origin_lsn_range_and_space_and_they_combine(tmp_path):
    _node_a_wal(tmp_path / "node" / "wal")
    d = str(tmp_path / "node")
    every = rows(run_replog("wal", "dump", d))
    by_b = rows(run_replog("wal", "dump", d, "--origin", UUID_B))
    assert by_b == [r for r in every if r["origin"] == UUID_B] and by_b
    assert rows(run_replog("wal", "dump", d, "--origin", UUID_C[:8])) == [r for r in every if r["origin"] == UUID_C]
    ranged = rows(run_replog("wal", "dump", d, "--lsn-from", "2", "--lsn-to", "4"))
    assert ranged == [r for r in every if 2 <= r["lsn"] <= 4] and ranged
    data = rows(run_replog("wal", "dump", d, "--space", "data"))
    assert data == [r for r in every if r["space"] == "data"]
    assert {r["key"] for r in data if r["op"] == "put"} == {"a", "b", "c", "c2", "d", "e", "f"}
    both = rows(run_replog("wal", "dump", d, "--origin", UUID_A, "--space", "data", "--lsn-from", "5"))
    assert [(r["key"], r["lsn"]) for r in both] == [("c", 5), ("c2", 6)]
    assert rows(run_replog("wal", "dump", d, "--space", "nothing")) == []
    r = run_replog("wal", "dump", d, "--lsn-from", "0")
    assert r.returncode == 2 and "--lsn-from" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_dump_headers_shows_each_segment_with_its_vclock_by_uuid(tmp_path):
    _node_a_wal(tmp_path / "wal")
    heads = rows(run_replog("wal", "dump", str(tmp_path / "wal"), "--headers"))
    assert [h["segment"] for h in heads] == list_segments(str(tmp_path / "wal"))
    first, second = heads
    assert first["node"] == UUID_A and first["format_version"] == fmt.FORMAT_VERSION and first["vclock"] == {}
    ids = {m["id"]: m["uuid"] for m in second["cluster"]}
    assert ids == {1: UUID_A, 2: UUID_B, 3: UUID_C}
    assert set(second["vclock"]) == {"0", "1", "2", "3"}          # 0: rows of local spaces
    assert second["vclock_uuid"] == {ids[int(k)]: v for k, v in second["vclock"].items() if k != "0"}
    assert all(h["bytes"] > 0 for h in heads)


def test_dump_of_a_directory_without_wal_is_an_error_not_an_empty_dump(tmp_path):
    (tmp_path / "empty").mkdir()
    for args in (["dump"], ["dump", "--headers"], ["verify"]):
        r = run_replog("wal", *args, str(tmp_path / "empty"))
        assert r.returncode == 1 and r.stdout == "", (args, r.stdout)
        assert r.stderr.strip().splitlines() == [
            f"replog: error: {tmp_path / 'empty'}: no WAL segments here (give a node's data dir or its wal/ dir)"]


def test_a_damaged_wal_names_force_recovery_and_dump_accepts_it(tmp_path):
    whole = rows(run_replog("wal", "dump", str(write_wal(tmp_path / "whole", base_txns(4)).dir)))
    b = write_wal(tmp_path / "damaged", base_txns(4))
    [path] = segment_paths(tmp_path / "damaged")
    flip_bit(path, b.frames[1][1] + fmt.FRAME_OVERHEAD + 1, 5)
    r = run_replog("wal", "dump", str(tmp_path / "damaged"))
    assert r.returncode == 1 and "--force-recovery" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_replog("wal", "dump", str(tmp_path / "damaged"), "--force-recovery")
    assert "skipping damaged WAL bytes" in r.stderr
    kept = rows(r)
    same = ("offset", "origin", "lsn", "op", "space", "key", "value")
    lost = [x for x in whole if x["offset"] == b.frames[1][1]]
    assert lost and [[x[k] for k in same] for x in kept] == [[x[k] for k in same] for x in whole if x not in lost]


def test_a_segment_collected_between_the_listing_and_its_reading_is_named_not_a_traceback(tmp_path, monkeypatch, capsys):
    """The dump of a live node's WAL: the node may collect its oldest segment after the dump
    listed it (the full run once met this). The dump, its headers and verify pass over it and
    say so; every row of the segments left is still shown."""
    import io

    from node.wal import dump

    _node_a_wal(tmp_path / "wal")
    d = str(tmp_path / "wal")
    every = list(dump.iter_rows(d))
    first = list_segments(d)[0]
    assert {r["segment"] for r in every} - {first}, "the WAL has rows past its first segment"
    kept = (tmp_path / "wal" / first).read_bytes()
    listings = []

    def listing_then_gc(wal_dir: str) -> list[str]:
        names = list_segments(wal_dir)
        (tmp_path / "wal" / first).unlink()
        listings.append(names)
        return names

    def gc_after_the_next_listing() -> None:
        (tmp_path / "wal" / first).write_bytes(kept)

    monkeypatch.setattr(dump, "list_segments", listing_then_gc)
    gc_after_the_next_listing()
    out = io.StringIO()
    assert dump.dump(d, out=out) == 0
    assert [json.loads(line) for line in out.getvalue().splitlines()] == [r for r in every if r["segment"] != first]
    assert f"{first} was collected by the node while this dump read its WAL" in capsys.readouterr().err
    gc_after_the_next_listing()
    out = io.StringIO()
    assert dump.dump_headers(d, out=out) == 0
    left = [n for n in list_segments(d) if n != first]
    assert [json.loads(line)["segment"] for line in out.getvalue().splitlines()] == left
    gc_after_the_next_listing()
    out = io.StringIO()
    assert dump.verify(d, out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].endswith(f"{first}: collected by the node since the listing, not checked")
    assert lines[-1].startswith(f"{len(left)} segments,") and lines[-1].endswith("OK")
    assert len(listings) == 3 and all(first in names for names in listings)
