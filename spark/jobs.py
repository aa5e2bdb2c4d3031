"""The PySpark jobs: WAL segments of many nodes -> the Parquet tables of spark.tables.

Order of work (each stage logs a line, so long runs show progress):
  1. the driver lists each node's segments and reads its first header (node uuid, base vclock);
  2. executors plan splits: one task per segment walks frame headers (spark.walread.plan_segment);
  3. executors read the splits (one task each) into nested frame records, which the JVM explodes
     into `rows`; written to Parquet and read back, so later stages scan columns, not WALs;
  4. `vclock_history` with window functions: per node, ordered by position, a running max of
     each origin's last lsn (plus the first header's vclock); never collected to the driver;
  5. `origin_history` (a join of every observation of a transaction with its origin's own)
     and `replication_delay`; 6. `divergence`; 7. `concurrent_writes`;
  8. small aggregates for the summary and the progress plots are the only things collected.
Rules: the same code runs on local[*] and under spark-submit on a cluster (inputs and OUT must
then be paths every executor can read and write); the code that runs in executors is shipped
with the job (a zip of the `spark` and `node` packages); no Python UDFs, only Spark SQL over
what the readers emit."""
from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import time
import zipfile
from typing import Iterable

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as ST

from node.core.rows import GROUP_NAMES, OP_NAMES
from spark import tables as T
from spark import walread

log = logging.getLogger("replog.analyze")

plot_buckets = 400                 # points per origin line in a progress plot

_TXN_OPS = ST.ArrayType(ST.StructType([
    ST.StructField("kind", ST.IntegerType(), False),
    ST.StructField("space", ST.StringType(), False),
    ST.StructField("key", ST.StringType(), False),
    ST.StructField("content_hash", ST.LongType(), False),
]), False)
FRAME_SCHEMA = ST.StructType([
    ST.StructField("node_uuid", ST.StringType(), False),
    ST.StructField("segment", ST.StringType(), False),
    ST.StructField("ordinal", ST.LongType(), False),
    ST.StructField("offset", ST.LongType(), False),
    ST.StructField("written_us", ST.LongType(), False),
    ST.StructField("txns", ST.ArrayType(ST.StructType([
        ST.StructField("origin_uuid", ST.StringType(), True),
        ST.StructField("lsn", ST.LongType(), False),
        ST.StructField("group", ST.IntegerType(), False),
        ST.StructField("timestamp", ST.LongType(), False),
        ST.StructField("first_index", ST.IntegerType(), False),
        ST.StructField("ops", _TXN_OPS, False),
    ]), False), False),
])


