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


def own_lsn(c: Cluster, holder: str, origin: str) -> int:
    """How many of origin's rows holder has applied."""
    return c.nodes[holder].core.vclock_by_uuid().get(c.nodes[origin].uuid, 0)


def flushed(c: Cluster, name: str) -> int:
    """Run until `name` has written and synced all it submitted; its own lsn then."""
    n = c.nodes[name]
    c.run_until(lambda: not n.queue and len(n.wal) == n.durable, what=f"{name}'s journal drained")
    return own_lsn(c, name, name)
