"""Faults at random on lease-identity containers, more containers than slots (kills, orderly
stops with their hand-over, pauses short and past the lease, cut links, loops stalled past the
lease, restarts on the old disk or an empty one), and the oracles after healing
(tests/integration/lease_nemesis.py). The default run takes one seed for `SECONDS`;
`REPLOG_LEASE_NEMESIS_SEED` and `REPLOG_LEASE_NEMESIS_S` choose others (a soak:
`python -m tests.integration.lease_nemesis --seconds 300 --seed 7`)."""
from __future__ import annotations

import os

from tests.integration import lease_nemesis

SECONDS = float(os.environ.get("REPLOG_LEASE_NEMESIS_S", "20"))
SEED = int(os.environ.get("REPLOG_LEASE_NEMESIS_SEED", "1"))
FIRST = ("zombie", "stop", "kill", "cut", "pause")     # each tried until it happens, whatever the timing


def test_every_acknowledged_write_survives_unless_its_containers_disk_went_and_no_row_forks(tmp_path):
    nem = lease_nemesis.run(tmp_path, SEED, SECONDS, first=FIRST)
    kinds = {line.split()[1] for line in nem.history}
    assert set(FIRST) <= kinds, nem.history                     # the schedule did fault
    assert any(" ended: lease lost" in line for line in nem.history), nem.history   # a holder lost its slot
    assert len(nem.acked.writes) > 1000, len(nem.acked.writes)  # and the writers wrote under it
    # lease_nemesis.run checked the oracles and every container's log
