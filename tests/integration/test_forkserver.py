"""The fork server the harness starts nodes from (tests/integration/forkserver.py) gives each node
what an exec'd `python -m node` gets: its argv, environment, working directory, log, exit code
and signals, and a process of its own."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.integration import forkserver, harness
from tests.integration.harness import REPLOG, REPO_DIR, ReplogProcess


def server():
    return forkserver.server(REPO_DIR, {**os.environ, "SSL_CERT_FILE": os.devnull})


def test_a_bad_option_exits_2_with_the_clis_one_line_in_the_log(tmp_path):
    log = str(tmp_path / "log")
    p = server().spawn(REPLOG + ["serve", "--no-such-option"], dict(os.environ), str(tmp_path), log)
    assert p.wait(30) == 2
    text = open(log).read()
    assert "unrecognized arguments: --no-such-option" in text and "Traceback" not in text


def test_a_node_gets_its_own_environment_and_directory_and_dies_by_the_signal_sent(tmp_path):
    n = ReplogProcess(tmp_path, "a")
    n.env["REPLOG_CLUSTER_NAME"] = "from-the-env"
    n.start()
    try:
        if harness.FORK:
            assert type(n.proc) is forkserver.ForkedProcess and n.proc.pid != server().pid
        assert n.info()["cluster_name"] == "from-the-env"      # (/proc/PID/environ shows the server's)
        assert os.readlink(f"/proc/{n.proc.pid}/cwd") == REPO_DIR
        fds = {fd: os.readlink(f"/proc/{n.proc.pid}/fd/{fd}") for fd in ("0", "1", "2")}
        assert fds == {"0": os.devnull, "1": n.log_path, "2": n.log_path}
        assert n.proc.poll() is None
        n.proc.send_signal(signal.SIGKILL)
        assert n.proc.wait(10) == -signal.SIGKILL
    finally:
        n.stop()
        n.release_port()


def test_an_orderly_stop_exits_0_and_a_wait_that_runs_out_raises_as_popens_does(tmp_path):
    n = ReplogProcess(tmp_path, "a")
    n.start()
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            n.proc.wait(0.05)
        assert n.stop() == 0
        assert "Traceback" not in n.log_text()
    finally:
        n.release_port()


def test_a_variable_read_at_import_makes_the_harness_exec_the_node(tmp_path):
    assert forkserver.exec_only({"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"})
    assert forkserver.exec_only({"PYTHONDEVMODE": "1"})
    assert not forkserver.exec_only({"REPLOG_FAULT": "x"})
    n = ReplogProcess(tmp_path, "a")
    n.env["PYTHONDEVMODE"] = "1"
    n.start()
    try:
        assert type(n.proc) is subprocess.Popen
        with open(f"/proc/{n.proc.pid}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[:3] == [sys.executable.encode(), b"-m", b"node"]
    finally:
        n.stop()
        n.release_port()
