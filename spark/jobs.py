"""The PySpark jobs: WAL segments of many nodes -> the Parquet tables of spark.tables.

Order of work (each stage logs a line, so long runs show progress):
  1. the driver lists each node's segments and reads its first header (node uuid, base vclock);
  2-3. pass 1, one Python task per segment (spark.columnar): cut it into splits by walking frame
     headers (spark.walread.plan_segment), decode each split into columns, write its `rows`
     Parquet file with Arrow (no row is pickled or crosses into the JVM), return small facts
     (row counts, each origin's max lsn in the split, the written_us span);
  4. the driver folds those facts into the vclock at each split's start; pass 2, one task per
     split: its `vclock_history` (that start + a running max within the split: the same as a
     running max per node over position), `origin_history` (each replicated transaction beside
     its origin's own, which the driver sends to every task), the observations that differ from
     their origin's own (divergence suspects) and its own writes with their vclock, bucketed by
     key, all Parquet;
  5. `replication_delay` from pass 2's partial sums; 6. `divergence`: usually no suspects, so
     no job; else Spark SQL groups the suspects by (origin, lsn);
  7. `concurrent_writes`: one Python task a key bucket pairs its writes (spark.concurrent);
  8. the summary comes from the passes' facts; nothing large is collected.
  When the origins' own transactions are too many to send to every task, origin_history and
  divergence fall back to Spark SQL joins over `rows`.
Rules: the same code runs on local[*] and under spark-submit on a cluster (inputs and OUT must
then be paths every executor can read and write: the passes write their files themselves); the
code that runs in executors is shipped with the job (a zip of the `spark` and `node` packages);
executors need pyarrow and numpy (and read the WAL natively with spark._walcols when it loads);
no Python UDFs: Python tasks over files, and Spark SQL over what they wrote."""
from __future__ import annotations

import logging
import os
import re
import shutil
import time
from typing import NamedTuple

from py4j.protocol import Py4JJavaError
from pyspark import SparkContext
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark import walread
from spark.headstart import HeadStart

log = logging.getLogger("replog.analyze")

plot_buckets = 400                 # points per origin line in a progress plot

# --- stage 1-3: reading ------------------------------------------------------------
class Inputs(NamedTuple):
    dirs: tuple[str, ...]
    segments: list[walread.SegmentFile]      # every node's, node by node, in WAL order
    bases: list[walread.NodeBase]
    node_of: dict[str, str]                  # segment path -> node uuid (from its first header)
    total_bytes: int


def list_inputs(dirs: list[str]) -> Inputs:
    """Each node's segments and base vclock (its first header): the driver's only reading."""
    segments: list[walread.SegmentFile] = []
    bases: list[walread.NodeBase] = []
    node_of: dict[str, str] = {}
    dir_of: dict[str, str] = {}                  # node uuid -> input dir
    for d in dirs:
        base = walread.node_base(d)
        if base.node_uuid in dir_of:
            raise walread.WalInputError(f"{d}: node {base.node_uuid} is given twice (also {dir_of[base.node_uuid]})")
        dir_of[base.node_uuid] = d
        bases.append(base)
        segs = walread.node_segments(d)
        segments.extend(segs)
        node_of.update((s.path, base.node_uuid) for s in segs)
    total = sum(os.path.getsize(s.path) for s in segments)
    log.info("[1/8] %d nodes, %d segments, %.1f MiB", len(dirs), len(segments), total / 2**20)
    return Inputs(tuple(dirs), segments, bases, node_of, total)


def _pass1(inputs: Inputs, split_bytes: int, out: str):
    """Pass 1 of one segment, as a function of (n, segment) that any process can run."""
    own_cap = 4 * task_lookup_rows_max // max(1, len(inputs.segments))    # the total is checked after
    rows_dir, pass2_dir = os.path.join(out, "rows"), os.path.join(out, PASS2_INPUT_DIR)
    return lambda n, seg: _as_value(_columnar().write_segment_rows, n, seg, split_bytes, rows_dir, pass2_dir, own_cap)


PASS2_INPUT_DIR = "_pass2_input"    # under OUT from pass 1 to the end of pass 2 (columnar.Pass2Input)


def _fresh_pass1(out: str) -> None:
    _fresh(os.path.join(out, "rows"))
    _fresh(os.path.join(out, PASS2_INPUT_DIR))


