"""Two processes with one member's uuid, on real processes (node/core/link/twins.py): a backup
restored without --as-new-member and started while its node runs, whether it names that node as
a peer or only the others, stops (exit 1, one line saying why) before it writes a row, and the
cluster is as it was: no (origin, lsn) names two rows, the member's address is not moved, every
write reaches every node. Whichever way they meet, the younger run stops and the older serves
on (a restore started in place of a stopped node, and then the old node started again). And a
node killed and started again at once is no twin of its dead process."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.integration.harness import REPLOG, ReplogProcess, mesh, restore, vclocks_converged, wait_for
from tests.integration.oracles import no_fork, replicated_spaces
from tests.integration.test_backup import one_row_per_lsn


def backup_of(node: ReplogProcess, out: str) -> None:
    r = subprocess.run(REPLOG + ["backup", node.data_dir, "--to", out], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def twin_of(tmp_path, original: ReplogProcess, peers: list[ReplogProcess], name: str = "twin") -> ReplogProcess:
    backup_of(original, str(tmp_path / f"{name}-backup"))
    clone = ReplogProcess(tmp_path, name, peers=peers)
    restore(str(tmp_path / f"{name}-backup"), clone.data_dir)
    return clone


def exits_as_twin(node: ReplogProcess) -> None:
    node.start(wait=False)
    wait_for(lambda: node.proc.poll() is not None, 30, f"{node.name} stops")
    assert node.proc.returncode == 1, node.log_text()[-3000:]
    log = node.log_text().split(f"===== start #{node.starts}")[-1]
    run = re.search(r"listening on \S+ as run ([0-9a-f]{24})", log)
    assert run is not None and f"the younger ({run[1]}) stops" in log, log[-3000:]
    assert "another process with the uuid" in log and "younger" in log and "Traceback" not in log, log[-3000:]


def writes_everywhere(nodes: list[ReplogProcess], key: str) -> None:
    wait_for(lambda: all("kv" in replicated_spaces(n) for n in nodes), 30, "the space on every node")
    for i, n in enumerate(nodes):
        assert n.put(f"/v1/spaces/kv/keys/{key}{i}", i)[0] == 200
    wait_for(lambda: all(n.kv_get("kv", f"{key}{i}")[0] == 200 for n in nodes for i in range(len(nodes))), 30,
             "every write on every node")


@pytest.mark.parametrize("names_original", [True, False], ids=["peers-with-original", "peers-without"])
def test_a_restore_started_beside_its_running_node_stops_and_forks_nothing(tmp_path, procs, names_original):
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    a, b, c = nodes
    a.create_space("kv")
    writes_everywhere(nodes, "before")
    clone = twin_of(tmp_path, a, [a, b, c] if names_original else [b, c])
    procs.append(clone)
    for i in range(5):                            # rows of a's that the copy lacks
        assert a.put(f"/v1/spaces/kv/keys/after{i}", i)[0] == 200
    exits_as_twin(clone)
    addresses = {m["uuid"]: m["address"] for m in a.get("/v1/cluster")[1]["members"]}
    assert addresses[a.uuid()] == a.address, "the twin's greeting moved the member's address"
    writes_everywhere(nodes, "later")
    wait_for(lambda: vclocks_converged(nodes), 30, "converged")
    no_fork(nodes)
    one_row_per_lsn(*(n.data_dir for n in nodes + [clone]))     # the stopped twin's WAL too
    for n in nodes:
        assert n.get("/readyz")[0] == 200, n.name
    if not names_original:
        # fenced, it wrote nothing of its own: once the original is gone it takes its place
        assert a.stop() == 0
        clone.start()
        wait_for(lambda: clone.get("/readyz")[0] == 200, 60, "the restore serves in place of its node")
        live = [clone, b, c]
        writes_everywhere(live, "in-place")
        no_fork(live)


def test_the_younger_run_stops_whichever_started_in_place_of_the_other(tmp_path, procs):
    """The restore is started in place of its stopped node, as recovery does; then the old node
    is started again by mistake: the old node's process is now the younger, and it stops."""
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    a, b, c = nodes
    a.create_space("kv")
    writes_everywhere(nodes, "before")
    clone = twin_of(tmp_path, a, [b, c], "replacement")
    procs.append(clone)
    assert a.stop() == 0
    clone.start()
    live = [clone, b, c]
    wait_for(lambda: clone.get("/readyz")[0] == 200, 60, "the replacement catches up and serves")
    writes_everywhere(live, "replaced")
    exits_as_twin(a)
    writes_everywhere(live, "after")
    wait_for(lambda: vclocks_converged(live), 30, "converged")
    no_fork(live)
    one_row_per_lsn(*(n.data_dir for n in live + [a]))


def test_a_node_killed_and_started_again_at_once_is_not_its_own_twin(tmp_path, procs):
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    a, b, c = nodes
    a.create_space("kv")
    writes_everywhere(nodes, "before")
    for _ in range(3):
        a.kill9()
        a.start()
        wait_for(lambda: a.get("/readyz")[0] == 200, 30, "a serves again")
        assert a.proc.poll() is None and "another process with the uuid" not in a.log_text()
    writes_everywhere(nodes, "after")
    no_fork(nodes)


def test_a_copy_made_by_hand_that_met_its_node_never_serves_again(tmp_path, procs):
    """No fence: it may have written under the member's next lsns before it met its twin. Its dir
    keeps a note, and `replog serve` on it exits 2 naming it."""
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    a, b, c = nodes
    a.create_space("kv")
    writes_everywhere(nodes, "before")
    assert a.stop() == 0
    copy = ReplogProcess(tmp_path, "copy", peers=[a, b, c])
    procs.append(copy)
    shutil.copytree(a.data_dir, copy.data_dir)
    a.start()
    exits_as_twin(copy)
    assert os.path.exists(os.path.join(copy.data_dir, "twin-stopped"))
    copy.start(wait=False)
    wait_for(lambda: copy.proc.poll() is not None, 30, "the copy refuses to start")
    assert copy.proc.returncode == 2
    tail = copy.log_text().split(f"===== start #{copy.starts}")[-1]
    assert "replog: error: data_dir:" in tail and "younger of two processes" in tail, tail[-2000:]
    r = subprocess.run(REPLOG + ["admin", "inspect", copy.data_dir], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "twin stopped:" in r.stdout, r.stdout + r.stderr
    writes_everywhere(nodes, "after")
    no_fork(nodes)
