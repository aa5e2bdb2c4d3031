"""A node whose WAL lost its beginning (its WAL directory gone while the store holds data) on real
processes: the rows below the new WAL's start are no longer there to relay, so the node records
that start as collected (`gc_vclock`, node/wal/gc.py `gc_at_wal_start`) and a subscriber behind it
is told to rejoin, as after WAL collection. Before, the relay sent such a subscriber the origin's
later rows past a gap: they waited for ever, and its own rows never reached it
(docs/replication.md, "A gap in the rows a peer sends of its own origin")."""
from __future__ import annotations

import shutil

from tests.integration.harness import mesh, vclocks_converged, wait_for
from tests.integration.oracles import log_since_last_start


def test_a_subscriber_behind_a_node_whose_wal_is_gone_is_told_to_rejoin_and_gets_every_row(tmp_path, procs):
    a, c = mesh(tmp_path, 2)
    procs.extend([a, c])
    a.create_space("kv")
    wait_for(lambda: c.get("/v1/spaces/kv/keys")[0] == 200, 20, "kv on C")
    a.stop()
    for i in range(20):                          # rows A never gets from C's WAL
        c.kv_put("kv", f"c{i}", i)
    cu = c.uuid()
    c.kill9()
    shutil.rmtree(f"{c.data_dir}/wal")
    c.start()
    held = {u: n for u, n in c.info()["vclock_uuid"].items()}
    assert held[cu] >= 20
    wal = c.info()["wal"]
    gc_by_uuid = {c.cluster()[u]["id"]: n for u, n in held.items()}
    assert {int(k): v for k, v in wal["gc_vclock"].items()} == gc_by_uuid, (wal, held)
    assert "past what was collected" in log_since_last_start(c)

    a.start()
    wait_for(lambda: c.info()["own_rows_fence"] is None, 30, "C's fence lifted once A greeted it")
    c.kv_put("kv", "after", 1)
    wait_for(lambda: a.kv_get("kv", "after")[0] == 200 and a.kv_get("kv", "c0")[0] == 200, 60,
             "A has C's rows from before the loss and after it")
    assert all(a.kv_get("kv", f"c{i}")[0] == 200 for i in range(20))
    wait_for(lambda: vclocks_converged([a, c]), 20, "converged")
    assert f"{a.uuid()} is behind collected WAL" in c.log_text(), c.log_tail()
    assert "of its own (its WAL lost rows" not in a.log_text()