def head_start(dirs: list[str], out: str, split_bytes: int = walread.split_bytes_default) -> HeadStart:
    """Local mode, before the session exists: list the inputs (input errors are raised here,
    before a JVM starts) and begin pass 1 on the driver (spark.headstart). Give it to run()."""
    inputs = list_inputs(dirs)
    _fresh_pass1(out)
    return HeadStart(inputs, _pass1(inputs, split_bytes, out)).start()


def plan_and_write_rows(sc: SparkContext, dirs: list[str], split_bytes: int, out: str,
                        head: HeadStart | None = None) -> tuple[list[walread.Split], list, list[walread.NodeBase]]:
    """Pass 1, one task per segment: cut it into splits (walking frame headers: each split
    carries the table at its start) and write each split's `rows` Parquet file, from the
    executor (Python, Arrow) that read it: no row crosses into the JVM; and what pass 2 needs
    of the split (columnar.Pass2Input), so that pass 2 does not decode it again. Segments a
    head start reads are not read again. Returns the splits in WAL order, their SplitStats
    (numbered as the splits) and each node's base vclock."""
    if head is None:
        inputs, taken = list_inputs(dirs), set()
        _fresh_pass1(out)
    else:
        inputs, taken = head.inputs, head.stop()
        assert inputs.dirs == tuple(dirs), (inputs.dirs, dirs)
    t = time.monotonic()
    rest = [(n, seg) for n, seg in enumerate(inputs.segments) if n not in taken]
    work = _pass1(inputs, split_bytes, out)
    done = (sc.parallelize(rest, _tasks(sc, len(rest), sum(os.path.getsize(seg.path) for _, seg in rest)))
            .map(lambda w: (w[0], work(*w))).collect()) if rest else []
    if head is not None:
        done.extend(head.results().items())
    done.sort(key=lambda r: r[0])
    _raise_first([r for _, r in done])
    assert [n for n, _ in done] == list(range(len(inputs.segments)))
    splits = [s for _, parts in done for s, _x in parts]
    stats = [x._replace(i=i) for i, x in enumerate(x for _, parts in done for _s, x in parts)]
    for s in splits:
        if s.node_uuid != inputs.node_of[s.path]:
            raise walread.WalInputError(f"{s.path}: segment of node {s.node_uuid} among node {inputs.node_of[s.path]}'s")
    _done(os.path.join(out, "rows"))
    log.info("[2/8] planned %d splits; [3/8] rows: %d rows in %.1fs", len(splits), sum(x.rows for x in stats),
             time.monotonic() - t)
    return splits, stats, inputs.bases


class InputFailure(NamedTuple):
    """A task's WalInputError, returned as a value: as a task failure Spark would log the
    worker's traceback and retry a read that fails the same way every time."""
    message: str


def _as_value(f, *args):
    try:
        return f(*args)
    except walread.WalInputError as e:
        return InputFailure(str(e))


def _raise_first(results: list) -> None:
    """The first input error among the tasks' results (in input order), as the driver's own."""
    for r in results:
        if isinstance(r, InputFailure):
            raise walread.WalInputError(r.message)


