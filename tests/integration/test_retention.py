"""WAL retention: members' acknowledged positions hold segments, anonymous replicas only
within their TTL; a replica behind collected WAL rejoins from a snapshot, same uuid and id."""
from __future__ import annotations

from tests.integration.harness import ReplogProcess, vclocks_converged, wait_for

SMALL = ["--segment-bytes-max", "4096", "--checkpoint-interval-s", "0.3", "--anon-ttl-s", "1.5"]


def test_lagging_anonymous_replica_behind_collected_wal_rejoins(tmp_path, procs):
    a = ReplogProcess(tmp_path, "a", extra=SMALL).start()
    procs.append(a)
    a.create_space("kv")
    r = ReplogProcess(tmp_path, "r", peers=[a], extra=["--anon"]).start()
    procs.append(r)
    for i in range(20):
        a.kv_put("kv", f"k{i}", "x" * 100)
    wait_for(lambda: r.kv_get("kv", "k19")[0] == 200, 20, "replica caught up")
    ru, rid = r.uuid(), r.info()["id"]
    wait_for(lambda: ru in {d["uuid"] for d in a.info()["downstreams"]}, 10, "replica is a downstream")
    r.stop()
    for i in range(20, 300):
        a.kv_put("kv", f"k{i}", "x" * 100)
    # Once the replica's TTL has passed, its position no longer holds the WAL.
    wait_for(lambda: a.info()["wal"]["gc_vclock"].get("1", 0) > 100, 30, "WAL collected past the replica")
    r.start(wait=False)
    wait_for(lambda: "rejoin" in r.log_text(), 30, "replica told to rejoin")
    r.wait_healthy(60)
    wait_for(lambda: r.kv_get("kv", "k299")[0] == 200, 30, "rejoined replica has the data")
    assert r.uuid() == ru and r.info()["id"] == rid
    assert r.kv_get("kv", "k0")[1]["value"] == "x" * 100


def a_and_member_b(tmp_path, procs) -> tuple[ReplogProcess, ReplogProcess]:
    """A (small segments, frequent checkpoints) with space kv, and B, a member following A and
    followed by it."""
    a = ReplogProcess(tmp_path, "a", extra=SMALL).start()
    procs.append(a)
    a.create_space("kv")
    b = ReplogProcess(tmp_path, "b", peers=[a]).start()
    procs.append(b)
    a.set_peers([b])
    return a, b


def test_member_position_holds_the_wal(tmp_path, procs):
    a, b = a_and_member_b(tmp_path, procs)
    a.kv_put("kv", "first", 1)
    wait_for(lambda: b.kv_get("kv", "first")[0] == 200, 20, "member caught up")
    wait_for(lambda: b.uuid() in {d["uuid"] for d in a.info()["downstreams"]}, 10, "member subscribed")
    b.stop()
    for i in range(300):
        a.kv_put("kv", f"k{i}", "y" * 100)
    segments = a.info()["wal"]["segments"]
    assert segments > 5
    b.start()
    wait_for(lambda: b.kv_get("kv", "k299")[0] == 200, 30, "member catches up from the WAL")
    assert "rejoin" not in b.log_text()
    wait_for(lambda: vclocks_converged([a, b]), 20, "converged")


def test_an_anonymous_replicas_wal_is_collected_though_no_member_replicates_from_it(tmp_path, procs):
    """Members never subscribe to an anonymous replica, so while it has no row of its own none
    holds its WAL (node/core/holds.py `lapsing`); before, each got a hold from the first
    checkpoint after the replica learned of it, and the replica's WAL grew for ever. B, a member
    that stops, still holds A's WAL."""
    a, b = a_and_member_b(tmp_path, procs)
    r = ReplogProcess(tmp_path, "r", peers=[a], extra=["--anon"] + SMALL).start()
    procs.append(r)
    a.kv_put("kv", "first", 1)
    wait_for(lambda: b.kv_get("kv", "first")[0] == 200 and r.kv_get("kv", "first")[0] == 200, 20, "caught up")
    b_has = b.info()["vclock_uuid"][a.uuid()]
    b.stop()
    a_on_r = str(r.cluster()[a.uuid()]["id"])
    rows = iter(range(10_000))

    def collected_on_r() -> bool:
        for _ in range(20):
            a.kv_put("kv", f"k{next(rows)}", "y" * 100)
        return r.info()["wal"]["gc_vclock"].get(a_on_r, 0) > 200
    wait_for(collected_on_r, 60, "R collected its WAL past 200 rows of A", interval=0.2)
    assert a.info()["wal"]["gc_vclock"].get("1", 0) <= b_has + 1, "A collected what stopped B still needs"
    assert r.info()["wal"]["segments"] < a.info()["wal"]["segments"] / 2, (r.info()["wal"], a.info()["wal"])
    b.start()
    wait_for(lambda: vclocks_converged([a, b, r]), 30, "converged")
    assert "rejoin" not in b.log_text()
