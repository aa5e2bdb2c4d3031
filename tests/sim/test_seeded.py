"""Seeded simulation runs: random schedules of writes, concurrent joins, crashes and power
losses, lost stores, partitions, drops, peer-list changes, WAL collection, expels, members
down for good and anonymous replicas over 5-8 nodes (tests/sim/workload.py), with every
invariant of tests/sim/checkers.py checked after every tick, and convergence and every
acknowledged write demanded at the end (tests/sim/liveness.py).

Seeds: the default range below; `REPLOG_SIM_SEEDS=LO-HI` runs seeds LO..HI-1 instead (a
soak, e.g. "0-5000"); `REPLOG_SIM_SEED=N` runs seed N alone and prints its trace (use
`-s`); `REPLOG_SIM_MIX=full` also combines the faults whose combinations hit known bugs (see
tests/sim/test_known_bugs.py). A failure names its seed and the one command that replays it.
"""
from __future__ import annotations

import os

import pytest

from tests.sim.workload import run_seed

DEFAULT_SEEDS = "0-1000"


def _seeds() -> list[int]:
    one = os.environ.get("REPLOG_SIM_SEED")
    if one:
        return [int(one)]
    lo, _, hi = os.environ.get("REPLOG_SIM_SEEDS", DEFAULT_SEEDS).partition("-")
    return list(range(int(lo), int(hi))) if hi else [int(lo)]


def _repro(seed: int) -> str:
    mix = "REPLOG_SIM_MIX=full " if os.environ.get("REPLOG_SIM_MIX") == "full" else ""
    return f"cd /work/main && {mix}REPLOG_SIM_SEED={seed} .venv/bin/python -m pytest -q -s tests/sim/test_seeded.py"


FULL = os.environ.get("REPLOG_SIM_MIX") == "full"


@pytest.mark.parametrize("seed", _seeds(), ids=lambda s: f"seed{s}")
def test_seeded_run_keeps_every_invariant_and_converges(seed):
    run_seed(seed, verbose=bool(os.environ.get("REPLOG_SIM_SEED")), repro=_repro(seed), full=FULL)


def test_a_seed_replays_the_same_run():
    a, b = run_seed(3, repro=_repro(3)), run_seed(3, repro=_repro(3))
    assert (a.now, a.stats, list(a.trace)) == (b.now, b.stats, list(b.trace))
    assert [n.wal for n in a.nodes.values()] == [n.wal for n in b.nodes.values()]


def test_the_workload_exercises_what_the_checkers_watch():
    """The seeded runs are not vacuous: across a few seeds, joins clash on ids and get
    remapped, crashes lose unsynced entries, links break, members are expelled and
    anonymous replicas fetch and register; and issue 16's faults happen: stores are lost and
    joined again fenced, power losses fence wal_mode write nodes, fences lift, refused writes,
    WAL entries are collected, relays answer need_rejoin and nodes rebuild, peer lists change
    with second spellings and the node itself refused, and acknowledged writes are checked."""
    total: dict[str, int] = {}
    for seed in range(40):
        for k, v in run_seed(seed, repro=_repro(seed)).stats.items():
            total[k] = total.get(k, 0) + v
    for what in ("joins", "remapped_members", "crashes", "lost_entries", "link_breaks", "writes",
                 "refused_expelled", "anon_fetches", "anon_registrations",
                 "disks_lost", "fenced_joins", "fenced_restarts", "fences_lifted", "refused_fenced_writes",
                 "checkpoints", "wal_entries_collected", "refused_need_rejoin", "rejoins", "peer_changes",
                 "refused_duplicate", "refused_self", "acked_writes_checked"):
        assert total.get(what, 0) > 0, what
