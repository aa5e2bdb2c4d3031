"""HTTP write load against a real `replog serve` process on 127.0.0.1.

Starts one node (free port, temp data dir), waits for `/v1/health` to answer 200, creates
a space, then drives it with an aiohttp client on loopback, phase by phase:

  put_seq    single-key PUTs, one at a time on one keep-alive connection: latency
  put_conc   single-key PUTs from --concurrency clients at once: latency and throughput
             (concurrent writes share group-commit batches)
  txn_seq    POST /v1/txn with --txn-ops puts each, one at a time: ops/s
  txn_conc   the same from --txn-concurrency clients at once

Each phase is bounded by a request count and by --phase-s-max seconds. All phases run
--runs times (fresh keys each run); the table shows medians. Server and client share the
machine, so the client's CPU is reported beside the server's. The node is stopped with
SIGTERM and waited for (SIGKILL only past a deadline). Figures only: no timing assertions.

    python -m bench.http_load                  # ~1 min on 2 cores
    python -m bench.http_load --wal-mode fsync --runs 1"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.common import (LoadWatch, dump_json, free_port, machine, median, percentile, print_load, print_machine,
                          print_table)
from node.logsetup import file_tail

SPACE = "bench"
VALUE_BYTES = 100                    # every value: a 100-character JSON string
START_TIMEOUT_S = 30.0               # the node must answer /v1/health 200 within this
STOP_TIMEOUT_S = 20.0                # after SIGTERM; the node's own shutdown deadline is 10 s per step
REQUEST_TIMEOUT_S = 30.0             # one request; a stuck server fails the bench, not hangs it
POLL_INTERVAL_S = 0.05               # health polling while the node starts
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class PhaseResult:
    phase: str
    clients: int
    requests: int = 0
    ops: int = 0
    errors: int = 0
    first_error: str = ""
    seconds: float = 0.0
    latencies_s: list[float] = field(default_factory=list, repr=False)
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    rows_written: float = 0.0        # from the node's /metrics: rows persisted during the phase
    batches: float = 0.0             # group-commit batches during the phase

    def summary(self) -> dict[str, Any]:
        lat = self.latencies_s
        return {
            "phase": self.phase, "clients": self.clients, "requests": self.requests, "ops": self.ops,
            "errors": self.errors, "seconds": self.seconds,
            "req_s": self.requests / self.seconds if self.seconds else 0.0,
            "ops_s": self.ops / self.seconds if self.seconds else 0.0,
            "p50_ms": 1000 * percentile(lat, 50), "p99_ms": 1000 * percentile(lat, 99),
            "max_ms": 1000 * max(lat) if lat else float("nan"),
            "server_cpu_pct": 100 * self.server_cpu_s / self.seconds if self.seconds else 0.0,
            "client_cpu_pct": 100 * self.client_cpu_s / self.seconds if self.seconds else 0.0,
            "rows_per_batch": self.rows_written / self.batches if self.batches else float("nan"),
        }


# --- the server process ----------------------------------------------------------------------
class Server:
    def __init__(self, data_dir: str, wal_mode: str, log_path: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")
        cmd = [sys.executable, "-m", "node", "serve", "--data-dir", data_dir, "--listen", f"127.0.0.1:{self.port}",
               "--wal-mode", wal_mode, "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def cpu_s(self) -> float:
        """utime + stime of the node process so far."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            return (int(parts[11]) + int(parts[12])) / CLK_TCK
        except (OSError, IndexError, ValueError):
            return float("nan")

    def log_tail(self, lines: int = 20) -> str:
        return file_tail(self.log_path, lines)

    async def wait_healthy(self, session: aiohttp.ClientSession) -> float:
        """Poll /v1/health until 200; returns seconds taken. Fails if the process exits."""
        t0 = time.perf_counter()
        deadline = t0 + START_TIMEOUT_S
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"replog serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                async with session.get(self.url + "/v1/health") as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except aiohttp.ClientError:
                pass  # not listening yet
            await asyncio.sleep(POLL_INTERVAL_S)
        raise RuntimeError(f"replog serve not healthy after {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def stop(self) -> tuple[int | None, float]:
        """SIGTERM, then wait; SIGKILL only past STOP_TIMEOUT_S. Returns (exit code, seconds)."""
        t0 = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"http_load: node did not stop within {STOP_TIMEOUT_S} s of SIGTERM; killing it",
                      file=sys.stderr)
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode, time.perf_counter() - t0


async def metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


