"""A node that is stopping starts no replication link (node/process/peering.py `set_peers`), on
a real node in this process (real LMDB, real sockets). Found by the secure nemesis (seed 48): a
node stopped on request while it rebuilt its store from a donor; the rebuild, cancelled, brought
its links back as a failed rebuild does (node/rejoin.py), after Node.stop had stopped the
appliers. The new ones dialled with the HTTP client stop then closed, and each was logged as a
bug with its traceback: `applier ... failed (a bug; the node serves on): RuntimeError: Session
is closed`."""
from __future__ import annotations

import asyncio
import logging

import pytest

from tests.integration.harness import silent_address
from tests.unit.test_dashboard_http import collector_restored, start_node


@pytest.fixture(autouse=True)
def collector():
    """The node tunes the collector for a server; pytest is not one."""
    with collector_restored():
        yield


async def test_a_task_that_brings_links_back_when_cancelled_starts_none_while_the_node_stops(
        tmp_path, listen, caplog):
    node = await start_node(tmp_path, listen, token="")
    with silent_address() as peer:                  # nobody listens there: an applier keeps dialling
        node.peers[:] = [peer]
        started = asyncio.Event()

        async def rebuild():                        # as Rejoiner._rebuild: links down, then back on the way out
            node.set_peers([])
            started.set()
            try:
                await asyncio.Event().wait()
            finally:
                node.set_peers(list(node.peers))
        node.spawn(rebuild(), "a-rebuild")
        await started.wait()
        assert node.appliers == {}
        caplog.set_level(logging.INFO, logger="replog")
        errors = await node.stop()
        assert errors == []
        assert node.appliers == {}, "a stopping node started an applier"
        bugs = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert bugs == [], bugs


async def test_peers_taken_while_stopping_stop_the_removed_ones_and_start_none(tmp_path, listen):
    node = await start_node(tmp_path, listen, token="")
    with silent_address() as a, silent_address() as b:
        node.set_peers([a])
        first = node.appliers[a]
        node.status = "stopping"
        stopping = node.set_peers([b])
        assert node.appliers == {} and len(stopping) == 1
        await asyncio.gather(*stopping)
        assert first.status == "stopped"
        node.status = "running"
    await node.stop()
