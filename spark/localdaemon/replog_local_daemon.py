"""PySpark's worker daemon for local mode, minus the copy of PySpark it would import from a zip.

The JVM starts the daemon as `python -m <spark.python.daemon.module> pyspark.worker` with
SPARK_HOME/python/lib/pyspark.zip (and py4j's zip) first on PYTHONPATH. For pip's PySpark that zip
holds the same sources as the installed package, but as .py files in an archive: every daemon
compiles PySpark from source (~0.65 CPU-s) and every worker reads its 1,485-entry directory and
compiles pyspark.worker (~0.6 CPU-s each), on the critical path of the first job. This module
drops those zips from sys.path, so the installed package (with its cached bytecode) is used, then
runs PySpark's own daemon unchanged.

Used only where the two are the same files: spark.launch.session sets it for a local master,
outside spark-submit, when SPARK_HOME is the installed pyspark package (the embedded default),
and puts this directory on the workers' PYTHONPATH. Not a package on purpose: this directory
holds nothing else, so nothing else is importable from it."""
import gc
import os
import sys

_LIB = os.path.join(os.environ.get("SPARK_HOME", "\0"), "python", "lib")
_zips = [p for p in sys.path if os.path.dirname(p) == _LIB and p.endswith(".zip")]
for _p in _zips:
    sys.path.remove(_p)
    # Finding this module opened the zip: a worker's importlib.invalidate_caches() (on its first
    # task) would read its directory again.
    sys.path_importer_cache.pop(_p, None)
try:
    from pyspark import daemon
except ImportError:          # no installed pyspark after all: the zips' copy, as Spark meant
    sys.path[1:1] = _zips
    from pyspark import daemon

if __name__ == "__main__":
    # Out of the collector's reach before the daemon forks: the daemon runs gc.collect() in each
    # worker after every task, and walking the inherited objects wrote to every page of them
    # (copy on write: ~0.3 CPU-s a worker, on the first job's critical path).
    gc.freeze()
    daemon.manager()
