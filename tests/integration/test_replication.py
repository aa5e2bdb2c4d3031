"""Real processes replicating: mesh convergence, the reference's case (a), power-off,
secrets, expel, chains and garbage peers."""
from __future__ import annotations

import asyncio
import os
import threading
import time

import aiohttp
import pytest

from tests.integration.harness import (ReplogProcess, case_a, case_a_topology, mesh, request,
                                       vclocks_converged, wait_for)


TRANSIENT = {"catching_up", "not_ready", "too_busy"}   # 503s a client retries (docs/client.md)
WRITE_RETRY_S = 30.0


def write_load(node: ReplogProcess, space: str, prefix: str, n: int, errors: list, transient: list) -> None:
    """n puts, each retried on a transient 503 as a client would; anything else goes to `errors`
    (a thread's exception would otherwise only be printed)."""
    try:
        for i in range(n):
            deadline = time.monotonic() + WRITE_RETRY_S
            while True:
                s, d = node.put(f"/v1/spaces/{space}/keys/{prefix}-{i}", {"by": prefix, "i": i})
                if s == 200:
                    break
                code = d.get("error", {}).get("code") if isinstance(d, dict) else None
                assert s == 503 and code in TRANSIENT and time.monotonic() < deadline, (node.name, i, s, d)
                transient.append((node.name, code))
                time.sleep(0.05)                    # a client's retry pause, not synchronisation
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


def assert_same_data(nodes: list[ReplogProcess], space: str) -> dict:
    datas = []
    for n in nodes:
        s, page = n.get(f"/v1/spaces/{space}/keys?limit=10000")
        assert s == 200, page
        datas.append({i["key"]: (i["value"], i["origin"], i["lsn"]) for i in page["items"]})
    for d in datas[1:]:
        assert d == datas[0]
    return datas[0]


