"""Where the jobs run: the SparkSession (or, for the RDD stages alone, the SparkContext) with
the settings the jobs need, and the code the executors need shipped to them.

Rules: `master=None` keeps what spark-submit chose (or local[*]); the local-mode speed-ups (a
driver JVM that starts faster, spark.jvmstart; workers that import the installed pyspark,
spark/localdaemon) apply only to a local master outside spark-submit, and a setting the caller
passes in `conf` wins over ours; everything else is the same on a cluster."""
from __future__ import annotations

import atexit
import os
import re
import shutil
import sys
import tempfile
import zipfile

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

def session(master: str | None = None, *, app_name: str = "replog-analyze",
            conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession for the jobs (and whoever reads their tables with Spark SQL)."""
    master, settings = _settings(master, conf)
    b = SparkSession.builder.appName(app_name)
    if master is not None:
        b = b.master(master)
    for k, v in settings.items():
        b = b.config(k, v)
    return b.getOrCreate()


def context(master: str | None = None, *, app_name: str = "replog-analyze",
            conf: dict[str, str] | None = None) -> SparkContext:
    """The SparkContext alone, with the same settings: all that the usual path of the jobs needs
    (RDDs of Python tasks). A SparkSession on top cost ~1 s more of start and ~1.2 CPU-s of JVM
    (local[2], measured); spark.jobs makes one only for its Spark SQL stages."""
    master, settings = _settings(master, conf)
    c = SparkConf().setAppName(app_name).setAll(list(settings.items()))
    if master is not None:
        c.setMaster(master)
    return SparkContext.getOrCreate(c)


def _settings(master: str | None, conf: dict[str, str] | None) -> tuple[str | None, dict[str, str]]:
    """The master (None: what spark-submit chose) and the settings, the caller's `conf` last."""
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master is None and not under_submit:
        master = "local[*]"
    local = master is not None and master.startswith("local")
    if local and not under_submit:
        # Executors run this very interpreter (it has msgpack, crc32c); a laptop's hostname
        # may not resolve, the loopback always does. Never for a cluster: executors connect back.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings = {
        "spark.sql.execution.arrow.pyspark.enabled": "true",       # readers hand Arrow batches over
        "spark.sql.execution.pythonUDF.arrow.enabled": "true",
        "spark.sql.execution.pythonUDTF.arrow.enabled": "true",
        "spark.ui.showConsoleProgress": "false",                   # stages log their own lines
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.compression.codec": "zstd",             # as spark.columnar.codec
    }
    if local:
        settings.update({
            "spark.ui.enabled": "false",
            "spark.driver.memory": "2g",
            # Two shuffle partitions a core: each is a task of its own; more only add overhead.
            "spark.sql.shuffle.partitions": str(2 * _local_cores(master)),
            # JVM <-> Python worker over a Unix socket: over loopback TCP every task paid
            # ~40 ms of delayed-ACK stalls (measured: 64 tasks 2.0 s -> 0.7 s).
            "spark.python.unix.domain.socket.enabled": "true",
        })
        if not under_submit:
            from spark import jvmstart
            settings["spark.driver.extraJavaOptions"] = jvmstart.driver_java_options()
            settings.update(_local_daemon(conf or {}))
    settings.update(conf or {})
    return master, settings


def _local_daemon(conf: dict[str, str]) -> dict[str, str]:
    """Settings that start PySpark's workers from the installed pyspark, not from the zip of
    the same sources under SPARK_HOME (spark/localdaemon: ~1.6 CPU-s and ~1 s less before the
    first task). Only when SPARK_HOME is that installed package (pip's PySpark, which the driver
    launched itself; another Spark's zip may hold another version), and the caller sets neither
    the daemon nor the workers' PYTHONPATH."""
    import pyspark
    home = os.path.dirname(os.path.abspath(pyspark.__file__))
    if os.path.realpath(os.environ.get("SPARK_HOME", home)) != os.path.realpath(home) \
            or {"spark.python.daemon.module", "spark.executorEnv.PYTHONPATH"} & set(conf):
        return {}
    return {"spark.python.daemon.module": "replog_local_daemon",
            "spark.executorEnv.PYTHONPATH": os.path.join(os.path.dirname(os.path.abspath(__file__)), "localdaemon")}


def _local_cores(master: str) -> int:
    m = re.match(r"local\[(\d+)", master)
    return int(m.group(1)) if m else (os.cpu_count() or 1)


def ship_code(spark: SparkSession | SparkContext) -> None:
    """Send the `spark` and `node` packages to the executors (a cluster has no copy of them).
    Once per SparkContext: a second zip of the same name would be refused."""
    sc = spark.sparkContext if isinstance(spark, SparkSession) else spark
    if getattr(sc, "_replog_code_shipped", False):
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # Executors fetch the zip from the driver's file server for as long as the context lives,
    # so it stays until this process ends, and goes then (not one directory left per run).
    where = tempfile.mkdtemp(prefix="replog-analyze-")
    atexit.register(shutil.rmtree, where, True)
    path = os.path.join(where, "replog_analysis.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for pkg in ("spark", "node"):
            for dirpath, dirnames, files in os.walk(os.path.join(root, pkg)):
                dirnames[:] = [d for d in dirnames if d != "__pycache__"]
                for f in files:
                    if f.endswith(".py"):
                        full = os.path.join(dirpath, f)
                        z.write(full, os.path.relpath(full, root))
    sc.addPyFile(path)
    # The native WAL reader cannot be imported from a zip: it goes as a file of its own, which
    # executors find on sys.path (spark.walcols.native). Built for this machine's platform: an
    # executor that cannot load it reads in pure Python (same results, slower; it logs why).
    from spark import walcols
    native = walcols.native_file()
    if native is not None:
        sc.addFile(native)
    sc._replog_code_shipped = True  # type: ignore[attr-defined]