# --- the session -------------------------------------------------------------------
def session(master: str | None = None, *, app_name: str = "replog-analyze",
            conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession for the jobs. `master=None` keeps what spark-submit chose (or local[*])."""
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master is None and not under_submit:
        master = "local[*]"
    local = master is not None and master.startswith("local")
    if local and not under_submit:
        # Executors run this very interpreter (it has msgpack, crc32c); a laptop's hostname
        # may not resolve, the loopback always does. Never for a cluster: executors connect back.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    b = SparkSession.builder.appName(app_name)
    if master is not None:
        b = b.master(master)
    settings = {
        "spark.sql.execution.pythonUDF.arrow.enabled": "false",    # pyarrow is not a dependency
        "spark.sql.execution.pythonUDTF.arrow.enabled": "false",
        "spark.ui.showConsoleProgress": "false",                   # stages log their own lines
        "spark.sql.session.timeZone": "UTC",
    }
    if local:
        settings.update({
            "spark.ui.enabled": "false",
            "spark.driver.memory": "2g",
            "spark.sql.shuffle.partitions": "16",
            # JVM <-> Python worker over a Unix socket: over loopback TCP every task paid
            # ~40 ms of delayed-ACK stalls (measured: 64 tasks 2.0 s -> 0.7 s).
            "spark.python.unix.domain.socket.enabled": "true",
        })
    settings.update(conf or {})
    for k, v in settings.items():
        b = b.config(k, v)
    return b.getOrCreate()


def ship_code(spark: SparkSession) -> None:
    """Send the `spark` and `node` packages to the executors (a cluster has no copy of them).
    Once per SparkContext: a second zip of the same name would be refused."""
    sc = spark.sparkContext
    if getattr(sc, "_replog_code_shipped", False):
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(tempfile.mkdtemp(prefix="replog-analyze-"), "replog_analysis.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for pkg in ("spark", "node"):
            for dirpath, dirnames, files in os.walk(os.path.join(root, pkg)):
                dirnames[:] = [d for d in dirnames if d != "__pycache__"]
                for f in files:
                    if f.endswith(".py"):
                        full = os.path.join(dirpath, f)
                        z.write(full, os.path.relpath(full, root))
    sc.addPyFile(path)
    sc._replog_code_shipped = True  # type: ignore[attr-defined]


# --- stage 1-3: reading ------------------------------------------------------------
def plan(spark: SparkSession, dirs: list[str], split_bytes: int) -> tuple[list[walread.Split], list[walread.NodeBase], dict[str, str]]:
    """Splits of every node's segments, each node's base vclock, and node uuid -> input dir."""
    segments: list[walread.SegmentFile] = []
    bases: list[walread.NodeBase] = []
    node_dirs: dict[str, str] = {}
    for d in dirs:
        base = walread.node_base(d)
        if base.node_uuid in node_dirs:
            raise walread.WalInputError(f"{d}: node {base.node_uuid} is given twice (also {node_dirs[base.node_uuid]})")
        node_dirs[base.node_uuid] = d
        bases.append(base)
        segments.extend(walread.node_segments(d))
    log.info("[1/8] %d nodes, %d segments, %.1f MiB", len(dirs), len(segments),
             sum(os.path.getsize(s.path) for s in segments) / 2**20)
    t = time.monotonic()
    sc = spark.sparkContext
    splits = (sc.parallelize(segments, _tasks(sc, len(segments), 0))
              .flatMap(lambda s: walread.plan_segment(s, split_bytes)).collect())
    by_path = {s.path: b.node_uuid for d, b in zip(dirs, bases) for s in walread.node_segments(d)}
    for s in splits:
        if s.node_uuid != by_path[s.path]:
            raise walread.WalInputError(f"{s.path}: segment of node {s.node_uuid} among node {by_path[s.path]}'s")
    log.info("[2/8] planned %d splits in %.1fs", len(splits), time.monotonic() - t)
    return splits, bases, node_dirs


def _tasks(sc, items: int, total_bytes: int) -> int:
    """Tasks for a list of segments or splits: one each when they are big, and never more
    than a few per core when they are small (a Python task costs tens of ms to start)."""
    return max(1, min(items, max(4 * sc.defaultParallelism, -(-total_bytes // walread.split_bytes_default))))


def _name_of(names: dict[int, str], col: str):
    m = F.create_map(*[x for k, v in sorted(names.items()) for x in (F.lit(k), F.lit(v))])
    return F.element_at(m, F.col(col))


def read_rows(spark: SparkSession, splits: list[walread.Split]) -> DataFrame:
    """Row observations (spark.tables.ROWS) of the splits, read in executors."""
    sc = spark.sparkContext
    total = sum(s.end - s.start for s in splits)
    rdd = sc.parallelize(splits, _tasks(sc, len(splits), total)).flatMap(walread.read_split)
    frames = spark.createDataFrame(rdd, FRAME_SCHEMA, verifySchema=False)
    txns = frames.select("node_uuid", "segment", "ordinal", "offset", "written_us",
                         F.explode("txns").alias("t")).select(
        "node_uuid", "segment", "ordinal", "offset", "written_us", "t.*")
    r = txns.select("*", F.posexplode("ops").alias("row_in_txn", "o"))
    index = F.col("first_index") + F.col("row_in_txn")
    origin = F.col("origin_uuid")
    return r.select(
        "node_uuid", "segment", "offset",
        index.cast("int").alias("index"),
        (F.shiftleft(F.col("ordinal"), walread.POSITION_SEGMENT_SHIFT) + F.col("offset") + index).alias("position"),
        "written_us", "origin_uuid",
        (F.col("lsn") + F.col("row_in_txn")).alias("origin_lsn"),
        F.when(F.col("group") == 1, F.concat(origin, F.lit("/local/"), F.col("lsn").cast("string")))
         .otherwise(F.concat(origin, F.lit("/"), F.col("lsn").cast("string"))).alias("txn_id"),
        F.col("lsn").alias("txn_lsn"),
        F.col("row_in_txn").cast("int").alias("row_in_txn"),
        F.size("ops").alias("txn_rows"),
        "timestamp",
        _name_of(GROUP_NAMES, "group").alias("group"),
        _name_of(OP_NAMES, "o.kind").alias("op"),
        F.col("o.space").alias("space"), F.col("o.key").alias("key"),
        F.col("o.content_hash").alias("content_hash"),
    )


# --- stage 4-7: the tables ------------------------------------------------------------
def _txns(rows: DataFrame) -> DataFrame:
    return rows.where(F.col("row_in_txn") == 0).withColumn(
        "txn_last_lsn", F.col("txn_lsn") + F.col("txn_rows") - 1)


def row_origins(rows: DataFrame) -> list[str]:
    """Origins of replicated rows (a small list: the members that wrote)."""
    return sorted(r[0] for r in rows.where((F.col("group") != "local") & F.col("origin_uuid").isNotNull())
                  .select("origin_uuid").distinct().collect())


def origins_of(rows: DataFrame, bases: Iterable[walread.NodeBase], written: list[str] | None = None) -> list[str]:
    """Every uuid that can be a vclock component: writers and the first headers' members."""
    seen = set(row_origins(rows) if written is None else written)
    for b in bases:
        seen.update(u for u, _ in b.vclock)
    return sorted(seen)


def vclock_history(spark: SparkSession, rows: DataFrame, bases: list[walread.NodeBase],
                   origins: list[str]) -> DataFrame:
    w = Window.partitionBy("node_uuid").orderBy("position").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    base_schema = ST.StructType([
        ST.StructField("node_uuid", ST.StringType(), False),
        ST.StructField("base", ST.MapType(ST.StringType(), ST.LongType()), False),
        ST.StructField("base_local", ST.LongType(), False)])
    base_df = spark.createDataFrame([(b.node_uuid, dict(b.vclock), b.local_lsn) for b in bases], base_schema)
    t = _txns(rows)
    replicated = (F.col("group") != "local")
    running = [F.max(F.when(replicated & (F.col("origin_uuid") == u), F.col("txn_last_lsn"))).over(w).alias(f"c{i}")
               for i, u in enumerate(origins)]
    local = F.max(F.when(~replicated, F.col("txn_last_lsn"))).over(w).alias("c_local")
    h = t.select("node_uuid", "position", "segment", "offset", "written_us", "origin_uuid", "txn_id",
                 "group", *running, local).join(F.broadcast(base_df), "node_uuid")
    entries = [F.struct(F.lit(u).alias("k"),
                        F.greatest(F.coalesce(F.col(f"c{i}"), F.lit(0)),
                                   F.coalesce(F.element_at("base", F.lit(u)), F.lit(0))).alias("v"))
               for i, u in enumerate(origins)]
    vclock = (F.map_from_entries(F.filter(F.array(*entries), lambda e: e["v"] > 0)) if origins
              else F.create_map().cast("map<string,bigint>"))
    return h.select("node_uuid", "position", "segment", "offset", "written_us", "origin_uuid", "txn_id", "group",
                    vclock.alias("vclock"),
                    F.greatest(F.coalesce(F.col("c_local"), F.lit(0)), F.col("base_local")).alias("local_lsn"))


def origin_history(rows: DataFrame) -> DataFrame:
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
    rep = rows.where((F.col("group") != "local") & F.col("origin_uuid").isNotNull())
    bad = (rep.groupBy("origin_uuid", "origin_lsn")
           .agg(F.min("content_hash").alias("lo"), F.max("content_hash").alias("hi"))
           .where(F.col("lo") != F.col("hi")).select("origin_uuid", "origin_lsn"))
    obs = rep.join(bad, ["origin_uuid", "origin_lsn"])
    w = Window.partitionBy("origin_uuid", "origin_lsn")
    return obs.select("origin_uuid", "origin_lsn", "node_uuid", "content_hash", "op", "space", "key",
                      F.size(F.collect_set("content_hash").over(w)).alias("variants"))


def concurrent_writes(rows: DataFrame, vclocks: DataFrame) -> DataFrame:
    writes = rows.where((F.col("node_uuid") == F.col("origin_uuid")) & (F.col("group") == "default")
                        & F.col("op").isin(*T.WRITE_OPS)).select(
        "node_uuid", "space", "key", "origin_uuid", "origin_lsn", "timestamp",
        (F.col("position") - F.col("row_in_txn")).alias("position"))
    own = vclocks.where((F.col("node_uuid") == F.col("origin_uuid")) & (F.col("group") == "default")).select(
        "node_uuid", "position", "vclock")
    wv = writes.join(own, ["node_uuid", "position"]).select("space", "key", "origin_uuid", "origin_lsn", "timestamp", "vclock")
    a, b = wv.alias("a"), wv.alias("b")
    pairs = a.join(b, (F.col("a.space") == F.col("b.space")) & (F.col("a.key") == F.col("b.key"))
                   & (F.col("a.origin_uuid") < F.col("b.origin_uuid")))
    seen_a = F.coalesce(F.element_at(F.col("b.vclock"), F.col("a.origin_uuid")), F.lit(0))
    seen_b = F.coalesce(F.element_at(F.col("a.vclock"), F.col("b.origin_uuid")), F.lit(0))
    return pairs.where((seen_a < F.col("a.origin_lsn")) & (seen_b < F.col("b.origin_lsn"))).select(
        F.col("a.space").alias("space"), F.col("a.key").alias("key"),
        F.col("a.origin_uuid").alias("origin_a"), F.col("a.origin_lsn").alias("lsn_a"),
        F.col("a.timestamp").alias("timestamp_a"),
        F.col("b.origin_uuid").alias("origin_b"), F.col("b.origin_lsn").alias("lsn_b"),
        F.col("b.timestamp").alias("timestamp_b"))


# --- stage 8: what the driver collects --------------------------------------------------
def summary(rows: DataFrame, vclocks: DataFrame, delays: DataFrame, div: DataFrame, conc: DataFrame,
            origins: list[str]) -> dict:
    """The figures `replog analyze` prints; same shape as spark.oracle.summary."""
    nodes: dict[str, dict] = {}
    counts = rows.groupBy("node_uuid").agg(
        F.count(F.lit(1)).alias("n"), F.sum(F.col("origin_uuid").isNull().cast("long")).alias("unresolved"))
    unresolved = 0
    for r in counts.collect():
        nodes[r["node_uuid"]] = {"rows": r["n"], "max_delay_us": None, "vclock": {}, "local_lsn": 0}
        unresolved += r["unresolved"]
    for r in vclocks.groupBy("node_uuid").agg(F.max_by(F.struct("vclock", "local_lsn"), "position").alias("v")).collect():
        nodes[r["node_uuid"]]["vclock"] = dict(r["v"]["vclock"])
        nodes[r["node_uuid"]]["local_lsn"] = r["v"]["local_lsn"]
    for r in delays.groupBy("node_uuid").agg(F.max("delay_us_max").alias("m")).collect():
        nodes[r["node_uuid"]]["max_delay_us"] = r["m"]
    return {
        "nodes": nodes,
        "origins": sorted(origins),
        "rows": sum(n["rows"] for n in nodes.values()),
        "unresolved_rows": unresolved,
        "divergent_rows": sorted((r[0], r[1]) for r in div.select("origin_uuid", "origin_lsn").distinct().collect()),
        "concurrent_writes": conc.count(),
    }


def progress_points(rows: DataFrame) -> list[tuple[str, str, float, int]]:
    """(node, origin, seconds since the first frame of any node, lsn) at plot_buckets points
    per node: the node's progress per origin over its own time."""
    t = _txns(rows).where((F.col("group") != "local") & F.col("origin_uuid").isNotNull())
    span = t.agg(F.min("written_us").alias("t0"), F.max("written_us").alias("t1")).collect()[0]
    if span["t0"] is None:
        return []
    t0, width = span["t0"], max(1, span["t1"] - span["t0"]) / plot_buckets
    b = F.floor((F.col("written_us") - F.lit(t0)) / F.lit(width))
    pts = (t.groupBy("node_uuid", "origin_uuid", b.alias("b"))
           .agg(F.max("written_us").alias("t"), F.max("txn_last_lsn").alias("lsn")).collect())
    return sorted((r["node_uuid"], r["origin_uuid"], (r["t"] - t0) / 1e6, r["lsn"]) for r in pts)


# --- the whole run -----------------------------------------------------------------------
_INPUT_ERROR = re.compile(r"WalInputError: (.*)")


def run(spark: SparkSession, dirs: list[str], out: str, *,
        split_bytes: int = walread.split_bytes_default) -> tuple[dict, list]:
    """Write every table under `out`; returns the summary and the progress points.
    Raises WalInputError for input that cannot be analysed, wherever a reader met it."""
    try:
        return _run(spark, dirs, out, split_bytes)
    except (PySparkException, Py4JJavaError) as e:
        # A reader's WalInputError in an executor reaches the driver as text inside Spark's error.
        m = _INPUT_ERROR.search(str(e))
        if m is None:
            raise
        raise walread.WalInputError(m.group(1)) from None


def _run(spark: SparkSession, dirs: list[str], out: str, split_bytes: int) -> tuple[dict, list]:
    started = time.monotonic()
    splits, bases, _node_dirs = plan(spark, dirs, split_bytes)

    def path(name: str) -> str:
        return os.path.join(out, name)

    def write(df: DataFrame, name: str, step: str) -> DataFrame:
        t = time.monotonic()
        df.write.mode("overwrite").parquet(path(name))
        back = spark.read.parquet(path(name))
        log.info("%s %s: %d rows in %.1fs", step, name, back.count(), time.monotonic() - t)
        return back

    rows = write(read_rows(spark, splits), "rows", "[3/8]")
    written = row_origins(rows)
    origins = origins_of(rows, bases, written)
    vclocks = write(vclock_history(spark, rows, bases, origins), "vclock_history", "[4/8]")
    history = write(origin_history(rows), "origin_history", "[5/8]")
    delays = write(replication_delay(history), "replication_delay", "[5/8]")
    div = write(divergence(rows), "divergence", "[6/8]")
    conc = write(concurrent_writes(rows, vclocks), "concurrent_writes", "[7/8]")
    t = time.monotonic()
    s = summary(rows, vclocks, delays, div, conc, written)
    points = progress_points(rows)
    log.info("[8/8] summary and plot data in %.1fs; all stages %.1fs", time.monotonic() - t, time.monotonic() - started)
    return s, points