def _tasks(sc, items: int, total_bytes: int) -> int:
    """Tasks for a list of segments or splits: one each when they are big, and never more
    than a few per core when they are small (a Python task costs tens of ms to start)."""
    return max(1, min(items, max(4 * sc.defaultParallelism, -(-total_bytes // walread.split_bytes_default))))


def _columnar():
    from spark import columnar    # numpy/pyarrow: imported where the work runs
    if not _frozen:
        _freeze()
    return columnar


_frozen = False


def _freeze() -> None:
    """Move what a worker has imported (pyspark, numpy, pyarrow, our modules: ~50k objects)
    out of the cyclic collector's reach. PySpark's daemon runs a full gc.collect() after every
    task of a reused worker; each one walked them all again (~10-30 ms a task, ~1-2 CPU-s of
    the benchmark's ~100 tasks). Nothing frozen is garbage: modules live as long as the process."""
    global _frozen
    import gc
    gc.freeze()
    _frozen = True


def _pass2():
    from spark import pass2
    _columnar()                   # which freezes what is imported by then
    return pass2


def _fresh(d: str) -> None:
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)


def _done(d: str) -> None:
    open(os.path.join(d, "_SUCCESS"), "w").close()


# --- stage 4-7: the tables ------------------------------------------------------------
def _txns(rows: DataFrame) -> DataFrame:
    return rows.where(F.col("row_in_txn") == 0).withColumn(
        "txn_last_lsn", F.col("txn_lsn") + F.col("txn_rows") - 1)


broadcast_rows_max = 2_000_000     # a join side up to this many rows is broadcast, not shuffled
task_lookup_rows_max = 8_000_000   # origins' own txns/rows sent to every pass-2 task (16 bytes each)
writes_bucket_txns = 250_000       # own transactions whose writes one concurrent_writes task pairs


def origin_history(rows: DataFrame) -> DataFrame:
    """Every observation of a replicated transaction with its origin's own written_us: the
    Spark SQL form, for when the origins' own transactions are too many for pass 2 (a join
    of the observations with them by origin and lsn, shuffled)."""
    t = _txns(rows).where((F.col("group") != "local") & F.col("origin_uuid").isNotNull())
    own = t.where(F.col("node_uuid") == F.col("origin_uuid")).select(
        "origin_uuid", "txn_lsn", F.col("written_us").alias("origin_written_us"))
    h = t.join(own, ["origin_uuid", "txn_lsn"], "left")
    return h.select(
        "origin_uuid", "txn_lsn", "txn_last_lsn", "txn_id", "timestamp", "node_uuid", "position", "written_us",
        "origin_written_us",
        (F.col("written_us") - F.coalesce(F.col("origin_written_us"), F.col("timestamp"))).alias("delay_us"),
        F.when(F.col("origin_written_us").isNotNull(), F.lit("origin_wal")).otherwise(F.lit("timestamp")).alias("delay_basis"))


def replication_delay(history: DataFrame) -> DataFrame:
    return (history.where(F.col("node_uuid") != F.col("origin_uuid"))
            .groupBy("node_uuid", "origin_uuid")
            .agg(F.count(F.lit(1)).alias("txns"), F.max("delay_us").alias("delay_us_max"),
                 F.sum("delay_us").alias("s"))
            .select("node_uuid", "origin_uuid", "txns", "delay_us_max",
                    (F.col("s").cast("double") / F.col("txns")).alias("delay_us_mean")))


def divergence(rows: DataFrame) -> DataFrame:
    """Observations of an (origin, lsn) whose contents differ. The grouping of every replicated
    row is shuffled as fixed-width longs (a 64-bit hash of the origin uuid, the lsn, the content
    hash); the candidates it finds (a superset: two uuids may share a hash) are then checked
    exactly, by uuid, among their own observations only."""
    rep = (rows.where((F.col("group") != "local") & F.col("origin_uuid").isNotNull())
           .withColumn("oh", F.xxhash64("origin_uuid")))
    cand = (rep.groupBy("oh", "origin_lsn")
            .agg(F.min("content_hash").alias("lo"), F.max("content_hash").alias("hi"))
            .where(F.col("lo") != F.col("hi")).select("oh", "origin_lsn")).localCheckpoint()
    if cand.count() <= broadcast_rows_max:
        cand = F.broadcast(cand)
    obs = rep.join(cand, ["oh", "origin_lsn"])
    w = Window.partitionBy("origin_uuid", "origin_lsn")
    return (obs.select("origin_uuid", "origin_lsn", "node_uuid", "content_hash", "op", "space", "key",
                       F.size(F.collect_set("content_hash").over(w)).alias("variants"))
            .where(F.col("variants") > 1))


def divergence_from_input(rows: DataFrame, suspects: DataFrame) -> DataFrame:
    """divergence, given pass 2's suspects (pass2._divergence_input): the (origin, lsn) whose
    suspects hold two contents are divergent; their observations are then found in `rows`
    (skipped when there are none: the usual case)."""
    bad = (suspects.groupBy("origin_uuid", "origin_lsn")
           .agg(F.min("content_hash").alias("lo"), F.max("content_hash").alias("hi"))
           .where(F.col("lo") != F.col("hi")).select("origin_uuid", "origin_lsn")).localCheckpoint()
    n = bad.count()
    w = Window.partitionBy("origin_uuid", "origin_lsn")
    rep = rows.where((F.col("group") != "local") & F.col("origin_uuid").isNotNull())
    if n == 0:
        rep = rep.limit(0)
    obs = rep.join(F.broadcast(bad) if n <= broadcast_rows_max else bad, ["origin_uuid", "origin_lsn"])
    return obs.select("origin_uuid", "origin_lsn", "node_uuid", "content_hash", "op", "space", "key",
                      F.size(F.collect_set("content_hash").over(w)).alias("variants"))


def concurrent_pairs(sc: SparkContext, writes_dir: str, out: str, buckets: int, writers: list[str]) -> int:
    """concurrent_writes from pass 2's own writes, bucketed by key: one Python task a bucket
    (spark.concurrent); returns the number of pairs."""
    _fresh(out)
    n = sum(sc.parallelize(range(buckets), buckets)
            .map(lambda b: _concurrent().write_bucket_pairs(b, writes_dir, out, _columnar()._write, writers))
            .collect())
    _done(out)
    return n


def _concurrent():
    from spark import concurrent
    return concurrent


def _progress_points(partials: list[tuple], t0: int | None) -> list[tuple[str, str, float, int]]:
    """(node, origin, seconds since t0, lsn) per plot bucket, from pass 2's partial maxima."""
    points: dict[tuple, list[int]] = {}
    for node, origin, b, tw, lsn in partials:
        p = points.setdefault((node, origin, b), [tw, lsn])
        p[0], p[1] = max(p[0], tw), max(p[1], lsn)
    return sorted((node, origin, (tw - t0) / 1e6, lsn) for (node, origin, _b), (tw, lsn) in points.items())


# --- the whole run -----------------------------------------------------------------------
_INPUT_ERROR = re.compile(r"WalInputError: (.*)")


def run(spark: SparkSession | SparkContext, dirs: list[str], out: str, *,
        split_bytes: int = walread.split_bytes_default, head: HeadStart | None = None,
        on_points=None) -> tuple[dict, list]:
    """Write every table under `out`; returns the summary and the progress points, which
    `on_points(points)` also gets as soon as they are known (pass 2), while the last stages
    run. `head`: pass 1 begun on the driver (head_start(), same dirs, out and split_bytes).
    Given a SparkContext, a SparkSession is made only if a Spark SQL stage runs (the fallbacks,
    or divergence suspects). Raises WalInputError for input that cannot be analysed, wherever
    a reader met it."""
    try:
        return _run(spark, dirs, out, split_bytes, head, on_points)
    except (PySparkException, Py4JJavaError) as e:
        # A reader's WalInputError in an executor reaches the driver as text inside Spark's error.
        m = _INPUT_ERROR.search(str(e))
        if m is None:
            raise
        raise walread.WalInputError(m.group(1)) from None


def _run(spark: SparkSession | SparkContext, dirs: list[str], out: str, split_bytes: int, head: HeadStart | None,
         on_points) -> tuple[dict, list]:
    started = time.monotonic()
    sc = spark.sparkContext if isinstance(spark, SparkSession) else spark
    col, pass2 = _columnar(), _pass2()

    def sql() -> SparkSession:
        return spark if isinstance(spark, SparkSession) else SparkSession.builder.getOrCreate()

    def path(name: str) -> str:
        return os.path.join(out, name)

    def write(df: DataFrame, name: str, step: str) -> DataFrame:
        t = time.monotonic()
        df.write.mode("overwrite").parquet(path(name))
        back = sql().read.parquet(path(name))
        log.info("%s %s: %d rows in %.1fs", step, name, back.count(), time.monotonic() - t)
        return back

    splits, stats, bases = plan_and_write_rows(sc, dirs, split_bytes, out, head)

    # vclock_history, the writes' vclocks and (when the origins' own transactions are few
    # enough to send to every task) origin_history: per split, from the vclock at its start.
    t = time.monotonic()
    pre = col.prefixes(splits, stats, bases)
    spans = [x.written_us for x in stats if x.written_us is not None]
    t0 = min(lo for lo, _ in spans) if spans else None
    width = max(1, max(hi for _, hi in spans) - t0) / plot_buckets if spans else 1.0
    rows_dir, vclock_dir, writes_dir = path("rows"), path("vclock_history"), path(pass2.WRITES_DIR)
    in_tasks = (all(x.own is not None or x.own_txns == 0 for x in stats)
                and sum(x.own_txns for x in stats) <= task_lookup_rows_max)
    history_dir = path("origin_history") if in_tasks else None
    own = sc.broadcast(col.own_written(splits, stats)) if in_tasks else None
    contents = col.own_contents(stats, task_lookup_rows_max)
    ref = sc.broadcast(contents) if contents is not None else None
    div_dir = path(pass2.DIVERGENCE_DIR) if contents is not None else None
    for d in (vclock_dir, writes_dir) + ((history_dir,) if in_tasks else ()) + ((div_dir,) if div_dir else ()):
        _fresh(d)
    writers = sorted({u for x in stats for u in x.origin_max})
    buckets = max(2 * sc.defaultParallelism, sum(x.own_txns for x in stats) // writes_bucket_txns + 1)
    work = [(i, stats[i].name, pre[i]) for i in range(len(splits))]
    input_dir = path(PASS2_INPUT_DIR)
    results = (sc.parallelize(work, _tasks(sc, len(work), sum(x.end - x.start for x in splits)))
               .map(lambda w: _as_value(_pass2().write_split_pass2, w[0], w[1], input_dir, vclock_dir, writes_dir,
                                        history_dir,
                                        own.value if own is not None else None,
                                        div_dir, ref.value if ref is not None else None,
                                        w[2], t0, width, writers, buckets)).collect())
    _raise_first(results)
    shutil.rmtree(input_dir)
    _done(vclock_dir)
    log.info("[4/8] vclock_history: %d rows in %.1fs", sum(x.txns for x in stats), time.monotonic() - t)
    pts = _progress_points([p for r in results for p in r[0]], t0)
    if on_points is not None:
        on_points(pts)

    def rows() -> DataFrame:        # only the Spark SQL fallbacks read `rows` back
        return sql().read.parquet(rows_dir)

    if in_tasks:
        _done(history_dir)
        own.unpersist()
        acc: dict[tuple[str, str], list[int]] = {}
        for r in results:
            for node, origin, n, mx, sm in r[1]:
                a = acc.setdefault((node, origin), [0, mx, 0])
                a[0], a[1], a[2] = a[0] + n, max(a[1], mx), a[2] + sm
        delay_rows = sorted((node, origin, n, mx, sm / n) for (node, origin), (n, mx, sm) in acc.items())
        col.write_table(path("replication_delay"), col.REPLICATION_DELAY_SCHEMA, delay_rows)
        max_delay: dict[str, int] = {}
        for node, _o, _n, mx, _m in delay_rows:
            max_delay[node] = max(max_delay.get(node, mx), mx)
        log.info("[5/8] origin_history (in pass 2), replication_delay: %d rows", len(delay_rows))
    else:
        history = write(origin_history(rows()), "origin_history", "[5/8]")
        delays = write(replication_delay(history), "replication_delay", "[5/8]")
        max_delay = {r["node_uuid"]: r["m"] for r in
                     delays.groupBy("node_uuid").agg(F.max("delay_us_max").alias("m")).collect()}
    suspects = sum(r[2] for r in results)
    if div_dir is not None and suspects == 0:
        # Every observation equals its origin's own: no divergence, and no Spark job to say so.
        col.write_table(path("divergence"), col.DIVERGENCE_SCHEMA, [])
        shutil.rmtree(div_dir)
        ref.unpersist()
        div, divergent_rows = None, []
        log.info("[6/8] divergence: none (every observation equals its origin's own)")
    elif div_dir is not None:
        ref.unpersist()
        div = write(divergence_from_input(rows(), sql().read.parquet(div_dir)), "divergence", "[6/8]")
        shutil.rmtree(div_dir)
    else:
        div = write(divergence(rows()), "divergence", "[6/8]")
    if div is not None:
        divergent_rows = sorted((r[0], r[1]) for r in div.select("origin_uuid", "origin_lsn").distinct().collect())
    t = time.monotonic()
    conc = concurrent_pairs(sc, writes_dir, path("concurrent_writes"), buckets, writers)
    shutil.rmtree(writes_dir)
    log.info("[7/8] concurrent_writes: %d rows in %.1fs", conc, time.monotonic() - t)

    t = time.monotonic()
    nodes: dict[str, dict] = {}
    for x in stats:
        if x.rows:
            n = nodes.setdefault(x.node_uuid, {"rows": 0, "max_delay_us": None, "vclock": {}, "local_lsn": 0})
            n["rows"] += x.rows
    for node, (vc, local) in col.finals(splits, stats, pre).items():
        if node in nodes:
            nodes[node]["vclock"], nodes[node]["local_lsn"] = vc, local
    for node, m in max_delay.items():
        nodes[node]["max_delay_us"] = m
    s = {
        "nodes": nodes,
        "origins": sorted({u for x in stats for u in x.origin_max}),
        "rows": sum(x.rows for x in stats),
        "unresolved_rows": sum(x.unresolved for x in stats),
        "divergent_rows": divergent_rows,
        "concurrent_writes": conc,
    }
    log.info("[8/8] summary in %.1fs; all stages %.1fs", time.monotonic() - t, time.monotonic() - started)
    return s, pts
