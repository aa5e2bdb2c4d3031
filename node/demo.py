"""`replog demo`: a local multi-master cluster on embedded defaults.

Starts N masters in full mesh and M anonymous replicas as real `replog serve` processes
under a temporary (or given) directory, runs a small write workload on every master,
and prints a live status table (members, their id on each node, vclocks, lag) until
Ctrl-C or --duration; then stops every process with SIGTERM and waits for each.
The dashboard's URL (the first master's /ui) is the first line printed; --open starts a
graphical browser on it where there is one, and does nothing where there is none.

Rules kept here: a busy port ends the demo before anything starts, naming the port and the
node it was for; a node that exits or does not come up is named with the end of its log; the
screen names nodes as they were started (master1, anon1), and shows the write rate and one
line saying whether every node holds the same rows."""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import webbrowser

import replog

from node.cli_http import http, sdk_client
from node.logsetup import file_tail
from node.status import collect, convergence, render_table


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def busy_port(ports: list[int]) -> int | None:
    """The first port that cannot be bound on 127.0.0.1, or None."""
    for p in ports:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            return p
        finally:
            s.close()
    return None


class WriteRate:
    """Acknowledged writes, and their rate since the last look."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.total = 0
        self._seen, self._at = 0, time.monotonic()

    def add(self) -> None:
        with self.lock:
            self.total += 1

    def per_s(self) -> float:
        with self.lock:
            now, total = time.monotonic(), self.total
        rate = (total - self._seen) / max(now - self._at, 1e-6)
        self._seen, self._at = total, now
        return rate


def _spawn(argv: list[str], log_path: str) -> subprocess.Popen:
    log = open(log_path, "ab")
    try:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if http("GET", url + "/v1/health", timeout=2)[0] == 200:
                return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    return False


def open_browser(url: str) -> None:
    """A graphical browser only: a console one (lynx, w3m) would take over the demo's terminal."""
    graphical = sys.platform in ("darwin", "win32") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    try:
        opened = bool(graphical) and webbrowser.open(url, new=2)
    except webbrowser.Error:
        opened = False
    if not opened:
        print("  (no graphical browser here: open the dashboard URL above in yours)")


def run_demo(args: argparse.Namespace) -> int:
    base = args.dir or tempfile.mkdtemp(prefix="replog-demo-")
    os.makedirs(base, exist_ok=True)
    exe = [sys.executable, "-m", "node", "serve", "--log-level", "info"]
    if args.base_port:
        ports = [args.base_port + i for i in range(args.masters + args.anon)]
    else:   # any free ports (tests; several demos side by side)
        ports = _free_ports(args.masters + args.anon)
    addrs = [f"127.0.0.1:{p}" for p in ports]
    masters = addrs[: args.masters]
    procs: list[tuple[str, subprocess.Popen]] = []
    names = [f"master{i + 1}" if i < args.masters else f"anon{i - args.masters + 1}" for i in range(len(addrs))]
    busy = busy_port(ports)
    if busy is not None:
        who = names[ports.index(busy)]
        print(f"replog demo: port {busy} (for {who}, 127.0.0.1:{busy}) is already in use; stop what holds it, "
              f"or choose other ports with --base-port N (0: any free ports)", file=sys.stderr)
        return 2
    dashboard = f"http://{masters[0]}/ui"
    print(f"dashboard: {dashboard}", flush=True)
    print(f"replog demo: {args.masters} masters in full mesh + {args.anon} anonymous replica(s) under {base}")
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        for i, (addr, name) in enumerate(zip(addrs, names)):
            peers = [a for a in masters if a != addr]
            argv = exe + ["--data-dir", os.path.join(base, name), "--listen", addr]
            if peers:
                argv += ["--peers", ",".join(peers)]
            if i >= args.masters:
                argv += ["--anon"]
            procs.append((addr, _spawn(argv, os.path.join(base, f"{name}.log"))))
            print(f"  started {name} on {addr} (log {os.path.join(base, name + '.log')})")
        for (addr, p), name in zip(procs, names):
            if not _wait_healthy("http://" + addr, p, 60):
                why = f"exited with {p.returncode}" if p.poll() is not None else "did not become healthy within 60 s"
                log_path = os.path.join(base, name + ".log")
                print(f"replog demo: {name} ({addr}) {why}; the end of {log_path}:\n{file_tail(log_path, 20)}",
                      file=sys.stderr)
                return 1
        clients = {addr: sdk_client(addr, "", timeout=5) for addr in masters}    # the SDK, one node each
        clients[masters[0]].create_space("demo")
        for addr in masters:
            clients[addr].create_space("scratch_local", local=True)
        print("  all nodes healthy; space 'demo' created; workload running (Ctrl-C to stop)\n")
        if args.open:
            open_browser(dashboard)

        rate = WriteRate()

        def workload(addr: str, seed: int) -> None:
            rng = random.Random(seed)
            i = 0
            while not stop.is_set():
                key = f"k{rng.randrange(1000)}"
                try:
                    clients[addr].put("demo", key, {"by": addr, "n": i})
                    rate.add()
                except replog.ReplogError:
                    pass
                i += 1
                stop.wait(1.0 / max(args.rate, 0.1))

        threads = [threading.Thread(target=workload, args=(a, n), daemon=True) for n, a in enumerate(masters)]
        for t in threads:
            t.start()
        started = time.monotonic()
        tty = sys.stdout.isatty()
        by_addr = dict(zip(addrs, names))
        while not stop.is_set():
            report = collect(["http://" + a for a in addrs])
            table = render_table(report, by_addr)
            if tty:
                sys.stdout.write("\x1b[H\x1b[2J")
            print(f"replog demo — {time.strftime('%H:%M:%S')} — dashboard {dashboard} — {base}\n"
                  f"writes: {rate.per_s():.1f}/s ({rate.total} acknowledged); {convergence(report, by_addr)}\n"
                  f"{table}\n", flush=True)
            if args.duration and time.monotonic() - started >= args.duration:
                break
            stop.wait(1.0)
        stop.set()
        for t in threads:
            t.join(5)
        for c in clients.values():
            c.close()
    finally:
        print("replog demo: stopping every node ...")
        for _, p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        failed = []
        for (addr, p), name in zip(procs, names):
            try:
                rc = p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait(5)
            print(f"  {addr} exited with {rc}")
            if rc != 0:
                failed.append(name)
        for name in failed:   # say why here, not only in a log the user has to find
            print(f"--- {name} did not stop cleanly; the end of {name}.log:\n{file_tail(os.path.join(base, name + '.log'), 20)}",
                  file=sys.stderr)
        if not args.dir and not failed:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"data kept in {base} (try: replog analyze {base}/master1 {base}/master2 {base}/master3)")
    return 1 if failed else 0

