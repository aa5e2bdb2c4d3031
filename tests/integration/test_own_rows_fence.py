"""The own-rows fence against real processes, for the losses the membership rule names beyond a
lost store (which tests/integration/test_membership_safety.py covers): a lost WAL, and a machine
restart under wal_mode = write. A fenced node refuses writes under its own id until every member
has greeted it and its own rows are back; the fence survives a restart; a loss that cannot have
lost a sent row fences nothing."""
from __future__ import annotations

import shutil

from tests.integration.harness import mesh, vclocks_converged, wait_for


def _fenced(node) -> dict | None:
    return node.info()["own_rows_fence"]


def _trio(tmp_path, procs, extra=None):
    nodes = mesh(tmp_path, 3, extra=extra)
    procs.extend(nodes)
    a, b, c = nodes
    a.create_space("kv")
    wait_for(lambda: all(n.get("/v1/spaces/kv/keys")[0] == 200 for n in nodes), 20, "kv everywhere")
    return a, b, c


def _write_then_isolate(a, b, c, n: int = 20) -> int:
    """C writes n rows that reach B only (A is stopped first); returns C's top lsn."""
    a.stop()
    cu = c.uuid()
    for i in range(n):
        c.kv_put("kv", f"c{i}", i)
    top = c.info()["vclock_uuid"][cu]
    wait_for(lambda: b.info()["vclock_uuid"].get(cu) == top, 20, "B holds all of C's rows")
    return top


def test_a_node_whose_wal_is_gone_is_fenced_until_its_peers_give_its_rows_back(tmp_path, procs):
    a, b, c = _trio(tmp_path, procs)
    top = _write_then_isolate(a, b, c)
    bu = b.uuid()
    b.stop()
    c.kill9()
    shutil.rmtree(f"{c.data_dir}/wal")          # the store may be behind what was written and sent
    a.start()
    c.start()
    fence = _fenced(c)
    assert fence is not None and "WAL directory is gone" in fence["reason"], fence
    s, d = c.put("/v1/spaces/kv/keys/new", 1)
    assert (s, d["error"]["code"]) == (503, "own_rows_unconfirmed"), (s, d)
    assert bu in d["error"]["message"]
    c.kill9()                                    # the fence is kept across a restart
    c.start()
    assert _fenced(c) is not None
    b.start()
    wait_for(lambda: _fenced(c) is None, 30, "C's fence lifted once B greeted it")
    assert all(c.kv_get("kv", f"c{i}")[0] == 200 for i in range(20))
    assert c.kv_put("kv", "new", 1)["lsn"] > top
    wait_for(lambda: vclocks_converged([a, b, c]), 20, "converged")


def test_a_machine_restart_under_wal_mode_write_fences_and_an_orderly_stop_does_not(tmp_path, procs):
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    a, b, c = _trio(tmp_path, procs)
    for n in (a, b, c):
        n.env["REPLOG_BOOT_ID_FILE"] = str(boot)
        n.stop()
    for n in (a, b, c):
        n.start(wait=False)
    for n in (a, b, c):
        n.wait_healthy(60)
    top = _write_then_isolate(a, b, c)
    b.stop()
    c.kill9()                                    # a power cut: no orderly stop ...
    boot.write_text("boot-2\n")                  # ... and the machine came back
    a.start()
    c.start()
    fence = _fenced(c)
    assert fence is not None and "machine restarted" in fence["reason"], fence
    assert c.put("/v1/spaces/kv/keys/new", 1)[0] == 503
    b.start()
    wait_for(lambda: _fenced(c) is None, 30, "fence lifted")
    assert c.kv_put("kv", "new", 1)["lsn"] > top
    c.stop()                                     # an orderly stop ...
    boot.write_text("boot-3\n")                  # ... then a reboot: nothing unsynced was lost
    c.start()
    assert _fenced(c) is None
    c.kill9()                                    # a process crash on the same boot: the page cache kept all
    c.start()
    assert _fenced(c) is None


def test_wal_mode_fsync_is_not_fenced_by_a_machine_restart(tmp_path, procs):
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    a, b, c = _trio(tmp_path, procs, extra=["--wal-mode", "fsync"])
    c.env["REPLOG_BOOT_ID_FILE"] = str(boot)
    c.stop()
    c.start()
    c.kv_put("kv", "x", 1)
    c.kill9()
    boot.write_text("boot-2\n")
    c.start()
    assert _fenced(c) is None
    c.kv_put("kv", "y", 1)


def test_a_member_expelled_on_a_peer_lifts_a_fence_whose_links_stay_up(tmp_path, procs):
    """C is fenced (its WAL is gone) and waits for D, which is down for good. The operator does
    what C's fence says, expels D — on A, not on C. C's links stay up, and C asks A's and B's rows
    from where they were when it subscribed (fenced: its own rows first), so A's expel row, and
    B's own `_cluster` row that follows it, reach C past a gap in their origins' rows and are
    not applied; what they say of D must still reach the fence, or C waits for D for ever (it
    did: the rows were dropped, and only a new greeting would have told C)."""
    nodes = mesh(tmp_path, 4)
    procs.extend(nodes)
    a, b, c, d = nodes
    a.create_space("kv")
    wait_for(lambda: all(n.get("/v1/spaces/kv/keys")[0] == 200 for n in nodes), 20, "kv everywhere")
    c.kv_put("kv", "c0", 0)
    wait_for(lambda: vclocks_converged(nodes), 20, "converged")
    du = d.uuid()
    d.stop()                                     # down for good
    c.kill9()
    for i in range(5):                           # rows of A and B that C asks for only after its fence
        a.kv_put("kv", f"a{i}", i)
        b.kv_put("kv", f"b{i}", i)
    shutil.rmtree(f"{c.data_dir}/wal")
    c.start()
    wait_for(lambda: du in ((_fenced(c) or {}).get("waiting_for") or []), 30, "C's fence waits for D alone")
    assert (_fenced(c) or {}).get("waiting_for") == [du], _fenced(c)
    up = {a.uuid(), b.uuid()}

    def linked() -> bool:                        # every link between C and A, B is up: no greeting to come
        i = c.info()
        return {u["uuid"] for u in i["upstreams"] if u["status"] == "follow"} >= up and \
            {r["uuid"] for r in i["downstreams"] if r["status"] == "subscribed"} >= up
    wait_for(linked, 30, "C linked both ways with A and B")
    s, body = a.delete(f"/v1/cluster/{du}")
    assert s == 200, (s, body)
    wait_for(lambda: _fenced(c) is None, 30, "C's fence lifted by D's expel on A")
    assert c.kv_put("kv", "after", 1)["lsn"] > 1
    wait_for(lambda: all(n.kv_get("kv", f"{w}{i}")[0] == 200 for n in (a, b, c) for w in "ab" for i in range(5)),
             20, "A's and B's rows everywhere once C subscribes again")
    wait_for(lambda: (c.cluster().get(du) or {}).get("state") == "expelled", 20, "D expelled on C")
