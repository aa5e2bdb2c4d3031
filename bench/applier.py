"""Applier throughput: a replica catching up a backlog, replog beside Tarantool (issue 5).

The workload, the same for both systems, per run and per transaction shape:
  1. a fresh master (wal_mode = write) with one space; a replica joins it and catches up;
  2. the replica is stopped (SIGTERM);
  3. the master gets N rows {unsigned key, 100-byte string} as N / txn_rows transactions
     of txn_rows rows (1: N separate single-row transactions; 100: 100-row transactions);
  4. the replica process is started again. The clock runs from just before its exec until
     its durable vclock reaches the master's (replog: `/v1/info` vclock_uuid, polled every
     20 ms over one keep-alive connection; Tarantool: a fiber in the replica polls
     box.info.vclock every 1 ms and writes the CLOCK_MONOTONIC time it saw the target).
     rows/s = N / that time, process start-up included, as in the reference figures.
Neither system checkpoints during a run (replog: --checkpoint-interval-s 86400; Tarantool:
checkpoint_interval = 0), and a replog catch-up that turned into a snapshot rejoin fails
the run instead of reporting a figure.
The two systems alternate (replog run 1, Tarantool run 1, replog run 2, ...); the tables show
medians of --runs runs. Tarantool runs when `tarantool` is on PATH (Debian package
`tarantool`; the Lua scripts are in bench/tarantool/).

Loading the master is not timed. `--load direct` (default) stops the replog master and
writes the backlog in-process through the node's own write path (Store -> recover ->
WalWriter -> NodeCore -> Journal, as node/server.py opens a node, with --writers tasks each
submitting `core.local_txn(ops)` so group commit batches them), then starts it again: the
WAL holds exactly what N HTTP writes would leave there (one frame per transaction). `--load
http` writes through the running master over HTTP instead (PUT per row for 1-row
transactions, POST /v1/txn per transaction otherwise, from --http-clients clients); it is
much slower to load. Tarantool is loaded inside the master by 64 fibers.

Also printed, per shape:
  floor   the same backlog rows (the master's WAL frames, read before timing) through
          msgpack decode + crc32c + one WAL write per 1 MiB relay batch (the received
          frame bytes, not re-encoded) + one LMDB transaction of puts per batch (records
          packed as the store packs them), in one
          tight loop in this process: what Python can do with no network, no asyncio, no
          Txn objects, no id translation. `vs floor` = rows/s / floor rows/s.
  RSS     the replica process's peak resident set (VmHWM from /proc/<pid>/status, read
          while it runs, after it caught up).
  CPU     replica (and master) CPU time during the catch-up, % of one core; and the
          replica's CPU microseconds per row, which other load on the machine disturbs far
          less than rows/s (a starved replica waits longer but does the same work).

    python -m bench.applier                                  # 1M rows, 1- and 100-row txns, 3 runs each
    python -m bench.applier --rows 200000 --runs 1           # a quick look
    python -m bench.applier --only replog --txn-rows 100
    python -m bench.applier --profile --rows 300000 --txn-rows 1   # py-spy on the replica's catch-up
    python -m bench.applier --only replog --gc-stats --replica-prelude "import gc; gc.freeze()"
    python -m bench.applier --only replog --links plain,tls,nomac   # TLS and the per-message MAC, alternating
    python -m bench.applier --links plain,base --baseline /tmp/replog-main   # this tree beside another checkout

`--links` runs replog with each link variant of bench/links.py in turn (replog = sealed
messages, replog+tls = the same inside TLS, on asyncio's loop, replog-asyncio = plain on
asyncio's loop, replog-nomac = without the per-message tag), so
their figures come from one alternating run and sit in one table.

`--gc-stats` times the replog replica's cyclic garbage collector (gc.callbacks, CPU time of
the collecting thread) and `--replica-prelude` runs a line of Python in the replica before
the node starts: together they let a change be tried on the real workload without editing
node/ (the replica then runs as `python -c <prelude + runpy node>`, otherwise identical).

One run of each system is bench/catchup.py; the backlog and the floor are bench/backlog.py.
Figures only: nothing here asserts on timing."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench import links as links_mod
from bench.backlog import floor_run
from bench.catchup import Run, profile_run, replog_run, tarantool_run
from bench.common import LoadWatch, dump_json, machine, median, print_load, print_machine, print_table
from bench.links import SYSTEM
from bench.procs import code_version
from bench.pyspy import print_profile
from node import limits

ROWS_DEFAULT = 1_000_000
RUNS_DEFAULT = 3
WRITERS_DEFAULT = 64                 # --load direct: concurrent submitting tasks (group commit)
HTTP_CLIENTS_DEFAULT = 32            # --load http: concurrent HTTP clients
TARANTOOL_MEMTX_MB = 1024            # memtx arena of each Tarantool instance (1M rows take ~200 MiB)


# --- the matrix --------------------------------------------------------------------------------
def summarize(runs: list[Run]) -> dict[str, Any]:
    r = runs[0]
    return {
        "system": r.system, "txn_rows": r.txn_rows, "rows": r.rows, "runs": len(runs),
        "seconds": median(x.seconds for x in runs),
        "rows_s": median(x.rows_s for x in runs),
        "each_rows_s": [round(x.rows_s) for x in runs],
        "startup_s": median(x.startup_s for x in runs),
        "peak_rss_mib": median((x.peak_rss_kib or float("nan")) / 1024 for x in runs),
        "end_rss_anon_mib": median((x.rss_anon_kib or float("nan")) / 1024 for x in runs),
        "end_rss_file_mib": median((x.rss_file_kib or float("nan")) / 1024 for x in runs),
        "replica_cpu_pct": median(100.0 * x.replica_cpu_s / x.seconds for x in runs),
        # CPU per row moves much less than rows/s when other work shares the machine
        "replica_cpu_us_row": median(1e6 * x.replica_cpu_s / x.rows for x in runs),
        "master_cpu_pct": median(100.0 * x.master_cpu_s / x.seconds for x in runs),
        "load_s": median(x.load_s for x in runs),
        "gc_cpu_s": median(x.gc_cpu_s for x in runs),
    }


def run_matrix(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    variants = {SYSTEM[v]: v for v in args.links} if "replog" in args.systems else {}
    systems = list(variants) + [s for s in ("tarantool",) if s in args.systems]
    for txn_rows in args.txn_rows:
        runs: dict[str, list[Run]] = {s: [] for s in systems + ["floor"]}
        for i in range(args.runs):
            for system in systems:
                base = tempfile.mkdtemp(prefix=f"applier-{system}-{txn_rows}-", dir=args.dir)
                try:
                    if system in variants:
                        run, batches = replog_run(base, args.rows, txn_rows, args, variants[system])
                        extra = ""
                        if system == systems[0]:     # the floor once per round, beside the first variant
                            fl = Run("floor", txn_rows, *floor_run(batches, os.path.join(base, "floor")))
                            runs["floor"].append(fl)
                            extra = f"; floor {fl.rows_s:,.0f} rows/s"
                        del batches
                    else:
                        run = tarantool_run(base, args.rows, txn_rows, args)
                        extra = ""
                finally:
                    if not args.keep:
                        shutil.rmtree(base, ignore_errors=True)
                runs[system].append(run)
                if not args.json:
                    print(f"  {system:9} {txn_rows:>3}-row txns run {i + 1}/{args.runs}: {run.rows:,} rows in "
                          f"{run.seconds:.2f} s = {run.rows_s:,.0f} rows/s (start-up {run.startup_s:.2f} s, "
                          f"peak RSS {(run.peak_rss_kib or 0) / 1024:.0f} MiB [at the end: anon {(run.rss_anon_kib or 0) / 1024:.0f}, "
                          f"file {(run.rss_file_kib or 0) / 1024:.0f}], load {run.load_s:.1f} s"
                          + (f", GC {run.gc_cpu_s:.2f} CPU-s / {run.gc_full} full" if run.gc_full is not None else "")
                          + f"){extra}"
                          + (f" [{base}]" if args.keep else ""), file=sys.stderr, flush=True)
        summary = {s: summarize(r) for s, r in runs.items() if r}
        fl = summary.get("floor")
        for s in summary.values():
            s["vs_floor"] = s["rows_s"] / fl["rows_s"] if fl else float("nan")
        if "replog" in summary and "tarantool" in summary:
            summary["replog"]["vs_tarantool"] = summary["replog"]["rows_s"] / summary["tarantool"]["rows_s"]
        out += list(summary.values())
    return out


def print_cases(cases: list[dict[str, Any]]) -> None:
    gc = any(c["gc_cpu_s"] == c["gc_cpu_s"] for c in cases)
    rows = [[c["system"], c["txn_rows"], c["rows"], c["runs"], c["rows_s"], c["seconds"], c["startup_s"],
             c["peak_rss_mib"], c["replica_cpu_pct"], c["replica_cpu_us_row"], c["master_cpu_pct"]]
            + ([c["gc_cpu_s"]] if gc else [])
            + [c["vs_floor"], c.get("vs_tarantool", float("nan")), " ".join(f"{x:,}" for x in c["each_rows_s"])]
            for c in cases]
    print_table(["system", "txn rows", "rows", "runs", "rows/s", "catch-up s", "start-up s", "peak RSS MiB",
                 "replica CPU %", "replica CPU us/row", "master CPU %"] + (["GC CPU-s"] if gc else [])
                + ["vs floor", "vs Tarantool", "each run rows/s"], rows)


# --- command line -------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.applier", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=ROWS_DEFAULT, help="backlog rows per run (default %(default)s)")
    p.add_argument("--runs", type=int, default=RUNS_DEFAULT, help="runs per system and shape (default %(default)s)")
    p.add_argument("--txn-rows", default="1,100", help="rows per transaction: 1, 100 or 1,100 (default %(default)s)")
    p.add_argument("--only", choices=("replog", "tarantool"), help="run one system (the floor runs with replog)")
    p.add_argument("--links", default="plain",
                   help="replog link variants to run in alternation: plain, tls, asyncio, nomac, base, comma-separated "
                        "(bench/links.py; default %(default)s)")
    p.add_argument("--baseline", metavar="DIR", default=None,
                   help="with --links ...,base: another replog checkout whose nodes run as replog-base (bench/links.py)")
    p.add_argument("--load", choices=("direct", "http"), default="direct",
                   help="how the replog master gets its backlog (default %(default)s; see the module doc)")
    p.add_argument("--writers", type=int, default=WRITERS_DEFAULT, help="--load direct: submitting tasks")
    p.add_argument("--http-clients", type=int, default=HTTP_CLIENTS_DEFAULT, help="--load http: clients")
    p.add_argument("--memtx-mb", type=int, default=TARANTOOL_MEMTX_MB, help="Tarantool memtx_memory in MiB")
    p.add_argument("--gc-stats", action="store_true",
                   help="replog replica: time its cyclic GC (gc.callbacks) and print GC CPU-s per run")
    p.add_argument("--replica-prelude", metavar="PYTHON", default="",
                   help="replog replica: Python run before the node starts, to try a change without editing "
                        "node/, e.g. \"import gc; gc.freeze()\" or \"import node.limits as L; "
                        "L.applier_pending_rows_max = 20000\"")
    p.add_argument("--dir", default=None, help="where temp data dirs go (default: the system temp dir)")
    p.add_argument("--keep", action="store_true", help="keep each run's data dirs and logs")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.add_argument("--profile", action="store_true",
                   help="instead of the matrix: one replog catch-up (last --txn-rows, first --links) under py-spy")
    p.add_argument("--profile-rate", type=int, default=200, help="with --profile: samples per second")
    p.add_argument("--profile-gil", action="store_true",
                   help="with --profile: sample only the thread holding the GIL (where CPU goes)")
    p.add_argument("--top", type=int, default=20, help="with --profile: functions per table")
    a = p.parse_args(argv)
    a.txn_rows = [int(x) for x in a.txn_rows.split(",") if x.strip()]
    if not a.txn_rows or min(a.txn_rows) < 1 or max(a.txn_rows) > limits.txn_ops_max:
        p.error(f"--txn-rows: each is 1..{limits.txn_ops_max}")
    if a.rows < max(a.txn_rows) or a.runs < 1 or a.writers < 1 or a.http_clients < 1:
        p.error("--rows, --runs, --writers and --http-clients must be positive (and rows >= txn rows)")
    try:
        a.links = links_mod.parse(a.links, a.baseline)
    except ValueError as e:
        p.error(str(e))
    a.systems = ("replog", "tarantool") if a.only is None else (a.only,)
    a.tarantool = shutil.which("tarantool")
    if "tarantool" in a.systems and not a.tarantool:
        if a.only == "tarantool":
            p.error("tarantool is not on PATH (apt-get install -y tarantool)")
        a.systems = ("replog",)
    a.dir = a.dir or tempfile.gettempdir()
    return a


def tarantool_version() -> str:
    try:
        return subprocess.run(["tarantool", "--version"], capture_output=True, text=True, timeout=10).stdout.split("\n")[0]
    except (OSError, subprocess.SubprocessError):
        return "-"


def _children_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mach = machine(args.dir)
    mach["tarantool"] = tarantool_version() if args.tarantool else "not installed"
    mach["code"] = code_version()
    watch, c0, t0 = LoadWatch(), _children_cpu_s(), time.perf_counter()
    if args.profile:
        base = tempfile.mkdtemp(prefix="applier-profile-", dir=args.dir)
        doc = profile_run(base, args.rows, args.txn_rows[-1], args)
        load = watch.stop(_children_cpu_s() - c0)
        if args.json:
            dump_json({"machine": mach, "load": load, "profile": doc})
        else:
            print_machine(mach)
            print(f"code:    {mach['code']}")
            print_load(load, mach["nproc"])
            print()
            print_profile(doc)
        return 0
    cases = run_matrix(args)
    load = watch.stop(_children_cpu_s() - c0)
    total_s = time.perf_counter() - t0
    if args.json:
        dump_json({"machine": mach, "load": load, "args": {k: v for k, v in vars(args).items()
                                                           if k not in ("tarantool",)},
                   "total_s": total_s, "cases": cases})
        return 0
    print_machine(mach)
    print(f"code:    {mach['code']}")
    print(f"tarantool: {mach['tarantool']}")
    print_load(load, mach["nproc"])
    print(f"workload: {args.rows:,} rows {{key, 100-byte string}} backlog, wal_mode write, replica restarted and "
          f"timed from exec to vclock = master's; load {args.load}; {args.runs} runs each, alternating; "
          f"total {total_s:.0f} s\n")
    print_cases(cases)
    for txn_rows in args.txn_rows:
        c = {x["system"]: x for x in cases if x["txn_rows"] == txn_rows}
        parts = []
        if "replog" in c and "tarantool" in c:
            parts.append(f"replog/Tarantool = {c['replog']['vs_tarantool']:.3f}")
        if "floor" in c:
            parts += [f"{s}/floor = {c[s]['vs_floor']:.3f}" for s in ("replog", "tarantool") if s in c]
        for s in links_mod.VARIANTS:                  # --links: each variant beside plain
            if s in c and "replog" in c:
                parts.append(f"{s}/replog rows/s = {c[s]['rows_s'] / c['replog']['rows_s']:.3f} (replica CPU "
                             f"{c[s]['replica_cpu_us_row']:.2f} vs {c['replog']['replica_cpu_us_row']:.2f} us/row)")
        print(f"{txn_rows}-row txns: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
