"""deploy/: what can be checked where docker cannot run. The systemd unit passes
`systemd-analyze verify`; the Dockerfile's own commands, read from the file, build a wheel and
install it in a fresh venv, and its environment, entrypoint and health check run a node that
answers the check, refuses to start without the secrets the image expects, and stops on
SIGTERM with exit 0."""
from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import venv

import pytest

from tests.integration.harness import PortReservation, request, wait_for
from tests.packaging.test_no_compiler import _copy_tracked

REPO = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """[(INSTRUCTION, arguments), ...] per stage, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        if op == "FROM":
            stages.append([])
        stages[-1].append((op, rest.strip()))
    return stages


def test_the_systemd_unit_verifies(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here (Debian package systemd)")
    exe = REPO / ".venv" / "bin" / "replog"
    assert exe.exists(), "the dev install (scripts/setup.sh) provides the executable the unit names"
    unit = (DEPLOY / "replog.service").read_text()
    assert "ExecStart=/opt/replog/bin/replog serve --config /etc/replog/node.toml" in unit
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit and "RestartPreventExitStatus=2" in unit
    (tmp_path / "replog.service").write_text(unit.replace("/opt/replog/bin/replog", str(exe)))
    r = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "replog.service")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", r.stdout + r.stderr


def test_the_dockerfiles_commands_build_install_and_run_a_node_that_passes_its_health_check(tmp_path):
    build, runtime = dockerfile_stages()
    [wheel_cmd] = [a for op, a in build if op == "RUN" and a.startswith("pip wheel")]
    [install_cmd] = [a for op, a in runtime if op == "RUN" and a.startswith("pip install")]
    env_line = " ".join(a for op, a in runtime if op == "ENV")
    image_env = dict(kv.split("=", 1) for kv in shlex.split(env_line))
    [health] = [a for op, a in runtime if op == "HEALTHCHECK"]
    health_cmd = shlex.split(health.split(" CMD ", 1)[1])
    entry = [json.loads(a) for op, a in runtime if op in ("ENTRYPOINT", "CMD")]   # JSON-form arrays
    assert entry == [["replog"], ["serve"]]

    src, wheels = tmp_path / "src", tmp_path / "wheels"
    _copy_tracked(src)
    venv.create(tmp_path / "venv", with_pip=True)
    bin_dir = tmp_path / "venv" / "bin"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PIP_DISABLE_PIP_VERSION_CHECK="1")
    r = subprocess.run(wheel_cmd.replace("/wheels", str(wheels)), shell=True, cwd=src, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(install_cmd.replace("/wheels", str(wheels)), shell=True, cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]

    # The image's environment, with its paths moved under tmp_path and its port on loopback.
    reservation = PortReservation()          # the node's ports, held until the test ends
    port = reservation.port
    node_env = {k: v for k, v in env.items() if not k.startswith("REPLOG_")} | image_env
    node_env |= {"REPLOG_DATA_DIR": str(tmp_path / "data"), "REPLOG_LISTEN": f"127.0.0.1:{port}",
                 "REPLOG_SECRET_FILE": str(tmp_path / "secret"), "REPLOG_TOKEN_FILE": str(tmp_path / "token")}
    argv = [str(bin_dir / entry[0][0])] + entry[1]
    r = subprocess.run(argv, env=node_env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("replog: error: secret_file: cannot read "), r.stderr

    (tmp_path / "secret").write_text("cluster-secret\n")
    (tmp_path / "token").write_text("client-token\n")
    log = open(tmp_path / "node.log", "wb")
    p = subprocess.Popen(argv, env=node_env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        check = [str(bin_dir / health_cmd[0]), *[a.replace(":7301", f":{port}") for a in health_cmd[1:]]]
        wait_for(lambda: subprocess.run(check, capture_output=True, timeout=10).returncode == 0, 30,
                 "the image's health check passes")
        s, _ = request("GET", f"http://127.0.0.1:{port}/v1/info", token="client-token")
        assert s == 200
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        log.close()
        reservation.close()
    assert (tmp_path / "node.log").read_text().lstrip().startswith('{"ts": ')   # REPLOG_LOG_FORMAT=json
