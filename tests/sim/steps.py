"""Steps the scripted simulation scenarios share (tests/sim/test_scenarios_membership.py,
tests/sim/test_fixed_bugs.py): forming a cluster, waiting for a node, reading its position."""
from __future__ import annotations

from tests.sim.harness import Cluster


def ready(c: Cluster, name: str) -> bool:
    return c.nodes[name].ready and not c.nodes[name].proc


def form(c: Cluster, *names: str) -> None:
    """The first name bootstraps; the others join through it, one at a time, calmly (without
    the mesh, each then follows the first)."""
    for n in names:
        if n not in c.nodes:
            c.add_node(n)
    c.bootstrap(names[0])
    c.run_until_quiet()
    for n in names[1:]:
        c.join(n, via=names[0])
        c.run_until(lambda: ready(c, n), what=f"{n} joined")
        if not c.mesh:
            c.configure_peers(n, [names[0]])
        c.run_until_quiet()


def a_and_its_follower(c: Cluster) -> None:
    """A, B and C formed; R, an anonymous replica, follows A alone."""
    form(c, "A", "B", "C")
    c.add_node("R", anon=True)
    c.fetch_anon("R", via="A")
    c.run_until(lambda: ready(c, "R"), what="R fetched")
    c.configure_peers("R", ["A"])
    c.run_until_quiet()


def rows_only_r_has(c: Cluster) -> int:
    """A, cut off from B and C, writes three rows; R takes them. A's own lsn then."""
    c.cut("A", "B")
    c.cut("A", "C")
    for i in range(3):
        assert c.put("A", f"a{i}")
        c.run(1)
    want = flushed(c, "A")
    c.run_until(lambda: own_lsn(c, "R", "A") == want, what="R holds A's rows")
    assert own_lsn(c, "B", "A") < want and own_lsn(c, "C", "A") < want
    return want


def own_lsn(c: Cluster, holder: str, origin: str) -> int:
    """How many of origin's rows holder has applied."""
    return c.nodes[holder].core.vclock_by_uuid().get(c.nodes[origin].uuid, 0)


def flushed(c: Cluster, name: str) -> int:
    """Run until `name` has written and synced all it submitted; its own lsn then."""
    n = c.nodes[name]
    c.run_until(lambda: not n.queue and len(n.wal) == n.durable, what=f"{name}'s journal drained")
    return own_lsn(c, name, name)
