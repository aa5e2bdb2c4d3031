"""A member that catches up at start (`--cluster-wait-for`: it takes a running member's updates
before it goes active, node/lifecycle.py catch_up) and is told to rejoin by that member (its WAL
was collected past this member's store) rebuilds from a snapshot, and then goes active.

The rejoin acts only on a running node, and catch-up waited for rows no link could bring: the
member stayed `catching_up` for good. (Found by an audit of the simulation's stand-ins: the
simulation does not run the catch-up.)"""
from __future__ import annotations

import shutil

from tests.integration.harness import ReplogProcess, wait_for
from tests.integration.oracles import Acked, acked_everywhere
from tests.integration.test_rejoin_donors import SMALL, collect_past, started


def test_a_member_catching_up_at_start_that_is_told_to_rejoin_rebuilds_and_goes_active(tmp_path, procs):
    acked = Acked()
    a = started(procs, tmp_path, "a", extra=SMALL)
    a.create_space("kv")
    d = started(procs, tmp_path, "d", peers=[a], extra=["--cluster-wait-for", "1"])
    acked.put(a, "kv", "first", 1)
    acked_everywhere([d], acked)
    assert d.stop() == 0
    backup = str(tmp_path / "d-backup")
    shutil.copytree(d.data_dir, backup)          # D's store as it was: behind what A will collect
    d.start()
    collect_past(a, d, acked)
    assert d.stop() == 0
    shutil.rmtree(d.data_dir)
    shutil.copytree(backup, d.data_dir)
    d.start(wait=False)
    wait_for(lambda: _status(d) == "ok", 60, "D rebuilt and went active")
    acked_everywhere([d], acked, 60)


def _status(n: ReplogProcess) -> str | None:
    try:
        return n.get("/v1/health")[1].get("status")
    except OSError:
        return None
