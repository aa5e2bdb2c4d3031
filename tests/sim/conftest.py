"""Fixtures of the simulation tests: a Cluster whose failures print a one-line repro."""
from __future__ import annotations

import gc
import logging

import pytest

from tests.sim.harness import Cluster


@pytest.fixture(autouse=True)
def _quiet_core_logs():
    # The core logs every registration; thousands of simulated runs would flood the capture.
    logging.getLogger("replog").setLevel(logging.CRITICAL)
    yield
    logging.getLogger("replog").setLevel(logging.NOTSET)


@pytest.fixture(autouse=True)
def _one_collection_per_run():
    """A simulated cluster is one object graph with cycles (its nodes, checker and rejoiners
    point back at it) that lives for the whole run. The collector's passes during a run find
    nothing to free in it, yet traverse it again in each older generation it is promoted to,
    and once the run is over only a full pass (over the test session's objects too) frees it.
    So no pass runs during a run, and one pass of the young generation after it frees the
    whole graph in one traversal. (A run's own cyclic garbage waits until then: a few
    hundred objects.)"""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)


def pytest_collection_finish(session):
    """What collection built lives for the whole session: the collector's full passes need not
    traverse it again after every few hundred runs."""
    gc.collect()
    gc.freeze()


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
