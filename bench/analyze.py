"""Benchmark of the WAL analysis: the Spark jobs beside the single-process oracle, same input.

    .venv/bin/python bench/analyze.py [--nodes 8] [--rows 1000000] [--seed 1] [--master local[2]]
                                      [--workdir DIR] [--skip-oracle]

The input is spark.generate's synthetic cluster (`--rows` rows written by the origins; every node
holds about that many, so row observations ~ nodes x rows), generated once into the workdir and
reused. Each side runs in a child process of its own, so its wall time and peak memory are its
own: for Spark, the driver's Python (getrusage), the JVM (driver and, on local[*], the executor:
VmHWM from /proc) and the Python workers (VmHWM, largest and sum), sampled before the session
stops; for the oracle, its getrusage. The Spark side runs as `replog analyze` does
(spark.analyze.Analysis: in local mode pass 1 begins on the driver while the session starts, and
the plots are drawn while the last stage runs). Figures: wall time end to end (process start to
tables and plots written), when the session was ready, the jobs from then to the tables written,
the plots' tail after that, row observations per second, CPU seconds of the whole process tree.
The machine may be shared and its speed vary: before each side a fixed pure-Python loop is timed
(`speed reference`), and the CPU other processes used meanwhile is printed. Prints the figures;
writes nothing but the workdir."""
from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

_HZ = os.sysconf("SC_CLK_TCK")


# --- /proc helpers -----------------------------------------------------------------------
def _procs() -> dict[int, tuple[int, str, float, float]]:
    """pid -> (ppid, comm, cpu seconds incl. reaped children, cpu seconds of its own)."""
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1: s.rindex(")")]
        rest = s[s.rindex(")") + 2:].split()
        out[int(p)] = (int(rest[1]), comm, sum(int(x) for x in rest[11:15]) / _HZ,
                       sum(int(x) for x in rest[11:13]) / _HZ)
    return out


def _descendants(root: int, procs: dict) -> list[int]:
    kids: dict[int, list[int]] = {}
    for pid, (ppid, *_) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    out, stack = [], [root]
    while stack:
        p = stack.pop()
        for k in kids.get(p, []):
            out.append(k)
            stack.append(k)
    return out


