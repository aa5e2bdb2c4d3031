"""Client write and read load: the replog SDK (`replog.AsyncClient`, binary protocol) against a
real `replog serve`, beside Tarantool 2.6's net.box against a Tarantool instance, in one run.

For each wal_mode (write, fsync) one node of each system is started on 127.0.0.1 with a space
`bench`; then, 3 runs, alternating which system goes first: for 1, 16 and 64 concurrent writers,
each writer puts fresh keys with 100-byte values in a loop for --seconds (replog: `await
c.put(...)`; Tarantool: a fiber doing `conn.space.bench:replace{key, value}`), then the same
number of readers get random keys of 10,000 preloaded ones. The writers are spread over
several load processes (--procs: 1, 2 and 4 for 1, 16 and 64), started at one instant, so
the load generator is not the bound; each process's CPU is printed per operation beside the
server's, so a reader can see which side a figure is bound by.

    python -m bench.client_load                    # both modes, 3 runs, 5 s phases (~5 min)
    python -m bench.client_load --modes write --runs 1 --seconds 3
    python -m bench.client_load --http --baseline /tmp/replog-main   # + HTTP PUT with wrk, vs an older tree

--http adds HTTP puts/s measured with wrk (2 threads, 64 connections, fresh keys, 100-byte
values, write mode) on this tree's node and, with --baseline DIR, on a node run from another
checkout of replog (e.g. `git archive <commit> | tar -x -C DIR`), alternating.
Figures only: nothing here asserts a time."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.common import LoadWatch, machine, median, percentile, print_load, print_machine, print_table
from bench.procs import LUA_DIR, REPO, ReplogNode, TarantoolNode, code_version, proc_cpu_s

SPACE = "bench"
VALUE = "v" * 100
NKEYS = 10_000                 # preloaded keys the readers pick from
SAMPLES = 20_000               # latency samples each load process keeps (reservoir)
START_DELAY_S = 2.0            # load processes start this long after they are launched, together
WORKER_TIMEOUT_S = 120.0       # a load process must finish within this past its phase


# --- the replog load process -------------------------------------------------------------------
async def _replog_load(a: argparse.Namespace) -> dict[str, Any]:
    import replog
    c = replog.AsyncClient([a.target], timeout=60)
    await c.info()                                   # connected before the start
    if a.op == "preload":
        await asyncio.gather(*(c.put(SPACE, f"g{i}", VALUE) for i in range(NKEYS)))
        await c.close()
        return {"ops": NKEYS}
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, a.start_at - time.time()))
    samples: list[float] = []
    ops = 0
    deadline = loop.time() + a.seconds
    put = a.op == "put"
    rnd = random.Random(os.getpid())

    async def writer(w: int) -> None:
        nonlocal ops
        n = 0
        perf = time.perf_counter
        while loop.time() < deadline:
            t = perf()
            if put:
                await c.put(SPACE, f"{a.prefix}-{w}-{n}", VALUE)
            else:
                await c.get(SPACE, f"g{rnd.randrange(NKEYS)}")
            lat = (perf() - t) * 1e6
            n += 1
            ops += 1
            if len(samples) < SAMPLES:
                samples.append(lat)
            else:
                j = rnd.randrange(ops)
                if j < SAMPLES:
                    samples[j] = lat

    cpu0, t0 = time.process_time(), time.monotonic()
    await asyncio.gather(*(writer(w) for w in range(a.writers)))
    out = {"ops": ops, "cpu_s": time.process_time() - cpu0, "wall_s": time.monotonic() - t0, "lat_us": samples}
    await c.close()
    return out


# --- one phase: P load processes of one system at once ----------------------------------------
def _launch(system: str, target: str, op: str, writers: int, seconds: float, prefix: str,
            start_at: float, out: str) -> subprocess.Popen:
    """A load process; it writes its result as one JSON line to the file `out` (stdout would not
    do: an event loop may leave it non-blocking, and a long line then comes out cut)."""
    if system == "replog":
        argv = [sys.executable, "-m", "bench.client_load", "--worker", "--target", target, "--op", op,
                "--writers", str(writers), "--seconds", str(seconds), "--prefix", prefix, "--start-at", str(start_at),
                "--out", out]
        env = None
    else:
        argv = ["tarantool", os.path.join(LUA_DIR, "client_load.lua")]
        env = dict(os.environ, BENCH_TARGET=target, BENCH_WRITERS=str(writers), BENCH_SECONDS=str(seconds),
                   BENCH_OP=op, BENCH_PREFIX=prefix, BENCH_KEYS=str(NKEYS), BENCH_START_AT=str(start_at),
                   BENCH_OUT=out)
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO, env=env, text=True)


def _result(p: subprocess.Popen, out: str, system: str, timeout: float) -> dict[str, Any]:
    _, err = p.communicate(timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{system} load process failed ({p.returncode}): {err[-2000:]}")
    with open(out, encoding="utf-8") as f:
        doc = json.loads(f.read())
    os.unlink(out)
    return doc


def phase(system: str, server, op: str, writers: int, procs: int, seconds: float, tag: str) -> dict[str, Any]:
    target = server.client_target
    per = [writers // procs + (1 if i < writers % procs else 0) for i in range(procs)]
    start_at = time.time() + START_DELAY_S
    files = [os.path.join(server.dir, f"load-{tag}-{i}.json") for i in range(procs)]
    ps = [_launch(system, target, op, w, seconds, f"{tag}-{i}", start_at, f) for (i, w), f in zip(enumerate(per), files)]
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = proc_cpu_s(server.pid)
    outs = [_result(p, f, system, seconds + START_DELAY_S + WORKER_TIMEOUT_S) for p, f in zip(ps, files)]
    server_cpu = (proc_cpu_s(server.pid) or 0) - (cpu0 or 0)
    ops = sum(o["ops"] for o in outs)
    wall = max(o["wall_s"] for o in outs)
    lat = [x for o in outs for x in o["lat_us"]]
    return {"ops_s": ops / wall, "p50_ms": percentile(lat, 50) / 1000, "p99_ms": percentile(lat, 99) / 1000,
            "server_us": 1e6 * server_cpu / ops if ops else float("nan"),
            "client_us": 1e6 * sum(o["cpu_s"] for o in outs) / ops if ops else float("nan"),
            "cpu_s": server_cpu + sum(o["cpu_s"] for o in outs)}


def preload(system: str, server) -> None:
    f = os.path.join(server.dir, "preload.json")
    _result(_launch(system, server.client_target, "preload", 1, 0, "g", 0, f), f, system, 300)


# --- servers -------------------------------------------------------------------------------------
def start_replog(work: str, mode: str, tree: str | None = None) -> ReplogNode:
    n = ReplogNode(f"replog-{mode}" + ("-base" if tree else ""), os.path.join(work, f"replog-{mode}-{bool(tree)}"),
                   wal_mode=mode, log_level="warning")
    if tree:                                         # run another checkout's node/ (the HTTP baseline)
        n.prelude = f"import sys; sys.path.insert(0, {tree!r}); sys.modules.pop('node', None)"
    n.start()
    n.create_space(SPACE)
    n.client_target = n.address
    return n


def start_tarantool(work: str, mode: str) -> TarantoolNode:
    t = TarantoolNode(f"tarantool-{mode}", os.path.join(work, f"tarantool-{mode}"), "client_server.lua",
                      env={"BENCH_WAL_MODE": mode})
    t.start()
    t.client_target = t.address
    return t


# --- HTTP with wrk -------------------------------------------------------------------------------
def wrk_puts(node: ReplogNode, seconds: float) -> float:
    out = subprocess.run(["wrk", "-t2", "-c64", f"-d{seconds:g}s", "-s", os.path.join(REPO, "bench", "wrk_put.lua"),
                          node.url], capture_output=True, text=True, timeout=seconds + 60).stdout
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    raise RuntimeError(f"wrk printed no rate:\n{out}")


def http_bench(work: str, args: argparse.Namespace) -> list[list[Any]]:
    trees = [("this tree", None)] + ([(f"baseline {args.baseline}", args.baseline)] if args.baseline else [])
    nodes = {name: start_replog(work, "write", tree) for name, tree in trees}
    got: dict[str, list[float]] = {name: [] for name, _ in trees}
    try:
        for run in range(args.runs):
            order = trees if run % 2 == 0 else trees[::-1]
            for name, _ in order:
                got[name].append(wrk_puts(nodes[name], args.seconds))
    finally:
        for n in nodes.values():
            n.stop()
    base = median(got[trees[-1][0]]) if args.baseline else float("nan")
    return [[name, median(v), " ".join(f"{x:,.0f}" for x in v), median(v) / base if args.baseline else float("nan")]
            for name, v in got.items()]


# --- the report ----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.client_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="write,fsync")
    p.add_argument("--writers", default="1,16,64")
    p.add_argument("--procs", default="1,2,4", help="load processes per writers figure, in the same order")
    p.add_argument("--ops", default="put,get")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--only", choices=("replog", "tarantool"))
    p.add_argument("--http", action="store_true", help="also HTTP PUTs with wrk (write mode)")
    p.add_argument("--baseline", help="another replog checkout to run the HTTP figure on too")
    p.add_argument("--dir", help="where the servers keep their data (default: a temp dir)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    p.add_argument("--op", help=argparse.SUPPRESS)
    p.add_argument("--prefix", default="p", help=argparse.SUPPRESS)
    p.add_argument("--start-at", dest="start_at", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        a.writers = int(a.writers)
        try:                       # the SDK on uvloop, as the node (an application chooses its own loop)
            import uvloop
            run = uvloop.run
        except ImportError:
            run = asyncio.run
        doc = run(_replog_load(a))
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc) + "\n")
        return 0
    systems = ["replog", "tarantool"]
    if a.only:
        systems = [a.only]
    elif shutil.which("tarantool") is None:
        print("tarantool is not installed (apt-get install -y tarantool): replog only")
        systems = ["replog"]
    work = a.dir or tempfile.mkdtemp(prefix="replog-client-load-")
    m = machine(work)
    print_machine(m)
    print(f"code:    {code_version()}")
    watch = LoadWatch()
    own_cpu = 0.0
    writers = [int(x) for x in a.writers.split(",")]
    procs = dict(zip(writers, [int(x) for x in a.procs.split(",")]))
    rows = []
    try:
        for mode in a.modes.split(","):
            servers = {"replog": start_replog(work, mode)} if "replog" in systems else {}
            if "tarantool" in systems:
                servers["tarantool"] = start_tarantool(work, mode)
            try:
                for s, v in servers.items():
                    preload(s, v)
                res: dict[tuple, list[dict]] = {}
                for run in range(a.runs):
                    for op in a.ops.split(","):
                        for w in writers:
                            order = systems if (run + w) % 2 == 0 else systems[::-1]
                            for s in order:
                                r = phase(s, servers[s], op, w, procs.get(w, 1), a.seconds, f"{mode}{run}{w}")
                                res.setdefault((op, w, s), []).append(r)
                                own_cpu += r["cpu_s"]
                for op in a.ops.split(","):
                    for w in writers:
                        row = [mode, op, w]
                        meds = {}
                        for s in systems:
                            rs = res[(op, w, s)]
                            meds[s] = median(r["ops_s"] for r in rs)
                            row += [meds[s], " ".join(f"{r['ops_s'] / 1000:.0f}k" for r in rs),
                                    median(r["p50_ms"] for r in rs), median(r["p99_ms"] for r in rs),
                                    median(r["server_us"] for r in rs), median(r["client_us"] for r in rs)]
                        if len(systems) == 2:
                            row.append(meds["replog"] / meds["tarantool"])
                        rows.append(row)
            finally:
                for v in servers.values():
                    v.stop()
        head = ["mode", "op", "writers"]
        for s in systems:
            head += [f"{s} ops/s", "runs", "p50 ms", "p99 ms", "server µs/op", "client µs/op"]
        if len(systems) == 2:
            head.append("replog/tarantool")
        print()
        print_table(head, rows)
        if a.http:
            print("\nHTTP PUT /v1/spaces/bench/keys/<fresh key>, 100-byte value, wrk -t2 -c64, write mode:")
            print_table(["node", "puts/s (median)", "runs", "vs baseline"], http_bench(work, a))
    finally:
        print()
        print_load(watch.stop(own_cpu), m["nproc"])
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
