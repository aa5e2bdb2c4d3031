"""A task cancelled at the moment the thing it waits for arrives is still cancelled.

On Python 3.11 `asyncio.wait_for(coro, timeout)` returns the inner result when the inner task
finished in the same loop iteration as the cancel, and the cancel is lost. An applier whose link
received a message just as `PUT /v1/admin/peers` removed it then ran on for ever: `Applier.stop`
(cancel, then await the task) never returned, the API call answered only after its 10 s wait, and
the removed peer's rows kept being applied. Every wait inside a long-lived loop (a link's
receive, the journal's change, the lease loops' stop waits) must let a cancel through."""
from __future__ import annotations

import asyncio

import aiohttp

from node.applier.conn import Conn
from node.core import messages as m
from node.core.replicaset import NodeCore
from node.identity import lease_runner
from node.journal import Journal
from node.wal.recovery import recover
from node.wal.writer import WalWriter
from tests.unit.helpers import UUID_A, open_store


async def _cancel_as_it_arrives(wait, arrive) -> asyncio.Task:
    """Start a task that awaits `wait()` and then goes on (as the node's loops do), let it park,
    then make the awaited thing arrive and cancel the task in the same iteration of the event
    loop. Returns the task once it has ended (or after 2 s, still running)."""
    async def loop_forever():
        await wait()
        await asyncio.sleep(3600)                # the loop's next step: a lost cancel parks here

    task = asyncio.create_task(loop_forever())
    for _ in range(5):
        await asyncio.sleep(0)                   # parked in wait()
    arrive()
    task.cancel()
    await asyncio.wait([task], timeout=2)
    if not task.done():                          # end it (the test fails on it anyway)
        task.cancel()
        await asyncio.wait([task], timeout=2)
        return _StillRunning()
    return task


class _StillRunning:
    def cancelled(self) -> bool:
        return False


async def test_a_link_cancelled_as_a_message_arrives_is_cancelled():
    loop = asyncio.get_running_loop()
    pending: list[asyncio.Future] = []

    class WS:                                   # the WebSocket under a Conn: one message per receive()
        async def receive(self):
            pending.append(loop.create_future())
            return await pending[-1]

    conn = Conn(WS(), "peer")
    heartbeat = aiohttp.WSMessage(aiohttp.WSMsgType.BINARY, m.encode(m.HEARTBEAT, now_us=1), None)
    task = await _cancel_as_it_arrives(lambda: conn.recv(5), lambda: pending[-1].set_result(heartbeat))
    assert task.cancelled(), "the cancel was lost: the link's loop runs on"


async def test_waiting_for_the_journal_cancelled_as_it_changes_is_cancelled(tmp_path):
    store = open_store(tmp_path / "store", UUID_A)
    wal_dir = str(tmp_path / "wal")
    res = recover(store, wal_dir, UUID_A)
    wal = WalWriter(wal_dir, "write", UUID_A)
    wal.open_last(res.last_valid_end)
    core = NodeCore(UUID_A, store.table.copy(), store.vclock, spaces=store.space_flags())
    journal = Journal(core, store, wal, lambda e: None)
    journal.start()
    try:
        task = await _cancel_as_it_arrives(lambda: journal.changed(timeout=5),
                                           lambda: journal._changed.set())   # a batch became durable
        assert task.cancelled(), "the cancel was lost: an applier held back by the journal runs on"
    finally:
        await journal.stop()
        store.close()


async def test_a_lease_loop_cancelled_as_it_is_told_to_stop_is_cancelled():
    stop = asyncio.Event()
    task = await _cancel_as_it_arrives(lambda: lease_runner._stopped(stop, 5), stop.set)
    assert task.cancelled(), "the cancel was lost: the lease loop runs on"
