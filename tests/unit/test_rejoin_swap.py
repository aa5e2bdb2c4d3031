"""What reads the old store is done before a rejoin swaps in the rebuilt one
(node/process/opening.py `reopen_after_rejoin`), on a real node in this process (real LMDB, WAL
and sockets) and subscribers played by tests/integration/fakepeer.py: no inbound link outlives
the swap, and a backup under way finishes first (none starts while the node rejoins).

Found by the nemesis (seed 51): a master rebuilt its store from a donor's snapshot, and while
the swap closed its inbound links one by one (each close awaits), a member subscribed. That
link was not among those being closed; its relay went on over the swapped store and failed
reading a WAL segment that was gone (`relay ... failed (a bug ...): FileNotFoundError`). It
could as well have read on into the new WAL, whose ids are the donor's, under a greeting that
stated the old table's. Links are now refused (`not_ready`) until the new store is open.
Likewise a backup copying the old store would have had it closed under it, and its WAL copied
from the new one."""
from __future__ import annotations

import asyncio
import logging
import os
import threading

import pytest

from node.applier.conn import Conn
from node.core import messages as m
from node.errors import PeerRefused
from node.ops import backup
from node.ops.backup_node import backup_node
from tests.integration.fakepeer import FakePeer
from tests.unit.test_dashboard_http import open_node  # noqa: F401 - the fixture `node` takes
from tests.waiting import until


@pytest.fixture
def node(open_node):
    return open_node


async def test_a_member_subscribing_while_the_swap_closes_links_is_refused_and_none_outlives_it(
        node, monkeypatch):
    address = node.cfg.listen
    first, late = FakePeer(node.cfg.secret), FakePeer(node.cfg.secret)
    for p in (first, late):
        await p.start()
        await p.introduce(address)
    late_link: list[asyncio.Task] = []
    real_close = Conn.close

    async def close(self, going_away: bool = False):
        if not late_link:        # the swap's first close: the late member subscribes meanwhile
            links = len(node.links)
            late_link.append(asyncio.create_task(late.listen(address)))
            await until(lambda: late_link[0].done() or len(node.links) > links, 10,
                        "the late subscription taken or refused")
        await real_close(self, going_away)
    try:
        streaming = asyncio.create_task(first.listen(address))
        await until(lambda: len(node.relays) == 1, 10, "the first member's relay streaming")
        monkeypatch.setattr(Conn, "close", close)
        await node.reopen_after_rejoin(lambda data_dir: None)      # the same store, swapped for itself
        monkeypatch.undo()
        assert node.status == "running" and node.links_refused is None
        _, ended = await asyncio.wait_for(streaming, 10)
        assert not isinstance(ended, PeerRefused), f"the first link was closed, not refused: {ended!r}"
        await until(lambda: late_link[0].done(), 10, "the late link to end: it must not outlive the swap")
        _, refused = late_link[0].result()
        assert isinstance(refused, PeerRefused) and refused.code == "not_ready", repr(refused)
        assert "swapping in a store" in refused.message
        answer = await asyncio.wait_for(late.request(address, m.SUBSCRIBE, vclock={}), 10)
        assert getattr(answer, "type", None) == m.SUBSCRIBED, f"links are taken again after the swap: {answer!r}"
    finally:
        for t in [*late_link]:
            t.cancel()
        for p in (first, late):
            await p.close()



async def test_a_backup_under_way_finishes_from_the_old_store_before_the_swap(node, tmp_path, monkeypatch, caplog):
    entered, release, copied = threading.Event(), threading.Event(), threading.Event()
    real_copy = backup.BackupJob.copy_store

    def copy_store(job, store=None):               # the copy is slow: the swap comes meanwhile
        entered.set()
        release.wait(10)
        real_copy(job, store)
        copied.set()
    monkeypatch.setattr(backup.BackupJob, "copy_store", copy_store)
    old_store = node.store
    closed: list[bool] = []                        # at each close of the old store: was the copy done?
    real_close = old_store.close
    monkeypatch.setattr(old_store, "close", lambda: (closed.append(copied.is_set()), real_close()))
    caplog.set_level(logging.INFO, logger="replog")
    taking = asyncio.create_task(backup_node(node, str(tmp_path / "b")))
    await until(entered.is_set, 10, "the backup copying the store")
    swapping = asyncio.create_task(node.reopen_after_rejoin(lambda data_dir: None))
    await until(lambda: closed or any("before it is swapped out" in r.getMessage() for r in caplog.records), 10,
                "the swap to close the old store, or to wait for the backup")
    release.set()
    manifest = await asyncio.wait_for(taking, 20)
    await asyncio.wait_for(swapping, 20)
    assert closed == [True], "the old store was closed under the backup's copy"
    assert manifest["uuid"] == node.uuid and os.path.isfile(tmp_path / "b" / "MANIFEST.json")
    assert node.status == "running" and node.store is not old_store


async def test_a_backup_asked_while_the_node_rejoins_is_refused(node, tmp_path):
    node.status, node.status_reason = "rejoining", "an upstream collected rows this node needs"
    try:
        with pytest.raises(backup.BackupError) as e:
            await backup_node(node, str(tmp_path / "b"))
    finally:
        node.status, node.status_reason = "running", ""
    assert (e.value.status, e.value.code) == (503, "not_ready") and "rejoining" in e.value.message
    assert not os.path.exists(tmp_path / "b") and node.backups == []



async def test_a_stop_begun_during_the_swap_is_not_undone_by_its_end(node):
    """The stop's status stands: the swap shows no `running`, and starts no applier."""
    node.peers = ["127.0.0.1:9"]                    # (nobody listens there: it would only try)

    def swap(data_dir):
        node.status, node.status_reason = "stopping", "shutting down"     # the stop begins meanwhile
    await node.reopen_after_rejoin(swap)
    assert (node.status, node.status_reason) == ("stopping", "shutting down")
    assert node.appliers == {}, "appliers started on a node that stops"
