"""A member's last rows held only by an anonymous replica, on real processes (session 28; the
simulation's full-mix seeds 5108 and 5782 found it): masters A, B and C, an anonymous replica R
following B. With A and C down, B takes writes that only R receives; B then loses its store and WAL
(its identity kept) and rejoins through A, which lacks them. B must not write under its own
uuid until those rows are back: once it did, its next rows took the lsns R holds, and R skipped
them as rows it had, for good. The way back that loses nothing is the one B's status names:
replicate from R. (The fence hears R only if R comes back while it stands: an anonymous
replica is never waited for; docs/operations.md.)"""
from __future__ import annotations

import os
import shutil

from tests.integration.harness import ReplogProcess, mesh, wait_for
from tests.integration.oracles import Acked, acked_everywhere, no_fork, replicated_spaces, restart_all


def test_a_node_whose_last_rows_only_an_anonymous_replica_holds_takes_them_back_before_writing(tmp_path, procs):
    """C stays down while B rejoins, so B's fence is still up when R comes back to it: B must
    hear R, wait for its rows, and take them back from R once it replicates from it."""
    acked = Acked()
    a, b, c = mesh(tmp_path, 3)
    procs.extend([a, b, c])
    b.create_space("kv")
    r = ReplogProcess(tmp_path, "r", peers=[b], extra=["--anon"])
    procs.append(r)
    r.start()
    for n in (a, b, c):
        acked.put(n, "kv", f"early-{n.name}", n.name)
    acked_everywhere([a, b, c, r], acked)

    assert a.stop() == 0 and c.stop() == 0
    b_last = [acked.put(b, "kv", f"b-{i}", i)["lsn"] for i in range(20)][-1]
    acked_everywhere([b, r], acked)                     # on B and R only
    b.kill9()
    shutil.rmtree(os.path.join(b.data_dir, "store"))
    shutil.rmtree(os.path.join(b.data_dir, "wal"))
    a.start()
    b.start(wait=False)
    wait_for(lambda: "kv" in replicated_spaces(b), 60, "B rejoined through A")
    ru = r.uuid()

    def fenced_on_r():
        fence = b.info().get("own_rows_fence") or {}
        return fence if fence.get("target") == b_last else None
    fence = wait_for(fenced_on_r, 30, "B's fence heard that R holds its rows")
    c.start()
    wait_for(lambda: not b.info()["own_rows_fence"]["waiting_for"], 30, "B heard C")
    fence = b.info()["own_rows_fence"]
    assert fence is not None and fence["target"] == b_last, fence
    assert f"{ru} at {r.address} is an anonymous replica" in fence["message"] and "peers" in fence["message"], fence
    s, d = b.put("/v1/spaces/kv/keys/while-fenced", 1)
    assert s == 503 and d["error"]["code"] == "own_rows_unconfirmed", \
        f"B wrote under its own uuid while only R held its rows up to lsn {b_last}: {s} {d}"

    b.set_peers([a, c, r])                               # what the status says: replicate from R
    wait_for(lambda: b.info().get("own_rows_fence") is None, 60, "B's rows came back from R")
    acked_everywhere([a, b, c, r], acked, 60)
    d = b.kv_put("kv", "after", "after")
    assert d["lsn"] > b_last, f"B's next lsn {d['lsn']} reuses one of its rows up to {b_last}"
    acked.writes[("kv", "after")] = ("after", b.uuid(), d["lsn"])
    acked_everywhere([a, b, c, r], acked, 30)            # R did not skip it as a row it had
    assert ru not in a.cluster() and ru not in b.cluster(), "a master registered the anonymous replica"
    no_fork([a, b, c, r])
    restart_all([a, b, c, r])
