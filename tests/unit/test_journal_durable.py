"""Rows a peer relies on are on disk before it is told, whatever `wal_mode` says
(node/journal.py `durable`).

In wal_mode write the journal answers a write once the WAL write returned and fsyncs the tail
every `wal_sync_interval_s`. That is the promise for a client's write (it survives a process
crash), but a registration is a promise to another node: a donor that answered REGISTER (or a
JOIN's id) and then lost the row to a power loss has forgotten a member that exists, and its
fence waits for that member. Likewise an expel the operator was told of. So the registration
paths ask the journal for an fsync before they answer (`Journal.durable`), which is what the
simulation always modelled (it answers a registration after the fsync).

The journal's half runs on real LMDB and a real WAL with the fsync seen (tests/unit/
test_journal_fsync.py's `Node`); the callers' half on a real node in this process."""
from __future__ import annotations

import asyncio
import errno
import threading
from uuid import uuid4

import pytest

from node import limits
from node.core.rows import OP_PUT, OP_SPACE, Op
from node.journal import Journal
from tests.unit import test_journal_fsync as journal_fsync
from tests.unit.test_dashboard_http import collector_restored, start_node
from tests.unit.test_journal_fsync import DEADLINE_S, Crash, FaultPoint, Node, check_recovered, power_loss_image
from tests.waiting import until


@pytest.fixture(autouse=True)
def no_periodic_sync(monkeypatch):
    """No fsync comes by itself during a test: each one seen was asked for."""
    monkeypatch.setattr(limits, "wal_sync_interval_s", 3600.0)


def on_disk(node: Node) -> bool:
    return node.wal.synced_bytes == node.wal.bytes_written


async def test_durable_fsyncs_what_was_written_and_a_power_loss_keeps_it(tmp_path):
    node = Node(tmp_path / "node", "write", FaultPoint(None))
    await node.bootstrap()
    await node.journal.durable()
    written = {}
    for i in range(5):
        txn = node.txn([Op(OP_PUT, "data", f"k{i}", i)])
        await node.journal.submit([txn])
        written[f"k{i}"] = txn.lsn
    assert not on_disk(node), "wal_mode write fsynced a batch nobody asked to sync"
    fsyncs = node.wal.fsyncs
    await asyncio.wait_for(node.journal.durable(), DEADLINE_S)
    assert node.wal.fsyncs == fsyncs + 1 and on_disk(node)
    assert node.core.synced.get(1) == node.core.vclock.get(1), "an fsync'd row not reported durable"
    # a power loss now that keeps none of the unsynced bytes still has every row
    image = power_loss_image(node, tmp_path / "image", unsynced_kept=0.0)
    check_recovered(tmp_path, image, written, "after-durable")
    # nothing new written: no fsync for nothing
    await node.journal.durable()
    assert node.wal.fsyncs == fsyncs + 1
    await node.stop()


async def test_without_durable_a_power_loss_may_take_the_unsynced_tail(tmp_path):
    """The control: the same writes, no durable(): the image cut at the last fsync lacks them
    (so the test above shows durable() at work, not a sync that happened anyway)."""
    node = Node(tmp_path / "node", "write", FaultPoint(None))
    await node.bootstrap()
    await node.journal.durable()
    txn = node.txn([Op(OP_PUT, "data", "k", 1)])
    await node.journal.submit([txn])
    image = power_loss_image(node, tmp_path / "image", unsynced_kept=0.0)
    with pytest.raises(AssertionError, match="lost after the crash"):
        check_recovered(tmp_path, image, {"k": txn.lsn}, "no-durable")
    await node.stop()


