"""Two nodes that each hold an expelled member's rows in their snapshot only, on real processes
(the simulation's full+anon seed 16768). A expels B and C while both are cut off; B, not
knowing, takes a write and registers F, and C likewise E: F's snapshot holds B's row that
nobody else has, E's holds C's. B and C then stop for good. E and F each lack a row that lives
in the other's snapshot only, and hold one the other lacks: neither snapshot covers the other,
so neither can rejoin (A may rebuild from one of them, and then lacks the other's row). The links once stayed in `need_rejoin` for ever, and what E
and F wrote afterwards reached nobody. Now each rejoin, finding no donor, goes without the
expelled member's rows it lacks (`/v1/info` `rejoin.going_without`), each SUBSCRIBE says so,
and the relays serve the rest: E's and F's writes reach every node (docs/replication.md,
"A rejoin discards nothing")."""
from __future__ import annotations

from tests.integration.harness import ReplogProcess, mesh, wait_for
from tests.integration.oracles import expel_bound, readable, start_joiner, upstream


def _write(node: ReplogProcess, key: str) -> None:
    """A write, once the node takes writes: a rejoin attempt that waits for a donor to receive
    this node's rows pauses them (503) for at most rejoin_cover_wait_s."""
    wait_for(lambda: node.put(f"/v1/spaces/kv/keys/{key}", 1)[0] == 200, 30, f"{node.name} takes a write")


def _going_without(node: ReplogProcess) -> dict:
    return (node.info().get("rejoin") or {}).get("going_without") or {}


def _each_row_or_going_without(a, e, f, bu: str, cu: str) -> None:
    wait_for(lambda: all(readable(n, key) or x in _going_without(n)
                         for n in (a, e, f) for x, key in ((bu, "b-after-expel"), (cu, "c-after-expel"))),
             60, "each node goes without the rows no donor could give")


def test_rows_that_live_in_two_snapshots_only_do_not_stop_the_others_from_flowing(tmp_path, procs):
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    a, b, c = nodes
    a.create_space("kv")
    a.kv_put("kv", "early", 1)
    wait_for(lambda: readable(b, "early") and readable(c, "early"), 20, "A's write on B and C")
    bu, cu = b.uuid(), c.uuid()

    for n in (a, b, c):                   # each cut off from the others
        n.set_peers([])
    wait_for(lambda: not any(upstream(x, y.address) for x in (a, b, c) for y in (a, b, c)), 20, "every link gone")
    for gone in (bu, cu):
        s, d = a.delete(f"/v1/cluster/{gone}")
        assert s == 200, (s, d)

    b.kv_put("kv", "b-after-expel", 1)    # B and C have not heard: rows past the bounds A stated
    c.kv_put("kv", "c-after-expel", 1)
    f = start_joiner(tmp_path, procs, "f", b)
    e = start_joiner(tmp_path, procs, "e", c)
    assert readable(f, "b-after-expel") and not readable(f, "c-after-expel")    # in F's snapshot
    assert readable(e, "c-after-expel") and not readable(e, "b-after-expel")    # in E's
    assert b.stop() == 0 and c.stop() == 0                                         # gone for good

    for n, peers in ((a, [e, f]), (e, [a, f]), (f, [a, e])):
        n.set_peers(peers)
    wait_for(lambda: all(expel_bound(n, bu) is not None and expel_bound(n, cu) is not None for n in (a, e, f)), 60,
             "E and F heard of both expels")
    # Each node ends with each row or going without it: A may rebuild from E's snapshot or F's
    # first (whichever told it to rejoin first covers it then), but nobody can have both rows
    _each_row_or_going_without(a, e, f, bu, cu)
    assert bu in _going_without(e) and cu in _going_without(f)
    _write(e, "e-1")
    _write(f, "f-1")
    for n in (a, e, f):
        wait_for(lambda: readable(n, "e-1") and readable(n, "f-1"), 60, f"E's and F's writes on {n.name}")
    for n, others in ((a, (e, f)), (e, (a, f)), (f, (a, e))):
        for o in others:
            wait_for(lambda: upstream(n, o.address).get("status") == "follow", 30, f"{n.name} follows {o.name}")
    # the two rows stay where they are, in snapshots (the limitation the docs name)
    assert not any(readable(n, "b-after-expel") and readable(n, "c-after-expel") for n in (a, e, f))
    assert not readable(e, "b-after-expel") and not readable(f, "c-after-expel")
    assert expel_bound(a, bu) == expel_bound(e, bu) == expel_bound(f, bu) and expel_bound(a, cu) == expel_bound(e, cu) == expel_bound(f, cu)
    for n in (a, e, f):                   # every node restarts, and its links serve again
        assert n.stop() == 0
    for n, peers in ((a, [e, f]), (e, [a, f]), (f, [a, e])):
        n.start()
        n.set_peers(peers)                # (its command line names B and C, or the node it joined through)
    _write(e, "e-2")
    _write(f, "f-2")
    for n in (a, e, f):
        wait_for(lambda: readable(n, "e-2") and readable(n, "f-2"), 60, f"E's and F's writes after the restart on {n.name}")
    _each_row_or_going_without(a, e, f, bu, cu)      # (the rejoin's state is not kept: it is found again)
