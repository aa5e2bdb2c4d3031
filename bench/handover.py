"""How long a lease node's orderly stop takes when its peers follow it: a 3-node lease cluster
(`identity = "lease"` on a file:// store) of real processes; one node takes --writes writes,
then SIGTERM, and the time to its exit is measured. The stop first waits until a peer has
acknowledged every row of its member (node/identity/lease_handover.py), so the figure is how
soon a follower acknowledges the last rows of a burst. A fresh cluster per round. With
--baseline DIR the same rounds from another checkout, alternating.

    python -m bench.handover                                   # this checkout, 5 rounds
    python -m bench.handover --baseline /tmp/before --runs 2   # beside another checkout

Figures only: nothing here asserts on timing."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from bench import beside
from bench.procs import BenchError, ReplogNode

NODES = 3
LEASE_S = 3.0


def one_round(workdir: str, prelude: str, writes: int) -> tuple[float, float]:
    """Seconds from SIGTERM to the exit of the node that took the writes; the CPU the nodes used."""
    flags = ["--identity", "lease", "--lease-store", f"file://{workdir}/leases",
             "--cluster-size", str(NODES), "--lease-duration-s", str(LEASE_S)]
    nodes = [ReplogNode(f"n{i + 1}", os.path.join(workdir, f"n{i + 1}"), extra=flags, prelude=prelude)
             for i in range(NODES)]
    for n in nodes:
        n.peers = [m.address for m in nodes if m is not n]
    try:
        for n in nodes:
            n.start(wait=False)
        for n in nodes:
            n.wait_running()
        leaving = nodes[0]
        leaving.create_space("kv")
        for i in range(writes):
            s, d = leaving.request("PUT", f"/v1/spaces/kv/keys/k{i}", {"i": i})
            if s not in (200, 201):
                raise BenchError(f"{leaving.name}: write {i} answered {s}: {d}")
        leaving_cpu = leaving.cpu_s() or 0.0          # up to the signal: its stop's own CPU is not counted
        t0 = time.monotonic()
        leaving.proc.send_signal(signal.SIGTERM)
        rc = leaving.proc.wait(30)
        took = time.monotonic() - t0
        if rc != 0:
            raise BenchError(f"{leaving.name} exited with {rc}:\n{leaving.log_tail()}")
        return took, leaving_cpu + sum(x or 0.0 for x in (n.cpu_s() for n in nodes[1:]))
    finally:
        for n in nodes:
            n.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.handover", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="fresh clusters per run and tree (default 5)")
    p.add_argument("--writes", type=int, default=50, help="writes the stopping node takes first (default 50)")
    beside.add_arguments(p)
    a = p.parse_args(argv)
    if a.rounds < 1 or a.writes < 1:
        p.error("--rounds and --writes must be at least 1")
    systems = beside.trees(p, a)

    def rounds(workdir: str, prelude: str) -> tuple[list[float], float]:
        out = [one_round(os.path.join(workdir, str(k)), prelude, a.writes) for k in range(a.rounds)]
        return [t for t, _ in out], sum(cpu for _, cpu in out)
    got = beside.run("bench.handover", a, systems, rounds, digits=3)
    if got is None:
        return 1
    print(f"{NODES} lease nodes, {a.writes} writes to one, then SIGTERM; seconds to its exit:")
    beside.print_medians(got, digits=3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
