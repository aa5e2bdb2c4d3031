"""Replication lag under steady load: a 3-node full mesh of real processes, one node taking
a steady --rate rows/s for --seconds, p50/p99 lag of those rows on the other two; the same
beside Tarantool when `tarantool` is on PATH (bench/tarantool/lag_node.lua).

How lag is measured (one machine, so every process reads the same realtime clock):
  replog     nothing is sampled while the load runs. Afterwards the nodes are stopped and
             their WALs read. A row's start is its transaction's `timestamp`: the master's
             HLC when it accepted the write (Node.write -> core.local_txn), which is its
             wall clock in microseconds unless it had seen a later timestamp (checked: the
             master's own `master queue` figure below is never negative). A row's arrival
             on a follower is the `written_us` of the WAL frame that follower wrote it in:
             its wall clock when it began persisting that batch. lag = arrival - start,
             one sample per row. Also shown: `from master WAL` = follower written_us - the
             master's own written_us for the same lsn (replication alone, without the
             master's group-commit wait), and `master queue` = master written_us - start.
             Rows reach a follower by two routes in a mesh (directly and through the other
             follower); the WAL holds the first arrival, which is what a reader there sees.
  Tarantool  the master stamps each transaction with clock.realtime() just before writing
             it (before its WAL write); an on_replace trigger on each follower, for rows its
             applier applies, records realtime - stamp (before the follower's WAL write).
Both therefore measure "write accepted on the master -> the follower starts persisting it";
a row is readable there after that follower's WAL write (+ LMDB commit for replog), a few
ms later. Polling the followers over HTTP would cost them CPU and quantise the figure to
the poll interval; the WAL stamps cost nothing and are exact to a microsecond.

The load is open-loop: transactions are due on a fixed schedule (--rate rows/s in
transactions of --txn-rows rows) and sent by --clients concurrent HTTP clients (Tarantool:
32 fibers inside the master), so a slow node shows up as lag and as `late` transactions
(sent more than 10 ms after they were due), not as a quietly lower rate. The HTTP client
shares the machine with the three nodes; its CPU is reported.

    python -m bench.lag                                  # 10k rows/s for 20 s, replog then Tarantool
    python -m bench.lag --txn-rows 1 --rate 2000         # single-row transactions
    python -m bench.lag --only replog --keep
    python -m bench.lag --only replog --profile /tmp/lagprof  # py-spy on every node during the load
    python -m bench.lag --only replog --links plain,tls,nomac --runs 3   # TLS and the MAC, alternating
    python -m bench.lag --links plain,base --baseline /tmp/replog-main --runs 3   # beside another checkout

Also printed first: the machine's wake-up floor (`wakeup_floor`), a bare round trip over a
loopback socket to a process that sat idle for one batch interval, which no replication
system on this machine can beat for its followers' lag.

Figures only: nothing here asserts on timing."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from typing import Any

from bench import links as links_mod
from bench.links import SYSTEM, LinkSetup
from bench.common import LoadWatch, dump_json, free_port, machine, median, percentile, print_load, print_machine, \
    print_table
from bench.procs import ReplogNode, TarantoolNode, code_version, wait_for
from bench.pyspy import print_profiles, start_profilers, stop_profilers
from node.core.rows import GROUP_DEFAULT, OP_PUT
from node.wal import format as walfmt
from node.wal.reader import iter_segment, list_segments

SPACE = "lag"
WAKEUP_SAMPLES = 1000            # idle-wakeup round trips measured for the floor line
VALUE = "v" * 100                    # every row's value: a 100-byte string
NODES = 3
RATE_DEFAULT = 10_000                # rows/s on the master
SECONDS_DEFAULT = 20.0
TXN_ROWS_DEFAULT = 100               # rows per transaction: 10k rows/s = 100 HTTP requests/s, which one
                                     # client process keeps on schedule beside three nodes on 2 CPUs
CLIENTS_DEFAULT = 64                 # concurrent HTTP clients driving the schedule
TARANTOOL_FIBERS = 32
LATE_S = 0.01                        # a transaction sent this long after it was due is `late`
CONVERGE_TIMEOUT_S = 300.0           # the followers must hold every row within this after the load
START_TIMEOUT_S = 90.0               # a mesh forms (bootstrap + two joins) within this
TARANTOOL_MEMTX_MB = 512
PROFILE_RATE_HZ = 250                # py-spy samples per second per node (--profile)
PROFILE_TOP = 15                     # functions listed per thread role


def _lag_summary(samples_us: list[int]) -> dict[str, Any]:
    if not samples_us:
        return {"n": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan"),
                "mean_ms": float("nan"), "min_ms": float("nan")}
    return {"n": len(samples_us), "p50_ms": percentile(samples_us, 50) / 1000,
            "p99_ms": percentile(samples_us, 99) / 1000, "max_ms": max(samples_us) / 1000,
            "mean_ms": sum(samples_us) / len(samples_us) / 1000, "min_ms": min(samples_us) / 1000}


# --- the load (replog, over HTTP) --------------------------------------------------------------
async def paced_http_load(url: str, rate: float, seconds: float, txn_rows: int, clients: int,
                          ssl=None) -> dict[str, Any]:
    import aiohttp

    n_txns = int(rate * seconds / txn_rows)
    interval = txn_rows / rate
    reqs = []
    for i in range(n_txns):
        k = i * txn_rows + 1
        if txn_rows == 1:
            reqs.append(("PUT", f"{url}/v1/spaces/{SPACE}/keys/{k}", json.dumps(VALUE).encode()))
        else:
            reqs.append(("POST", f"{url}/v1/txn", json.dumps(
                {"ops": [{"op": "put", "space": SPACE, "key": str(k + j), "value": VALUE}
                         for j in range(txn_rows)]}).encode()))
    loop = asyncio.get_running_loop()
    state = {"next": 0, "late": 0, "errors": 0, "first_error": ""}
    latencies: list[float] = []
    c0 = time.process_time()
    t0 = loop.time() + 0.2

    async def client(session: aiohttp.ClientSession) -> None:
        while state["next"] < n_txns:
            i = state["next"]
            state["next"] = i + 1
            due = t0 + i * interval
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            elif wait < -LATE_S:
                state["late"] += 1
            method, u, body = reqs[i]
            s = loop.time()
            async with session.request(method, u, data=body) as r:
                await r.read()
                if r.status != 200:
                    state["errors"] += 1
                    state["first_error"] = state["first_error"] or f"{r.status}"
            latencies.append(loop.time() - s)

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, headers={"Content-Type": "application/json"},
                                     connector=aiohttp.TCPConnector(limit=clients, ssl=ssl or True)) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    wall = loop.time() - t0
    return {"rows": n_txns * txn_rows, "txns": n_txns, "seconds": wall, "rows_s": n_txns * txn_rows / wall,
            "late_txns": state["late"], "errors": state["errors"], "first_error": state["first_error"],
            "request_p50_ms": 1000 * percentile(latencies, 50), "request_p99_ms": 1000 * percentile(latencies, 99),
            "client_cpu_pct": 100.0 * (time.process_time() - c0) / wall}


# --- replog ------------------------------------------------------------------------------------
def wal_rows(wal_dir: str, origin_id: int) -> dict[int, tuple[int, int, int]]:
    """{lsn: (txn timestamp, frame written_us, rows)} of origin_id's `lag` transactions in
    this node's WAL (origin_id in this node's ids)."""
    out: dict[int, tuple[int, int, int]] = {}
    names = list_segments(wal_dir)
    for i, name in enumerate(names):
        for ref in iter_segment(os.path.join(wal_dir, name), is_last=i == len(names) - 1):
            written_us, txns = walfmt.unpack_frame(ref.body)
            for rid, lsn, group, ts, ops in txns:
                if rid == origin_id and group == GROUP_DEFAULT and ops and ops[0][0] == OP_PUT and ops[0][1] == SPACE:
                    out[lsn] = (ts, written_us, len(ops))
    return out


def replog_lag(base: str, args: argparse.Namespace, links: str = "plain") -> dict[str, Any]:
    ports = [free_port() for _ in range(NODES)]
    setup = LinkSetup(base, args.baseline)
    nodes = []
    for i in range(NODES):
        kw = setup.node_kwargs(links, f"n{i + 1}")
        kw["prelude"] = (kw["prelude"] + "\n" + args.node_prelude).strip()
        nodes.append(ReplogNode(f"n{i + 1}", os.path.join(base, f"n{i + 1}"), port=ports[i], log_level="warning",
                                peers=[f"127.0.0.1:{p}" for j, p in enumerate(ports) if j != i], **kw))
    try:
        for n in nodes:
            n.start(wait=False)
        for n in nodes:
            n.wait_running(START_TIMEOUT_S)
        master, followers = nodes[0], nodes[1:]
        master.create_space(SPACE)
        muuid = master.info()["uuid"]
        lsn0 = master.lsn_of(muuid)
        for f in followers:
            wait_for(lambda: f.lsn_of(muuid) >= lsn0, START_TIMEOUT_S, f"{f.name} to see the space")
        spies = start_profilers(nodes, args.profile, PROFILE_RATE_HZ) if args.profile else []
        cpu0 = [n.cpu_s() or 0.0 for n in nodes]
        t0 = time.monotonic()
        try:
            load = asyncio.run(paced_http_load(master.url, args.rate, args.seconds, args.txn_rows, args.clients,
                                               master.ssl_context))
        finally:
            cpu_wall = time.monotonic() - t0
            cpu = [100.0 * ((n.cpu_s() or 0.0) - c) / cpu_wall for n, c in zip(nodes, cpu0)]
            profiles = stop_profilers(spies, PROFILE_TOP)
        target = master.lsn_of(muuid)
        for f in followers:
            wait_for(lambda: f.lsn_of(muuid) >= target, CONVERGE_TIMEOUT_S, f"{f.name} to catch up")
        ids = {}
        for n in nodes:
            s, d = n.request("GET", "/v1/cluster")
            ids[n.name] = {mem["uuid"]: mem["id"] for mem in d["members"]}[muuid]
    finally:
        for n in nodes:
            n.stop()
    mrows = wal_rows(os.path.join(master.data_dir, "wal"), ids[master.name])
    queue = [w - ts for ts, w, k in mrows.values() for _ in range(k)]
    out: dict[str, Any] = {"load": load, "cpu_pct": {n.name: c for n, c in zip(nodes, cpu)},
                           "master_queue": _lag_summary(queue), "followers": {}}
    if profiles:
        out["profiles"] = profiles
    for f in followers:
        frows = wal_rows(os.path.join(f.data_dir, "wal"), ids[f.name])
        lag = [w - ts for ts, w, k in frows.values() for _ in range(k)]
        hop = [w - mrows[lsn][1] for lsn, (ts, w, k) in frows.items() if lsn in mrows for _ in range(k)]
        out["followers"][f.name] = {"lag": _lag_summary(lag), "from_master_wal": _lag_summary(hop)}
    return out


# --- Tarantool -----------------------------------------------------------------------------------
def tarantool_lag(base: str, args: argparse.Namespace) -> dict[str, Any]:
    ports = [free_port() for _ in range(NODES)]
    peers = ",".join(f"127.0.0.1:{p}" for p in ports)
    env = {"BENCH_PEERS": peers, "BENCH_MEMTX_MB": str(TARANTOOL_MEMTX_MB)}
    nodes = [TarantoolNode(f"t{i + 1}", os.path.join(base, f"t{i + 1}"), "lag_node.lua", env, port=ports[i])
             for i in range(NODES)]
    try:
        for n in nodes:
            n.start(wait=False)
        for n in nodes:
            n.wait_ctl(START_TIMEOUT_S)
        master, followers = nodes[0], nodes[1:]
        master.call("setup")
        for f in followers:
            wait_for(lambda: f.call("info")["has_space"], START_TIMEOUT_S, f"{f.name} to see the space")
            f.call("arm")
        mid = str(master.call("info")["id"])
        cpu0 = [n.cpu_s() or 0.0 for n in nodes]
        t0 = time.monotonic()
        load = master.call("load", rate=args.rate, seconds=args.seconds, txn_rows=args.txn_rows,
                           fibers=TARANTOOL_FIBERS)
        cpu_wall = time.monotonic() - t0
        cpu = [100.0 * ((n.cpu_s() or 0.0) - c) / cpu_wall for n, c in zip(nodes, cpu0)]
        target = int(load["vclock"][mid])
        for f in followers:
            wait_for(lambda: int(f.call("info")["vclock"].get(mid, 0)) >= target, CONVERGE_TIMEOUT_S,
                     f"{f.name} to catch up")
        load = {"rows": load["rows"], "seconds": load["seconds"], "rows_s": load["rows"] / load["seconds"],
                "late_txns": load["late_txns"], "errors": 0}
        out: dict[str, Any] = {"load": load, "cpu_pct": {n.name: c for n, c in zip(nodes, cpu)}, "followers": {}}
        for f in followers:
            s = f.call("lags")
            out["followers"][f.name] = {"lag": {k: s.get(k, float("nan")) for k in
                                                ("n", "p50_ms", "p99_ms", "max_ms", "mean_ms")}}
        return out
    finally:
        for n in nodes:
            n.stop()


# --- output ------------------------------------------------------------------------------------------
def print_result(system: str, res: dict[str, Any]) -> None:
    ld = res["load"]
    cpu = ", ".join(f"{k} {v:.0f}%" for k, v in res["cpu_pct"].items())
    extra = ""
    if "request_p50_ms" in ld:
        extra = (f"; HTTP request p50 {ld['request_p50_ms']:.1f} ms, p99 {ld['request_p99_ms']:.1f} ms; "
                 f"client CPU {ld['client_cpu_pct']:.0f}%")
    print(f"{system}: {ld['rows']:,} rows in {ld['seconds']:.1f} s = {ld['rows_s']:,.0f} rows/s achieved, "
          f"{ld['late_txns']:,} late txns, {ld['errors']} errors{extra}")
    print(f"  node CPU during the load (% of one core): {cpu}")
    rows = []
    for name, f in res["followers"].items():
        lag = f["lag"]
        rows.append([name, "lag", lag["n"], lag["p50_ms"], lag["p99_ms"], lag["max_ms"], lag["mean_ms"]])
        if "from_master_wal" in f:
            h = f["from_master_wal"]
            rows.append([name, "from master WAL", h["n"], h["p50_ms"], h["p99_ms"], h["max_ms"], h["mean_ms"]])
    if "master_queue" in res:
        q = res["master_queue"]
        rows.append(["master", "master queue", q["n"], q["p50_ms"], q["p99_ms"], q["max_ms"], q["mean_ms"]])
        if q["n"] and q["min_ms"] < 0:
            print(f"  WARNING: master queue min {q['min_ms']:.3f} ms < 0: the HLC ran ahead of the wall clock")
    print_table(["follower", "measure", "rows", "p50 ms", "p99 ms", "max ms", "mean ms"], rows)
    print()
    if res.get("profiles"):
        print_profiles(res["profiles"], PROFILE_RATE_HZ)


def print_summary(runs: dict[str, list[dict[str, Any]]]) -> None:
    """One row per system: medians over its runs and followers (bench/links.py variants side by side)."""
    rows = []
    for system, each in runs.items():
        lags = [f["lag"] for res in each for f in res["followers"].values()]
        cpu = [c for res in each for c in res["cpu_pct"].values()]
        rows.append([system, len(each), median(x["p50_ms"] for x in lags), median(x["p99_ms"] for x in lags),
                     median(x["max_ms"] for x in lags), median(cpu), sum(r["load"]["late_txns"] for r in each)])
    print_table(["system", "runs", "p50 ms", "p99 ms", "max ms", "node CPU % (median)", "late txns"], rows)
    print()


# --- command line ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.lag", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=RATE_DEFAULT, help="rows/s on the master (default %(default)s)")
    p.add_argument("--seconds", type=float, default=SECONDS_DEFAULT, help="load duration (default %(default)s)")
    p.add_argument("--txn-rows", type=int, default=TXN_ROWS_DEFAULT, help="rows per transaction (default %(default)s)")
    p.add_argument("--clients", type=int, default=CLIENTS_DEFAULT, help="concurrent HTTP clients (default %(default)s)")
    p.add_argument("--only", choices=("replog", "tarantool"), help="run one system")
    p.add_argument("--links", default="plain",
                   help="replog link variants, run in alternation: plain, tls, asyncio, nomac, base, comma-separated "
                        "(bench/links.py; default %(default)s)")
    p.add_argument("--baseline", metavar="DIR", default=None,
                   help="with --links ...,base: another replog checkout whose nodes run as replog-base (bench/links.py)")
    p.add_argument("--runs", type=int, default=1, help="rounds of every system, alternating (default %(default)s)")
    p.add_argument("--node-prelude", metavar="PYTHON", default="",
                   help="replog nodes: Python run before each node starts, to try a change without editing node/, "
                        "e.g. \"import sys; sys.setswitchinterval(0.0005)\"")
    p.add_argument("--profile", metavar="DIR", default=None,
                   help="replog: attach py-spy to every node during the load; raw stacks go to DIR")
    p.add_argument("--dir", default=None, help="where temp data dirs go (default: the system temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the data dirs and logs")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    a = p.parse_args(argv)
    if a.rate <= 0 or a.seconds <= 0 or a.txn_rows < 1 or a.clients < 1 or a.runs < 1:
        p.error("--rate, --seconds, --txn-rows, --clients and --runs must be positive")
    try:
        a.links = links_mod.parse(a.links, a.baseline)
    except ValueError as e:
        p.error(str(e))
    a.systems = ("replog", "tarantool") if a.only is None else (a.only,)
    if "tarantool" in a.systems and not shutil.which("tarantool"):
        if a.only == "tarantool":
            p.error("tarantool is not on PATH (apt-get install -y tarantool)")
        a.systems = ("replog",)
    a.dir = a.dir or tempfile.gettempdir()
    return a


def wakeup_floor(idle_s: float, samples: int = WAKEUP_SAMPLES) -> dict[str, Any]:
    """What this machine alone costs a replication hop: a process idle for `idle_s` (a
    follower between two batches at this rate) gets one byte over a loopback socket and
    answers; round trip p50/p99. On a VM whose idle vCPU halts (this project's machines are
    microVMs), waking it is most of a low-rate follower's lag tail; nothing replog does changes it."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:                       # the "follower": answer each byte, idle in between
        try:
            for _ in range(samples):
                b.sendall(b.recv(1))
        finally:
            os._exit(0)
    rtts = []
    try:
        for _ in range(samples):
            time.sleep(idle_s)
            t = time.perf_counter()
            a.sendall(b"x")
            a.recv(1)
            rtts.append(int((time.perf_counter() - t) * 1e6))
    finally:
        os.waitpid(pid, 0)
        a.close()
        b.close()
    return {"idle_ms": idle_s * 1e3, **_lag_summary(rtts)}


