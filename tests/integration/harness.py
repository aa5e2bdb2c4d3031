"""Real `replog serve` processes on 127.0.0.1 for integration tests.

Processes are started with a port of their own and a data dir under the test's tmp_path,
waited for through /v1/health with a deadline (never a bare sleep), killed with SIGKILL for
crash tests or stopped with SIGTERM. Logs go to a file that failures print.

A port the harness picks is reserved (bench/common.py PortReservation) from then until the
test ends, so no other test process is handed it, with the node's derived binary client port
(HTTP + 1000); a node moved to another port (`move_to_new_port`) keeps its old one reserved
too. A node counts as healthy only once its own process listens on its port: a 200 from
whatever else holds the port is never taken for the node's answer (a node that cannot listen
exits, and the failure shows its log). Tests draw no port with free_port() for a node."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import Any, Callable

from bench.common import PortReservation, free_port  # noqa: F401  (tests import free_port from here)
from node.client import request  # noqa: F401  (tests import it from here)
from node.logsetup import file_tail
from tests.integration import forkserver
from tests.waiting import wait_for  # noqa: F401  (tests import wait_for from here)

REPLOG = [sys.executable, "-m", "node"]
REPO_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Nodes are forked from a process that imported the node once (forkserver.py: ~0.6 s of CPU less
# per start, a third of a run's CPU); REPLOG_TEST_EXEC=1 execs every one, as `python -m node`.
FORK = os.environ.get("REPLOG_TEST_EXEC", "") != "1"


class ReplogProcess:
    def __init__(self, tmp, name: str, *, port: int | None = None, peers: list["ReplogProcess"] | list[str] = (),
                 extra: list[str] | None = None, token: str | None = None, tls=None, client_auth: bool = False,
                 reservation: PortReservation | None = None):
        """`tls`: a bench.throwaway_ca.NodeTls; the node serves TLS and the harness speaks https.
        No `port`: a reserved one (`reservation`'s, else a new one), held until release_port()."""
        self.name = name
        self.dir = os.path.join(str(tmp), name)
        os.makedirs(self.dir, exist_ok=True)
        self.data_dir = os.path.join(self.dir, "data")
        if port is None and reservation is None:
            reservation = PortReservation()
        self.reservation = reservation
        self._held = [reservation] if reservation is not None else []   # every port it had, released at the end
        self.port = port or reservation.port
        self.peers = [p.address if isinstance(p, ReplogProcess) else p for p in peers]
        self.extra = list(extra or [])
        self.token = token
        self.tls = tls
        self.client_auth = client_auth
        self.proc: subprocess.Popen | forkserver.ForkedProcess | None = None
        self.env: dict[str, str] = {}        # extra environment for the process (test hooks)
        self.exec_only = False               # started by subprocess.Popen, never forked (a test patches it)
        self.log_path = os.path.join(self.dir, "node.log")
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.address}"

    def argv(self) -> list[str]:
        a = REPLOG + ["serve", "--data-dir", self.data_dir, "--listen", self.address, "--log-level", "debug"]
        if self.peers:
            a += ["--peers", ",".join(self.peers)]
        if self.tls:
            a += self.tls.flags(self.client_auth)
        return a + self.extra

    def start(self, wait: bool = True, timeout: float = 30.0) -> "ReplogProcess":
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is already running"
        self.starts += 1
        log = open(self.log_path, "ab")
        log.write(f"\n===== start #{self.starts}: {' '.join(self.argv())}\n".encode())
        log.flush()
        # SSL_CERT_FILE: no system CA bundle. aiohttp builds two default client contexts when it is
        # imported, each loading the whole bundle (~40 ms), in each of the ~700 node starts of a
        # run, and no node here talks to a server a public CA vouches for (TLS tests bring their CA).
        # A test's own env wins over both.
        base = {**os.environ, "PYTHONUNBUFFERED": "1", "SSL_CERT_FILE": os.devnull}
        env = {**base, **self.env}
        argv = self.argv()
        if FORK and not self.exec_only and argv[:len(REPLOG)] == REPLOG and not forkserver.exec_only(self.env):
            # forked from a process that imported the node already (tests/integration/forkserver.py)
            log.close()
            self.proc = forkserver.server(REPO_DIR, base).spawn(argv, env, REPO_DIR, self.log_path)
        else:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_DIR)
            log.close()
        if wait:
            self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 30.0) -> None:
        def ok():
            if self.proc and self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            # another process's 200 is not this node's: until this process listens, wait (it
            # either listens or exits, "cannot listen", and the check above says so)
            if self.get("/v1/health")[0] != 200 or self.proc is None:
                return False
            return listens_on(self.proc.pid, self.port) is not False
        try:
            wait_for(ok, timeout, f"{self.name} healthy")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- {self.name} log ---\n{self.log_tail()}") from None

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def move_to_new_port(self) -> None:
        """The next start listens on a newly reserved port (a member changing its address). The
        old one stays reserved until the test ends: peers may still dial it, and must reach
        nobody there."""
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is running"
        self.reservation = PortReservation()
        self._held.append(self.reservation)
        self.port = self.reservation.port

    def release_port(self) -> None:
        """The end of the test: the reserved ports go back to the kernel."""
        for r in self._held:
            r.close()

    def log_tail(self, n: int = 60) -> str:
        return file_tail(self.log_path, n)

    def log_text(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    # --- HTTP ----------------------------------------------------------------------------
    def _tls_kw(self, kw: dict) -> dict:
        if self.tls and "ca_file" not in kw:
            kw["ca_file"] = self.tls.ca_file
        return kw

    def get(self, path: str, **kw) -> tuple[int, Any]:
        return request("GET", self.url + path, token=kw.pop("token", self.token), **self._tls_kw(kw))

    def put(self, path: str, body: Any = None, **kw) -> tuple[int, Any]:
        return request("PUT", self.url + path, body, token=kw.pop("token", self.token), **self._tls_kw(kw))

    def post(self, path: str, body: Any = None, **kw) -> tuple[int, Any]:
        return request("POST", self.url + path, body, token=kw.pop("token", self.token), **self._tls_kw(kw))

    def delete(self, path: str, **kw) -> tuple[int, Any]:
        return request("DELETE", self.url + path, token=kw.pop("token", self.token), **self._tls_kw(kw))

    def info(self) -> dict:
        s, d = self.get("/v1/info")
        assert s == 200, (s, d)
        return d

    def cluster(self) -> dict[str, dict]:
        s, d = self.get("/v1/cluster")
        assert s == 200, (s, d)
        return {m["uuid"]: m for m in d["members"]}

    def uuid(self) -> str:
        return self.info()["uuid"]

    def kv_put(self, space: str, key: str, value: Any) -> dict:
        s, d = self.put(f"/v1/spaces/{space}/keys/{key}", value)
        assert s == 200, (s, d)
        return d

    def kv_get(self, space: str, key: str) -> tuple[int, Any]:
        return self.get(f"/v1/spaces/{space}/keys/{key}")

    def create_space(self, space: str, local: bool = False) -> None:
        s, d = self.put(f"/v1/spaces/{space}", {"local": local})
        assert s in (200, 201), (s, d)

    def set_peers(self, peers: list["ReplogProcess"] | list[str]) -> None:
        s, d = self.put("/v1/admin/peers", {"peers": [p if isinstance(p, str) else p.address for p in peers]})
        assert s == 200, (s, d)


def restore(backup: str, data_dir: str, *flags: str) -> dict:
    """`replog restore BACKUP --data-dir DIR [flags]`, which must succeed: what it printed."""
    r = subprocess.run(REPLOG + ["restore", backup, "--data-dir", data_dir, *flags], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"restoring {backup} into {data_dir} failed ({r.returncode}): {r.stderr[-2000:]}"
    return json.loads(r.stdout)


@contextlib.contextmanager
def silent_address():
    """An address where nothing listens while the block runs: its port is held, not listening,
    so a connection there is refused and no other test's node is handed it meanwhile."""
    r = PortReservation(client_port=False)
    try:
        yield f"127.0.0.1:{r.port}"
    finally:
        r.close()


def listens_on(pid: int, port: int) -> bool | None:
    """Does process `pid` hold a listening TCP socket on `port`? None: this system has no
    /proc to tell (the check is skipped there)."""
    inodes = set()
    tables = [t for t in ("/proc/net/tcp", "/proc/net/tcp6") if os.path.exists(t)]
    if not tables or not os.path.isdir(f"/proc/{pid}/fd"):
        return None
    for table in tables:
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()            # sl local_address rem_address st ... inode
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:   # 0A: LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def vclocks_converged(nodes: list[ReplogProcess], ignore: set[str] = frozenset()) -> bool:
    vcs = []
    for n in nodes:
        v = {u: l for u, l in n.info()["vclock_uuid"].items() if u not in ignore}
        vcs.append(v)
    return all(v == vcs[0] for v in vcs)


def mesh_nodes(tmp, n: int, prefix: str = "n", extra: list[str] | None = None,
               lists: Callable[[int, int], bool] = lambda i, j: True, **kw) -> list[ReplogProcess]:
    """n nodes on reserved ports, named prefix1..prefixN, not started: node i lists node j as a
    peer where `lists(i, j)` (every other node by default). `kw` goes to every ReplogProcess."""
    ports = [PortReservation() for _ in range(n)]
    return [ReplogProcess(tmp, f"{prefix}{i + 1}", reservation=ports[i], extra=extra,
                          peers=[f"127.0.0.1:{p.port}" for j, p in enumerate(ports) if j != i and lists(i, j)], **kw)
            for i in range(n)]


def mesh(tmp, n: int, extra: list[str] | None = None, **kw) -> list[ReplogProcess]:
    """n fresh nodes listing each other: they form one cluster (simultaneous join). `kw`
    goes to every ReplogProcess (tls, client_auth, token)."""
    nodes = mesh_nodes(tmp, n, extra=extra, **kw)
    for node in nodes:
        node.start(wait=False)
    for node in nodes:
        node.wait_healthy(60)
    return nodes


def case_a(tmp, procs: list[ReplogProcess]) -> tuple[ReplogProcess, ReplogProcess, ReplogProcess, ReplogProcess]:
    """The reference's case (a), as the README reproduces it by hand: masters A and B; cut A-B;
    C joins through A and D through B at once (both get id 3); restore A-B, then link
    C - A - B - D both ways. Returns (a, b, c, d) with space `kv` and one row from C and D;
    A calls C 3 and D 4, B calls D 3 and C 4. Every process is appended to `procs`."""
    a, b = mesh(tmp, 2)
    procs.extend([a, b])
    a.create_space("kv")
    wait_for(lambda: b.get("/v1/spaces")[1]["spaces"], 20, "space on B")
    a.set_peers([])
    b.set_peers([])
    wait_for(lambda: not any(u["status"] == "follow" for u in a.info()["upstreams"] + b.info()["upstreams"]), 20,
             "A-B link cut")
    c = ReplogProcess(tmp, "c", peers=[a]).start(wait=False)
    d = ReplogProcess(tmp, "d", peers=[b]).start(wait=False)
    procs.extend([c, d])
    c.wait_healthy(60)
    d.wait_healthy(60)
    assert c.info()["id"] == 3 and d.info()["id"] == 3, "both masters should hand out id 3 while cut"
    c.kv_put("kv", "from-c", 1)
    d.kv_put("kv", "from-d", 1)
    a.set_peers([b])
    b.set_peers([a])
    cu, du = c.uuid(), d.uuid()
    wait_for(lambda: cu in b.cluster() and du in a.cluster(), 30, "masters learn each other's new member")
    for n, ps in case_a_topology(a, b, c, d).items():
        n.set_peers(ps)
    return a, b, c, d


def case_a_topology(a, b, c, d) -> dict:
    """Links both ways along C - A - B - D: C's rows must cross A and B to reach D."""
    return {a: [b, c], b: [a, d], c: [a], d: [b]}
