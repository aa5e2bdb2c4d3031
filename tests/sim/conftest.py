"""Fixtures of the simulation tests: a Cluster whose failures print a one-line repro."""
from __future__ import annotations

import logging

import pytest

from tests.sim.harness import Cluster


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
        return Cluster(seed, repro=repro)
    return make


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A plain assert in a scenario fails without the seed: add it to the report."""
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and getattr(item, "sim_repro", None):
        rep.sections.append(("simulation", item.sim_repro))
