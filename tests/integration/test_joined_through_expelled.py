"""A node that joined through a member expelled meanwhile, on real processes (the simulation's
full-mix seed 13943 found a stall on this path). C expels A while A is cut off; A, not knowing,
takes a write and registers F, whose snapshot so holds A's rows past the bound C stated. F hears
of the expel and raises the bound to what it holds (node/cluster_space/resolver.py: the bound
converges on the most any node holds), so the members then want those rows, which F's WAL does
not have (they came in its snapshot): from A while A serves them, or else by rebuilding from F's
snapshot. Either way every node ends with the same bound, A's rows up to it and F's writes. A
relay wants no row of an expelled member past the bound from a subscriber (node/core/link/relay.py
`behind`)."""
from __future__ import annotations

import pytest

from tests.integration.harness import ReplogProcess, mesh, wait_for
from tests.integration.oracles import expel_bound, readable, replicated_spaces, upstream


@pytest.mark.parametrize("a_serves", [True, False], ids=["the-expelled-member-serves", "it-is-gone"])
def test_a_node_that_joined_through_a_member_expelled_meanwhile_ends_with_the_members_bound_and_rows(
        tmp_path, procs, a_serves):
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    a, b, c = nodes
    a.create_space("kv")
    a.kv_put("kv", "early", 1)
    wait_for(lambda: readable(b, "early") and readable(c, "early"), 20, "A's write on B and C")
    au = a.uuid()

    a.set_peers([])                                   # A is cut off: it follows nobody, nobody follows it
    b.set_peers([c])
    c.set_peers([b])
    wait_for(lambda: not upstream(b, a.address) and not upstream(c, a.address), 20, "B and C stopped following A")
    s, d = c.delete(f"/v1/cluster/{au}")
    assert s == 200, (s, d)
    wait_for(lambda: expel_bound(b, au) is not None, 20, "A expelled on B")
    stated = expel_bound(c, au)
    assert expel_bound(b, au) == stated

    a_after = a.kv_put("kv", "a-after-expel", 1)      # A has not heard: its rows past the stated bound
    assert a_after["lsn"] > stated, (a_after, stated)
    f = ReplogProcess(tmp_path, "f", peers=[a])
    procs.append(f)
    f.start(wait=False)
    wait_for(lambda: "kv" in replicated_spaces(f), 60, "F joined through A")
    assert readable(f, "a-after-expel")              # in F's snapshot
    held = f.cluster()[au]["lsn"]                     # F holds A's rows up to its registration
    assert held > stated
    if not a_serves:
        assert a.stop() == 0
    f_lsn = f.kv_put("kv", "f-1", 1)["lsn"]

    f.set_peers([b, c])
    b.set_peers([c, f])
    c.set_peers([b, f])
    if a_serves:
        wait_for(lambda: expel_bound(f, au) == held, 30, "F heard of the expel and raised the bound to what it holds")
        wait_for(lambda: expel_bound(b, au) == held and expel_bound(c, au) == held, 30, "B and C took F's bound")
        # A serves its rows up to the bound (an expelled member still serves subscribers). A member
        # F told to rejoin may be rebuilding from F's snapshot meanwhile (the other way to them),
        # and takes no peer change until it is done (503 not_ready)
        for n, peers in ((b, [c, f, a]), (c, [b, f, a])):
            wait_for(lambda: n.put("/v1/admin/peers", {"peers": [p.address for p in peers]})[0] == 200, 60,
                     f"{n.name} takes A as a peer")
    for n in (b, c):
        wait_for(lambda: readable(n, "a-after-expel") and readable(n, "f-1"), 60, f"A's and F's rows on {n.name}")
        assert n.cluster()[au]["lsn"] == held and n.cluster()[f.uuid()]["lsn"] >= f_lsn
    assert expel_bound(b, au) == expel_bound(c, au) == expel_bound(f, au) == held
    if not a_serves:
        rebuilt = f"rebuilding the store from {f.address}'s snapshot"
        assert rebuilt in b.log_text() or rebuilt in c.log_text()
    f.kv_put("kv", "f-2", 2)
    wait_for(lambda: readable(b, "f-2") and readable(c, "f-2"), 30, "F's next write on B and C")
    for n in (b, c):     # a link F told to rejoin tries again every rejoin_retry_s, and F serves it now
        wait_for(lambda: upstream(n, f.address).get("status") == "follow", 30, f"{n.name} follows F")
