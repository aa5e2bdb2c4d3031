"""A node told to stop while it backs itself up (`POST /v1/admin/backup`), on a real node in this
process (real LMDB, WAL and sockets): the stop gives the backup up and waits, off the event loop,
for the store copy under way to end before it closes the store; the backup's request is answered
503 `stopping` and leaves nothing at its destination; a backup asked while the node stops is
refused.

Before, the stop closed the store under the copy (py-lmdb then waits in close(), on the event
loop, until the copy ends), and the backup went on after the node had stopped: it read the
stopped journal's position and copied the WAL with the data dir unlocked."""
from __future__ import annotations

import asyncio
import logging
import os
import threading

import pytest

from node import limits
from node.ops import backup
from node.ops.backup_node import backup_node
from tests.unit.test_dashboard_http import collector_restored, start_node
from tests.waiting import until


@pytest.fixture(autouse=True)
def collector():
    """The node tunes the collector for a server; pytest is not one."""
    with collector_restored():
        yield


async def test_a_stop_during_a_backup_waits_for_its_store_copy_then_abandons_it(tmp_path, listen, monkeypatch,
                                                                               caplog):
    node = await start_node(tmp_path, listen, token="")
    entered, release = threading.Event(), threading.Event()
    real_copy = backup.BackupJob.copy_store
    copy_ended: list[bool] = []

    def copy_store(job, store=None):               # the copy is slow: the stop comes meanwhile
        entered.set()
        release.wait(20)
        real_copy(job, store)
        copy_ended.append(True)

    monkeypatch.setattr(backup.BackupJob, "copy_store", copy_store)
    monkeypatch.setattr(limits, "backup_stop_log_s", 0.1)
    store = node.store
    closed_after_copy: list[bool] = []
    real_close = store.close
    monkeypatch.setattr(store, "close", lambda: (closed_after_copy.append(bool(copy_ended)), real_close()))
    caplog.set_level(logging.INFO, logger="replog")
    out = tmp_path / "b"
    stopping = None
    try:
        taking = asyncio.create_task(backup_node(node, str(out)))
        await until(entered.is_set, 10, "the backup copying the store")
        stopping = asyncio.create_task(node.stop())
        await until(lambda: any("the stop waits for the backup" in r.getMessage() for r in caplog.records), 10,
                    "the stop to say it waits for the backup")
        assert not stopping.done() and closed_after_copy == [], "the store was closed under the backup's copy"
        assert "MiB copied" in next(r.getMessage() for r in caplog.records if "the stop waits" in r.getMessage())

        with pytest.raises(backup.BackupError) as refused:
            await backup_node(node, str(tmp_path / "c"))
        assert (refused.value.status, refused.value.code) == (503, "not_ready"), refused.value
        assert "stopping" in refused.value.message

        release.set()
        with pytest.raises(backup.BackupError) as e:
            await asyncio.wait_for(taking, 20)
        assert (e.value.status, e.value.code) == (503, "stopping") and "abandoned" in e.value.message, e.value
        errors = await asyncio.wait_for(stopping, 20)
        assert errors == [] and node.status == "stopped"
        assert closed_after_copy == [True], "the store was closed before the backup's copy ended"
        assert sorted(os.listdir(tmp_path)) == ["n"], "the abandoned backup left files behind"
    finally:
        release.set()
        if stopping is None:
            await node.stop()