async def test_durable_during_a_workload_covers_every_batch_submitted_before_it(tmp_path, monkeypatch):
    # one segment: the image helper models a power loss within the last segment
    monkeypatch.setattr(journal_fsync, "SEGMENT_BYTES_MAX", 1 << 24)
    node = Node(tmp_path / "node", "write", FaultPoint(None))
    await node.bootstrap()
    before: dict[str, int] = {}
    done = asyncio.Event()

    async def writer(w: int) -> None:
        j = 0
        while not done.is_set():
            txn = node.txn([Op(OP_PUT, "data", f"w{w}-{j}", j)])
            await node.journal.submit([txn])      # (waits for its batch: the others run meanwhile)
            j += 1

    writers = [asyncio.create_task(writer(w)) for w in range(3)]
    await until(lambda: node.journal.batches > 20, DEADLINE_S, "batches under way")
    for i in range(3):
        txn = node.txn([Op(OP_PUT, "data", f"mine-{i}", i)])
        await node.journal.submit([txn])
        before[f"mine-{i}"] = txn.lsn
        await asyncio.wait_for(node.journal.durable(), DEADLINE_S)
        image = power_loss_image(node, tmp_path / f"image{i}", unsynced_kept=0.0)
        check_recovered(tmp_path, image, before, f"during-{i}")
    done.set()
    await asyncio.gather(*writers)
    await node.stop()


async def test_a_failing_fsync_fails_durable_and_stops_the_journal(tmp_path):
    error = OSError(errno.EIO, "Input/output error")
    node = Node(tmp_path / "node", "write", FaultPoint(1), fsync_error=error)
    await node.bootstrap()
    await node.journal.submit([node.txn([Op(OP_PUT, "data", "k", 1)])])
    node.fault.armed = True
    with pytest.raises(OSError) as e:
        await asyncio.wait_for(node.journal.durable(), DEADLINE_S)
    assert e.value is error
    assert node.fatal == [error] and node.journal.failed is error
    with pytest.raises(OSError):            # and any later call is told at once
        node.journal.submit_nowait([node.txn([Op(OP_PUT, "data", "late", 1)])])
    with pytest.raises(OSError) as again:
        await asyncio.wait_for(node.journal.durable(), DEADLINE_S)
    assert again.value is error
    await node.stop()


async def test_a_stop_waits_for_the_fsync_asked_for(tmp_path):
    node = Node(tmp_path / "node", "write", FaultPoint(None))
    await node.bootstrap()
    await node.journal.submit([node.txn([Op(OP_PUT, "data", "k", 1)])])
    asked = asyncio.create_task(node.journal.durable())
    await until(lambda: node.journal._sync_waiters or asked.done(), DEADLINE_S, "durable() to ask")
    await node.stop()
    await asyncio.wait_for(asked, DEADLINE_S)  # answered, not left hanging
    assert on_disk(node)


async def test_a_crash_at_the_asked_fsync_answers_the_caller_with_it(tmp_path):
    node = Node(tmp_path / "node", "write", FaultPoint(1))
    await node.bootstrap()
    await node.journal.submit([node.txn([Op(OP_PUT, "data", "k", 1)])])
    node.fault.armed = True
    with pytest.raises(Crash):
        await asyncio.wait_for(node.journal.durable(), DEADLINE_S)
    await node.stop()


# --- the callers: a registration and an expel are on disk before they are answered ----------
@pytest.fixture
async def write_mode_node(tmp_path, listen):
    with collector_restored():
        n = await start_node(tmp_path, listen)
        assert n.cfg.wal_mode == "write"
        yield n
        await n.stop()


def wal_on_disk(node) -> bool:
    wal = node.journal.wal
    return wal.synced_bytes == wal.bytes_written


async def unsynced_write(node) -> None:
    """A client's write: in wal_mode write it leaves the tail unsynced (the control: what
    follows must fsync it)."""
    await node.write([Op(OP_SPACE, f"s{uuid4().hex[:8]}", "", {"local": False, "conflict": "lww"})])
    assert not wal_on_disk(node), "a client's write was fsynced: the test would show nothing"


async def test_a_registration_is_answered_once_its_row_is_on_disk(write_mode_node):
    node = write_mode_node
    await unsynced_write(node)
    joiner = str(uuid4())
    result = await asyncio.wait_for(
        node.join.apply_registration({"uuid": joiner, "address": "127.0.0.1:7"}, {"code": "c" * 32}), 10)
    assert result.ok and node.core.table.get(joiner) is not None
    assert wal_on_disk(node), "REGISTERED answered before the fsync"


async def test_a_registration_without_a_code_is_on_disk_too(write_mode_node):
    node = write_mode_node
    await unsynced_write(node)
    result = await asyncio.wait_for(
        node.join.apply_registration({"uuid": str(uuid4()), "address": "127.0.0.1:8"}, {}), 10)
    assert result.ok
    assert wal_on_disk(node), "a lease joiner's registration answered before the fsync"