def _mem_mib(pid: int, field: str = "VmHWM") -> float:
    """VmHWM (peak RSS) or VmRSS of a live process; 0 once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class _MemorySampler(threading.Thread):
    """Peak memory of the JVM and of the Python workers under this process, sampled every
    interval_s while Spark runs (workers come and go, so a look at the end would miss them)."""

    def __init__(self, interval_s: float = 0.5):
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.done = threading.Event()
        self.jvm_mib = 0.0
        self.worker_mib: dict[int, float] = {}
        self.workers_together_mib = 0.0

    def run(self) -> None:
        while not self.done.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        procs = _procs()
        together = 0.0
        for p in _descendants(os.getpid(), procs):
            comm = procs[p][1]
            if comm == "java":
                self.jvm_mib = max(self.jvm_mib, _mem_mib(p))
            elif comm.startswith("python"):
                self.worker_mib[p] = max(self.worker_mib.get(p, 0.0), _mem_mib(p))
                together += _mem_mib(p, "VmRSS")
        self.workers_together_mib = max(self.workers_together_mib, together)

    def stop(self) -> None:
        self.sample()
        self.done.set()


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has been busy (all processes), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / _HZ     # user nice system irq softirq steal


def _tree_cpu_s() -> float:
    procs = _procs()
    me = os.getpid()
    return procs[me][2] + sum(procs[p][2] for p in _descendants(me, procs))


def _cpu_by_side() -> dict[str, float]:
    """CPU seconds of the driver's Python, of the JVM itself, and of everything the JVM started
    (the Python daemon and workers, reaped ones included)."""
    procs = _procs()
    me = os.getpid()
    jvm = [p for p in _descendants(me, procs) if procs[p][1] == "java"]
    under = [q for p in jvm for q in _descendants(p, procs)]
    return {"driver_cpu_s": procs[me][3], "jvm_cpu_s": sum(procs[p][3] for p in jvm),
            "workers_cpu_s": sum(procs[p][2] - procs[p][3] for p in jvm) + sum(procs[q][2] for q in under)}


# --- the two sides (each in its own child process) -------------------------------------------
def _dirs(workdir: str) -> list[str]:
    with open(os.path.join(workdir, "input", "manifest.json")) as f:
        m = json.load(f)
    return [os.path.join(workdir, "input", n["dir"]) for n in m["nodes"]]


def run_spark(workdir: str, master: str, conf: dict[str, str]) -> dict:
    t0 = time.monotonic()
    sampler = _MemorySampler()
    sampler.start()
    from spark.analyze import Analysis
    with Analysis(_dirs(workdir), os.path.join(workdir, "spark-out"), master=master, conf=conf,
                  log_level="ERROR") as a:
        s, _plots = a.run()
        sampler.stop()
        cpu = _tree_cpu_s()
        sides = _cpu_by_side()
    marks = a.marks
    done = max(marks["tables"], marks["plots"])
    return {**sides, "head_start": a.head_started,
        "rows": s["rows"], "nodes": len(s["nodes"]), "divergent_rows": len(s["divergent_rows"]),
        "concurrent_writes": s["concurrent_writes"],
        "wall_s": done - t0, "session_start_s": marks["session"] - t0, "jobs_s": marks["tables"] - marks["session"],
        "plots_s": done - marks["tables"], "cpu_s": cpu,
        "driver_python_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "jvm_peak_mib": sampler.jvm_mib,
        "python_worker_peak_mib": max(sampler.worker_mib.values(), default=0.0),
        "python_workers_peak_sum_mib": sampler.workers_together_mib,
        "python_workers": len(sampler.worker_mib),
    }


def run_oracle(workdir: str) -> dict:
    t0 = time.monotonic()
    from spark import oracle
    r = oracle.analyze(_dirs(workdir))
    return {"rows": len(r["rows"]), "divergent_rows": len(r["summary"]["divergent_rows"]),
            "concurrent_writes": len(r["concurrent_writes"]),
            "wall_s": time.monotonic() - t0, "cpu_s": _tree_cpu_s(),
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


reference_loop_items = 5_000_000     # additions in the speed reference (~0.4 s on the machine of record)


def _reference_s() -> float:
    """CPU seconds of a fixed pure-Python loop: how fast this machine runs Python right now
    (a shared virtual machine's speed moves with its neighbours; compare runs by it)."""
    t = time.process_time()
    s = 0
    for i in range(reference_loop_items):
        s += i
    return time.process_time() - t


def _child(side: str, args: argparse.Namespace) -> dict:
    reference_s = _reference_s()
    cmd = [sys.executable, os.path.abspath(__file__), "--child", side, "--workdir", args.workdir,
           "--master", args.master] + [f"--conf={kv}" for kv in args.conf]
    t = time.monotonic()
    load, busy = os.getloadavg()[0], _busy_cpu_s()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, cwd=ROOT, check=True, text=True)
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["process_wall_s"] = time.monotonic() - t
    # What the rest of the machine used meanwhile: all busy CPU time less our process tree's.
    r["others_cpus"] = max(0.0, _busy_cpu_s() - busy - r["cpu_s"]) / r["process_wall_s"]
    # The machine may be shared: the 1-minute load before and after says how much (ours included).
    r["load"] = f"{load:.2f} -> {os.getloadavg()[0]:.2f}"
    r["reference_s"] = reference_s
    return r


