"""Rounds of one scenario in this checkout and, with --baseline DIR, in another beside it,
alternating run by run, so a change's before and after come from one run on one machine:
the shared frame of bench/follow_again.py and bench/handover.py (the per-round timing is
theirs). Figures only."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import Callable

from bench.common import LoadWatch, machine, median, print_load, print_machine
from bench.links import baseline_prelude
from bench.procs import BenchError

# (work dir, prelude) -> (seconds per round, CPU seconds the nodes used)
OneRun = Callable[[str, str], tuple[list[float], float]]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=1, help="runs per tree, alternating (default 1)")
    p.add_argument("--baseline", metavar="DIR", default=None, help="another checkout to run beside this one")
    p.add_argument("--keep", action="store_true", help="keep the nodes' directories")


def trees(p: argparse.ArgumentParser, a: argparse.Namespace) -> list[tuple[str, str]]:
    """(system, prelude) per tree to run; a bad --runs or --baseline is the parser's error (exit 2)."""
    if a.runs < 1:
        p.error("--runs must be at least 1")
    if a.baseline and not os.path.isfile(os.path.join(a.baseline, "node", "__main__.py")):
        p.error(f"--baseline {a.baseline}: not a replog checkout (no node/__main__.py)")
    return [("replog", "")] + ([("replog-base", baseline_prelude(a.baseline))] if a.baseline else [])


def run(prog: str, a: argparse.Namespace, systems: list[tuple[str, str]], one_run: OneRun,
        digits: int = 2) -> dict[str, list[float]] | None:
    """Every run of every tree, alternating; prints each run's rounds and the load line. None
    (after saying why) if a run failed."""
    base = tempfile.mkdtemp(prefix=f"replog-{prog.rsplit('.', 1)[-1].replace('_', '-')}-")
    print_machine(machine(base))
    watch = LoadWatch()
    got: dict[str, list[float]] = {name: [] for name, _ in systems}
    own_cpu = 0.0
    try:
        for r in range(a.runs):
            for name, prelude in systems:
                times, cpu = one_run(os.path.join(base, f"{name}-{r}"), prelude)
                own_cpu += cpu
                got[name] += times
                print(f"run {r + 1} {name:12s} " + " ".join(f"{t:.{digits}f}" for t in times), flush=True)
    except BenchError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    print_load(watch.stop(own_cpu), os.cpu_count() or 1)
    return got


def print_medians(got: dict[str, list[float]], digits: int = 2) -> None:
    print(f"{'system':12s} {'rounds':>6s} {'median':>7s} {'max':>6s}")
    for name, xs in got.items():
        print(f"{name:12s} {len(xs):6d} {median(xs):7.{digits}f} {max(xs):6.{digits}f}")
    if "replog-base" in got:
        print(f"ratio of medians replog / replog-base: {median(got['replog']) / median(got['replog-base']):.2f}")
