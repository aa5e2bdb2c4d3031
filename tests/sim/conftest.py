"""Fixtures of the simulation tests: a Cluster whose failures print a one-line repro."""
from __future__ import annotations

import logging

import pytest

from tests.sim.harness import Cluster


def pytest_configure(config):
    config.addinivalue_line("markers", "sim_workaround(*names): the scenario steps around these known shell "
                            "bugs (tests/sim/workload.py WORKAROUNDS)")


@pytest.fixture(autouse=True)
def _quiet_core_logs():
    # The core logs every registration; thousands of simulated runs would flood the capture.
    logging.getLogger("replog").setLevel(logging.CRITICAL)
    yield
    logging.getLogger("replog").setLevel(logging.NOTSET)


@pytest.fixture
def make_cluster(request):
    """make_cluster(seed) -> a calm Cluster; its failures name the seed and the test to re-run."""
    def make(seed: int) -> Cluster:
        repro = f"cd /work/main && .venv/bin/python -m pytest -q '{request.node.nodeid}'"
        request.node.sim_repro = f"seed {seed}; repro: {repro}"
        c = Cluster(seed, repro=repro)
        marker = request.node.get_closest_marker("sim_workaround")
        if marker is not None:       # a known shell bug this scenario steps around (test_known_bugs.py)
            c.workarounds = set(marker.args)
        return c
    return make


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A plain assert in a scenario fails without the seed: add it to the report."""
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and getattr(item, "sim_repro", None):
        rep.sections.append(("simulation", item.sim_repro))
