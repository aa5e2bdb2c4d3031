"""Per-seed fingerprints of the deterministic simulation, to show a change keeps every seed's run.

A speed-up of the simulation (tests/sim/) or of the core it runs must not change any seed's
schedule. This records, for each seed, one digest of:
- the final simulated time, the stats, and the whole trace (every `Cluster.log` line, not
  only the last TRACE_LINES_MAX kept for a failure);
- the random stream: its state after every tick, chained (a draw added, dropped or moved
  anywhere shows at the tick it happened) and at the end;
- every node's WAL (its entries, durable / base / collected positions, gc_vclock, holds),
  its store state (spaces, data, `_cluster`, knowledge, vclock), its meta and its core's
  vclocks; a failing seed records its failure message instead.

Usage (from the tree to measure; one process per job, seeds in order in each):
    python -m tools.simtrace record OUT [--seeds 0-1000] [--full] [--jobs 2]
    python -m tools.simtrace compare A B     # exit 1 and the seeds that differ, if any
With --verbose-dir DIR, `record` also writes each seed's fingerprint text to DIR/<seed>.txt
(so two runs that differ can be diffed line by line). The "before" side is recorded in a copy of
the base commit's tree with this file added (the native scanner copied in too), e.g.
    git archive BASE node tests | tar -x -C /tmp/base && mkdir /tmp/base/tools &&
    cp tools/__init__.py tools/simtrace.py /tmp/base/tools/ && cp node/core/_rowscan*.so /tmp/base/node/core/
    (cd /tmp/base && python -m tools.simtrace record /tmp/before.txt) && python -m tools.simtrace record /tmp/after.txt
Session 31 (bench/RESULTS.md) compared the 1000 default seeds and full-mix seeds 0-300 this way.
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import logging
import multiprocessing
import sys
from typing import Any


def _canon(x: Any) -> Any:
    """A form of `x` whose repr does not depend on hash order (sets sorted)."""
    if isinstance(x, (set, frozenset)):
        return ("set", sorted(repr(_canon(v)) for v in x))
    if isinstance(x, dict):
        return {k: _canon(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)) and type(x) in (list, tuple):
        return type(x)(_canon(v) for v in x)
    return x


def _node_lines(n: Any) -> list[str]:
    st = n.state
    core = n.core
    out = [f"node {n.name} {n.uuid} up={n.up} retired={n.retired} status={n.status} mode={n.wal_mode}",
           f"  wal durable={n.durable} base_pos={n.base_pos} wal_gc={n.wal_gc} gc_vclock={n.gc_vclock}",
           f"  wal {n.wal!r}",
           f"  queue {n.queue!r}",
           f"  holds {_canon({u: (h.vclock, h.seen_s, h.anon) for u, h in n.holds.items()})!r}",
           f"  holds_disk {_canon({u: (h.vclock, h.seen_s, h.anon) for u, h in n.holds_disk.items()})!r}",
           f"  meta {_canon(n.meta)!r} registered={_canon(n.registered)!r} peers={n.peers!r}"]
    if st is not None:
        out += [f"  spaces {st.spaces!r} vclock {st.vclock!r}",
                f"  data {st.data!r}",
                f"  table {[(m.uuid, m.id, m.address, m.state, m.lsn) for m in st.table.members()]!r}",
                f"  knowledge {sorted(st.knowledge.items())!r}"]
    if core is not None:
        out.append(f"  core id={core.self_id} vclock={core.vclock!r} claimed={core.claimed!r} "
                   f"fence={core.fence is not None}")
    return out


def fingerprint(seed: int, full: bool) -> str:
    """The fingerprint text of one seed's run (run as tests/sim/conftest.py runs it: no
    collector pass during the run)."""
    from tests.sim import harness
    from tests.sim.workload import run_seed

    harness.TRACE_LINES_MAX = None          # keep every trace line (Cluster reads it at build)
    chain = hashlib.sha256()
    ticks = 0
    orig_tick = harness.Cluster.tick

    def tick(self: Any) -> None:            # the random stream's state after each tick, chained
        nonlocal ticks
        orig_tick(self)
        ticks += 1
        chain.update(repr((self.now, hash(self.rng.getstate()[1]))).encode())   # (ints: no hash seed)

    harness.Cluster.tick = tick
    logging.getLogger("replog").setLevel(logging.CRITICAL)    # as tests/sim/conftest.py
    gc.disable()
    try:
        c = run_seed(seed, repro="", full=full)
        lines = [f"seed {seed} now={c.now} ticks={ticks} rngchain={chain.hexdigest()}",
                 f"rng_end {hashlib.sha256(repr(c.rng.getstate()).encode()).hexdigest()}",
                 f"stats {sorted(c.stats.items())!r}"]
        lines += [f"trace {t}" for t in c.trace]
        for n in c.nodes.values():
            lines += _node_lines(n)
    except harness.SimFailure as e:
        lines = [f"seed {seed} FAIL ticks={ticks} rngchain={chain.hexdigest()}", str(e)]
    finally:
        harness.Cluster.tick = orig_tick
        harness.TRACE_LINES_MAX = 60
        gc.enable()
        gc.collect(0)
    return "\n".join(lines) + "\n"


def _work(args: tuple[list[int], bool, str | None]) -> list[tuple[int, str]]:
    seeds, full, vdir = args
    sys.setrecursionlimit(10000)
    out = []
    for s in seeds:
        text = fingerprint(s, full)
        if vdir:
            with open(f"{vdir}/{s}.txt", "w") as f:
                f.write(text)
        out.append((s, hashlib.sha256(text.encode()).hexdigest()[:24]))
    return out


def record(path: str, seeds: list[int], full: bool, jobs: int, vdir: str | None) -> None:
    chunks = [seeds[i * len(seeds) // jobs:(i + 1) * len(seeds) // jobs] for i in range(jobs)]
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        parts = pool.map(_work, [(ch, full, vdir) for ch in chunks])
    with open(path, "w") as f:
        for part in parts:
            for s, d in part:
                f.write(f"{s} {d}\n")
    print(f"{path}: {sum(len(p) for p in parts)} seeds ({'full mix' if full else 'default mix'})")


def compare(a: str, b: str) -> int:
    da = dict(line.split() for line in open(a))
    db = dict(line.split() for line in open(b))
    differ = sorted((int(s) for s in da.keys() & db.keys() if da[s] != db[s]))
    missing = sorted(int(s) for s in da.keys() ^ db.keys())
    print(f"{len(da.keys() & db.keys())} seeds in both, {len(differ)} differ, {len(missing)} in one only")
    if differ:
        print("differ:", " ".join(map(str, differ[:50])))
    if missing:
        print("in one only:", " ".join(map(str, missing[:50])))
    return 1 if differ or missing else 0


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m tools.simtrace")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out")
    r.add_argument("--seeds", default="0-1000", help="LO-HI: seeds LO..HI-1")
    r.add_argument("--full", action="store_true", help="REPLOG_SIM_MIX=full's schedule")
    r.add_argument("--jobs", type=int, default=2)
    r.add_argument("--verbose-dir", default=None)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = p.parse_args()
    if args.cmd == "compare":
        return compare(args.a, args.b)
    lo, _, hi = args.seeds.partition("-")
    seeds = list(range(int(lo), int(hi))) if hi else [int(lo)]
    record(args.out, seeds, args.full, args.jobs, args.verbose_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
