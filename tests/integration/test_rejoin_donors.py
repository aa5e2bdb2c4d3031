"""A member told to rejoin by an anonymous replica, on real processes. The replica's WAL starts
where its snapshot did, so a member behind that which replicates from it is told to rejoin; the
replica registers nobody, so the member rebuilds from its snapshot (FETCH_SNAPSHOT, not JOIN)
and keeps none of its anonymous entries. Before, the replica was taken for a donor, refused the
JOIN, and the member tried again every few seconds for ever, taking its links down each time
(node/core/lifecycle_rejoin.py, Rebuild.donor_anon).

The setup: D follows A; D's data dir is backed up; D acknowledges 300 more of A's rows, so A
collects its WAL past the backup; then R, an anonymous replica of A, fetches its snapshot. D
restored from the backup replicates from R alone, and is told to rejoin by it."""
from __future__ import annotations

import shutil

from tests.integration.harness import ReplogProcess, wait_for
from tests.integration.oracles import Acked, acked_everywhere, no_fork, restart_all, upstream

SMALL = ["--segment-bytes-max", "4096", "--checkpoint-interval-s", "0.3"]


def started(procs, tmp_path, name: str, **kw) -> ReplogProcess:
    p = ReplogProcess(tmp_path, name, **kw)
    procs.append(p)
    return p.start()


def gc_past(node: ReplogProcess, uuid: str, lsn: int) -> bool:
    """The node's WAL is collected past `lsn` of member `uuid`'s rows (its id there)."""
    rid = str(node.cluster()[uuid]["id"])
    return node.info()["wal"]["gc_vclock"].get(rid, 0) > lsn


def collect_past(a: ReplogProcess, d: ReplogProcess, acked: Acked) -> tuple[str, int]:
    """A writes 300 rows, D (following A) takes them, and A collects its WAL past D's position
    before them; returns (A's uuid, that position)."""
    au = a.uuid()
    d_had = d.info()["vclock_uuid"][au]
    for i in range(300):
        acked.put(a, "kv", f"a-{i}", "x" * 100)
    acked_everywhere([d], acked, 60)
    wait_for(lambda: gc_past(a, au, d_had + 50), 30, "A collected its WAL past the backup's position")
    return au, d_had


def d_behind_both(tmp_path, procs):
    """Returns (a, r, d, acked): D restored from a backup whose position is behind the WAL of A
    (collected) and of R (started after it), D down."""
    acked = Acked()
    a = started(procs, tmp_path, "a", extra=SMALL)
    a.create_space("kv")
    d = started(procs, tmp_path, "d", peers=[a])
    acked.put(a, "kv", "first", 1)
    acked_everywhere([d], acked)
    assert d.stop() == 0
    backup = str(tmp_path / "d-backup")
    shutil.copytree(d.data_dir, backup)
    d.start()
    au, d_had = collect_past(a, d, acked)
    r = started(procs, tmp_path, "r", peers=[a], extra=["--anon"])
    acked_everywhere([r], acked, 60)
    assert gc_past(r, au, d_had + 50), r.info()["wal"]        # its WAL starts at its snapshot
    assert d.stop() == 0
    shutil.rmtree(d.data_dir)
    shutil.copytree(backup, d.data_dir)
    return a, r, d, acked


def test_a_member_told_to_rejoin_by_an_anonymous_replica_rebuilds_from_its_snapshot(tmp_path, procs):
    a, r, d, acked = d_behind_both(tmp_path, procs)
    d.peers = [r.address]
    d.start(wait=False)
    wait_for(lambda: upstream(d, r.address).get("status") == "follow", 60, "D rebuilt from R and follows it")
    assert f"rebuilding the store from {r.address}'s snapshot (an anonymous replica)" in d.log_text()
    acked_everywhere([d], acked, 30)
    members = d.cluster()
    assert members[d.uuid()]["state"] == "member" and r.uuid() not in members, members
    assert "anonymous" not in {m["state"] for m in members.values()}, members
    d.set_peers([r, a])
    a.set_peers([d])
    wait_for(lambda: upstream(d, a.address).get("status") == "follow", 60, "D follows A with no second rebuild")
    acked.put(d, "kv", "d-after", 1)
    acked_everywhere([a, r, d], acked, 30)
    assert a.cluster()[d.uuid()]["state"] == "member" and r.uuid() not in a.cluster()
    rebuilds = [ln for ln in d.log_text().splitlines() if "rebuilding the store from" in ln]
    assert len(rebuilds) == 1, rebuilds
    no_fork([a, r, d])
    restart_all([a, r, d])