def _all_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mach = machine(args.dir)
    mach["code"] = code_version()
    watch, c0 = LoadWatch(), _all_cpu_s()
    floor = wakeup_floor(args.txn_rows / args.rate)
    variants = {SYSTEM[v]: v for v in args.links} if "replog" in args.systems else {}
    systems = list(variants) + [s for s in ("tarantool",) if s in args.systems]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for _ in range(args.runs):
        for system in systems:
            base = tempfile.mkdtemp(prefix=f"lag-{system}-", dir=args.dir)
            try:
                runs[system].append(replog_lag(base, args, variants[system]) if system in variants
                                    else tarantool_lag(base, args))
            finally:
                if args.keep:
                    print(f"kept {base}", file=sys.stderr)
                else:
                    shutil.rmtree(base, ignore_errors=True)
    results = {s: r[-1] for s, r in runs.items()}
    load = watch.stop(_all_cpu_s() - c0)
    if args.json:
        dump_json({"machine": mach, "load": load, "args": {k: v for k, v in vars(args).items()},
                   "wakeup_floor": floor, "results": results, "runs": runs})
        return 0
    print_machine(mach)
    print(f"code:    {mach['code']}")
    print_load(load, mach["nproc"])
    print(f"workload: 3-node full mesh, wal_mode write; one master takes {args.rate:,.0f} rows/s "
          f"({args.txn_rows}-row txns, 100-byte values) for {args.seconds:.0f} s")
    print(f"floor:   a process idle {floor['idle_ms']:.1f} ms (a follower between batches) gets a byte over "
          f"loopback and answers: round trip p50 {floor['p50_ms']:.2f} ms, p99 {floor['p99_ms']:.2f} ms, "
          f"max {floor['max_ms']:.2f} ms (the machine's own wake-up cost; bench.lag.wakeup_floor)\n")
    for system, each in runs.items():
        for i, res in enumerate(each):
            print_result(system + (f" (run {i + 1}/{len(each)})" if len(each) > 1 else ""), res)
    if len(runs) > 1:
        print_summary(runs)
    if "replog" in results and "tarantool" in results:
        r = [f["lag"]["p99_ms"] for f in results["replog"]["followers"].values()]
        t = [f["lag"]["p99_ms"] for f in results["tarantool"]["followers"].values()]
        print(f"p99 lag, median over followers: replog {median(r):.1f} ms, Tarantool {median(t):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