async def test_an_expel_is_answered_once_its_row_is_on_disk(write_mode_node):
    node = write_mode_node
    member = str(uuid4())
    await node.join.apply_registration({"uuid": member, "address": "127.0.0.1:9"}, {"code": "d" * 32})
    await unsynced_write(node)
    answer = await asyncio.wait_for(node.expel(member), 10)
    assert answer["state"] == "expelled"
    assert wal_on_disk(node), "the expel answered before the fsync"


async def test_a_journal_without_a_wal_has_nothing_to_sync(tmp_path):
    """wal_mode none: the store is all there is (durable() returns; nothing to wait for)."""
    node = Node(tmp_path / "node", "write", FaultPoint(None))
    await node.bootstrap()
    bare = Journal(node.core, node.store, None, node.fatal.append)
    await asyncio.wait_for(bare.durable(), DEADLINE_S)
    await node.stop()


async def gated_node(tmp_path, error: BaseException | None = None) -> tuple[Node, threading.Event]:
    """A bootstrapped node whose next fsyncs wait (on their thread) until the gate opens, then
    sync, or raise `error`; with one write in its unsynced tail."""
    gate = threading.Event()
    node = Node(tmp_path / "node", "write", FaultPoint(None))
    await node.bootstrap()
    real_fsync = node.wal._fsync

    def gated_fsync(fd):
        assert gate.wait(DEADLINE_S), "the test never opened the gate"
        if error is not None:
            raise error
        real_fsync(fd)

    node.wal._fsync = gated_fsync
    await node.journal.submit([node.txn([Op(OP_PUT, "data", "k", 1)])])
    return node, gate


async def fsync_under_way(node: Node) -> None:
    await until(lambda: node.journal._off_loop_work is not None, DEADLINE_S, "the fsync under way")


async def test_a_caller_that_gave_up_waiting_does_not_break_the_journal(tmp_path):
    """A durable() caller cancelled while it waits (its link closed): the fsync still runs, and
    the journal goes on (answering a cancelled waiter would raise in the journal's task)."""
    node, gate = await gated_node(tmp_path)
    gone = asyncio.create_task(node.journal.durable())
    await fsync_under_way(node)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    gate.set()
    await until(lambda: on_disk(node), DEADLINE_S, "the fsync asked for")
    txn = node.txn([Op(OP_PUT, "data", "after", 2)])
    await asyncio.wait_for(node.journal.submit([txn]), DEADLINE_S)
    await asyncio.wait_for(node.journal.durable(), DEADLINE_S)
    assert node.journal.failed is None and not node.fatal
    await node.stop()


async def test_a_caller_that_gave_up_is_not_answered_with_the_failure_either(tmp_path):
    error = OSError(errno.EIO, "Input/output error")
    node, gate = await gated_node(tmp_path, error)
    gone = asyncio.create_task(node.journal.durable())
    staying = asyncio.create_task(node.journal.durable())
    await fsync_under_way(node)
    gone.cancel()
    gate.set()
    with pytest.raises(OSError):
        await asyncio.wait_for(staying, DEADLINE_S)
    assert gone.cancelled()
    assert node.fatal == [error], "the failure reached on_fatal once, as itself"
    await node.stop()


async def test_a_stop_during_a_stuck_fsync_answers_the_caller(tmp_path, monkeypatch):
    """The fsync asked for has not returned when the stop gives up waiting for it: the caller
    is told the journal stopped (it may not claim the row is on disk), and is not left hanging."""
    monkeypatch.setattr(limits, "journal_drain_wait_s", 0.05)
    node, gate = await gated_node(tmp_path)
    asked = asyncio.create_task(node.journal.durable())
    await fsync_under_way(node)
    stopping = asyncio.create_task(node.stop())
    await until(lambda: node.journal._task.done(), DEADLINE_S, "the stop to cancel the journal")
    with pytest.raises(RuntimeError, match="stopped before the fsync"):
        await asyncio.wait_for(asked, DEADLINE_S)
    gate.set()                                  # the stop waits for the thread, then closes the WAL
    await asyncio.wait_for(stopping, DEADLINE_S)
