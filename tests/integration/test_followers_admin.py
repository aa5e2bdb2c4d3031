"""The anonymous followers a node remembers, seen and forgotten by the operator, on real processes
(node/process/followers.py): a single master keeps every anonymous replica that followed it (no
member holds its rows: each may be their only other holder), so one gone for good stays until the
operator says so; forgotten, it is refused if it comes back, and the others follow on."""
from __future__ import annotations

import os
import time
import uuid

from node import limits
from tests.integration.harness import ReplogProcess, mesh, wait_for
from tests.integration.oracles import Acked, acked_everywhere, upstream


def followers(node: ReplogProcess) -> dict[str, dict]:
    s, d = node.get("/v1/admin/followers")
    assert s == 200, d
    return {f["uuid"]: f for f in d["followers"]}


def test_the_operator_sees_the_followers_and_forgets_one_gone_for_good_which_is_refused_if_it_comes_back(
        tmp_path, procs):
    acked = Acked()
    (m,) = mesh(tmp_path, 1, extra=["--anon-ttl-s", "1", "--checkpoint-interval-s", "0.3"])
    procs.append(m)
    m.create_space("kv")
    r1 = ReplogProcess(tmp_path, "r1", peers=[m], extra=["--anon"])
    r2 = ReplogProcess(tmp_path, "r2", peers=[m], extra=["--anon"])
    procs.extend([r1, r2])
    r1.start()
    r2.start()
    acked.put(m, "kv", "a", 1)
    acked_everywhere([m, r1, r2], acked)
    u1, u2 = r1.uuid(), r2.uuid()
    f = wait_for(lambda: (lambda f: f if {u1, u2} <= set(f) and f[u1]["linked"] and f[u2]["linked"] else None)(
        followers(m)), 20, "m lists both replicas as linked followers")
    assert f[u1]["address"] == r1.address and f[u1]["may_hold_own_lsn"] is None
    s, d = m.delete(f"/v1/admin/followers/{u1}")
    assert (s, d["error"]["code"]) == (409, "follower_linked"), d

    assert r1.stop() == 0
    # unseen past its TTL, with no other member to hold m's rows: kept for them, checkpoint after checkpoint
    f = wait_for(lambda: (lambda x: x if not x["linked"] and x["unseen_s"] > 2 else None)(followers(m)[u1]), 20,
                 "r1 is unseen past its TTL")
    assert f["kept_for_rows"] and f["may_hold_own_lsn"] >= 2, f
    for bad in ("", "?unseen_s=-1", "?unseen_s=nan", "?unseen_s=soon"):
        s, d = m.delete(f"/v1/admin/followers{bad}")
        assert (s, d["error"]["code"]) == (400, "bad_unseen_s"), (bad, d)
    s, d = m.delete("/v1/admin/followers?unseen_s=3600")
    assert s == 200 and d == {"forgotten": [], "kept": sorted([u1, u2])}, d
    s, d = m.delete("/v1/admin/followers/00000000-0000-4000-8000-000000000000")
    assert (s, d["error"]["code"]) == (404, "no_such_follower"), d
    s, d = m.delete("/v1/admin/followers?unseen_s=2")
    assert s == 200 and d == {"forgotten": [u1], "kept": [u2]}, d
    assert u1 not in followers(m) and m.get("/v1/admin/followers")[1]["forgotten"] == 1
    assert "the operator had this node forget anonymous follower " + u1 in m.log_text()

    m.stop()
    m.start()                                           # both lists are beside the identity
    assert u1 not in followers(m)
    r1.start(wait=False)
    wait_for(lambda: "forgotten" in upstream(r1, m.address).get("error", ""), 30, "m refuses r1 as forgotten")
    assert upstream(r1, m.address)["status"] == "refused"
    acked.put(m, "kv", "b", 2)
    acked_everywhere([m, r2], acked)                    # r2 follows on
    assert r1.kv_get("kv", "b")[0] == 404
    assert u2 in followers(m) and u1 not in followers(m)


def test_a_node_that_remembers_as_many_followers_as_it_may_refuses_a_new_one_until_the_operator_makes_room(
        tmp_path, procs):
    """Past anon_followers_max a new anonymous replica would be served and not remembered: the only
    holder of the node's last rows, perhaps, and a lost store would not wait for it. It is refused
    with ERROR followers_full instead (here 1024 followers gone for two days fill the file), and
    follows once the operator forgets those gone for good."""
    acked = Acked()
    (m,) = mesh(tmp_path, 1)
    procs.append(m)
    m.create_space("kv")
    acked.put(m, "kv", "a", 1)
    assert m.stop() == 0
    old = time.time() - 2 * 86400
    with open(os.path.join(m.data_dir, "anonymous_followers"), "a") as f:
        for i in range(limits.anon_followers_max):
            f.write(f"{uuid.UUID(int=i + 1)} gone{i}.example:1 {old:.3f}\n")
    m.start()
    assert len(followers(m)) == limits.anon_followers_max

    r = ReplogProcess(tmp_path, "r", peers=[m], extra=["--anon"])
    procs.append(r)
    r.start(wait=False)
    wait_for(lambda: "followers_full" in r.log_text(), 30, "m refuses r: it remembers as many followers as it may")
    assert "takes no more" in m.log_text()              # the relay's log line names the refusal
    assert r.info().get("status") != "running"

    s, d = m.delete("/v1/admin/followers?unseen_s=86400")
    assert s == 200 and len(d["forgotten"]) == limits.anon_followers_max and d["kept"] == [], (s, len(d["forgotten"]))
    acked.put(m, "kv", "b", 2)
    acked_everywhere([m, r], acked, 60)                 # r tries again (slowly: it was refused) and follows
    assert set(followers(m)) == {r.uuid()}
