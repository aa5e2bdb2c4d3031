"""A checkpoint marks as on disk only what the store had committed when it synced
(node/retention.py `checkpoint`, wal_mode write).

In wal_mode write nothing but a checkpoint makes rows durable before the periodic WAL fsync, and
`core.synced` is what this node's ACKs report as `durable`: an upstream collects its WAL by it.
The store's vclock moves in memory inside the write transaction, before it commits, and a batch
too big for the event loop is applied on an executor thread while a checkpoint runs on the loop.
The checkpoint used to read that vclock: it could mark synced the rows of a transaction not yet
committed (not on any disk after the sync), and an upstream could collect them while this node,
after a power loss, still needed them. It reads the core's vclock now, which moves only once a
batch is committed."""
from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

from node import limits
from node.core.rows import OP_PUT, Op
from node.retention import Retention
from node.storage import store as store_module
from tests.unit.test_nospace import DEADLINE_S, Pieces

ROWS = limits.journal_inline_rows_max + 1      # a batch applied on an executor thread


async def test_a_checkpoint_during_an_uncommitted_apply_marks_only_what_was_committed(tmp_path, monkeypatch):
    p = Pieces(tmp_path)
    await p.bootstrap()
    node = SimpleNamespace(store=p.store, core=p.core, cfg=SimpleNamespace(anon_ttl_s=60.0), data_dir=str(tmp_path),
                           wal_dir=p.wal_dir, relays=[], uuid=p.core.uuid)
    retention = Retention(node)
    inside, release = threading.Event(), threading.Event()
    real_apply = store_module.apply_entries

    def held_apply(view, entries, self_uuid):
        out = real_apply(view, entries, self_uuid)     # the store's vclock has moved; nothing committed
        inside.set()
        assert release.wait(DEADLINE_S), "the test never let the transaction commit"
        return out
    monkeypatch.setattr(store_module, "apply_entries", held_apply)
    committed = p.core.vclock.get(1)
    fut = p.journal.submit_nowait([p.txn([Op(OP_PUT, "kv", f"k{i}", i) for i in range(ROWS)])])
    try:
        assert await asyncio.to_thread(inside.wait, DEADLINE_S), "the batch is being applied on a thread"
        assert p.store.vclock.get(1) > committed           # the race this is about
        # the checkpoint's own writes to the store wait for the transaction (one writer at a time,
        # on the loop): a timer, not the loop, lets it commit a moment after the checkpoint began
        threading.Timer(0.2, release.set).start()
        await asyncio.wait_for(retention.checkpoint(), DEADLINE_S)
        assert p.core.synced.get(1) <= committed, "rows of an uncommitted transaction marked on disk"
    finally:
        release.set()
    await asyncio.wait_for(fut, DEADLINE_S)
    await asyncio.wait_for(retention.checkpoint(), DEADLINE_S)
    assert p.core.synced.get(1) == committed + ROWS         # once committed, the next checkpoint marks it
    await p.stop()