def test_three_node_mesh_converges_under_writes_on_every_node(tmp_path, procs):
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    infos = [n.info() for n in nodes]
    assert len({i["cluster_uuid"] for i in infos}) == 1, "simultaneous join formed more than one cluster"
    assert sorted(i["id"] for i in infos) == [1, 2, 3]
    nodes[0].create_space("kv")
    wait_for(lambda: all(n.get("/v1/spaces")[1]["spaces"] for n in nodes), 20, "space replicated")
    errors: list = []
    transient: list = []
    threads = [threading.Thread(target=write_load, args=(n, "kv", n.name, 150, errors, transient)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors and not any(t.is_alive() for t in threads), (errors, transient[:20])
    wait_for(lambda: vclocks_converged(nodes), 30, "vclocks converge")
    data = assert_same_data(nodes, "kv")
    assert len(data) == 450
    uuids = {n.name: n.uuid() for n in nodes}
    for key, (value, origin, _) in data.items():
        assert origin == uuids[value["by"]], f"{key} attributed to {origin}"


def test_case_a_id_clash_keeps_replicating(tmp_path, procs):
    """Masters A and B; cut A-B; C joins via A and D via B (both get id 3); restore."""
    a, b, c, d = case_a(tmp_path, procs)
    cu, du = c.uuid(), d.uuid()
    assert a.cluster()[cu]["id"] == 3 and a.cluster()[du]["id"] == 4
    assert b.cluster()[du]["id"] == 3 and b.cluster()[cu]["id"] == 4
    topology = case_a_topology(a, b, c, d)
    for i in range(20):
        c.kv_put("kv", f"c{i}", i)
        d.kv_put("kv", f"d{i}", i)
    nodes = [a, b, c, d]
    wait_for(lambda: vclocks_converged(nodes), 40, "vclocks by uuid converge after case (a)")
    data = assert_same_data(nodes, "kv")
    for k, (_, origin, _) in data.items():
        if k.startswith("c") or k == "from-c":
            assert origin == cu, k
        if k.startswith("d") or k == "from-d":
            assert origin == du, k
    for n in nodes:
        for u in n.info()["upstreams"]:
            assert u["status"] == "follow", (n.name, u)

    # Power-off: kill -9 all four, restart, write more, converge with correct origins.
    for n in nodes:
        n.kill9()
    for n in nodes:
        n.start(wait=False)
    for n in nodes:
        n.wait_healthy(60)
    for n, ps in topology.items():          # run-time peers are not persisted (like box.cfg)
        n.set_peers(ps)
    assert a.cluster()[cu]["id"] == 3 and b.cluster()[cu]["id"] == 4
    for n in nodes:
        n.kv_put("kv", f"after-{n.name}", n.name)
    wait_for(lambda: vclocks_converged(nodes), 40, "vclocks converge after power-off")
    data = assert_same_data(nodes, "kv")
    owner = {n.name: n.uuid() for n in nodes}
    for n in nodes:
        assert data[f"after-{n.name}"][1] == owner[n.name]


def test_wrong_secret_is_refused_and_logged(tmp_path, procs):
    s1, s2 = tmp_path / "s1", tmp_path / "s2"
    s1.write_text("one")
    s2.write_text("two")
    a = ReplogProcess(tmp_path, "a", extra=["--secret-file", str(s1)]).start()
    procs.append(a)
    b = ReplogProcess(tmp_path, "b", peers=[a], extra=["--secret-file", str(s2)]).start(wait=False)
    procs.append(b)
    wait_for(lambda: "wrong cluster secret" in a.log_text(), 20, "A logs the refusal")
    wait_for(lambda: "refused" in b.log_text() or "secret" in b.log_text(), 20, "B logs the refusal")
    assert b.get("/v1/health")[0] == 503
    assert len(a.cluster()) == 1


def test_expelled_member_is_refused(tmp_path, procs):
    a, b, c = mesh(tmp_path, 3)
    procs.extend([a, b, c])
    a.create_space("kv")
    c.kv_put("kv", "before", 1) if wait_for(lambda: c.get("/v1/spaces")[1]["spaces"], 20, "space on C") else None
    wait_for(lambda: vclocks_converged([a, b, c]), 20, "converged before expel")
    cu = c.uuid()
    s, d = a.delete(f"/v1/cluster/{cu}")
    assert s == 200 and d["state"] == "expelled"
    wait_for(lambda: b.cluster()[cu]["state"] == "expelled", 20, "expel replicated to B")
    s, d = c.put("/v1/spaces/kv/keys/after", 1)   # refused once C knows it; before, its own alone
    assert s == 200 or (s, d["error"]["code"]) == (409, "expelled"), (s, d)
    wait_for(lambda: "expelled" in a.log_text() or "expelled" in c.log_text(), 20, "expelled peer refused")
    s, d = wait_for(lambda: (lambda sd: sd if sd[0] == 409 else None)(c.put("/v1/spaces/kv/keys/later", 1)), 20,
                    "C refuses writes once it knows it was expelled")
    assert d["error"]["code"] == "expelled", d
    # Neither master ever gets the row written after the expel.
    for n in (a, b):
        assert n.kv_get("kv", "after")[0] == 404
        assert n.kv_get("kv", "before")[0] == 200
    # The expelled id is never reused.
    e = ReplogProcess(tmp_path, "e", peers=[a]).start()
    procs.append(e)
    assert a.cluster()[e.uuid()]["id"] == 4


def test_chain_delivers_rows_end_to_end(tmp_path, procs):
    """C - A - B - D: each node subscribes only to its neighbours."""
    a, b = mesh(tmp_path, 2)
    procs.extend([a, b])
    c = ReplogProcess(tmp_path, "c", peers=[a]).start()
    d = ReplogProcess(tmp_path, "d", peers=[b]).start()
    procs.extend([c, d])
    a.set_peers([b, c])
    b.set_peers([a, d])
    a.create_space("kv")
    wait_for(lambda: c.get("/v1/spaces")[1]["spaces"], 20, "space reached C")
    c.kv_put("kv", "from-c", "hello")
    wait_for(lambda: d.kv_get("kv", "from-c")[0] == 200, 30, "C's row reached D through A and B")
    assert d.kv_get("kv", "from-c")[1]["origin"] == c.uuid()
    d.kv_put("kv", "from-d", "back")
    wait_for(lambda: c.kv_get("kv", "from-d")[0] == 200, 30, "D's row reached C")
    assert c.kv_get("kv", "from-d")[1]["origin"] == d.uuid()


def test_garbage_peer_is_disconnected_and_node_keeps_serving(tmp_path, procs):
    a = ReplogProcess(tmp_path, "a").start()
    procs.append(a)

    async def junk() -> None:
        async with aiohttp.ClientSession() as s:
            for payload in (b"\x00\xff garbage", os.urandom(200), b"\x92\x01\x80"):
                async with s.ws_connect(a.url + "/v1/replication") as ws:
                    await ws.receive()                      # HELLO
                    await ws.send_bytes(payload)
                    msg = await ws.receive(timeout=10)
                    while msg.type == aiohttp.WSMsgType.BINARY:   # an ERROR, then the close
                        msg = await ws.receive(timeout=10)
                    assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
            async with s.ws_connect(a.url + "/v1/replication") as ws:
                await ws.send_str("text frames are not the protocol")
                msg = await ws.receive(timeout=10)

    asyncio.run(junk())
    assert a.get("/v1/health")[0] == 200
    a.create_space("kv")
    a.kv_put("kv", "still", "alive")


def test_node_rejoining_with_its_uuid_never_reuses_its_own_lsns(tmp_path, procs):
    """B loses its store (keeping its identity) and joins again through A, which misses B's
    last rows; C has them. B must take them back before writing, or its next write would
    reuse an lsn that C already holds for B (and C would drop it as a duplicate)."""
    import shutil
    a, b, c = mesh(tmp_path, 3)
    procs.extend([a, b, c])
    a.create_space("kv")
    wait_for(lambda: all(n.get("/v1/spaces")[1]["spaces"] for n in (b, c)), 20, "space everywhere")
    a.set_peers([])                                   # A stops hearing anything
    for i in range(5):
        b.kv_put("kv", f"b{i}", i)
    wait_for(lambda: c.kv_get("kv", "b4")[0] == 200, 20, "C has B's rows")
    got = a.kv_get("kv", "b4")
    assert got[0] == 404, (got, a.info()["appliers"] if "appliers" in a.info() else a.info())
    bu, b_lsn = b.uuid(), b.info()["vclock_uuid"][b.uuid()]
    b.kill9()
    shutil.rmtree(f"{b.data_dir}/store")
    shutil.rmtree(f"{b.data_dir}/wal")
    b.peers = [a.address, c.address]                  # joins through A first
    b.start()
    assert b.uuid() == bu
    answers = []

    def write_now():
        s, d = b.put("/v1/spaces/kv/keys/after", "new")
        answers.append((s, d.get("error", {}).get("code") if s != 200 else d["lsn"]))
        return d if s == 200 else None

    d = wait_for(write_now, 30, "B accepts a write", interval=0.02)
    assert all(a_ in ((503, "catching_up"), (503, "own_rows_unconfirmed")) for a_ in answers[:-1]), answers
    # (its next lsns go to the table it states again once its fence lifts: node/core clear_fence)
    assert d["lsn"] > b_lsn, f"B reused its own lsn: {answers}"
    wait_for(lambda: c.kv_get("kv", "after")[0] == 200, 20, "B's new write reaches C")
    assert c.kv_get("kv", "after")[1]["origin"] == bu
