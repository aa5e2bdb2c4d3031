"""How much a hot backup stalls a node's writes (node/ops/backup.py).

One real `replog serve` (wal_mode write) is filled with --rows rows of 100-byte values (1,000 to a
transaction), then --writers clients, each on its own keep-alive connection, send single-key PUTs
back to back, and a probe asks /v1/health every 10 ms (its answer time is the event loop's lag).
Each run takes --window-s of that load alone (the baseline), then one backup under the same load,
alternating between the two ways of taking one:

  http   POST /v1/admin/backup: the node copies its store on an executor thread; its event loop
         only reads the journal's position between the store copy and the WAL copy
  cli    `replog backup DATA_DIR --to OUT` from another process, beside the running node

Reported per run: the backup's seconds (store copy, WAL copy, recovery of the copy) and bytes;
for the baseline window and for the backup's own window: writes/s, write latency p50, p99 and max,
the longest gap between two write answers (what a writer sees as a stall), and the health probe's
worst answer. The summary gives medians per way, and the backup window's figures as ratios to the
baseline's. Figures only: nothing is asserted.

    python -m bench.backup                      # ~2 min on 2 cores
    python -m bench.backup --rows 1000000 --runs 2"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from bench.common import LoadWatch, dump_json, machine, median, percentile, print_load, print_machine, print_table
from bench.procs import ReplogNode, proc_cpu_s

SPACE = "bench"
VALUE = "x" * 100
FILL_TXN_ROWS = 1000                 # rows per fill transaction
PROBE_INTERVAL_S = 0.01              # the health probe's period
REQUEST_TIMEOUT_S = 60.0             # one write; a stuck node fails the bench instead of hanging it


class Load:
    """Writers and a health probe; every answer's (start, end) kept."""

    def __init__(self, node: ReplogNode, writers: int):
        self.node = node
        self.writes: list[tuple[float, float]] = []
        self.probes: list[tuple[float, float]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._write, args=(i,), daemon=True) for i in range(writers)]
        self._threads.append(threading.Thread(target=self._probe, daemon=True))

    def _conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.node.port, timeout=REQUEST_TIMEOUT_S)

    def _write(self, w: int) -> None:
        conn, n = self._conn(), 0
        body = json.dumps(VALUE).encode()
        while not self._stop.is_set():
            n += 1
            t0 = time.monotonic()
            conn.request("PUT", f"/v1/spaces/{SPACE}/keys/w{w}-{n % 5000}", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            t1 = time.monotonic()
            with self._lock:
                if r.status == 200:
                    self.writes.append((t0, t1))
                else:
                    self.errors += 1

    def _probe(self) -> None:
        conn = self._conn()
        while not self._stop.is_set():
            t0 = time.monotonic()
            conn.request("GET", "/v1/health")
            conn.getresponse().read()
            self.probes.append((t0, time.monotonic()))
            time.sleep(PROBE_INTERVAL_S)      # the probe's period, not a synchronisation

    def start(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(REQUEST_TIMEOUT_S)

    def window(self, t0: float, t1: float) -> dict:
        with self._lock:
            lat = [e - s for s, e in self.writes if t0 <= s < t1]
            ends = sorted(e for _, e in self.writes if t0 <= e < t1)
        gaps = [b - a for a, b in zip([t0] + ends, ends + [t1])]
        probe = [e - s for s, e in self.probes if t0 <= s < t1]
        span = max(t1 - t0, 1e-9)
        return {"seconds": span, "writes_s": len(lat) / span,
                "p50_ms": 1e3 * percentile(lat, 50), "p99_ms": 1e3 * percentile(lat, 99),
                "max_ms": 1e3 * max(lat, default=float("nan")), "gap_ms": 1e3 * max(gaps, default=span),
                "probe_max_ms": 1e3 * max(probe, default=float("nan"))}


def fill(node: ReplogNode, rows: int) -> None:
    for start in range(0, rows, FILL_TXN_ROWS):
        ops = [{"op": "put", "space": SPACE, "key": f"fill{i}", "value": VALUE}
               for i in range(start, min(rows, start + FILL_TXN_ROWS))]
        s, d = node.request("POST", "/v1/txn", {"ops": ops})
        if s != 200:
            raise SystemExit(f"fill failed: {s} {d}")


def take_backup(node: ReplogNode, way: str, out: str) -> dict:
    if way == "http":
        s, man = node.request("POST", "/v1/admin/backup", {"to": out}, timeout_s=600)
        if s != 200:
            raise SystemExit(f"backup failed: {s} {man}")
        return man
    r = subprocess.run([sys.executable, "-m", "node", "backup", node.data_dir, "--to", out], capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"replog backup failed: {r.stderr}")
    with open(os.path.join(out, "MANIFEST.json")) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.backup", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=300_000, help="rows in the store before the runs")
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--window-s", type=float, default=3.0, help="load alone before each backup")
    p.add_argument("--runs", type=int, default=4, help="backups, alternating http and cli")
    p.add_argument("--dir", help="where the node's data and the backups go (default: a temp dir)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="bench-backup-", dir=args.dir)
    node = ReplogNode("node", os.path.join(work, "node"), extra=["--map-size", str(1 << 34)])
    results = []
    try:
        node.start()
        node.create_space(SPACE)
        t = time.monotonic()
        fill(node, args.rows)
        fill_s = time.monotonic() - t
        watch = LoadWatch()
        cpu0 = proc_cpu_s(node.pid) or 0.0
        load = Load(node, args.writers).start()
        for run in range(args.runs):
            way = ("http", "cli")[run % 2]
            base0 = time.monotonic()
            time.sleep(args.window_s)         # the baseline window is a length of time, not a wait for state
            b0 = time.monotonic()
            out = os.path.join(work, f"backup-{run}")
            man = take_backup(node, way, out)
            b1 = time.monotonic()
            results.append({"run": run + 1, "way": way, "backup_s": b1 - b0, "bytes": man["bytes"],
                            "steps": man["seconds"], "baseline": load.window(base0, b0), "during": load.window(b0, b1)})
            shutil.rmtree(out, ignore_errors=True)
        load.stop()
        own = (proc_cpu_s(node.pid) or 0.0) - cpu0
        stats = watch.stop(own)
    finally:
        node.stop()
    doc = {"machine": machine(work), "rows": args.rows, "fill_s": fill_s, "writers": args.writers,
           "errors": load.errors, "runs": results, "load": stats}
    shutil.rmtree(work, ignore_errors=True)
    if args.json:
        dump_json(doc)
        return 0
    print_machine(doc["machine"])
    print(f"store:   {args.rows} rows of {len(VALUE)} bytes; {args.writers} writers; write errors {load.errors}")
    rows = []
    for r in results:
        for phase in ("baseline", "during"):
            w = r[phase]
            rows.append([r["run"], r["way"], phase, f"{w['seconds']:.2f}", f"{w['writes_s']:.0f}", f"{w['p50_ms']:.2f}",
                         f"{w['p99_ms']:.2f}", f"{w['max_ms']:.1f}", f"{w['gap_ms']:.1f}", f"{w['probe_max_ms']:.1f}",
                         f"{r['bytes'] / 2**20:.1f}" if phase == "during" else "",
                         " ".join(f"{k[:-2]}={v:.3f}" for k, v in r["steps"].items()) if phase == "during" else ""])
    print_table(["run", "way", "window", "s", "writes/s", "p50 ms", "p99 ms", "max ms", "gap ms", "probe max ms",
                 "MiB", "backup steps (s)"], rows)
    print()
    summary = []
    for way in ("http", "cli"):
        rs = [r for r in results if r["way"] == way]
        if not rs:
            continue
        med = {k: median(r["during"][k] for r in rs) for k in ("writes_s", "p50_ms", "p99_ms", "max_ms", "gap_ms")}
        base = {k: median(r["baseline"][k] for r in rs) for k in med}
        summary.append([way, len(rs), f"{median(r['backup_s'] for r in rs):.2f}"]
                       + [f"{med[k]:.1f} ({med[k] / base[k]:.2f}x)" for k in med])
    print_table(["way", "runs", "backup s", "writes/s (vs base)", "p50 ms", "p99 ms", "max ms", "gap ms"], summary)
    print_load(stats, os.cpu_count() or 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
