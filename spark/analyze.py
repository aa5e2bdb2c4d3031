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
import logging
import os
import sys

if __package__ in (None, ""):
    # Run as a script (spark-submit spark/analyze.py): import the packages from the tree above.
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[0] = _root

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
    except walread.WalInputError as e:
        print(f"analyze: {e}", file=sys.stderr)
        return 2
    # Imported here: `--help` and bad input answer without loading pyspark.
    from pyspark.sql import SparkSession

    from spark import jobs, plots
    embedded = SparkSession.getActiveSession() is not None   # a caller's session: leave it running
    spark = jobs.session(args.master, conf=conf)
    try:
        if not embedded:
            spark.sparkContext.setLogLevel("WARN")
        jobs.ship_code(spark)
        try:
            s, points = jobs.run(spark, args.dirs, args.out, split_bytes=int(args.split_mb * 2**20))
        except walread.WalInputError as e:
            print(f"analyze: {e}", file=sys.stderr)
            return 2
    finally:
        if not embedded:
            spark.stop()
    node_dirs = {walread.node_base(d).node_uuid: d for d in args.dirs}
    written = plots.draw(points, os.path.join(args.out, "plots"), node_dirs)
    log.info("wrote %d plots", len(written))
    print(format_summary(s, node_dirs, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
