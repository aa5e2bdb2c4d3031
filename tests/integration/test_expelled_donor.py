"""A node expelled from the cluster takes no row under its own id: no member takes its rows past
its expel bound. A client's write there was acknowledged and reached nobody; a newcomer it
registered held rows nobody else could have (full-mix seed 15214: every node then told the
newcomer to rejoin, and no snapshot covered it). It knows it is expelled when the expel row
reaches it, or, expelled while it was down (the row in no WAL it reads yet), when a member
refuses its link as expelled. On real processes."""
from __future__ import annotations

from tests.integration.harness import ReplogProcess, mesh, wait_for


def _told_expelled(node: ReplogProcess) -> list[str]:
    s, d = node.get("/v1/health")
    return [w for w in (d.get("warnings") or []) if "this node was expelled from the cluster" in w] if s == 200 else []


def test_a_member_refused_as_expelled_registers_nobody_and_says_so(tmp_path, procs):
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    a, b, c = nodes
    a.create_space("kv")
    wait_for(lambda: all(n.get("/v1/spaces/kv/keys")[0] == 200 for n in nodes), 20, "kv everywhere")
    cu = c.uuid()
    c.stop()
    s, body = a.delete(f"/v1/cluster/{cu}")
    assert s == 200, (s, body)
    wait_for(lambda: (b.cluster().get(cu) or {}).get("state") == "expelled", 20, "C expelled on B")
    c.start()
    assert (c.cluster().get(cu) or {}).get("state") == "member"     # C has not heard of its expel
    warned = wait_for(lambda: _told_expelled(c), 30, "C's health says it was expelled")
    assert "refused it as expelled" in warned[0] and "registers nobody" in warned[0], warned
    s, d = c.put("/v1/spaces/kv/keys/lost", 1)
    assert (s, d["error"]["code"]) == (409, "expelled"), (s, d)
    members = set(c.cluster())

    n = ReplogProcess(tmp_path, "n", peers=[c]).start(wait=False)
    procs.append(n)
    wait_for(lambda: "donor_expelled" in n.log_text(), 30, "the newcomer's JOIN refused by C")
    assert set(c.cluster()) == members and set(a.cluster()) == set(b.cluster()) == members
    assert n.get("/v1/info")[1].get("status") != "running"


def test_a_member_that_takes_its_own_expel_row_takes_no_more_writes_to_replicated_spaces(tmp_path, procs):
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    a, b, c = nodes
    a.create_space("kv")
    c.create_space("mine", local=True)
    wait_for(lambda: all(n.get("/v1/spaces/kv/keys")[0] == 200 for n in nodes), 20, "kv everywhere")
    c.kv_put("kv", "before", 1)
    # (the expel's bound is what A holds of C: a row of C not yet on A would be given up with it)
    wait_for(lambda: a.kv_get("kv", "before")[0] == 200, 20, "C's row on A before the expel")
    cu = c.uuid()
    s, body = a.delete(f"/v1/cluster/{cu}")
    assert s == 200, (s, body)
    wait_for(lambda: (c.cluster().get(cu) or {}).get("state") == "expelled", 20, "C took its own expel row")
    s, d = c.put("/v1/spaces/kv/keys/after", 1)
    assert (s, d["error"]["code"]) == (409, "expelled"), (s, d)
    s, d = c.post("/v1/txn", {"ops": [{"op": "put", "space": "kv", "key": "t", "value": 1}]})
    assert (s, d["error"]["code"]) == (409, "expelled"), (s, d)
    s, d = c.delete(f"/v1/cluster/{b.uuid()}")
    assert (s, d["error"]["code"]) == (409, "expelled"), (s, d)
    assert c.put("/v1/spaces/mine/keys/k", 1)[0] == 200          # a local space is this node's own
    assert any("its _cluster says it was expelled" in w for w in c.get("/v1/health")[1]["warnings"])
    assert c.kv_get("kv", "before")[0] == 200 and a.kv_get("kv", "before")[0] == 200
