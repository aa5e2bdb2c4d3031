"""Identity and cluster lifecycle on real processes (node/lifecycle.py, docs/operations.md).

Crash-safe registration: a joiner killed (os._exit(137), as kill -9) at each crash point of the
registration comes back with one identity, the same register code, the id the donor holds for it,
no leaked or duplicate id and all of the donor's rows; a lost apply answer is retried with the same
code; a damaged identity file stops the process with one line. A restart at another address keeps
uuid and ids everywhere. The Qpid join protocol: wait for N, option mismatch named, wrong store,
orderly cluster shutdown and automatic restart, clean stores of two shutdowns refused, total
failure refused with `Cannot recover, no clean store` and recovered with `replog admin`."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from unittest import mock

import aiohttp
import pytest

from node.applier.conn import client_auth, connect
from node.core import messages as m
from node.errors import PeerRefused
from node.identity.identity_file import FAULT_POINTS
from tests.integration.harness import REPLOG, ReplogProcess, mesh, mesh_nodes, vclocks_converged, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NO_CLEAN = "replog: error: Cannot recover, no clean store"


def admin(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(REPLOG + ["admin", *args], capture_output=True, text=True, timeout=60, cwd=REPO)


def start_with_fault(p: ReplogProcess, spec: str) -> None:
    with mock.patch.dict(os.environ, {"REPLOG_FAULT_POINT": spec}):
        p.start(wait=False)


def exit_code(p: ReplogProcess, timeout: float = 30.0) -> int:
    try:
        return p.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{p.name} did not exit:\n{p.log_tail()}") from None


def last_line(p: ReplogProcess) -> str:
    return p.log_text().rstrip().splitlines()[-1]


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def items(node: ReplogProcess, space: str) -> dict:
    s, page = node.get(f"/v1/spaces/{space}/keys?limit=10000")
    assert s == 200, page
    return {i["key"]: i["value"] for i in page["items"]}


def inspect_field(data_dir: str, field: str) -> str:
    r = admin("inspect", data_dir)
    assert r.returncode == 0, r.stderr
    return next(line.split(":", 1)[1].strip() for line in r.stdout.splitlines() if line.startswith(field + ":"))


# --- crash-safe registration -------------------------------------------------------------------

@pytest.fixture(scope="module")
def donor(tmp_path_factory):
    d = ReplogProcess(tmp_path_factory.mktemp("donor"), "donor").start()
    d.create_space("kv")
    for i in range(40):
        d.kv_put("kv", f"k{i}", i)
    yield d
    d.kill9()


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_kill_at_each_registration_crash_point_then_restart(tmp_path, procs, donor, point):
    before = donor.cluster()
    j = ReplogProcess(tmp_path, "joiner", peers=[donor])
    procs.append(j)
    start_with_fault(j, point)
    assert exit_code(j) == 137, j.log_tail()
    files = sorted(n for n in os.listdir(j.data_dir) if n.startswith("identity"))
    expected = {"after_identity_written": ["identity", "identity.temp"], "after_temp_removed": ["identity"]}
    assert files == expected.get(point, ["identity.temp"]), (point, files)
    first = read_json(os.path.join(j.data_dir, files[-1] if point != "after_identity_written" else "identity.temp"))
    uuid, code = first["uuid"], first["register_code"]
    registered = set(donor.cluster()) - set(before)
    assert registered <= {uuid}, f"{point}: the donor registered somebody else: {registered}"
    if point == "after_temp_written":
        assert not registered, "nothing was sent before identity.temp was durable"
    if point in ("after_apply_ok", "after_identity_written", "after_temp_removed"):
        assert registered == {uuid}

    j.start()                                   # the same data dir, no fault
    info = j.info()
    assert info["uuid"] == uuid
    assert sorted(n for n in os.listdir(j.data_dir) if n.startswith("identity")) == ["identity"]
    ident = read_json(os.path.join(j.data_dir, "identity"))
    assert (ident["uuid"], ident["register_code"]) == (uuid, code), "the registration resumed with its code"
    now = donor.cluster()
    assert set(now) - set(before) == {uuid}, "exactly one new member"
    assert now[uuid]["id"] == ident["replica_id"] == info["id"]
    ids = sorted(mem["id"] for mem in now.values())
    assert ids == list(range(1, len(ids) + 1)), f"ids leaked or duplicated: {ids}"
    assert items(j, "kv") == items(donor, "kv"), "the joiner holds every row of the donor"
    j.kv_put("kv", f"mine-{point}", 1)
    j.stop()
    j.start()
    assert j.info()["uuid"] == uuid and j.kv_get("kv", f"mine-{point}")[0] == 200


def test_lost_apply_answer_is_retried_with_the_same_code(tmp_path, procs):
    d = ReplogProcess(tmp_path, "donor")
    procs.append(d)
    start_with_fault(d, "lose_apply_answer:2")    # applies, then drops the answer, twice
    d.wait_healthy()
    d.create_space("kv")
    d.kv_put("kv", "seed", 1)
    j = ReplogProcess(tmp_path, "joiner", peers=[d]).start()
    procs.append(j)
    ju = j.uuid()
    ident = read_json(os.path.join(j.data_dir, "identity"))
    log = d.log_text()
    assert log.count("dropping the answer") == 2
    applies = [line for line in log.splitlines() if f"register: {ju} is id" in line]
    assert len(applies) == 3, applies
    assert all(f"(code {ident['register_code'][:8]}" in line for line in applies), "one code for every apply"
    assert d.cluster()[ju]["id"] == ident["replica_id"] == 2 and len(d.cluster()) == 2
    assert j.kv_get("kv", "seed")[0] == 200


@pytest.mark.parametrize("name,damage", [("identity", "empty"), ("identity", "truncated"),
                                         ("identity.temp", "truncated")])
def test_damaged_identity_file_is_a_hard_error(tmp_path, procs, name, damage):
    n = ReplogProcess(tmp_path, "n").start()
    procs.append(n)
    uuid = n.uuid()
    assert n.stop() == 0
    path = os.path.join(n.data_dir, name)
    if name == "identity.temp":     # an unfinished registration: a fresh data dir holding only the temp
        shutil.move(os.path.join(n.data_dir, "identity"), path)
        shutil.rmtree(os.path.join(n.data_dir, "store"))
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(b"" if damage == "empty" else data[: len(data) // 2])
    argv = [a if a != "debug" else "info" for a in n.argv()]      # the default log level
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("replog: error: identity file ") and path in r.stderr
    if name == "identity":
        n.start(wait=False)
        assert exit_code(n) == 1
        with open(path, "wb") as f:
            f.write(data)           # repaired: the same member comes back
        n.start()
        assert n.uuid() == uuid


def test_restart_with_another_address_keeps_uuid_and_ids(tmp_path, procs):
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    a, b, c = nodes
    a.create_space("kv")
    wait_for(lambda: all(n.get("/v1/spaces")[1]["spaces"] for n in nodes), 20, "space everywhere")
    bu = b.uuid()
    ids = {n.name: n.cluster()[bu]["id"] for n in nodes}
    assert b.stop() == 0
    b.move_to_new_port()
    b.start()
    assert b.uuid() == bu and b.info()["id"] == ids["n2"]
    wait_for(lambda: all(n.cluster()[bu]["address"] == b.address for n in nodes), 30,
             "every _cluster shows B's new address")
    for n in nodes:
        cl = n.cluster()
        assert len(cl) == 3 and cl[bu]["id"] == ids[n.name], (n.name, cl)
    b.kv_put("kv", "moved", 1)
    wait_for(lambda: all(n.kv_get("kv", "moved")[0] == 200 for n in (a, c)), 30,
             "A and C follow B to its new address")
    a.kv_put("kv", "to-b", 1)
    wait_for(lambda: b.kv_get("kv", "to-b")[0] == 200, 30, "B still follows A")
    wait_for(lambda: vclocks_converged(nodes), 30, "converged")


# --- the join protocol -------------------------------------------------------------------------

def test_wait_for_n_holds_a_forming_cluster_until_n_members(tmp_path, procs):
    nodes = mesh_nodes(tmp_path, 3, prefix="w", extra=["--cluster-wait-for", "3"])
    procs.extend(nodes)
    for n in nodes[:2]:
        n.start(wait=False)

    def held() -> bool:
        return all(n.get("/v1/health") == (503, {"status": "waiting", "reason": "waiting for 3 initial members, 2 so far"})
                   for n in nodes[:2])
    wait_for(held, 30, "two of three wait, 503 with the reason")
    s, d = nodes[0].put("/v1/spaces/kv", {})
    assert s == 503 and d["error"]["code"] == "not_ready"
    nodes[2].start(wait=False)
    for n in nodes:
        n.wait_healthy(60)
    infos = [n.info() for n in nodes]
    assert len({i["cluster_uuid"] for i in infos}) == 1 and sorted(i["id"] for i in infos) == [1, 2, 3]
    founders = inspect_field(nodes[0].data_dir, "initial signature").split("founders ")[1].split(", ")
    assert sorted(founders) == sorted(i["uuid"] for i in infos), "the three initial members found the cluster"
    assert len({inspect_field(n.data_dir, "initial signature") for n in nodes}) == 1


def test_option_mismatch_is_refused_naming_the_option(tmp_path, procs):
    a = ReplogProcess(tmp_path, "a").start()
    procs.append(a)
    b = ReplogProcess(tmp_path, "b", peers=[a], extra=["--cluster-name", "other"]).start(wait=False)
    procs.append(b)
    # The joiner stops at once with exit code 2 and one line naming the option and both values
    # (issue 16, defect 6: it used to retry silently for ever).
    wait_for(lambda: b.proc.poll() is not None, 30, "B exits")
    assert b.proc.returncode == 2, b.log_tail()
    last = b.log_text().strip().splitlines()[-1]
    assert last == (f"replog: error: cluster_name: must be the same on every member: this node has 'other', "
                    f"{a.address} has 'replog'"), last
    # (A logs the refusal once its ERROR is sent: B may read it and exit first)
    wait_for(lambda: "cluster_name" in a.log_text(), 10, "A logged why it refused B")
    assert len(a.cluster()) == 1

    async def peer_with_other_options() -> tuple[str, str]:
        async with aiohttp.ClientSession() as s:
            conn = await connect(s, a.address)
            try:
                await client_auth(conn, b"", "0f0f0f0f-0000-4000-8000-000000000001")
                await conn.send(
                    m.GREETING, uuid="0f0f0f0f-0000-4000-8000-000000000001", cluster_uuid=None,
                    cluster_name="replog", options_digest="elsewhere", options={"identity": "lease", "cluster_size": 3},
                    anon=False, address="127.0.0.1:1", cluster=[], status="joining")
                with pytest.raises(PeerRefused) as e:
                    await conn.recv()
                return e.value.code, e.value.message
            finally:
                await conn.close()

    code, message = asyncio.run(peer_with_other_options())
    assert code == "options" and "identity is 'lease' there, 'local' here" in message, message


def test_joining_with_another_clusters_store_aborts_with_wrong_store(tmp_path, procs):
    a = ReplogProcess(tmp_path, "a").start()
    x = ReplogProcess(tmp_path, "x").start()
    procs.extend([a, x])
    x.create_space("kv")
    xu = x.uuid()
    assert x.stop() == 0
    x.peers = [a.address]
    r = subprocess.run(x.argv(), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1].startswith("replog: error: wrong store"), r.stderr
    assert xu not in a.cluster()


def test_orderly_cluster_shutdown_restarts_by_itself_and_two_shutdowns_are_refused(tmp_path, procs):
    nodes = mesh(tmp_path, 3, extra=["--cluster-wait-for", "3"])
    procs.extend(nodes)
    a, b, c = nodes
    a.create_space("kv")
    wait_for(lambda: all(n.get("/v1/spaces")[1]["spaces"] for n in nodes), 20, "space everywhere")
    for n in nodes:
        for i in range(10):
            n.kv_put("kv", f"{n.name}-{i}", i)
    s, d = b.post("/v1/admin/shutdown", {"cluster": True})
    assert s == 202 and d["cluster"] is True
    assert [exit_code(n) for n in nodes] == [0, 0, 0]
    assert {inspect_field(n.data_dir, "status") for n in nodes} == {"clean"}
    finals = {inspect_field(n.data_dir, "final signature") for n in nodes}
    assert len(finals) == 1 and d["shutdown_id"] in finals.pop(), "one final signature, the agreed shutdown"
    backup = str(tmp_path / "c-after-first-shutdown")
    shutil.copytree(c.data_dir, backup)

    for n in nodes:                       # automatic restart after an orderly shutdown
        n.start(wait=False)
    for n in nodes:
        n.wait_healthy(60)
    assert len(items(a, "kv")) == 30 and items(a, "kv") == items(c, "kv")
    c.kv_put("kv", "after-restart", 1)
    wait_for(lambda: a.kv_get("kv", "after-restart")[0] == 200, 30, "replicating after the restart")
    assert inspect_field(a.data_dir, "status") == "dirty", "a running store is dirty"

    s, _ = a.post("/v1/admin/shutdown", {"cluster": True})
    assert s == 202 and [exit_code(n) for n in nodes] == [0, 0, 0]
    shutil.rmtree(c.data_dir)
    shutil.copytree(backup, c.data_dir)   # C comes back with a clean store of the first shutdown
    for n in nodes:
        n.start(wait=False)
    assert [exit_code(n) for n in nodes] == [1, 1, 1]
    for n in nodes:
        assert "clean stores from different shutdowns" in last_line(n), n.log_tail()


def test_total_failure_refuses_then_manual_recovery_restarts(tmp_path, procs):
    nodes = mesh(tmp_path, 3, extra=["--cluster-wait-for", "3"])
    procs.extend(nodes)
    a, b, c = nodes
    a.create_space("kv")
    for i in range(10):
        a.kv_put("kv", f"early-{i}", i)
    wait_for(lambda: vclocks_converged(nodes), 30, "converged")
    c.kill9()                             # C goes first: its store falls behind
    for i in range(10):
        b.kv_put("kv", f"late-{i}", i)
    wait_for(lambda: len(items(a, "kv")) == 20, 30, "A has B's late rows")
    a.kill9()
    b.kill9()

    for n in nodes:                       # every store is dirty: nobody serves
        n.start(wait=False)
    assert [exit_code(n) for n in nodes] == [1, 1, 1]
    for n in nodes:
        assert last_line(n) == NO_CLEAN, n.log_tail()

    r = admin("compare", a.data_dir, b.data_dir, c.data_dir)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "same cluster: yes" in out
    assert f"latest: {a.data_dir}, {b.data_dir}" in out, out
    assert f"{c.data_dir} is behind {a.data_dir}" in out or f"{a.data_dir} is ahead of {c.data_dir}" in out, out
    r = admin("mark-clean", a.data_dir)
    assert r.returncode == 0 and "marked clean" in r.stdout, r.stderr
    assert inspect_field(a.data_dir, "status") == "clean"

    for n in nodes:
        n.start(wait=False)
    for n in nodes:
        n.wait_healthy(60)
    assert items(c, "kv") == items(a, "kv") and len(items(c, "kv")) == 20, "C caught up from the clean store"
    c.kv_put("kv", "recovered", 1)
    wait_for(lambda: all(n.kv_get("kv", "recovered")[0] == 200 for n in nodes), 30, "replicating again")
    r = admin("mark-clean", a.data_dir)
    assert r.returncode == 2 and "in use" in r.stderr, "a running node's store is not marked by hand"
