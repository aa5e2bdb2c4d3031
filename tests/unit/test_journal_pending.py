"""`Journal.pending` counts an entry until its rows are in the core's vclock (node/journal.py).

A rejoin takes its links down, waits for the journal to drain, and then takes what the donor's
snapshot must cover (node/rejoin.py `_rebuild`: `mine`); the swap then deletes the WAL. `pending`
used to count only the entries still queued: the journal pops a batch before it writes it, so
while a batch was being persisted (on an executor thread, or on the loop between its WAL write and
its store commit, where the journal yields to the relays) `pending` was 0 and the vclock lacked
the batch. A rebuild that looked then checked the snapshot against a `mine` without it, the batch
was acknowledged a moment later, and the swap deleted it: the nemesis lost a binary client's batch
of eight acknowledged writes that way (CI of session 49, seed 1), and the node wrote its lsns again
with other rows. The simulation's journal always counted an entry until it was applied
(tests/sim/simnode.py `pending`), so it never met this."""
from __future__ import annotations

import asyncio

from node import limits
from node.core.rows import OP_PUT, Op
from tests.unit.test_nospace import DEADLINE_S, Pieces
from tests.waiting import until

ROWS = limits.journal_inline_rows_max + 1      # one more than a batch persisted on the loop


async def test_a_new_journal_is_drained_and_an_entry_is_pending_from_its_submission(tmp_path):
    p = Pieces(tmp_path)
    assert p.journal.pending == 0
    await p.bootstrap()
    fut = p.put("k", 1)
    assert p.journal.pending == 1                # queued: the journal's task has not run yet
    await asyncio.wait_for(fut, DEADLINE_S)
    assert p.journal.pending == 0
    await p.stop()


async def test_a_batch_an_executor_thread_is_persisting_is_pending(tmp_path, monkeypatch):
    p = Pieces(tmp_path)
    await p.bootstrap()
    entered, release = p.hold_writes(monkeypatch)
    lsn = p.core.claimed.get(1) + 1
    fut = p.journal.submit_nowait([p.txn([Op(OP_PUT, "kv", f"k{i}", i) for i in range(ROWS)])])
    try:
        assert await asyncio.to_thread(entered.wait, DEADLINE_S), "the batch went to an executor thread"
        assert p.journal.pending == 1, "a batch being written is not drained"
        assert p.core.vclock.get(1) < lsn
    finally:
        release.set()
    await asyncio.wait_for(fut, DEADLINE_S)
    assert p.journal.pending == 0 and p.core.vclock.get(1) == lsn + ROWS - 1
    await p.stop()


async def test_pending_is_zero_only_when_the_vclock_has_every_submitted_row(tmp_path):
    """On the loop: a small batch is written, the relays are woken (the journal yields), then the
    store commits it. Every turn of the loop, `pending == 0` must mean the vclock has it."""
    p = Pieces(tmp_path)
    await p.bootstrap()
    p.journal.listen(asyncio.Event())          # a relay listens: the journal yields after the write
    seen: list[tuple[int, int, int]] = []       # (pending, vclock, lsn submitted last)
    submitted = [p.core.vclock.get(1)]
    loop = asyncio.get_running_loop()
    sampling = [True]

    def sample() -> None:                       # once every turn of the loop
        seen.append((p.journal.pending, p.core.vclock.get(1), submitted[-1]))
        if sampling[0]:
            loop.call_soon(sample)
    sample()
    for i in range(20):
        submitted.append(p.core.claimed.get(1) + 1)
        await asyncio.wait_for(p.put(f"k{i}", i), DEADLINE_S)
    sampling[0] = False
    lacking = [s for s in seen if s[0] == 0 and s[1] < s[2]]
    assert len(seen) > 40 and not lacking, f"pending was 0 while the vclock lacked a submitted row: {lacking[:3]}"
    await p.stop()


async def test_a_batch_kept_for_want_of_room_is_pending(tmp_path, monkeypatch):
    """A batch the store could not take (no room) stays the journal's, and stays pending: a
    rebuild must not take the store's measure without it."""
    p = Pieces(tmp_path)
    await p.bootstrap()
    from node.errors import NoSpaceError
    real_apply = p.store.apply
    full = [True]

    def apply(entries, *a, **kw):
        if full[0]:
            raise NoSpaceError("map", "the test's store is full")
        return real_apply(entries, *a, **kw)
    monkeypatch.setattr(p.store, "apply", apply)
    monkeypatch.setattr(p.space, "check", lambda: None, raising=False)
    fut = p.put("k", 1)
    await until(lambda: p.journal.nospace is not None, DEADLINE_S, "the batch kept for want of room")
    assert p.journal.pending == 1
    full[0] = False
    await asyncio.wait_for(fut, DEADLINE_S + limits.nospace_retry_s * 4)
    assert p.journal.pending == 0
    await p.stop()
