"""The `replog` command as a user runs it: client commands, status, demo, log formats,
wal_mode none, and local spaces that never leave their node."""
from __future__ import annotations

import json
import os
import re
import subprocess

from tests.integration.harness import REPLOG, ReplogProcess, mesh, request, silent_address, wait_for


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(REPLOG + list(args), capture_output=True, text=True, timeout=timeout)


def test_put_get_delete_and_status_commands(tmp_path, procs):
    n = ReplogProcess(tmp_path, "cli").start()
    procs.append(n)
    n.create_space("kv")
    r = run("put", n.address, "kv", "k1", '{"a": 1}')
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["lsn"] >= 1
    r = run("get", n.address, "kv", "k1")
    assert r.returncode == 0 and json.loads(r.stdout)["value"] == {"a": 1}
    r = run("put", n.address, "kv", "plain", "not json")
    assert r.returncode == 0 and n.kv_get("kv", "plain")[1]["value"] == "not json"
    r = run("put", n.address, "kv", "typo", '{"a": 1,}')       # opens like JSON: a typo, not a string
    assert r.returncode == 2 and "not valid JSON" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert n.kv_get("kv", "typo")[0] == 404
    r = run("put", n.address, "kv", "typo", "--string", '{"a": 1,}')
    assert r.returncode == 0 and n.kv_get("kv", "typo")[1]["value"] == '{"a": 1,}'
    r = run("delete", n.address, "kv", "k1")
    assert r.returncode == 0
    r = run("get", n.address, "kv", "k1")                 # the node's error: one line on stderr, exit 1
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert r.stderr.startswith("replog: error: no_such_key: ") and "HTTP 404" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run("status", n.address)
    assert r.returncode == 0 and n.uuid()[:8] in r.stdout and "running" in r.stdout
    with silent_address() as nowhere:
        r = run("get", nowhere, "kv", "k1")
    assert r.returncode == 1 and "cannot reach" in r.stderr and "Traceback" not in r.stderr


def test_status_shows_every_members_id_on_every_node(tmp_path, procs):
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    wait_for(lambda: all(n.get("/readyz")[0] == 200 for n in nodes), 30, "every node follows both others")
    r = run("status", nodes[0].address)
    assert r.returncode == 0, r.stdout
    for n in nodes:
        assert n.uuid()[:8] in r.stdout
    header = r.stdout.splitlines()[0]
    assert header.count("id@") == 3


def test_json_logs(tmp_path, procs):
    n = ReplogProcess(tmp_path, "json", extra=["--log-format", "json"]).start()
    procs.append(n)
    lines = [line for line in n.log_text().splitlines() if line.startswith("{")]
    assert lines, n.log_text()
    rec = json.loads(lines[0])
    assert {"ts", "level", "logger", "msg"} <= rec.keys()


def test_wal_mode_none_serves_clients_but_not_replicas(tmp_path, procs):
    a = ReplogProcess(tmp_path, "nowal", extra=["--wal-mode", "none"]).start()
    procs.append(a)
    a.create_space("kv")
    a.kv_put("kv", "k", 1)
    assert a.info()["wal"]["segments"] == 0
    b = ReplogProcess(tmp_path, "b", peers=[a]).start()
    procs.append(b)
    wait_for(lambda: any("wal_mode" in u["error"] for u in b.info()["upstreams"]), 20,
             "subscriber told that wal_mode none cannot serve replicas")
    assert a.stop() == 0
    a.start()
    assert a.kv_get("kv", "k")[1]["value"] == 1


def test_a_node_that_ran_with_wal_mode_none_starts_with_a_wal_again_unfenced_and_replicates(tmp_path, procs):
    """No WAL directory is no loss for a store that last ran without one: nothing of it left
    the node (a node with wal_mode none relays nothing), so with its other member down it takes
    writes at once (a loss would fence it until that member said what it holds), and it serves
    that member from its new WAL."""
    a = ReplogProcess(tmp_path, "nowal", extra=["--wal-mode", "none"]).start()
    procs.append(a)
    a.create_space("kv")
    b = ReplogProcess(tmp_path, "b", peers=[a]).start()
    procs.append(b)
    bu = b.uuid()
    wait_for(lambda: bu in a.cluster(), 20, "B registered on A")
    before = a.kv_put("kv", "k", 1)["lsn"]
    assert b.stop() == 0 and a.stop() == 0
    a.extra = ["--wal-mode", "write"]
    a.start()
    assert a.info()["own_rows_fence"] is None, a.info()["own_rows_fence"]
    s, d = a.put("/v1/spaces/kv/keys/after", 2)
    assert s == 200 and d["lsn"] == before + 1, (s, d)
    b.start()
    wait_for(lambda: b.kv_get("kv", "after")[0] == 200, 30, "B has the row written after the change")


def test_local_space_rows_never_leave_the_node(tmp_path, procs):
    a, b = mesh(tmp_path, 2)
    procs.extend([a, b])
    a.create_space("kv")
    a.create_space("mine", local=True)
    a.kv_put("mine", "secret", "stays")
    a.kv_put("kv", "shared", "goes")
    wait_for(lambda: b.kv_get("kv", "shared")[0] == 200, 20, "replicated row arrives")
    assert "mine" not in [s["name"] for s in b.get("/v1/spaces")[1]["spaces"]]
    assert b.kv_get("mine", "secret")[0] == 404
    assert "0" not in b.info()["vclock"], "local rows count in component 0 on their own node only"
    assert a.info()["vclock"]["0"] >= 2


def test_demo_runs_masters_and_an_anonymous_replica_and_stops_cleanly(tmp_path):
    """It prints the dashboard's URL first; --open without a graphical display opens nothing
    (a console browser would take over the terminal) and says so."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")}
    r = subprocess.run(REPLOG + ["demo", "--dir", str(tmp_path / "demo"), "--duration", "4", "--base-port", "0",
                                 "--open"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "anonymous" in r.stdout and r.stdout.count("exited with 0") == 4, r.stdout[-3000:] + r.stderr[-3000:]
    first = r.stdout.splitlines()[0]
    assert re.fullmatch(r"dashboard: http://127\.0\.0\.1:\d+/ui", first), first
    master1 = re.search(r"started master1 on (\S+)", r.stdout).group(1)
    assert first == f"dashboard: http://{master1}/ui"
    assert "no graphical browser here" in r.stdout
    screen = r.stdout.split("workload running")[1]
    for name in ("master1", "master2", "master3", "anon1"):       # nodes as they were started
        assert re.search(rf"^{name}\s+127\.0\.0\.1:\d+\s", screen, re.M), (name, screen[-3000:])
    assert re.search(r"^writes: \d+\.\d/s \(\d+ acknowledged\); (converged|lagging): ", screen, re.M), screen[-3000:]


def test_demo_with_a_busy_port_fails_at_once_naming_the_port_and_its_node(tmp_path):
    import socket
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        r = subprocess.run(REPLOG + ["demo", "--dir", str(tmp_path / "demo"), "--base-port", str(port),
                                     "--duration", "1"], capture_output=True, text=True, timeout=30)
    finally:
        held.close()
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"port {port} (for master1, 127.0.0.1:{port}) is already in use" in r.stderr, r.stderr
    assert "started" not in r.stdout and not (tmp_path / "demo" / "master1").exists()
