"""The `replog` command line as an operator meets it: help and version, status of every member
with its exit codes, spaces and scans, errors on stderr, no traceback when the reader of stdout
goes away, and the hints for what is not installed."""
from __future__ import annotations

import json
import subprocess
import sys

from node import config, limits
from tests.integration.harness import REPLOG, ReplogProcess, mesh, silent_address, wait_for


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(REPLOG + list(args), capture_output=True, text=True, timeout=timeout)


def run_without(module: str, *args: str) -> subprocess.CompletedProcess:
    """`replog ARGS` in a process where `module` cannot be imported (as in an install without it)."""
    code = f"import sys; sys.modules[{module!r}] = None; from node.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


# --- help ----------------------------------------------------------------------------------------

def test_serve_help_describes_every_option_of_the_table_with_its_default():
    r = run("serve", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())                     # argparse wraps lines
    for f in config.OPTIONS:
        flag = "--" + f.name.replace("_", "-")
        assert flag in text, flag
        assert f"TOML {f.name}, env REPLOG_{f.name.upper()}" in text, f.name
        shown = ("on" if f.default else "off") if isinstance(f.default, bool) else \
            (",".join(f.default) or "none") if isinstance(f.default, tuple) else (str(f.default) or "none")
        assert f"(default: {shown};" in text, (f.name, shown)
        assert " ".join(f.metadata["help"].split()) in text, f.name


def test_bare_replog_prints_usage_and_version_prints_the_version():
    r = run()
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("usage: replog") and "status" in r.stderr and "serve" in r.stderr
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("replog ") and r.stdout.split()[1][0].isdigit()


# --- status --------------------------------------------------------------------------------------

