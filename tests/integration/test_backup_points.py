"""A backup from another process (`replog backup`, node/ops/backup.py BackupJob) with its steps
driven one by one against a running node, so that what happens between them is chosen, not
left to timing: the node's first space created and rows written across several WAL segments
(checkpoints running) after the store copy and before the point are all in the restored node,
and nothing after the point is."""
from __future__ import annotations

from node.ops.backup import BackupJob
from tests.integration.harness import ReplogProcess
from tests.integration.test_backup import keys_of, restore


def test_the_first_space_created_after_the_store_copy_and_before_the_point_is_in_the_restored_node(tmp_path, procs):
    n = ReplogProcess(tmp_path, "n", extra=["--segment-bytes-max", "65536", "--checkpoint-interval-s", "0.2"])
    procs.append(n)
    n.start()
    assert n.get("/v1/spaces")[1]["spaces"] == [], "no space before the backup starts"
    out = str(tmp_path / "backup")
    job = BackupJob(n.data_dir, out)
    try:
        job.begin()
        job.copy_store(None)                  # the store as it is now: the cluster, no space
        n.create_space("kv")
        for i in range(0, 2000, 100):         # ~200 KiB: several segments, checkpoints in between
            s, d = n.post("/v1/txn", {"ops": [{"op": "put", "space": "kv", "key": f"k{j}", "value": "x" * 100}
                                              for j in range(i, i + 100)]})
            assert s == 200, (s, d)
        segments = n.info()["wal"]["segments"]
        assert segments >= 3, f"the writes span several segments ({segments})"
        job.copy_wal(None)
        man = job.finish()
    except BaseException:
        job.abort()
        raise
    n.kv_put("kv", "after-the-point", 1)
    assert man["replayed_txns"] >= 21, man     # the space's creation and every write came from the WAL
    r = ReplogProcess(tmp_path, "restored")
    restore(out, r.data_dir)
    procs.append(r)
    r.start()
    assert r.uuid() == man["uuid"]
    have = keys_of(r)
    assert set(have) == {f"k{j}" for j in range(2000)}, sorted(set(have) ^ {f"k{j}" for j in range(2000)})[:5]
