"""Faults at random on real processes (kills, pauses, cuts, lost stores, restores from hot
backups, torn writes at the end of a WAL, a master seeded from another's backup, a master lost
for good and replaced from its backup), with WAL
collection running all the time, and the oracles after healing (tests/integration/nemesis.py).
The default run takes one seed for `SECONDS`; `REPLOG_NEMESIS_SEED` and `REPLOG_NEMESIS_S`
choose others (a soak: `python -m tests.integration.nemesis --seconds 600 --seed 7`)."""
from __future__ import annotations

import os

from tests.integration import nemesis

SECONDS = float(os.environ.get("REPLOG_NEMESIS_S", "30"))
SEED = int(os.environ.get("REPLOG_NEMESIS_SEED", "1"))


# The default run's 30 s draws restores, torn writes and masters seeded from a backup more often
# than a long run does (tests/integration/nemesis.py WEIGHTS), and tries every kind the test
# asserts first, each until it happens (a replace needs every other master up, a restore a backup), so that
# each comes up in it whatever the timing.
WEIGHTS = {"backup": 1, "restore": 6, "tear": 4, "seed": 3}
FIRST = ("replace", "restore", "seed", "tear", "cut", "pause", "kill")


def test_every_acknowledged_write_survives_random_kills_pauses_cuts_and_lost_stores(tmp_path):
    nem = nemesis.run(tmp_path, SEED, SECONDS, weights=WEIGHTS, first=FIRST)
    kinds = {line.split()[1] for line in nem.history}
    assert {"kill", "pause", "cut", "restore", "tear", "seed", "replace"} <= kinds, nem.history   # the schedule did fault
    assert len(nem.acked.writes) > 1000, len(nem.acked.writes)     # and the writers wrote under it
    # nemesis.run checked the oracles, and every node's log (Nemesis.logs_clean)
