"""A node whose store alone holds an expelled member's rows, and that lacks a member's rows which
its upstream collected, on real processes (the simulation's full+replace seed 204848).

A expels B while they are cut off; B, not knowing, takes a write and registers F, which joins
through it: F's snapshot holds B's rows past the bound A stated. B stops for good. F hears of the
expel through E (A's row, from E's WAL) and raises the bound to the rows it holds, as every node
does. A writes on and collects its WAL before it ever hears of F. Then A tells F to rejoin (F lacks
A's rows), and no snapshot covers F (A lacks B's rows, and goes without them): F keeps its store
and is blocked for good, taking nothing more from A (docs/replication.md, "A rejoin discards
nothing"). Only the operator may let B's rows go: `POST /v1/admin/rejoin {"discard": [B]}`
(docs/operations.md, "A node that cannot rejoin"), after which F rebuilds from A and follows it."""
from __future__ import annotations

import re

from tests.integration.harness import ReplogProcess, mesh, wait_for
from tests.integration.oracles import expel_bound, readable, start_joiner, upstream

SMALL = ["--segment-bytes-max", "4096", "--checkpoint-interval-s", "0.3"]


def _rejoin(node: ReplogProcess) -> dict:
    return node.info().get("rejoin") or {}


def test_the_operator_lets_a_blocked_node_discard_an_expelled_members_rows_no_donor_has(tmp_path, procs):
    a, b = mesh(tmp_path, 2, extra=SMALL)
    procs.extend([a, b])
    a.create_space("kv")
    e = start_joiner(tmp_path, procs, "e", a)
    a.kv_put("kv", "early", 1)
    wait_for(lambda: readable(b, "early") and readable(e, "early"), 20, "A's write on B and E")
    bu = b.uuid()
    a.set_peers([e])
    b.set_peers([])                            # A and B cut off from each other
    wait_for(lambda: not upstream(a, b.address) and not upstream(b, a.address), 20, "the A-B links gone")
    s, d = a.delete(f"/v1/cluster/{bu}")
    assert s == 200, (s, d)
    wait_for(lambda: expel_bound(e, bu) is not None, 20, "E took A's expel")

    b.kv_put("kv", "b-after-expel", 1)         # B has not heard: past the bound A stated
    f = start_joiner(tmp_path, procs, "f", b)
    assert readable(f, "b-after-expel")
    assert b.stop() == 0                       # gone for good
    f.set_peers([e])                           # F takes A's expel from E's WAL, and raises the bound
    f_b = f.info()["vclock_uuid"][bu]       # B's rows F holds: its registration and the write
    wait_for(lambda: expel_bound(f, bu) == f_b, 30, "F raised B's bound to the rows it holds")
    f.set_peers([])
    wait_for(lambda: not upstream(f, e.address), 20, "F's link to E gone")
    me = str(a.info()["id"])
    f_has = f.info()["vclock_uuid"][a.uuid()]

    for i in range(120):                       # A writes on and collects past F, before it hears of F
        a.kv_put("kv", f"a-{i}", "x" * 100)
    wait_for(lambda: int(a.info()["wal"]["gc_vclock"].get(me, 0)) > f_has, 30, "A collected its WAL past F")

    a.set_peers([e, f])
    f.set_peers([a])
    wait_for(lambda: "would discard" in _rejoin(f).get("blocked", ""), 90, "F is blocked: no snapshot covers it")
    assert bu in _rejoin(f)["blocked"] and upstream(f, a.address)["status"] == "need_rejoin"
    assert not readable(f, "a-119") and readable(f, "b-after-expel")

    for bad in ({}, {"discard": []}, {"discard": "x"}, {"discard": [bu.replace("-", "")]}, [bu]):
        s, d = f.post("/v1/admin/rejoin", bad)
        assert (s, d["error"]["code"]) == (400, "bad_body"), (bad, s, d)
    s, d = f.post("/v1/admin/rejoin", {"discard": [a.uuid()]})
    assert (s, d["error"]["code"]) == (409, "not_expelled"), d
    s, d = e.post("/v1/admin/rejoin", {"discard": [bu]})
    assert (s, d["error"]["code"]) == (409, "not_told_to_rejoin"), d

    s, d = f.post("/v1/admin/rejoin", {"discard": [bu]})
    assert s == 200 and d["discard"] == [bu] and d["needed_by"] == [a.address], d
    wait_for(lambda: readable(f, "a-119") and upstream(f, a.address).get("status") == "follow", 60,
             "F rebuilt from A and follows it")
    assert not readable(f, "b-after-expel")                     # what the operator let go
    assert re.search(f"discarding rows that the operator let go .*: expelled member {bu} from lsn \\d+ to {f_b}$",
                     f.log_text(), re.M), f.log_tail()
    assert _rejoin(f).get("discard", []) == []
    wait_for(lambda: f.put("/v1/spaces/kv/keys/f-1", 1)[0] == 200, 30, "F takes a write")
    wait_for(lambda: readable(a, "f-1"), 30, "F's write on A")
    assert f.stop() == 0
    f.start()
    f.set_peers([a])                           # (its command line names B, which it joined through)
    wait_for(lambda: upstream(f, a.address).get("status") == "follow", 30, "F follows A after a restart")
    assert _rejoin(f) == {}
