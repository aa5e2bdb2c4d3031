"""The Spark jobs against the oracle and against what the inputs were built to contain.
One SparkSession for the run (conftest); each input is analysed once per module."""
from __future__ import annotations

import os
import re
import shutil

import pytest

from spark import analyze, jobs, oracle, plots, walread
from spark import tables as T
from tests.spark import scenario
from tests.spark.conftest import SPLIT_BYTES, flip_a_middle_byte, node_dirs, uuid_of


def _norm(v):
    return tuple(sorted(v.items())) if isinstance(v, dict) else v


def table(spark, out: str, name: str) -> list[tuple]:
    """A written table as sorted tuples in spark.tables column order (maps as sorted items)."""
    cols = T.TABLES[name]
    return sorted(tuple(_norm(r[c]) for c in cols) for r in spark.read.parquet(os.path.join(out, name)).collect())


def expected(result: dict, name: str) -> list[tuple]:
    return sorted(tuple(_norm(x) for x in r) for r in result[name])


def _run(spark, dirs: list[str], out: str) -> dict:
    summary, points = jobs.run(spark, dirs, out, split_bytes=SPLIT_BYTES)
    return {"out": out, "summary": summary, "points": points, "oracle": oracle.analyze(dirs)}


@pytest.fixture(scope="module")
def healthy_run(spark, healthy, tmp_path_factory):
    root, m = healthy
    return {**_run(spark, node_dirs(root, m), str(tmp_path_factory.mktemp("healthy-out"))), "manifest": m}


@pytest.fixture(scope="module")
def corrupted_run(spark, corrupted, tmp_path_factory):
    root, m = corrupted
    return {**_run(spark, node_dirs(root, m), str(tmp_path_factory.mktemp("corrupted-out"))), "manifest": m}


@pytest.fixture(scope="module")
def scenario_run(spark, tmp_path_factory):
    dirs = scenario.build(str(tmp_path_factory.mktemp("scenario")))
    return {**_run(spark, [dirs[scenario.A], dirs[scenario.B]], str(tmp_path_factory.mktemp("scenario-out"))),
            "dirs": dirs}


# --- Spark == oracle ----------------------------------------------------------------------
@pytest.mark.parametrize("name", list(T.TABLES))
def test_spark_table_equals_the_oracle_on_remapped_ids(spark, healthy_run, name):
    got = table(spark, healthy_run["out"], name)
    assert got == expected(healthy_run["oracle"], name)
    if name != "divergence":
        assert got, f"{name} is empty: the comparison would prove nothing"


def test_spark_summary_equals_the_oracle(healthy_run):
    assert healthy_run["summary"] == healthy_run["oracle"]["summary"]


def test_without_broadcasts_every_table_still_equals_the_oracle(spark, corrupted, tmp_path, monkeypatch):
    """The paths for inputs too big to broadcast: origin_history and replication_delay in
    Spark SQL (not in pass 2), divergence's candidates joined by a shuffle."""
    monkeypatch.setattr(jobs, "broadcast_rows_max", 0)
    monkeypatch.setattr(jobs, "task_lookup_rows_max", 0)
    root, m = corrupted
    r = _run(spark, node_dirs(root, m), str(tmp_path / "out"))
    for name in T.TABLES:
        assert table(spark, r["out"], name) == expected(r["oracle"], name), name
    assert r["summary"] == r["oracle"]["summary"]
    assert r["summary"]["divergent_rows"]


# --- what the inputs contain -----------------------------------------------------------------
def test_healthy_run_has_no_divergence(spark, healthy_run):
    assert table(spark, healthy_run["out"], "divergence") == []
    assert healthy_run["summary"]["divergent_rows"] == []


def test_corrupted_row_is_a_divergence_naming_origin_and_lsn(spark, corrupted_run):
    c = corrupted_run["manifest"]["corruption"]
    assert c is not None
    assert corrupted_run["summary"]["divergent_rows"] == [(c["origin"], c["lsn"])]
    div = table(spark, corrupted_run["out"], "divergence")
    assert div == expected(corrupted_run["oracle"], "divergence")
    cols = T.DIVERGENCE
    assert {(d[cols.index("origin_uuid")], d[cols.index("origin_lsn")]) for d in div} == {(c["origin"], c["lsn"])}
    assert {d[cols.index("variants")] for d in div} == {2}
    by_node = {d[cols.index("node_uuid")]: d[cols.index("content_hash")] for d in div}
    odd = by_node.pop(c["node"])
    assert len(by_node) >= 2 and odd not in by_node.values() and len(set(by_node.values())) == 1


