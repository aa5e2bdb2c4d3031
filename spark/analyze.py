"""`replog analyze DIR... [--master local[*]] [--out OUT]`: the Spark analysis of many nodes' WALs.

Each DIR is one node's data dir (holding `wal/`) or its WAL dir. Writes the Parquet tables of
spark.tables under OUT, a progress PNG per node under OUT/plots/, and prints a summary.
Runs unchanged under spark-submit, as a script:

    spark-submit --master spark://host:7077 spark/analyze.py DIR... --out OUT

(then DIRs and OUT must be paths the driver and every executor can reach, and the executors'
Python needs msgpack and crc32c). Exit codes: 0 done (divergences are findings, not failures),
2 bad usage or input that cannot be analysed (one line on stderr)."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time

if __package__ in (None, ""):
    # Run as a script (spark-submit spark/analyze.py): import the packages from the tree above.
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[0] = _root

# After the path is fixed: run as a script, the script's own dir (holding spark/concurrent.py)
# would otherwise shadow the standard library's `concurrent`.
import concurrent.futures  # noqa: E402

from spark import walread  # noqa: E402

log = logging.getLogger("replog.analyze")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="replog analyze", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("dirs", nargs="+", metavar="DIR", help="a node's data dir or WAL dir")
    p.add_argument("--master", default=None,
                   help="Spark master (default: local[*], or what spark-submit was given)")
    p.add_argument("--out", default="replog-analysis", help="output directory (default: %(default)s)")
    p.add_argument("--split-mb", type=float, default=walread.split_bytes_default / 2**20,
                   help="bytes of WAL one task reads, in MiB (default: %(default)s)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def format_summary(s: dict, node_dirs: dict[str, str] | None = None, out: str | None = None) -> str:
    node_dirs = node_dirs or {}
    lines = [f"replog analyze: {len(s['nodes'])} nodes, {len(s['origins'])} origins, "
             f"{s['rows']:,} row observations"
             + (f", {s['unresolved_rows']:,} with an unknown replica id" if s["unresolved_rows"] else "")]
    for node, n in sorted(s["nodes"].items(), key=lambda kv: node_dirs.get(kv[0], kv[0])):
        delay = "-" if n["max_delay_us"] is None else f"{n['max_delay_us'] / 1000:.1f} ms"
        lines.append(f"  node {node} ({node_dirs.get(node, '?')}): {n['rows']:,} rows, "
                     f"max delay {delay}, vclock signature {sum(n['vclock'].values()):,}, local {n['local_lsn']:,}")
    div = s["divergent_rows"]
    lines.append(f"divergences: {len(div)} rows with different content on different nodes")
    for origin, lsn in div[:10]:
        lines.append(f"  origin {origin} lsn {lsn}")
    if len(div) > 10:
        lines.append(f"  ... and {len(div) - 10} more (see the divergence table)")
    lines.append(f"concurrent writes: {s['concurrent_writes']:,} pairs")
    if out:
        lines.append(f"tables and plots: {out}")
    return "\n".join(lines)


class Analysis:
    """One run of the jobs from this driver, as a context: on entry a SparkContext (or the
    caller's session, which is left running) with the code shipped; `run()` writes the tables
    and the plots; on exit the context stops. In local mode (no session yet, not under spark-submit) pass 1
    begins on the driver while the JVM starts (spark.headstart); everywhere the plots are drawn
    in a driver thread while the last Spark stages run. `marks` holds when each part ended
    (time.monotonic()): "session", "tables", "plots"."""

    def __init__(self, dirs: list[str], out: str, *, master: str | None = None, conf: dict[str, str] | None = None,
                 split_bytes: int = walread.split_bytes_default, log_level: str = "WARN"):
        self.dirs, self.out, self.master, self.conf = dirs, out, master, conf or {}
        self.split_bytes, self.log_level = split_bytes, log_level
        self.node_dirs: dict[str, str] = {}
        self.marks: dict[str, float] = {}
        self.spark = self._head = None
        self._embedded = False

    def __enter__(self) -> "Analysis":
        from pyspark.sql import SparkSession

        from spark import jobs, launch
        self._embedded = SparkSession.getActiveSession() is not None
        local = (self.master or "local").startswith("local") and "PYSPARK_GATEWAY_PORT" not in os.environ
        if local and not self._embedded:
            self._head = jobs.head_start(self.dirs, self.out, self.split_bytes)
        started = False
        try:
            # The usual path runs RDD jobs only: a bare SparkContext starts ~1 s sooner than a
            # session (spark.jobs makes one if a Spark SQL stage runs).
            self.spark = SparkSession.getActiveSession() if self._embedded else \
                launch.context(self.master, conf=self.conf)
            if not self._embedded:
                self.spark.setLogLevel(self.log_level)
            launch.ship_code(self.spark)
            started = True
        finally:
            if not started:             # no `with` body will run: stop what did start
                self.__exit__(None, None, None)
        self.marks["session"] = time.monotonic()
        return self

    def run(self) -> tuple[dict, list[str]]:
        """Every table and plot under `out`: the summary and the plots' paths."""
        from spark import jobs
        self.node_dirs = {b.node_uuid: d for b, d in zip(self._bases(), self.dirs)}
        drawer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="replog-plots")
        drawn: list[concurrent.futures.Future] = []

        def on_points(points: list) -> None:
            drawn.append(drawer.submit(self._draw, points))

        # matplotlib takes ~0.5 CPU-s to import: now, while PySpark's workers start for pass 1
        # (a CPU is about idle then), not after pass 2 (both are busy).
        drawer.submit(importlib.import_module, "spark.plots")
        try:
            s, points = jobs.run(self.spark, self.dirs, self.out, split_bytes=self.split_bytes, head=self._head,
                                 on_points=on_points)
            self.marks["tables"] = time.monotonic()
            written = drawn[0].result() if drawn else self._draw(points)
        finally:
            drawer.shutdown(wait=True)
        return s, written

    @property
    def head_started(self) -> bool:
        """Whether pass 1 began on the driver (local mode, a session of our own)."""
        return self._head is not None

    def _bases(self) -> list[walread.NodeBase]:
        return self._head.inputs.bases if self._head is not None else [walread.node_base(d) for d in self.dirs]

    def _draw(self, points: list) -> list[str]:
        from spark import plots          # imported already (run()), in this thread
        written = plots.draw(points, os.path.join(self.out, "plots"), self.node_dirs)
        self.marks["plots"] = time.monotonic()
        log.info("wrote %d plots", len(written))
        return written

    def __exit__(self, *exc) -> None:
        if self._head is not None:
            self._head.stop()
        if self.spark is not None and not self._embedded:
            self.spark.stop()


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not args.quiet:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s analyze: %(message)s")
    conf = {}
    for kv in args.conf:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            print(f"analyze: --conf {kv!r}: expected KEY=VALUE", file=sys.stderr)
            return 2
        conf[k] = v
    try:
        for d in args.dirs:                 # fail fast, before a JVM starts
            walread.wal_dir_of(d)
        # pyspark is imported on entry: `--help` and bad input answer without loading it.
        with Analysis(args.dirs, args.out, master=args.master, conf=conf,
                      split_bytes=int(args.split_mb * 2**20)) as a:
            s, _plots = a.run()
    except walread.WalInputError as e:
        print(f"analyze: {e}", file=sys.stderr)
        return 2
    print(format_summary(s, a.node_dirs, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
