"""How long a mesh takes to follow a member again after it came back: a 3-node full mesh of
real processes; B is killed (-9), stays down --down-s (long enough for the others' reconnect
backoff to reach its cap), and is started again. Measured: from the moment B answers
/v1/health to the moment both A and C show their upstream to B as `follow` (polled every
20 ms). That is the time the others' appliers spend waiting out their backoff, plus the
handshake. With --baseline DIR the same runs from another checkout, alternating, so a change's
before and after come from one run on one machine.

    python -m bench.follow_again                                   # this checkout, 5 rounds
    python -m bench.follow_again --baseline /tmp/before --runs 2   # beside another checkout

Figures only: nothing here asserts on timing."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from bench import beside
from bench.procs import ReplogNode, wait_for

POLL_S = 0.02


def _follows(node: ReplogNode, address: str) -> bool:
    return any(u["address"] == address and u["status"] == "follow" for u in node.info()["upstreams"])


def one_run(workdir: str, prelude: str, rounds: int, down_s: float) -> tuple[list[float], float]:
    """The seconds from B healthy to A and C following it, per round; and the CPU the nodes used."""
    a, b, c = (ReplogNode(n, os.path.join(workdir, n), prelude=prelude) for n in "abc")
    nodes = [a, b, c]
    for n in nodes:
        n.peers = [m.address for m in nodes if m is not n]
    cpu = 0.0
    try:
        for n in nodes:                             # together: the lowest uuid founds the cluster
            n.start(wait=False)
        for n in nodes:
            n.wait_running()
        wait_for(lambda: all(_follows(n, m.address) for n in nodes for m in nodes if m is not n), 60,
                 "the full mesh following")
        out = []
        for _ in range(rounds):
            b.proc.send_signal(signal.SIGKILL)
            b.proc.wait(10)
            wait_for(lambda: not any(_follows(n, b.address) for n in (a, c)), 30, "A and C see B gone")
            time.sleep(down_s)                      # the others keep trying meanwhile: what is measured
            b.start(wait=False)
            wait_for(b.healthy, 60, "B healthy", POLL_S)
            t0 = time.monotonic()
            wait_for(lambda: all(_follows(n, b.address) for n in (a, c)), 60, "A and C follow B again", POLL_S)
            out.append(time.monotonic() - t0)
        cpu = sum(x or 0.0 for x in (n.cpu_s() for n in nodes))
        return out, cpu
    finally:
        for n in nodes:
            n.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.follow_again", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="kills and restarts of B per run (default 5)")
    p.add_argument("--down-s", type=float, default=8.0, help="seconds B stays down (default 8)")
    beside.add_arguments(p)
    a = p.parse_args(argv)
    if a.rounds < 1 or a.down_s < 0:
        p.error("--rounds must be at least 1, --down-s at least 0")
    systems = beside.trees(p, a)
    got = beside.run("bench.follow_again", a, systems,
                     lambda workdir, prelude: one_run(workdir, prelude, a.rounds, a.down_s))
    if got is None:
        return 1
    print(f"B down {a.down_s:.0f} s each time; seconds from B healthy to A and C following it:")
    beside.print_medians(got)
    return 0


if __name__ == "__main__":
    sys.exit(main())