# --- the benchmark ---------------------------------------------------------------------------
def _input(args: argparse.Namespace) -> dict:
    from spark import generate
    path = os.path.join(args.workdir, "input")
    mpath = os.path.join(path, "manifest.json")
    if os.path.exists(mpath):
        with open(mpath) as f:
            m = json.load(f)
        if m["seed"] == args.seed and len(m["nodes"]) == args.nodes and m.get("rows_target") == args.rows:
            print(f"input: reusing {path}", flush=True)
            return m
        raise SystemExit(f"{args.workdir} holds another input; choose another --workdir")
    t = time.monotonic()
    m = generate.generate(path, nodes=args.nodes, rows=args.rows, seed=args.seed)
    m["rows_target"] = args.rows
    with open(mpath, "w") as f:
        json.dump(m, f)
    print(f"input: generated {args.nodes} nodes x {args.rows:,} rows in {time.monotonic() - t:.1f}s", flush=True)
    return m


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--workdir", default=None)
    p.add_argument("--skip-oracle", action="store_true")
    p.add_argument("--skip-spark", action="store_true")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    p.add_argument("--child", choices=("spark", "oracle"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
        conf = dict(kv.split("=", 1) for kv in args.conf)
        r = run_spark(args.workdir, args.master, conf) if args.child == "spark" else run_oracle(args.workdir)
        print(json.dumps(r))
        return 0
    args.workdir = args.workdir or f"/tmp/replog-bench-analyze-{args.nodes}x{args.rows}-s{args.seed}"
    os.makedirs(args.workdir, exist_ok=True)
    _input(args)
    size = sum(os.path.getsize(os.path.join(d, "wal", f)) for d in _dirs(args.workdir)
               for f in os.listdir(os.path.join(d, "wal")))
    print(f"machine: {os.cpu_count()} cpus, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.1f} GiB;"
          f" input {size / 2**20:.0f} MiB of WAL; master {args.master}", flush=True)
    sp = _child("spark", args)
    rows = sp["rows"]
    print(f"spark:  {rows:,} row observations ({sp['nodes']} nodes); load average {sp['load']}; "
          f"other processes used {sp['others_cpus']:.2f} CPUs meanwhile; speed reference {sp['reference_s']:.2f} s")
    print(f"  wall end to end      {sp['wall_s']:8.1f} s   {rows / sp['wall_s']:>12,.0f} rows/s")
    print(f"  session ready at     {sp['session_start_s']:8.1f} s"
          + ("   (pass 1 began on the driver meanwhile)" if sp["head_start"] else ""))
    print(f"  jobs, then tables    {sp['jobs_s']:8.1f} s   {rows / sp['jobs_s']:>12,.0f} rows/s")
    print(f"  plots after tables   {sp['plots_s']:8.1f} s   (drawn while the last stage ran)")
    print(f"  cpu, process tree    {sp['cpu_s']:8.1f} s   (driver python {sp['driver_cpu_s']:.1f}, JVM "
          f"{sp['jvm_cpu_s']:.1f}, python workers {sp['workers_cpu_s']:.1f})")
    print(f"  peak memory: driver python {sp['driver_python_peak_mib']:.0f} MiB, JVM (driver+executor) "
          f"{sp['jvm_peak_mib']:.0f} MiB, python workers {sp['python_worker_peak_mib']:.0f} MiB each at most "
          f"({sp['python_workers']} processes incl. the daemon, at most {sp['python_workers_peak_sum_mib']:.0f} MiB together)")
    print(f"  divergent rows {sp['divergent_rows']}, concurrent write pairs {sp['concurrent_writes']:,}")
    if not args.skip_oracle:
        o = _child("oracle", args)
        assert o["rows"] == rows and o["divergent_rows"] == sp["divergent_rows"] \
            and o["concurrent_writes"] == sp["concurrent_writes"], (o, sp)
        print(f"oracle: wall {o['wall_s']:.1f} s, {rows / o['wall_s']:,.0f} rows/s, cpu {o['cpu_s']:.1f} s, "
              f"peak {o['peak_mib']:.0f} MiB; load average {o['load']}; other processes used {o['others_cpus']:.2f} CPUs; "
              f"speed reference {o['reference_s']:.2f} s")
        print(f"spark vs oracle: {o['wall_s'] / sp['wall_s']:.2f}x end to end, "
              f"{o['wall_s'] / sp['jobs_s']:.2f}x jobs alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