# --- load phases --------------------------------------------------------------------------------
async def run_phase(server: Server, phase: str, clients: int, requests: list[tuple[str, str, bytes, int]],
                    phase_s_max: float) -> PhaseResult:
    """Send `requests` ((method, path, body, ops) each) from `clients` concurrent clients,
    each on its own keep-alive connection; stop issuing after phase_s_max seconds."""
    res = PhaseResult(phase, clients)
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        m0 = await metrics(session, server.url)
        it = iter(requests)
        deadline = time.perf_counter() + phase_s_max

        async def client() -> None:
            for method, path, body, ops in it:  # shared: each request goes to one client
                if time.perf_counter() > deadline:
                    return
                t = time.perf_counter()
                async with session.request(method, server.url + path, data=body, headers=headers) as r:
                    payload = await r.read()
                    ok = r.status == 200
                res.latencies_s.append(time.perf_counter() - t)
                res.requests += 1
                if ok:
                    res.ops += ops
                else:
                    res.errors += 1
                    res.first_error = res.first_error or f"{r.status} {payload[:200]!r}"

        s0, c0, t0 = server.cpu_s(), time.process_time(), time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        res.seconds = time.perf_counter() - t0
        res.server_cpu_s, res.client_cpu_s = server.cpu_s() - s0, time.process_time() - c0
        m1 = await metrics(session, server.url)
    res.rows_written = m1.get("replog_rows_written_total", 0) - m0.get("replog_rows_written_total", 0)
    res.batches = m1.get("replog_commit_batches_total", 0) - m0.get("replog_commit_batches_total", 0)
    return res


def put_requests(prefix: str, n: int) -> list[tuple[str, str, bytes, int]]:
    body = json.dumps("v" * VALUE_BYTES).encode()
    return [("PUT", f"/v1/spaces/{SPACE}/keys/{prefix}-{i:09d}", body, 1) for i in range(n)]


def txn_requests(prefix: str, n: int, ops: int) -> list[tuple[str, str, bytes, int]]:
    value = "v" * VALUE_BYTES
    out = []
    for i in range(n):
        body = json.dumps({"ops": [{"op": "put", "space": SPACE, "key": f"{prefix}-{i:06d}-{j:05d}", "value": value}
                                   for j in range(ops)]}).encode()
        out.append(("POST", "/v1/txn", body, ops))
    return out


async def one_run(server: Server, args: argparse.Namespace, run: int) -> list[PhaseResult]:
    # Bodies are built before each phase starts, so the timed part only sends them.
    plan = [
        ("put_seq", 1, put_requests(f"r{run}-seq", args.seq_requests)),
        ("put_conc", args.concurrency, put_requests(f"r{run}-conc", args.conc_requests)),
        ("txn_seq", 1, txn_requests(f"r{run}-txn", args.txn_requests, args.txn_ops)),
        ("txn_conc", args.txn_concurrency, txn_requests(f"r{run}-txnc", args.txn_requests, args.txn_ops)),
    ]
    out = []
    for phase, clients, reqs in plan:
        if phase not in args.phases:
            continue
        r = await run_phase(server, phase, clients, reqs, args.phase_s_max)
        if not args.json:
            s = r.summary()
            print(f"  run {run + 1}/{args.runs} {phase:8} {s['requests']:>6} req {s['ops_s']:>10,.0f} ops/s "
                  f"p50 {s['p50_ms']:.2f} ms p99 {s['p99_ms']:.2f} ms errors {r.errors}", file=sys.stderr)
        if r.errors:
            print(f"http_load: {phase}: {r.errors} requests failed; first: {r.first_error}", file=sys.stderr)
        out.append(r)
    return out


async def bench(args: argparse.Namespace, data_dir: str) -> dict[str, Any]:
    server = Server(os.path.join(data_dir, "node"), args.wal_mode, os.path.join(data_dir, "node.log"))
    doc: dict[str, Any] = {"wal_mode": args.wal_mode, "url": server.url}
    watch, c0 = LoadWatch(), time.process_time()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as s:
            doc["startup_s"] = await server.wait_healthy(s)
            async with s.put(f"{server.url}/v1/spaces/{SPACE}", json={}) as r:
                if r.status not in (200, 201):
                    raise RuntimeError(f"creating space {SPACE}: {r.status} {await r.text()}")
        runs = [await one_run(server, args, i) for i in range(args.runs)]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as s:
            async with s.get(server.url + "/v1/info") as r:
                info = await r.json()
        acked = sum(p.ops for run in runs for p in run)
        # lsn 1 is the node's own _cluster row, lsn 2 the space definition
        doc["rows_acknowledged"] = acked
        doc["node_lsn"] = int(info["vclock"].get("1", 0))
        doc["node_lsn_expected"] = acked + 2
        doc["load"] = watch.stop(time.process_time() - c0 + server.cpu_s())
    finally:
        rc, stop_s = server.stop()
        doc["stop"] = {"exit_code": rc, "seconds": stop_s}
        if rc != 0:
            print(f"http_load: node exited with {rc}:\n{server.log_tail()}", file=sys.stderr)
    phases = []
    for i, name in enumerate(p.phase for p in runs[0]):
        sums = [run[i].summary() for run in runs]
        med = {k: (median(s[k] for s in sums) if isinstance(sums[0][k], (int, float)) else sums[0][k])
               for k in sums[0]}
        med["each_ops_s"] = [round(s["ops_s"]) for s in sums]
        med["errors"] = sum(s["errors"] for s in sums)
        phases.append(med)
    doc["phases"] = phases
    return doc


