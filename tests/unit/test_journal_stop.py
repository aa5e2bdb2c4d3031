"""Stopping the journal while an executor thread persists a batch (node/journal.py `stop`).

A batch too big for the event loop is written, fsync'd and applied on an executor thread. A
cancel stops the journal's task, not that thread: `stop` used to close the WAL right after the
cancel, while the thread still wrote to it, so the thread's write met a closed (or reused) file
descriptor and the shutdown logged "journal failed: TypeError" (a 240 s nemesis run hit it).
`stop` now waits for the thread's work to end before it closes the WAL, and the batch is whole
in the WAL for the next start to recover."""
from __future__ import annotations

import asyncio
import threading

from node import limits
from node.core.rows import OP_PUT, Op
from tests.unit.test_nospace import DEADLINE_S, Pieces, wal_txns
from tests.waiting import until

ROWS = limits.journal_inline_rows_max + 1      # one more than a batch persisted on the loop


async def test_stop_waits_for_a_batch_a_thread_is_persisting_before_it_closes_the_wal(tmp_path, monkeypatch):
    p = Pieces(tmp_path)
    await p.bootstrap()
    entered, release = threading.Event(), threading.Event()
    order: list[str] = []
    real_write, real_close = p.wal.write_batch, p.wal.close

    def slow_write(data):
        entered.set()
        assert release.wait(DEADLINE_S), "the test never let the write go"
        out = real_write(data)
        order.append("written")
        return out

    def close():
        order.append("closed")
        real_close()
    monkeypatch.setattr(p.wal, "write_batch", slow_write)
    monkeypatch.setattr(p.wal, "close", close)
    fut = p.journal.submit_nowait([p.txn([Op(OP_PUT, "kv", f"k{i}", i) for i in range(ROWS)])])
    assert await asyncio.to_thread(entered.wait, DEADLINE_S), "the batch went to an executor thread"
    stopping = asyncio.create_task(p.journal.stop())
    try:
        # The task ends (cancelled) while the thread still writes; stop() goes on from there
        # on the loop's next turn, before `until` polls again.
        await until(lambda: p.journal._task.done(), DEADLINE_S, "stop() to cancel the journal's task")
        assert "closed" not in order, "the WAL was closed under the thread writing to it"
    finally:
        release.set()
    await asyncio.wait_for(stopping, DEADLINE_S)
    assert order == ["written", "closed"]
    assert p.fatal == [] and not (fut.done() and fut.exception() is not None)
    p.store.close()
    txns = wal_txns(p.wal_dir)
    assert len(txns[-1].ops) == ROWS, "the batch is whole in the WAL"


async def test_a_write_that_fails_after_the_stop_began_is_logged_and_the_stop_ends(tmp_path, monkeypatch, caplog):
    p = Pieces(tmp_path)
    await p.bootstrap()
    entered, release = threading.Event(), threading.Event()

    def failing_write(data):
        entered.set()
        assert release.wait(DEADLINE_S), "the test never let the write go"
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(p.wal, "write_batch", failing_write)
    p.journal.submit_nowait([p.txn([Op(OP_PUT, "kv", f"k{i}", i) for i in range(ROWS)])], want_future=False)
    assert await asyncio.to_thread(entered.wait, DEADLINE_S)
    stopping = asyncio.create_task(p.journal.stop())
    try:
        await until(lambda: p.journal._task.done(), DEADLINE_S, "stop() to cancel the journal's task")
    finally:
        release.set()
    await asyncio.wait_for(stopping, DEADLINE_S)      # ends, and raises nothing of the thread's
    assert "the write under way at the stop failed: OSError" in caplog.text
    p.store.close()
