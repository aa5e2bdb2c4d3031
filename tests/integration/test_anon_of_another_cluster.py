"""An anonymous replica pointed at another cluster than the one its data dir belongs to, on real
processes (two clusters): with no store but the identity files of a member of cluster X, it
stops with `wrong store` before fetching anything from cluster Y (as a JOIN does), its identity
kept, so it can still rejoin X; with a store of X, its links to Y are refused as a wrong store
and its rows stay (node/core/lifecycle_join.py `_ask`, docs/operations.md)."""
from __future__ import annotations

import os
import shutil
import subprocess

from tests.integration.harness import ReplogProcess, mesh, wait_for
from tests.integration.oracles import upstream


def file_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def exit_code(p: ReplogProcess, timeout: float = 60.0) -> int:
    try:
        return p.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{p.name} did not exit:\n{p.log_tail()}") from None


def two_clusters(tmp_path, procs) -> tuple[ReplogProcess, ReplogProcess, ReplogProcess]:
    """Cluster X of two members (x1, x2) and cluster Y of one (y), each with rows in `kv`."""
    x1, x2 = mesh(tmp_path, 2)
    y = ReplogProcess(tmp_path, "y").start()
    procs.extend([x1, x2, y])
    for n in (x1, y):
        n.create_space("kv")
        n.kv_put("kv", f"from-{n.name}", n.name)
    wait_for(lambda: x2.kv_get("kv", "from-n1")[0] == 200, 30, "x2 holds x1's row")
    assert x1.info()["cluster_uuid"] != y.info()["cluster_uuid"]
    return x1, x2, y


def test_an_anonymous_replica_with_another_clusters_identity_stops_with_wrong_store_and_keeps_it(tmp_path, procs):
    x1, x2, y = two_clusters(tmp_path, procs)
    x_cluster, y_cluster = x1.info()["cluster_uuid"], y.info()["cluster_uuid"]
    x2u, x2_id = x2.uuid(), x2.info()["id"]
    assert x2.stop() == 0
    shutil.rmtree(os.path.join(x2.data_dir, "store"))        # the store is lost; the identity stays
    shutil.rmtree(os.path.join(x2.data_dir, "wal"))
    identity = os.path.join(x2.data_dir, "identity")
    before = file_bytes(identity)

    x2.peers, x2.extra = [y.address], ["--anon"]
    x2.start(wait=False)
    assert exit_code(x2) == 1, x2.log_tail()
    lines = x2.log_text().rstrip().splitlines()
    assert lines[-1] == (f"replog: error: wrong store: this node's identity belongs to cluster {x_cluster}, "
                         f"{y.address} to {y_cluster}"), x2.log_tail()
    assert any("hint: point --peers at cluster" in ln for ln in lines), x2.log_tail()
    assert "fetched a snapshot" not in x2.log_text()
    assert file_bytes(identity) == before, "the identity files are left as they were"
    assert x2u not in y.cluster()

    # Nothing of Y was installed: restarted as the member it is, through its own cluster, it
    # rejoins X under its uuid and id, with X's rows and none of Y's.
    x2.peers, x2.extra = [x1.address], []
    x2.start(wait=False)
    x2.wait_healthy(60)
    wait_for(lambda: x2.info()["cluster_uuid"] == x_cluster and x2.kv_get("kv", "from-n1")[0] == 200, 60,
             "x2 rejoined X")
    assert x2.uuid() == x2u and x2.info()["id"] == x2_id
    assert x2.kv_get("kv", "from-y")[0] == 404


def test_an_anonymous_replica_with_a_store_of_another_cluster_is_refused_by_its_peers_and_keeps_its_rows(tmp_path,
                                                                                                      procs):
    x1, _, y = two_clusters(tmp_path, procs)
    r = ReplogProcess(tmp_path, "anon", peers=[x1], extra=["--anon"]).start()
    procs.append(r)
    wait_for(lambda: r.kv_get("kv", "from-n1")[0] == 200, 30, "the anonymous replica holds X's row")
    x_cluster, vclock = r.info()["cluster_uuid"], r.info()["vclock_uuid"]
    assert r.stop() == 0

    r.peers = [y.address]
    r.start()
    wait_for(lambda: "wrong store" in (upstream(r, y.address).get("error") or ""), 30,
             "the link to Y refused as a wrong store")
    i = r.info()
    assert i["cluster_uuid"] == x_cluster and i["vclock_uuid"] == vclock
    assert r.kv_get("kv", "from-n1")[0] == 200 and r.kv_get("kv", "from-y")[0] == 404


def test_an_anonymous_replica_of_one_cluster_registering_with_another_stops_with_wrong_store(tmp_path, procs):
    """Restarted without --anon (which registers it) and pointed at cluster Y, a replica whose
    store is of X stops with one line instead of asking Y for ever; its store is left as it was
    and it registers with X once pointed there."""
    x1, _, y = two_clusters(tmp_path, procs)
    r = ReplogProcess(tmp_path, "anon", peers=[x1], extra=["--anon"]).start()
    procs.append(r)
    wait_for(lambda: r.kv_get("kv", "from-n1")[0] == 200, 30, "the anonymous replica holds X's row")
    ru, x_cluster, vclock = r.uuid(), r.info()["cluster_uuid"], r.info()["vclock_uuid"]
    assert r.stop() == 0

    r.peers, r.extra = [y.address], []
    r.start(wait=False)
    assert exit_code(r) == 1, r.log_tail()
    lines = r.log_text().rstrip().splitlines()
    assert lines[-1].startswith("replog: error: wrong store: ") and y.info()["cluster_uuid"] in lines[-1], r.log_tail()
    assert any(f"hint: point --peers at cluster {x_cluster}" in ln for ln in lines), r.log_tail()
    assert ru not in y.cluster()

    r.peers = [x1.address]
    r.start()
    wait_for(lambda: (x1.cluster().get(ru) or {}).get("state") == "member", 60, "registered with X")
    i = r.info()
    assert i["cluster_uuid"] == x_cluster and all(i["vclock_uuid"].get(u, 0) >= n for u, n in vclock.items())
    assert r.kv_get("kv", "from-n1")[0] == 200 and r.kv_get("kv", "from-y")[0] == 404