# --- command line ---------------------------------------------------------------------------------
PHASES = ("put_seq", "put_conc", "txn_seq", "txn_conc")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.http_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--wal-mode", default="write", choices=("none", "write", "fsync"), help="node's wal_mode (default %(default)s)")
    p.add_argument("--seq-requests", type=int, default=2000, help="sequential PUTs per run (default %(default)s)")
    p.add_argument("--concurrency", type=int, default=16, help="clients in put_conc (default %(default)s)")
    p.add_argument("--conc-requests", type=int, default=10000, help="PUTs per run in put_conc (default %(default)s)")
    p.add_argument("--txn-ops", type=int, default=1000, help="puts in one POST /v1/txn (default %(default)s)")
    p.add_argument("--txn-requests", type=int, default=50, help="txns per run in each txn phase (default %(default)s)")
    p.add_argument("--txn-concurrency", type=int, default=4, help="clients in txn_conc (default %(default)s)")
    p.add_argument("--phases", default=",".join(PHASES), help="comma-separated subset of %(default)s")
    p.add_argument("--phase-s-max", type=float, default=30.0, help="stop a phase's new requests after this (default %(default)s)")
    p.add_argument("--runs", type=int, default=3, help="runs; the table shows medians (default %(default)s)")
    p.add_argument("--dir", default=None, help="where the temp data dir goes (default: the system temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the data dir and node log")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    a = p.parse_args(argv)
    a.phases = [x.strip() for x in a.phases.split(",") if x.strip()]
    bad = [x for x in a.phases if x not in PHASES]
    if bad or not a.phases:
        p.error(f"--phases: choose from {', '.join(PHASES)}")
    for name in ("seq_requests", "concurrency", "conc_requests", "txn_ops", "txn_requests", "txn_concurrency", "runs"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    a.dir = a.dir or tempfile.gettempdir()
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data_dir = tempfile.mkdtemp(prefix="http_load-", dir=args.dir)
    try:
        mach = machine(data_dir)
        t0 = time.perf_counter()
        doc = asyncio.run(bench(args, data_dir))
        doc["total_s"] = time.perf_counter() - t0
    finally:
        if args.keep:
            print(f"http_load: data and node log kept in {data_dir}", file=sys.stderr)
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    if args.json:
        dump_json({"machine": mach, "value_bytes": VALUE_BYTES, **doc})
        return 0
    sys.stderr.flush()
    print_machine(mach)
    print_load(doc["load"], mach["nproc"])
    print(f"\nHTTP writes to one `replog serve` on loopback (wal_mode={doc['wal_mode']}, JSON bodies, "
          f"{VALUE_BYTES}-byte values), median of {args.runs} runs, total {doc['total_s']:.0f} s; "
          f"node healthy after {doc['startup_s']:.2f} s")
    print_table(
        ["phase", "clients", "req/run", "req/s", "ops/s", "p50 ms", "p99 ms", "max ms", "rows/batch",
         "server CPU %", "client CPU %", "errors"],
        [[p["phase"], p["clients"], p["requests"], p["req_s"], p["ops_s"], p["p50_ms"], p["p99_ms"], p["max_ms"],
          p["rows_per_batch"], p["server_cpu_pct"], p["client_cpu_pct"], p["errors"]] for p in doc["phases"]])
    print(f"\nrows acknowledged {doc['rows_acknowledged']:,}; node lsn {doc['node_lsn']:,} "
          f"(expected {doc['node_lsn_expected']:,}); node stopped by SIGTERM in {doc['stop']['seconds']:.2f} s, "
          f"exit code {doc['stop']['exit_code']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