def test_status_lists_every_member_with_reachability_and_exits_1_when_one_is_down(tmp_path, procs):
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    a, b, c = nodes
    a.create_space("kv")
    a.kv_put("kv", "k", 1)
    wait_for(lambda: all(n.get("/readyz")[0] == 200 for n in nodes), 30, "every node ready")
    uuids = {n.uuid(): n for n in nodes}
    r = run("status", a.address)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every member answers and is ready" in r.stdout and "{" not in r.stdout, r.stdout   # no dict reprs
    r = run("status", a.address, "--json")
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    assert doc["healthy"] is True and {m["uuid"] for m in doc["members"]} == set(uuids)
    for m in doc["members"]:
        n = uuids[m["uuid"]]
        assert m["reachable"] and m["ready"] and m["status"] == "running" and m["address"] == n.address
        assert set(m["vclock"]) <= set(uuids) and m["vclock"][a.uuid()] >= 2        # by uuid, not local ids
        assert len(m["upstreams"]) == 2 and all(u["status"] == "follow" for u in m["upstreams"])
        assert set(m["ids"]) == set(uuids)                                         # its id on every node

    c.kill9()
    wait_for(lambda: run("status", a.address).returncode == 1, 30, "status exit 1 with C down")
    doc = json.loads(run("status", a.address, "--json").stdout)
    [down] = [m for m in doc["members"] if m["address"] == c.address]
    assert down["reachable"] is False and down["error"] and doc["healthy"] is False
    r = run("status", a.address)
    assert f"at {c.address} is unreachable" in r.stdout and "NO" in r.stdout


def test_status_sends_the_token_only_to_the_urls_given_and_still_knows_whether_learned_members_are_ready(
        tmp_path, procs):
    (tmp_path / "token").write_text("tok\n")
    a, b = mesh(tmp_path, 2, extra=["--token-file", str(tmp_path / "token")], token="tok")
    procs.extend([a, b])
    wait_for(lambda: a.get("/readyz")[0] == 200 and b.get("/readyz")[0] == 200, 30, "both ready")
    r = run("status", a.address, "--token", "tok", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    [learned] = [m for m in doc["members"] if m["address"] == b.address]
    assert learned["reachable"] and learned["ready"] is True and learned["vclock"] is None
    assert learned["details"].startswith("needs the token") and doc["needs_token"] == [f"http://{b.address}"]
    r = run("status", a.address, b.address, "--token", "tok", "--json")
    assert all(m["vclock"] is not None for m in json.loads(r.stdout)["members"]), "named: shown in full"
    r = run("status", a.address)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip() == (f"replog: error: no node answered at {a.address} (http://{a.address}: needs the "
                                "client token (--token or $REPLOG_TOKEN))")


def test_status_against_nothing_listening_fails_with_a_clear_message(tmp_path):
    with silent_address() as addr:
        r = run("status", addr)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith(f"replog: error: no node answered at {addr}") and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_status_of_a_node_without_upstreams_shows_none_rather_than_lag_0(tmp_path, procs):
    n = ReplogProcess(tmp_path, "n").start()
    procs.append(n)
    r = run("status", n.address)
    assert r.returncode == 0
    row = r.stdout.splitlines()[1].split()
    assert row[row.index("running") + 2:row.index("running") + 4] == ["none", "-"], r.stdout


# --- spaces, scan, errors -----------------------------------------------------------------------

def test_space_create_list_and_scan_with_after_limit_and_pages(tmp_path, procs):
    n = ReplogProcess(tmp_path, "n").start()
    procs.append(n)
    r = run("space", "create", n.address, "kv")
    assert r.returncode == 0 and r.stdout.strip() == "space kv created (replicated, conflict lww)"
    assert run("space", "create", n.address, "kv").stdout.strip() == "space kv exists (replicated, conflict lww)"
    assert run("space", "create", n.address, "mine", "--local", "--conflict", "apply").returncode == 0
    r = run("space", "list", n.address)
    assert r.stdout.splitlines() == ["kv\treplicated\tconflict=lww", "mine\tlocal\tconflict=apply"]
    r = run("space", "create", n.address, "_sys")
    assert r.returncode == 1 and r.stderr.startswith("replog: error: system_space: ") and r.stdout == ""

    total = limits.range_limit_max + 7                      # more than one page
    keys = [f"k{i:06d}" for i in range(total)]
    for chunk in (keys[:limits.txn_ops_max], keys[limits.txn_ops_max:]):
        s, d = n.post("/v1/txn", {"ops": [{"op": "put", "space": "kv", "key": k, "value": k[1:]} for k in chunk]})
        assert s == 200, d
    r = run("scan", n.address, "kv")
    assert r.returncode == 0, r.stderr
    items = [json.loads(line) for line in r.stdout.splitlines()]
    assert [i["key"] for i in items] == keys and items[0]["value"] == "000000" and items[0]["lsn"] >= 1
    r = run("scan", n.address, "kv", "--after", "k000010", "--limit", "3")
    assert [json.loads(line)["key"] for line in r.stdout.splitlines()] == ["k000011", "k000012", "k000013"]
    r = run("scan", n.address, "kv", "--limit", "0")
    assert r.returncode == 2 and "--limit" in r.stderr
    r = run("scan", n.address, "nope")
    assert r.returncode == 1 and "no_such_space" in r.stderr and r.stdout == ""


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path, procs):
    """`replog scan ... | head -1`, `replog get ... | head -1`: no BrokenPipe traceback."""
    n = ReplogProcess(tmp_path, "n").start()
    procs.append(n)
    n.create_space("kv")
    s, d = n.post("/v1/txn", {"ops": [{"op": "put", "space": "kv", "key": f"k{i:05d}", "value": "v" * 200}
                                      for i in range(2000)]})
    assert s == 200, d
    n.kv_put("kv", "big", ["x" * 100] * 2000)             # pretty-printed: 2000 lines, > a pipe's buffer
    for args in (["scan", n.address, "kv"], ["get", n.address, "kv", "big"]):
        p = subprocess.Popen(REPLOG + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = p.stdout.readline()
        p.stdout.close()                                   # what head does after its line
        err = p.stderr.read().decode()
        assert p.wait(30) == 0 and first, (args, err)
        assert "Traceback" not in err and "BrokenPipe" not in err and err == "", err


# --- what is not installed -------------------------------------------------------------------------

def test_analyze_without_pyspark_prints_a_one_line_hint_and_exits_2(tmp_path):
    r = run_without("pyspark", "analyze", str(tmp_path))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "replog: error: replog analyze needs pyspark: install the spark extra (pip install 'replog[spark]'; "
        "Java 17 too)"]


def test_an_s3_lease_store_without_boto3_exits_2_with_a_one_line_hint(tmp_path):
    r = run_without("boto3", "serve", "--data-dir", str(tmp_path / "d"), "--identity", "lease",
                    "--lease-store", "s3://bucket/prefix", "--cluster-size", "3")
    assert r.returncode == 2 and not (tmp_path / "d").exists()
    assert r.stderr.strip().splitlines() == [
        "replog: error: lease_store: s3:// lease stores need boto3: pip install 'replog[s3]'"]