def test_uuid_with_different_ids_on_two_nodes_is_one_origin(spark, healthy_run):
    m = healthy_run["manifest"]
    masters = [n for n in m["nodes"] if not n["anon"]]
    remapped = [u for u in m["origins"] if len({n["ids"][u] for n in masters}) > 1]
    assert remapped, "the input must hold a uuid with different ids on different nodes"
    rows = spark.read.parquet(os.path.join(healthy_run["out"], "rows"))
    for u in remapped:
        own_lsns = {r[0] for r in rows.where((rows.node_uuid == u) & (rows.origin_uuid == u)
                                             & (rows.group != "local")).select("origin_lsn").collect()}
        for n in masters:
            if n["uuid"] == u:
                continue
            seen = {r[0] for r in rows.where((rows.node_uuid == n["uuid"]) & (rows.origin_uuid == u))
                    .select("origin_lsn").collect()}
            # Every row of the origin that this node holds is one the origin wrote itself.
            assert seen and seen <= own_lsns, (n["name"], u)
    assert set(healthy_run["summary"]["origins"]) <= {n["uuid"] for n in m["nodes"]}
    assert healthy_run["summary"]["unresolved_rows"] == 0


def test_vclock_history_is_monotone_and_ends_at_each_nodes_vclock(spark, healthy_run):
    cols = T.VCLOCK_HISTORY
    hist = table(spark, healthy_run["out"], "vclock_history")
    by_node: dict[str, list[tuple]] = {}
    for h in hist:
        by_node.setdefault(h[0], []).append(h)
    m = healthy_run["manifest"]
    assert set(by_node) == {n["uuid"] for n in m["nodes"]}
    for n in m["nodes"]:
        seq = sorted(by_node[n["uuid"]], key=lambda h: h[cols.index("position")])
        prev, prev_local = {}, 0
        for h in seq:
            vc, local = dict(h[cols.index("vclock")]), h[cols.index("local_lsn")]
            assert all(vc.get(u, 0) >= lsn for u, lsn in prev.items()) and local >= prev_local
            prev, prev_local = vc, local
        assert prev == {u: v for u, v in n["vclock"].items() if u != "local"}
        assert prev_local == n["vclock"].get("local", 0)


def test_joiner_history_starts_from_its_snapshot_vclock(spark, healthy_run):
    m = healthy_run["manifest"]
    j = uuid_of(m, "j1")
    cols = T.VCLOCK_HISTORY
    first = min((h for h in table(spark, healthy_run["out"], "vclock_history") if h[0] == j),
                key=lambda h: h[cols.index("position")])
    assert sum(dict(first[cols.index("vclock")]).values()) > 0


def test_concurrent_writes_found_for_a_concurrent_pair_not_for_a_causal_one(spark, scenario_run):
    got = table(spark, scenario_run["out"], "concurrent_writes")
    assert got == [("kv", "x", scenario.A, 1, 100, scenario.B, 1, 110)]
    assert got == expected(scenario_run["oracle"], "concurrent_writes")


def test_delay_is_written_us_on_the_node_minus_on_the_origin(spark, scenario_run):
    cols = T.ORIGIN_HISTORY
    hist = table(spark, scenario_run["out"], "origin_history")
    assert hist == expected(scenario_run["oracle"], "origin_history")
    delay = {(h[cols.index("origin_uuid")], h[cols.index("txn_lsn")], h[cols.index("node_uuid")]):
             (h[cols.index("delay_us")], h[cols.index("delay_basis")]) for h in hist}
    assert delay[(scenario.A, 1, scenario.B)] == (20, "origin_wal")
    assert delay[(scenario.B, 2, scenario.A)] == (10, "origin_wal")
    assert delay[(scenario.A, 1, scenario.A)] == (0, "origin_wal")
    assert scenario_run["summary"]["nodes"][scenario.B]["max_delay_us"] == 20


def test_progress_plots_are_written_per_node(healthy_run, tmp_path):
    paths = plots.draw(healthy_run["points"], str(tmp_path))
    assert sorted(os.path.basename(p) for p in paths) == sorted(
        f"progress-{n['uuid']}.png" for n in healthy_run["manifest"]["nodes"])
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


