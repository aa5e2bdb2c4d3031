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
import shutil
import signal
import sys
import tempfile
import time

from bench.common import LoadWatch, machine, median, print_load, print_machine
from bench.links import baseline_prelude
from bench.procs import BenchError, ReplogNode, wait_for

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
    p.add_argument("--runs", type=int, default=1, help="runs per tree, alternating (default 1)")
    p.add_argument("--writes", type=int, default=50, help="writes the stopping node takes first (default 50)")
    p.add_argument("--baseline", metavar="DIR", default=None, help="another checkout to run beside this one")
    p.add_argument("--keep", action="store_true", help="keep the nodes' directories")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.runs < 1 or a.writes < 1:
        p.error("--rounds, --runs and --writes must be at least 1")
    if a.baseline and not os.path.isfile(os.path.join(a.baseline, "node", "__main__.py")):
        p.error(f"--baseline {a.baseline}: not a replog checkout (no node/__main__.py)")
    trees = [("replog", "")] + ([("replog-base", baseline_prelude(a.baseline))] if a.baseline else [])
    base = tempfile.mkdtemp(prefix="replog-handover-")
    print_machine(machine(base))
    watch = LoadWatch()
    got: dict[str, list[float]] = {name: [] for name, _ in trees}
    own_cpu = 0.0
    try:
        for r in range(a.runs):
            for name, prelude in trees:
                times = []
                for k in range(a.rounds):
                    took, cpu = one_round(os.path.join(base, f"{name}-{r}-{k}"), prelude, a.writes)
                    times.append(took)
                    own_cpu += cpu
                got[name] += times
                print(f"run {r + 1} {name:12s} " + " ".join(f"{t:.3f}" for t in times), flush=True)
    except BenchError as e:
        print(f"bench.handover: {e}", file=sys.stderr)
        return 1
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    print_load(watch.stop(own_cpu), os.cpu_count() or 1)
    print(f"{NODES} lease nodes, {a.writes} writes to one, then SIGTERM; seconds to its exit:")
    print(f"{'system':12s} {'rounds':>6s} {'median':>7s} {'max':>6s}")
    for name, xs in got.items():
        print(f"{name:12s} {len(xs):6d} {median(xs):7.3f} {max(xs):6.3f}")
    if a.baseline:
        print(f"ratio of medians replog / replog-base: {median(got['replog']) / median(got['replog-base']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
