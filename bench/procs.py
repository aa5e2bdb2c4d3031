"""Real server processes for the replication benchmarks (bench/applier.py, bench/lag.py):
`replog serve` nodes driven over HTTP, Tarantool instances driven over the control socket
of bench/tarantool/ctl.lua, and what /proc says about a process (peak RSS, CPU time).

Rules: every wait is on a condition with a deadline, never a bare sleep; every process
started here is stopped by its own pid (SIGTERM, then SIGKILL past a deadline); each
process logs to a file in its own directory so a failure can print the tail."""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
from typing import Any, Callable

from bench.common import free_port
from node.client import request, tls_context
from node.logsetup import file_tail

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LUA_DIR = os.path.join(REPO, "bench", "tarantool")
START_TIMEOUT_S = 60.0               # a node must answer within this after it is started
STOP_TIMEOUT_S = 30.0                # after SIGTERM; then SIGKILL
HTTP_TIMEOUT_S = 30.0                # one control request (a busy node answers slowly)
POLL_INTERVAL_S = 0.02               # condition polling
CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    """A benchmark could not run as planned (a node died, a wait timed out)."""


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, interval_s: float = POLL_INTERVAL_S) -> Any:
    """Poll cond() until it returns something truthy; BenchError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except (OSError, ValueError, KeyError) as e:
            last = e
        time.sleep(interval_s)
    raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what}" + (f" (last error: {last})" if last else ""))


# --- /proc -------------------------------------------------------------------------------
def proc_status_kib(pid: int, field: str) -> int | None:
    """A `kB` field of /proc/<pid>/status (VmHWM: peak RSS; VmRSS: current), or None."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process, all threads (from /proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / CLK_TCK
    except (OSError, ValueError, IndexError):
        return None


class Proc:
    """One child process with a log file; stopped by its own pid only."""

    def __init__(self, name: str, workdir: str):
        self.name = name
        self.dir = workdir
        os.makedirs(self.dir, exist_ok=True)
        self.log_path = os.path.join(self.dir, f"{name}.log")
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0        # time.monotonic() just before the exec

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        assert not self.alive(), f"{self.name} is already running"
        log = open(self.log_path, "ab")
        log.write(f"\n===== {' '.join(argv)}\n".encode())
        log.flush()
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                     env=dict(os.environ, **(env or {})))
        log.close()

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode

    def peak_rss_kib(self) -> int | None:
        return proc_status_kib(self.pid, "VmHWM") if self.alive() else None

    def rss_split_kib(self) -> tuple[int | None, int | None]:
        """(anonymous, file-backed) resident KiB now: LMDB's map shows up as file-backed."""
        if not self.alive():
            return None, None
        return proc_status_kib(self.pid, "RssAnon"), proc_status_kib(self.pid, "RssFile")

    def cpu_s(self) -> float | None:
        return proc_cpu_s(self.pid) if self.alive() else None

    def log_tail(self, n: int = 40) -> str:
        return file_tail(self.log_path, n)


# --- replog ------------------------------------------------------------------------------
RUN_NODE = "import runpy, sys; sys.argv = ['node'] + sys.argv[1:]; runpy.run_module('node', run_name='__main__')"


def http_request(method: str, url: str, body: Any = None, timeout_s: float = HTTP_TIMEOUT_S,
                 ca_file: str | None = None) -> tuple[int, Any]:
    return request(method, url, body, timeout=timeout_s, ca_file=ca_file)