# --- the command ------------------------------------------------------------------------------
def test_analyze_command_writes_tables_plots_and_a_summary(spark, scenario_run, tmp_path, capsys):
    out = str(tmp_path / "out")
    d = scenario_run["dirs"]
    rc = analyze.main([d[scenario.A], os.path.join(d[scenario.B], "wal"), "--out", out, "--master", "local[2]"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "2 nodes, 2 origins, 8 row observations" in text
    assert "divergences: 0" in text and "concurrent writes: 1 pairs" in text
    for name in T.TABLES:
        assert os.path.isdir(os.path.join(out, name)), name
    for u in (scenario.A, scenario.B):
        with open(os.path.join(out, "plots", f"progress-{u}.png"), "rb") as f:
            assert f.read(4) == b"\x89PNG"
    assert not spark.sparkContext._jsc.sc().isStopped()   # an embedding caller's session lives on


def test_analyze_command_refuses_a_dir_without_wal(tmp_path, capsys):
    assert analyze.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no WAL segments" in err and "\n" == err[-1] and err.count("\n") == 1


def test_a_damaged_segment_fails_the_run_with_file_and_offset_not_a_task_failure(spark, healthy, tmp_path):
    root, m = healthy
    d = str(tmp_path / "node")
    shutil.copytree(os.path.join(root, m["nodes"][0]["dir"]), d)
    first = walread.node_segments(d)[0].path
    flip_a_middle_byte(first)
    sc = spark.sparkContext
    sc.setJobGroup("damaged-input", "a run over a damaged segment")
    try:
        with pytest.raises(walread.WalInputError, match=re.escape(first) + r": .* at byte \d+"):
            jobs.run(spark, [d], str(tmp_path / "out"), split_bytes=SPLIT_BYTES)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    # The reader's error came back as a value: no job of the run failed in Spark.
    tracker = sc.statusTracker()
    jobs_run = tracker.getJobIdsForGroup("damaged-input")
    assert jobs_run and [tracker.getJobInfo(j).status for j in jobs_run] == ["SUCCEEDED"] * len(jobs_run)


# --- how the tables are written -----------------------------------------------------------------
def _plain_type(t):
    """A type as a reader that knows no Arrow schema sees it (a map's inner names aside)."""
    import pyarrow as pa
    return ("map", t.key_type, t.item_type) if pa.types.is_map(t) else t


def test_tables_read_back_with_their_declared_types_whatever_was_dictionary_coded(healthy_run):
    """Strings handed to Parquet as dictionaries (uuids, group, op, txn_id) are a writing
    detail: pyarrow reads every file of rows, vclock_history and origin_history back with
    plain strings, the declared schema."""
    import pyarrow.parquet as pq

    from spark import columnar, pass2
    for name, schema in (("rows", columnar.ROWS_SCHEMA), ("vclock_history", columnar.VCLOCK_SCHEMA),
                         ("origin_history", pass2.ORIGIN_HISTORY_SCHEMA)):
        d = os.path.join(healthy_run["out"], name)
        files = [f for f in os.listdir(d) if f.endswith(".parquet")]
        assert files, name
        for f in files:
            got = pq.read_schema(os.path.join(d, f))
            assert got.names == schema.names, (name, f)
            assert [_plain_type(t) for t in got.types] == [_plain_type(t) for t in schema.types], (name, f)

# --- the head start (local mode: pass 1 begun on the driver) -------------------------------------
HEAD_WAIT_S = 120       # a slow CI machine; the wait ends as soon as the segments are read


def test_a_head_start_and_the_job_together_write_the_oracles_tables(spark, corrupted, tmp_path):
    """Some segments read by the driver's thread, the rest by the pass-1 job: every table
    and the summary still equal the oracle's (divergence included). Given the bare
    SparkContext, as `replog analyze` gives it, the run gets a session for its SQL stage."""
    root, m = corrupted
    dirs, out = node_dirs(root, m), str(tmp_path / "out")
    head = jobs.head_start(dirs, out, SPLIT_BYTES)
    assert head.wait(3, HEAD_WAIT_S)
    r = {"out": out}
    r["summary"], r["points"] = jobs.run(spark.sparkContext, dirs, out, split_bytes=SPLIT_BYTES, head=head)
    assert 3 <= len(head.results()) < len(head.inputs.segments)    # both read some
    o = oracle.analyze(dirs)
    for name in T.TABLES:
        assert table(spark, out, name) == expected(o, name), name
    assert r["summary"] == o["summary"] and r["summary"]["divergent_rows"]


def test_a_damaged_segment_read_by_the_head_start_fails_the_run_with_file_and_offset(spark, healthy, tmp_path):
    root, m = healthy
    d = str(tmp_path / "node")
    shutil.copytree(os.path.join(root, m["nodes"][0]["dir"]), d)
    last = walread.node_segments(d)[-1].path          # the head start reads from the last
    flip_a_middle_byte(last)
    head = jobs.head_start([d], str(tmp_path / "out"), SPLIT_BYTES)
    assert head.wait(1, HEAD_WAIT_S)
    with pytest.raises(walread.WalInputError, match=re.escape(last) + r": .* at byte \d+"):
        jobs.run(spark, [d], str(tmp_path / "out"), split_bytes=SPLIT_BYTES, head=head)



# --- local mode -------------------------------------------------------------------------------
def test_local_workers_run_the_installed_pyspark_not_the_zip_under_spark_home(spark):
    """spark/localdaemon: in local mode the daemon and its workers import pyspark from the
    package the driver runs (compiled once), not from SPARK_HOME/python/lib/pyspark.zip."""
    import pyspark

    def where(_):
        import sys as worker_sys
        return worker_sys.modules["pyspark"].__file__, [p for p in worker_sys.path if p.endswith("pyspark.zip")]

    files = set()
    for f, zips in spark.sparkContext.parallelize(range(4), 4).map(where).collect():
        files.add(f)
        assert zips == [], zips
    assert files == {pyspark.__file__}
