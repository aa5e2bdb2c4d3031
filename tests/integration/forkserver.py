"""Node processes forked from a process that has already imported the node, for the tests.

A node started with `python -m node serve` spends ~0.6 s of CPU on the interpreter's start and
its imports before it runs a line of its own, and a default test run starts ~700 of them on two
cores: a third of the run's CPU. A fork server imports the node once per test worker, then forks
a child per start that runs the same entry point as `python -m node` (node/__main__.py, as
runpy runs it for `-m`) with the node's own argv, environment, working directory and log file.
The child is a real process with its own pid, signals and exit code; what it skips is only the
interpreter's start and the imports, which the server did with the same interpreter and flags.

Used by tests/integration/harness.py `ReplogProcess.start` unless REPLOG_TEST_EXEC=1 (then every
node is exec'd, as before), or the node's environment sets a variable read while modules are
imported (`exec_only`: the interpreter's PYTHON* and the SSL defaults aiohttp loads at import):
those nodes are exec'd, as is one whose test sets `exec_only` on it (it patches subprocess.Popen,
say to set a resource limit between fork and exec). Tests of how the program starts (the
packaging and README tests, the CLI's commands) run the command themselves and never come here.

Wire (JSON lines): the client writes {"args" (after `-m node`), "env", "cwd", "log"}; the server
answers {"pid"} (or {"error"}) and later {"exit": pid, "code"} when the child ends, with the code as
subprocess reports it (-N for signal N). The server forks from one thread and never starts
another, so a child inherits no lock some other thread held."""
from __future__ import annotations

import atexit
import io
import json
import os
import runpy
import selectors
import signal
import subprocess
import sys
import threading
import traceback

# Imported by the server before it forks: everything `replog serve` imports at start, and the
# modules it imports later on some paths (lease identity, backups, the client protocol, the
# dashboard), so no child imports them again.
PRELOAD = ("node.cli", "node.logsetup", "node.process.run", "node.identity.lease_node", "node.identity.lease_store",
           "node.ops.backup", "node.ops.backup_node", "node.clientproto.listener", "node.http.ui")
PRELOAD_OPTIONAL = ("boto3", "botocore.config", "botocore.exceptions", "uvloop")  # what S3 leases, uvloop import


def exec_only(env: dict[str, str]) -> bool:
    """Whether a node with these extra variables must be exec'd: one read at import time (the
    interpreter's, or the CA bundle aiohttp loads at import) would not reach a forked child."""
    return any(k.startswith("PYTHON") or k.startswith("SSL_") for k in env)


# --- the server (python -m tests.integration.forkserver) ------------------------------------

def _child(req: dict) -> None:
    """In the forked child: become the node `req` describes and run it; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        log = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        # as PYTHONUNBUFFERED gives an exec'd node: every write reaches the log at once
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                      errors="backslashreplace")
        sys.argv = ["-m"] + list(req["args"])          # runpy puts node/__main__.py's path first
        try:
            runpy.run_module("node", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:   # noqa: BLE001 - as the interpreter would: the traceback, exit 1
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:   # noqa: BLE001
                pass
    finally:
        os._exit(code & 0xFF if code >= 0 else 1)


def serve() -> None:
    for name in PRELOAD:
        __import__(name)
    for name in PRELOAD_OPTIONAL:
        try:
            __import__(name)
        except ImportError:
            pass
    out = sys.stdout

    def say(doc: dict) -> None:
        out.write(json.dumps(doc) + "\n")
        out.flush()

    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "req")
    sel.register(rfd, selectors.EVENT_READ, "chld")
    pending = b""
    running = True
    while running:
        for key, _ in sel.select():
            if key.data == "chld":
                try:
                    while os.read(rfd, 512):
                        pass
                except BlockingIOError:
                    pass
            else:
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    running = False
                    break
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    req = json.loads(line)
                    try:                # (nothing is buffered to copy: say() flushes every answer)
                        pid = os.fork()
                    except OSError as e:
                        say({"error": str(e)})
                        continue
                    if pid == 0:
                        sel.close()
                        _child(req)
                    say({"pid": pid})
        while True:             # reap: every ended child is reported
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


# --- the client (in the test process) -------------------------------------------------------

class ForkedProcess:
    """A forked node, with the part of subprocess.Popen's interface the tests use."""

    def __init__(self, server: "ForkServer", pid: int):
        self._server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._server.exit_code(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(f"node pid {self.pid}", timeout)
            self.returncode = code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:          # as Popen: never signal a pid that may have been reused
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkServer:
    """One server process per test process, started at the first node start."""

    def __init__(self, cwd: str, env: dict[str, str]):
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.integration.forkserver"], cwd=cwd, env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._lock = threading.Lock()           # one spawn at a time: its answer is the next "pid"
        self._cond = threading.Condition()
        self._answers: list[dict] = []
        self._exits: dict[int, int] = {}
        self._gone = False
        threading.Thread(target=self._read, name="forkserver-reader", daemon=True).start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            doc = json.loads(line)
            with self._cond:
                if "exit" in doc:
                    self._exits[doc["exit"]] = doc["code"]
                else:
                    self._answers.append(doc)
                self._cond.notify_all()
        with self._cond:
            self._gone = True
            self._cond.notify_all()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return not self._gone and self._proc.poll() is None

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, log: str) -> ForkedProcess:
        """`argv`: the command as it would be exec'd, `python -m node ...` with this interpreter."""
        assert argv[:3] == [sys.executable, "-m", "node"], f"not a node command: {argv[:3]}"
        with self._lock:
            req = {"args": argv[3:], "env": env, "cwd": cwd, "log": log}
            self._proc.stdin.write((json.dumps(req) + "\n").encode())
            self._proc.stdin.flush()
            with self._cond:
                if not self._cond.wait_for(lambda: self._answers or self._gone, 30):
                    raise RuntimeError("the fork server did not answer within 30 s")
                if not self._answers:
                    raise RuntimeError("the fork server is gone")
                doc = self._answers.pop(0)
        if "error" in doc:
            raise OSError(f"the fork server could not fork: {doc['error']}")
        return ForkedProcess(self, doc["pid"])

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self._gone, timeout)
            if pid in self._exits:
                return self._exits[pid]
            if self._gone:              # the server died: its children were reparented, their codes lost
                return None if os.path.exists(f"/proc/{pid}") else -signal.SIGKILL
            return None

    def close(self) -> None:
        try:
            self._proc.stdin.close()
            self._proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()


_server: ForkServer | None = None
_server_lock = threading.Lock()


def server(cwd: str, env: dict[str, str]) -> ForkServer:
    """This test process's fork server (started on first use; `env`: its environment, the one
    modules read at import)."""
    global _server
    with _server_lock:
        if _server is None or not _server.alive:
            _server = ForkServer(cwd, env)
            atexit.register(_server.close)
        return _server


if __name__ == "__main__":
    serve()