class ReplogNode(Proc):
    """`python -m node serve` on 127.0.0.1 with its data in <workdir>/data."""

    def __init__(self, name: str, workdir: str, *, peers: list[str] = (), wal_mode: str = "write",
                 port: int | None = None, log_level: str = "info", extra: list[str] | None = None,
                 prelude: str = "", tls=None, event_loop: str = ""):
        """`tls`: a bench.throwaway_ca.NodeTls; the node serves TLS and is spoken to over https.
        `event_loop`: the node's --event-loop ("": its default, auto)."""
        super().__init__(name, workdir)
        self.data_dir = os.path.join(self.dir, "data")
        self.port = port or free_port()
        self.peers = list(peers)
        self.wal_mode = wal_mode
        self.log_level = log_level
        self.extra = list(extra or [])
        self.prelude = prelude
        self.tls = tls
        self.event_loop = event_loop
        self._poll_conn: http.client.HTTPConnection | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.address}"

    @property
    def ssl_context(self):
        """What a client of this node verifies it with (None: plaintext)."""
        return tls_context(self.tls.ca_file) if self.tls else None

    def argv(self) -> list[str]:
        """`python -m node serve ...`; with a prelude, `python -c "<prelude>; <run node>" serve ...`,
        which runs the same node after a line of Python (a change tried without editing node/)."""
        if self.prelude:
            a = [sys.executable, "-c", self.prelude + "\n" + RUN_NODE]
        else:
            a = [sys.executable, "-m", "node"]
        a += ["serve", "--data-dir", self.data_dir, "--listen", self.address,
              "--wal-mode", self.wal_mode, "--log-level", self.log_level]
        if self.peers:
            a += ["--peers", ",".join(self.peers)]
        if self.tls:
            a += self.tls.flags()
        if self.event_loop:
            a += ["--event-loop", self.event_loop]
        return a + self.extra

    def start(self, wait: bool = True) -> "ReplogNode":
        self._spawn(self.argv(), {"PYTHONUNBUFFERED": "1"})
        if wait:
            self.wait_running()
        return self

    def healthy(self) -> bool:
        self.check_alive()
        try:
            return self.request("GET", "/v1/health", timeout_s=2.0)[0] == 200
        except (OSError, urllib.error.URLError):
            return False

    def wait_running(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Health answers 200 and the node is `running` (joined or bootstrapped)."""
        wait_for(self.healthy, timeout_s, f"{self.name} healthy")
        wait_for(lambda: self.info()["status"] == "running", timeout_s, f"{self.name} running")

    def request(self, method: str, path: str, body: Any = None, timeout_s: float = HTTP_TIMEOUT_S) -> tuple[int, Any]:
        return http_request(method, self.url + path, body, timeout_s, self.tls.ca_file if self.tls else None)

    def info(self) -> dict:
        s, d = self.request("GET", "/v1/info")
        if s != 200:
            raise BenchError(f"{self.name}: /v1/info answered {s}: {d}")
        return d

    def lsn_of(self, origin_uuid: str) -> int:
        """This node's durable lsn of origin_uuid's rows (0 when none or not up yet).

        Polled during a timed catch-up, so it keeps one keep-alive connection: a new TCP
        connection per poll costs the node an accept and a transport each time."""
        try:
            if self._poll_conn is None:
                self._poll_conn = (http.client.HTTPSConnection("127.0.0.1", self.port, timeout=HTTP_TIMEOUT_S,
                                                               context=self.ssl_context) if self.tls else
                                   http.client.HTTPConnection("127.0.0.1", self.port, timeout=HTTP_TIMEOUT_S))
            self._poll_conn.request("GET", "/v1/info")
            r = self._poll_conn.getresponse()
            body = r.read()
            if r.status != 200:
                return 0
            return int(json.loads(body)["vclock_uuid"].get(origin_uuid, 0))
        except (OSError, http.client.HTTPException, ValueError):
            if self._poll_conn is not None:
                self._poll_conn.close()
            self._poll_conn = None
            return 0

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        if self._poll_conn is not None:
            self._poll_conn.close()
            self._poll_conn = None
        return super().stop(timeout_s)

    def create_space(self, space: str) -> None:
        s, d = self.request("PUT", f"/v1/spaces/{space}", {"local": False})
        if s not in (200, 201):
            raise BenchError(f"{self.name}: cannot create space {space}: {s} {d}")


# --- Tarantool -----------------------------------------------------------------------------
class TarantoolNode(Proc):
    """`tarantool <script>` with BENCH_* environment variables; driven over the JSON-lines
    control socket the script serves (bench/tarantool/ctl.lua)."""

    def __init__(self, name: str, workdir: str, script: str, env: dict[str, str] | None = None,
                 port: int | None = None):
        super().__init__(name, workdir)
        self.data_dir = os.path.join(self.dir, "data")
        os.makedirs(self.data_dir, exist_ok=True)
        self.script = os.path.join(LUA_DIR, script)
        self.port = port or free_port()
        self.ctl_path = os.path.join(self.dir, "ctl.sock")
        self.env = dict(env or {})
        self._sock: socket.socket | None = None
        self._rfile = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, wait: bool = True, env: dict[str, str] | None = None) -> "TarantoolNode":
        self.close_ctl()
        try:
            os.unlink(self.ctl_path)
        except FileNotFoundError:
            pass
        e = {"BENCH_DIR": self.data_dir, "BENCH_LISTEN": self.address, "BENCH_CTL": self.ctl_path,
             **self.env, **(env or {})}
        self._spawn(["tarantool", self.script], e)
        if wait:
            self.wait_ctl()
        return self

    def wait_ctl(self, timeout_s: float = START_TIMEOUT_S) -> None:
        def ready() -> bool:
            self.check_alive()
            return os.path.exists(self.ctl_path) and self.call("info") is not None
        wait_for(ready, timeout_s, f"{self.name} control socket")

    def call(self, cmd: str, timeout_s: float = 600.0, **args: Any) -> Any:
        if self._sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(self.ctl_path)
            self._sock, self._rfile = s, s.makefile("rb")
        assert self._sock is not None and self._rfile is not None
        self._sock.settimeout(timeout_s)
        self._sock.sendall(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
        line = self._rfile.readline()
        if not line:
            self.close_ctl()
            raise BenchError(f"{self.name}: control socket closed during {cmd}")
        reply = json.loads(line)
        if "error" in reply:
            raise BenchError(f"{self.name}: {cmd} failed: {reply['error']}")
        return reply["ok"]

    def close_ctl(self) -> None:
        if self._sock is not None:
            self._rfile.close()
            self._sock.close()
            self._sock = self._rfile = None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        self.close_ctl()
        return super().stop(timeout_s)


def code_version() -> str:
    """The commit the figures came from, and whether node/ had uncommitted changes (the
    figures then belong to the working tree, not to the commit)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "node"], cwd=REPO, capture_output=True,
                               text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (f" + uncommitted changes to {len(dirty)} file(s) under node/" if dirty else " (node/ clean)")
