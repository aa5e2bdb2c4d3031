"""Soak the deterministic simulation over a seed range: every seed's run, its failures listed
with the one command that replays each. Outside the default test run (tests/sim/test_seeded.py
runs the 1000 default seeds there); this is for ranges no run has tried yet, where the mixes
that combine every fault find what the default mix does not (docs/testing.md).

    python -m tools.soak --seeds 200000-206000 --mix full+replace      # one process per core
    python -m tools.soak --seeds 0-500 --mix default --jobs 1

Each job runs its share of the seeds in order in one process, with the collector off during a
run (as tests/sim/conftest.py does), and prints progress every 500 seeds. Exit 1 if a seed
failed, 0 if none did."""
from __future__ import annotations

import argparse
import gc
import logging
import multiprocessing
import os
import sys
import time

MIXES = ("default", "full", "full+anon", "full+replace")


def _seeds(text: str) -> range:
    lo, sep, hi = text.partition("-")
    try:
        r = range(int(lo), int(hi)) if sep else range(int(lo), int(lo) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are LO-HI (HI excluded) or one seed, not {text!r}") from None
    if not r or r.start < 0:
        raise argparse.ArgumentTypeError(f"an empty or negative range: {text!r}")
    return r


def repro(seed: int, mix: str) -> str:
    env = "" if mix == "default" else f"REPLOG_SIM_MIX={mix} "
    return f"{env}REPLOG_SIM_SEED={seed} .venv/bin/python -m pytest -q -s tests/sim/test_seeded.py"


def _run(args: tuple[list[int], str, int]) -> list[tuple[int, str]]:
    """One job: its seeds in order; (seed, the failure's first line) for each that failed."""
    seeds, mix, job = args
    logging.getLogger("replog").setLevel(logging.CRITICAL)
    from tests.sim.workload import run_seed
    kw = dict(full=mix != "default", anon_crash=mix in ("full+anon", "full+replace"),
              anon_replace=mix == "full+replace")
    gc.collect()
    gc.freeze()
    failed, t0 = [], time.monotonic()
    for i, seed in enumerate(seeds):
        gc.disable()
        try:
            run_seed(seed, **kw)
        except Exception as e:  # noqa: BLE001 - a failing seed is what a soak is for
            line = (str(e).splitlines() or [type(e).__name__])[0]
            failed.append((seed, f"{type(e).__name__}: {line[:300]}"))
            print(f"FAIL {seed} {failed[-1][1]}", flush=True)
        finally:
            gc.enable()
            gc.collect(0)
        if (i + 1) % 500 == 0:
            print(f"job {job}: {i + 1}/{len(seeds)} seeds, {time.monotonic() - t0:.0f} s", flush=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=_seeds, required=True, help="LO-HI (HI excluded), or one seed")
    p.add_argument("--mix", choices=MIXES, default="full+replace", help="the fault mix (default full+replace)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: one per core)")
    a = p.parse_args(argv)
    if a.jobs < 1:
        p.error("--jobs must be at least 1")
    seeds = list(a.seeds)
    jobs = min(a.jobs, len(seeds))
    shares = [(seeds[j::jobs], a.mix, j) for j in range(jobs)]
    t0 = time.monotonic()
    # always in processes of their own: a job quiets the node's logs and freezes the collector,
    # which must not leak into a caller (a test)
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        results = pool.map(_run, shares)
    failed = sorted(f for r in results for f in r)
    print(f"{len(seeds)} seeds of mix {a.mix} in {time.monotonic() - t0:.0f} s: {len(failed)} failed")
    for seed, why in failed:
        print(f"  seed {seed}: {why}\n    repro: {repro(seed, a.mix)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
