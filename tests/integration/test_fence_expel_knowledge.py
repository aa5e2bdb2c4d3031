"""A fenced node counts a member's word only once the member knows of every expel the fence
relies on, on real processes (node/core/membership.py OwnRowsFence.unaware; the simulation's
scripted case is tests/sim/test_scenarios_expel.py). C loses its store while B and D are down;
A expels B; A stops; D starts, knowing nothing of the expel. Were D's first word enough, C would
lift while D, not knowing, could follow B and take a row of C's that B alone kept. C's greeting
states the expel (`expels_heard`), D expels B too before it answers or subscribes, and C counts
only the word D gives knowing. Ends with the oracles of tests/integration/oracles.py."""
from __future__ import annotations

import os
import shutil

from tests.integration.harness import mesh, wait_for
from tests.integration.oracles import Acked, acked_everywhere, log_since_last_start, no_fork, replicated_spaces
from tests.integration.test_membership_safety import write_answer


def _fence(node) -> dict:
    return node.info().get("own_rows_fence") or {}


def test_a_fenced_node_counts_a_members_word_only_once_it_knows_of_the_expel_the_fence_relies_on(tmp_path, procs):
    acked = Acked()
    a, b, c, d = mesh(tmp_path, 4)
    procs.extend([a, b, c, d])
    a.create_space("kv")
    wait_for(lambda: all("kv" in replicated_spaces(n) for n in (b, c, d)), 30, "space everywhere")
    for n in (a, b, c, d):
        acked.put(n, "kv", f"early-{n.name}", n.name)
    acked_everywhere([a, b, c, d], acked)
    bu, du = b.uuid(), d.uuid()
    assert d.stop() == 0 and b.stop() == 0

    c.kill9()                                         # C loses its store and WAL, keeps its identity
    shutil.rmtree(os.path.join(c.data_dir, "store"))
    shutil.rmtree(os.path.join(c.data_dir, "wal"))
    c.start(wait=False)
    wait_for(lambda: "kv" in replicated_spaces(c), 60, "C rejoined through A")
    wait_for(lambda: {bu, du} <= set(_fence(c).get("waiting_for", [])), 30, "C fenced, waiting for B and D")

    s, body = a.delete(f"/v1/cluster/{bu}")
    assert s == 200, (s, body)
    wait_for(lambda: _fence(c).get("waiting_for") == [du], 30, "C waits no more for B, expelled")
    assert a.stop() == 0                              # D can learn of the expel only from C now

    d.start()
    wait_for(lambda: not _fence(c), 30, "C's fence lifts on a word of D's that knows of B's expel")
    s, w = write_answer(c, "after-lift")
    assert s == 200, (s, w)
    assert d.cluster()[bu]["state"] == "expelled"    # D knew before its word counted
    assert f"expel {bu}" in log_since_last_start(d) and "heard from" in log_since_last_start(d)
    acked.writes[("kv", "after-lift")] = ("after-lift", c.uuid(), w["lsn"])
    assert c.cluster()[bu]["state"] == "expelled"    # C wrote the expel it heard at the lift

    a.start()
    acked_everywhere([a, c, d], acked, 60)
    no_fork([a, c, d])
