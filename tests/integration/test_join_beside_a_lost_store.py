"""A new node whose only peer is a member that lost its store, on real processes: the member
greets without a store but `member_of` its cluster (its identity files name it), so the newcomer
waits for that cluster instead of founding one of its own, and joins it once the member has
rejoined. Before, the newcomer took the member for a fresh node and, having the lower uuid,
founded a second cluster beside the first (found by the simulation: tests/sim/
test_scenarios_membership.py, the same case)."""
from __future__ import annotations

import os
import shutil

from tests.integration.harness import PortReservation, ReplogProcess, mesh, wait_for
from tests.integration.oracles import Acked, acked_everywhere, no_fork, replicated_spaces, restart_all


# Fresh nodes tried until one draws a uuid below some member's. All 20 drew above three members
# once in a full run (members 0f48d22d, 1128846c, 30084fbe: 1 in ~1,800 for uniform uuids);
# 60 makes it 1 in ~40,000, and a try costs a second only when the draw goes that way.
ATTEMPTS = 60


def newcomer_below(tmp_path, procs: list, members: list[ReplogProcess]) -> tuple[ReplogProcess, ReplogProcess]:
    """A fresh node J (stopped) whose uuid is below some member's (that member returned as C):
    J first starts with a peer that never answers, so it neither founds nor joins while its
    uuid is read; its empty store keeps that uuid for its next start."""
    silent = PortReservation()             # held, never listening: no other test's node takes it
    try:
        for attempt in range(ATTEMPTS):
            j = ReplogProcess(tmp_path, f"j{attempt}", peers=[f"127.0.0.1:{silent.port}"])
            procs.append(j)
            j.start(wait=False)
            ju = wait_for(lambda: j.info()["uuid"], 30, "J answering")
            j.kill9()
            above = [m for m in members if m.uuid() > ju]
            if above:
                return j, above[0]
    finally:
        silent.close()
    raise AssertionError(f"no fresh node drew a uuid below a member's in {ATTEMPTS} tries")


def test_a_new_node_whose_only_peer_lost_its_store_joins_that_cluster_and_founds_none(tmp_path, procs):
    acked = Acked()
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    nodes[0].create_space("kv")
    wait_for(lambda: all("kv" in replicated_spaces(n) for n in nodes), 20, "kv everywhere")
    for n in nodes:
        acked.put(n, "kv", f"before-{n.name}", n.name)
    acked_everywhere(nodes, acked)
    cluster_uuid = nodes[0].info()["cluster_uuid"]

    j, c = newcomer_below(tmp_path, procs, nodes)
    others = [n for n in nodes if n is not c]
    for n in others:                       # C's cluster is down while C starts without its store
        assert n.stop() == 0
    c.kill9()
    shutil.rmtree(os.path.join(c.data_dir, "store"))
    shutil.rmtree(os.path.join(c.data_dir, "wal"))
    c.start(wait=False)
    wait_for(lambda: "waiting for a running member" in (c.info().get("status_reason") or ""), 30,
             "C waits for a running member of its cluster")

    j.peers = [c.address]                  # J's only peer: the member without its store
    j.start(wait=False)
    def decided():
        i = j.info()
        return i if i["cluster_uuid"] or "lost its store" in (i.get("status_reason") or "") else None
    i = wait_for(decided, 30, "J founds a cluster or sees that C lost its store")
    assert i["uuid"] < c.uuid()
    assert i["cluster_uuid"] is None, f"J founded cluster {i['cluster_uuid']} beside C's {cluster_uuid}"

    for n in others:
        n.start(wait=False)
    wait_for(lambda: c.info()["cluster_uuid"] == cluster_uuid and "kv" in replicated_spaces(c), 60,
             "C rejoined its cluster")
    wait_for(lambda: j.info()["cluster_uuid"] == cluster_uuid, 60, "J joined the cluster through C")
    c.set_peers(others + [j])              # and C follows J: J's writes reach everyone through C
    acked.put(j, "kv", "after-j", "j")
    everyone = nodes + [j]
    acked_everywhere(everyone, acked, 60)
    no_fork(everyone)
    restart_all(everyone)
