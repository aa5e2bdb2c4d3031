"""Anonymous replicas (case (b) of the reference), REGISTER, and convergent multi-master writes."""
from __future__ import annotations

import subprocess
import threading

import pytest

from tests.integration.harness import REPLOG, ReplogProcess, mesh, vclocks_converged, wait_for
from tests.integration.oracles import log_since_last_start, upstream


def test_anonymous_replica_lifecycle(tmp_path, procs):
    m1, m2 = mesh(tmp_path, 2)
    procs.extend([m1, m2])
    m1.create_space("kv")
    m1.kv_put("kv", "seed", "from m1")
    r = ReplogProcess(tmp_path, "anon", peers=[m1, m2], extra=["--anon"]).start()
    procs.append(r)
    ru = r.uuid()
    wait_for(lambda: r.kv_get("kv", "seed")[0] == 200, 20, "anonymous replica receives data")
    assert r.info()["anon"] is True
    for m in (m1, m2):
        assert ru not in m.cluster(), "an anonymous replica is never registered on the masters"
    s, d = r.put("/v1/spaces/kv/keys/nope", 1)
    assert s == 409 and d["error"]["code"] == "read_only"
    r.create_space("mine", local=True)
    for i in range(20):
        r.kv_put("mine", f"l{i}", i)
    anon_id = r.info()["id"]
    assert anon_id == 3, "the replica signs local rows with the lowest id free in its own _cluster"

    # A new member takes the next id on the masters: the same id the replica uses for itself.
    n = ReplogProcess(tmp_path, "newbie", peers=[m1, m2]).start()
    procs.append(n)
    nu = n.uuid()
    assert m1.cluster()[nu]["id"] == 3 and m2.cluster()[nu]["id"] == 3
    m1.set_peers([m2, n])
    m2.set_peers([m1, n])
    n.kv_put("kv", "from-newbie", "hi")
    wait_for(lambda: r.kv_get("kv", "from-newbie")[0] == 200, 30, "new member's row reaches the replica")
    assert r.kv_get("kv", "from-newbie")[1]["origin"] == nu
    rc = r.cluster()
    assert rc[ru]["id"] == 3 and rc[nu]["id"] != 3, "remapping keeps the replica and the new member apart"
    for i in range(20):
        s, d = r.kv_get("mine", f"l{i}")
        assert s == 200 and d["value"] == i and d["origin"] == ru

    # REGISTER: restart without --anon on the same data dir.
    r.stop()
    r.extra = []
    r.start()
    assert r.uuid() == ru and r.info()["anon"] is False
    wait_for(lambda: all(ru in m.cluster() and m.cluster()[ru]["state"] == "member" for m in (m1, m2)), 30,
             "masters register the former anonymous replica")
    for i in range(20):
        assert r.kv_get("mine", f"l{i}")[1]["value"] == i, "local rows survive registration"
    m1.set_peers([m2, n, r])
    m2.set_peers([m1, n, r])
    r.kv_put("kv", "from-registered", "now a member")
    wait_for(lambda: all(m.kv_get("kv", "from-registered")[0] == 200 for m in (m1, m2, n)), 30,
             "the registered replica's writes reach the masters")
    assert m1.kv_get("kv", "from-registered")[1]["origin"] == ru
    wait_for(lambda: vclocks_converged([m1, m2, n, r]), 30, "vclocks converge after registration")

    # Going back to anonymous is refused clearly.
    r.stop()
    res = subprocess.run(r.argv() + ["--anon"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "anon" in res.stderr and "Traceback" not in res.stderr


def test_concurrent_writes_to_one_key_converge(tmp_path, procs):
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    nodes[0].create_space("kv")
    wait_for(lambda: all(n.get("/v1/spaces")[1]["spaces"] for n in nodes), 20, "space everywhere")

    def hammer(n: ReplogProcess) -> None:
        for i in range(300):
            n.kv_put("kv", "hot", {"by": n.name, "i": i})

    threads = [threading.Thread(target=hammer, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    wait_for(lambda: vclocks_converged(nodes), 40, "vclocks converge")
    values = [n.kv_get("kv", "hot")[1] for n in nodes]
    assert all(v == values[0] for v in values), values
    assert values[0]["value"]["i"] == 299, "the winner is some master's last write"


def test_apply_resolver_keeps_arrival_order(tmp_path, procs):
    a, b = mesh(tmp_path, 2)
    procs.extend([a, b])
    s, d = a.put("/v1/spaces/arrival", {"conflict": "apply"})
    assert s == 201 and d["conflict"] == "apply"
    wait_for(lambda: b.get("/v1/spaces")[1]["spaces"], 20, "space on B")
    assert b.get("/v1/spaces")[1]["spaces"][0]["conflict"] == "apply"
    a.kv_put("arrival", "k", 1)
    wait_for(lambda: b.kv_get("arrival", "k")[0] == 200, 20, "row on B")
    b.kv_put("arrival", "k", 2)
    wait_for(lambda: a.kv_get("arrival", "k")[1]["value"] == 2, 20, "later arrival wins on A")


def test_anonymous_replica_follows_another_anonymous_replica(tmp_path, procs):
    m = ReplogProcess(tmp_path, "m").start()
    procs.append(m)
    m.create_space("kv")
    m.kv_put("kv", "before", 1)
    r1 = ReplogProcess(tmp_path, "r1", peers=[m], extra=["--anon"]).start()
    procs.append(r1)
    r2 = ReplogProcess(tmp_path, "r2", peers=[r1], extra=["--anon"]).start()
    procs.append(r2)
    m.kv_put("kv", "after", 2)
    wait_for(lambda: r2.kv_get("kv", "after")[0] == 200, 30, "row reaches the second-hop replica")
    assert r2.kv_get("kv", "before")[1]["value"] == 1
    assert r2.kv_get("kv", "after")[1]["origin"] == m.uuid()
    assert set(m.cluster()) == {m.uuid()}, "neither anonymous replica is registered on the master"


SMALL = ["--segment-bytes-max", "4096", "--checkpoint-interval-s", "0.3"]


@pytest.mark.parametrize("member_joins_later", [False, True], ids=["its-wal-collected", "after-a-private-note"])
def test_an_anonymous_replica_that_checkpoints_registers_and_is_followed_without_a_rejoin(tmp_path, procs,
                                                                                          member_joins_later):
    """An anonymous replica with no row of its own collects its WAL (members hold none of it);
    once a member joins after its snapshot, it has a private `_cluster` note under its own id,
    and members hold its WAL from there on, since once it registers they ask for its rows from
    that note. Either way it registers, and its members follow it with nothing to rejoin."""
    m1, m2 = mesh(tmp_path, 2)
    procs.extend([m1, m2])
    m1.create_space("kv")
    r = ReplogProcess(tmp_path, "anon", peers=[m1, m2], extra=["--anon"] + SMALL).start()
    procs.append(r)
    ru, m1u = r.uuid(), m1.uuid()
    members = [m1, m2]
    if member_joins_later:
        n = ReplogProcess(tmp_path, "newbie", peers=[m1, m2]).start()
        procs.append(n)
        members.append(n)
        m1.set_peers([m2, n])
        m2.set_peers([m1, n])
        wait_for(lambda: n.uuid() in r.cluster(), 30, "the replica learned of the new member")
    gc_before = r.info()["wal"]["gc_vclock"]
    rows = iter(range(10_000))

    def written_and_checkpointed() -> bool:
        for _ in range(20):
            m1.kv_put("kv", f"k{next(rows)}", "x" * 100)
        return r.info()["vclock_uuid"].get(m1u, 0) > 200 and (
            r.info()["wal"]["gc_vclock"].get(str(r.cluster()[m1u]["id"]), 0) > 100 or member_joins_later)
    wait_for(written_and_checkpointed, 60, "rows past 200 on the replica (collected past 100 if it has no note)",
             interval=0.2)
    if member_joins_later:
        assert r.info()["wal"]["gc_vclock"] == gc_before, "members hold its WAL"

    r.stop()
    r.extra = SMALL
    r.start()
    wait_for(lambda: all((m.cluster().get(ru) or {}).get("state") == "member" for m in members), 30,
             "the members register the former anonymous replica")
    for m in members:
        m.set_peers([x for x in members + [r] if x is not m])
    r.kv_put("kv", "from-registered", 1)
    wait_for(lambda: all(m.kv_get("kv", "from-registered")[0] == 200 for m in members), 30,
             "the registered replica's writes reach every member")
    wait_for(lambda: vclocks_converged(members + [r]), 30, "vclocks converge after registration")
    for m in members:
        up = upstream(m, r.address)
        assert up.get("status") == "follow", up
        assert "need_rejoin" not in log_since_last_start(m) and "rebuilding the store" not in m.log_text()
