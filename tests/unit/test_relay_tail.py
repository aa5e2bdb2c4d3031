"""The relay's two read paths over one real WAL: the journal's in-memory tail and the file.

A real Journal writes a real WAL (node/journal.py); a WalCursor (node/applier/walcursor.py)
reads it the way Relay._send_loop does: from the tail when it is exactly at a batch the
tail holds, else from the file. Whatever mix of paths it takes, what it hands out must be
exactly what a cursor reading only the file hands out: the same frames, in WAL order, once
each, filtered the same way (no local rows, nothing the subscriber has)."""
import asyncio
import os

import pytest

from node import limits
from node.applier.walcursor import WalCursor
from node.core import rowscan
from node.core.rows import GROUP_DEFAULT, GROUP_LOCAL, OP_PUT, OP_SPACE, Op
from node.errors import RemoteProtocolError
from node.journal import Journal
from node.wal import format as fmt
from node.wal.reader import list_segments
from test_journal_fsync import FaultPoint
from test_journal_fsync import Node as JournalNode

DEADLINE_S = 10
BUDGET_ALL = 1 << 30


class Node(JournalNode):
    """The journal tests' node (store, WAL, core and journal wired as node/server.py wires
    them), in write mode, with no fault armed and a space for local rows."""

    def __init__(self, data_dir, segment_bytes_max: int = 1 << 20, mode: str = "write"):
        super().__init__(data_dir, mode, FaultPoint(None))
        self.wal.segment_bytes_max = segment_bytes_max
        self.n = 0

    async def bootstrap(self) -> None:
        await super().bootstrap()
        await self.journal.submit([self.txn([Op(OP_SPACE, "loc", "", {"local": True, "conflict": "lww"})],
                                            GROUP_LOCAL)])

    async def write(self, batches: int, rows: int = 3, value: str = "v" * 100, with_local: bool = False) -> None:
        """`batches` durable batches; with_local puts a local row in the same frame as the
        replicated ones (as Node.write does), so a relay must re-pack that frame."""
        for _ in range(batches):
            ops = []
            for _ in range(rows):
                self.n += 1
                ops.append(Op(OP_PUT, "data", f"k{self.n}", value))
            entry = [self.txn(ops)]
            if with_local:
                entry.append(self.txn([Op(OP_PUT, "loc", f"l{self.n}", 1)], GROUP_LOCAL))
            await asyncio.wait_for(self.journal.submit(entry), DEADLINE_S)
        assert not self.fatal


def drain(cur: WalCursor, journal: Journal, budget: int = BUDGET_ALL) -> list:
    """Read until caught up, as the relay's send loop does between two wake-ups."""
    out = []
    while True:
        frames = cur.read_tail(journal, budget)
        if frames is None:
            frames = cur.read(journal.position, budget)
        if not frames:
            return out
        out += frames


def unpacked(frames: list) -> list:
    return [fmt.unpack_frame(bytes(f)) for f in frames]


def file_only(node: Node, sub: dict[int, int]) -> list:
    ref = WalCursor(node.wal_dir, sub)
    return unpacked(ref.read(node.journal.position, BUDGET_ALL))


def rows_of(frames: list) -> int:
    return sum(len(t[4]) for _, txns in frames for t in txns)


@pytest.fixture
async def node(tmp_path):
    n = Node(tmp_path)
    await n.bootstrap()
    yield n
    await n.stop()


async def test_a_cursor_behind_reads_the_file_then_follows_from_memory(node):
    await node.write(10)                                  # nobody listens: no tail kept
    assert not node.journal.tail
    cur = WalCursor(node.wal_dir, {})
    node.journal.listen(asyncio.Event())
    got = drain(cur, node.journal)
    assert cur.from_file == len(got) > 0 and cur.from_tail == 0
    for _ in range(5):
        await node.write(2, with_local=True)
        got += drain(cur, node.journal)
    assert cur.from_tail == 10                            # every new frame came from memory
    assert cur.from_file == len(got) - 10
    assert unpacked(got) == file_only(node, {})
    assert cur.rows == rows_of(unpacked(got))


async def test_a_frame_with_local_rows_is_repacked_without_them_on_both_paths(node):
    cur = WalCursor(node.wal_dir, {})
    node.journal.listen(asyncio.Event())
    drain(cur, node.journal)
    await node.write(4, with_local=True)
    got = unpacked(drain(cur, node.journal))
    assert cur.from_tail == 4
    assert got == file_only(node, {})[-4:]
    for _, txns in got:
        assert [t[2] for t in txns] == [GROUP_DEFAULT]    # the local txn of each frame left out


async def test_rows_the_subscriber_has_are_skipped_on_both_paths(node):
    await node.write(6)
    have = {node.core.self_id: node.core.vclock.get(node.core.self_id) - 6}   # misses the last 2 batches
    node.journal.listen(asyncio.Event())
    cur = WalCursor(node.wal_dir, have)
    got = drain(cur, node.journal)
    await node.write(3)
    got += drain(cur, node.journal)
    assert cur.from_tail == 3
    assert unpacked(got) == file_only(node, have)
    assert rows_of(unpacked(got)) == 5 * 3


async def test_a_cursor_that_falls_out_of_the_tail_reads_the_file_and_comes_back(node, monkeypatch):
    monkeypatch.setattr(limits, "relay_tail_bytes_max", 2048)     # a few batches
    cur = WalCursor(node.wal_dir, {})
    node.journal.listen(asyncio.Event())
    got = drain(cur, node.journal)
    await node.write(2)
    got += drain(cur, node.journal)
    assert cur.from_tail == 2
    file_before = cur.from_file
    await node.write(40)                                  # the slow subscriber does not read meanwhile
    assert node.journal.tail.bytes <= 2048 and node.journal.tail[0].seq > 3
    assert cur.read_tail(node.journal, BUDGET_ALL) is None       # its position left the tail
    got += drain(cur, node.journal)
    assert cur.from_file == file_before + 40
    await node.write(3)
    got += drain(cur, node.journal)
    assert cur.from_tail == 2 + 3                         # back on memory once caught up
    assert unpacked(got) == file_only(node, {})
    assert cur.rows == rows_of(unpacked(got))


async def test_a_small_budget_resumes_inside_a_batch_from_memory(node):
    cur = WalCursor(node.wal_dir, {})
    node.journal.listen(asyncio.Event())
    got = drain(cur, node.journal)
    # several entries in one durable batch: submitted with no await in between
    entries = []
    for i in range(6):
        t = node.txn([Op(OP_PUT, "data", f"b{i}", "x" * 300)])
        entries.append(node.journal.submit_nowait([t]))
    await asyncio.wait_for(asyncio.gather(*entries), DEADLINE_S)
    assert len(node.journal.tail[-1].frames) == 6
    while True:
        frames = cur.read_tail(node.journal, 1)          # one frame per read
        assert frames is not None
        if not frames:
            break
        assert len(frames) == 1
        got += frames
    assert cur.from_tail == 6 and cur.from_file == len(got) - 6
    assert unpacked(got) == file_only(node, {})


async def test_segments_rotate_while_a_cursor_streams_from_memory(tmp_path):
    node = Node(tmp_path, segment_bytes_max=4096)
    try:
        await node.bootstrap()
        cur = WalCursor(node.wal_dir, {})
        node.journal.listen(asyncio.Event())
        got = drain(cur, node.journal)
        file_frames = cur.from_file
        segments_before = len(list_segments(node.wal_dir))
        for _ in range(40):
            await node.write(1, rows=4, with_local=True)
            got += drain(cur, node.journal)
        assert len(list_segments(node.wal_dir)) >= segments_before + 3
        assert cur.from_file == file_frames and cur.from_tail == 40     # no file read across rotations
        assert cur.segment == node.journal.position[0]
        assert unpacked(got) == file_only(node, {})
    finally:
        await node.stop()


async def test_the_tail_is_kept_only_while_somebody_listens_and_stays_bounded(node, monkeypatch):
    monkeypatch.setattr(limits, "relay_tail_bytes_max", 4096)
    await node.write(3)
    assert not node.journal.tail
    wake = asyncio.Event()
    node.journal.listen(wake)
    await node.write(30)
    assert wake.is_set()
    assert 0 < node.journal.tail.bytes <= 4096
    first = node.journal.tail[0]
    assert node.journal.tail.chunk(first.prev) is first
    node.journal.unlisten(wake)
    assert not node.journal.tail and node.journal.tail.bytes == 0
    assert node.journal.tail.chunk(first.prev) is None


async def order_of_send_and_apply(node: Node) -> list:
    """What happens first for one new batch: a woken relay reading it, or the store's apply."""
    events = []
    real_apply = node.store.apply

    def apply(txns, *a):
        events.append("apply")
        return real_apply(txns, *a)

    node.store.apply = apply
    wake = asyncio.Event()
    node.journal.listen(wake)
    cur = WalCursor(node.wal_dir, {})
    drain(cur, node.journal)

    waiting = asyncio.Event()

    async def relay():
        wake.clear()
        waiting.set()
        await wake.wait()
        frames = cur.read_tail(node.journal, BUDGET_ALL)
        on_disk = os.path.getsize(os.path.join(node.wal_dir, cur.segment))
        events.append(("relay", len(frames), on_disk >= cur.offset))

    task = asyncio.create_task(relay())
    await asyncio.wait_for(waiting.wait(), DEADLINE_S)    # the relay is listening
    await node.write(1)
    await asyncio.wait_for(task, DEADLINE_S)
    return events


async def test_in_write_mode_a_relay_sends_a_written_batch_while_the_store_applies_it(node):
    # the batch is in the WAL file (write() returned) when the relay takes it from memory
    assert await order_of_send_and_apply(node) == [("relay", 1, True), "apply"]


async def test_in_fsync_mode_a_relay_sends_only_after_the_whole_batch_is_persisted(tmp_path):
    node = Node(tmp_path, mode="fsync")
    try:
        await node.bootstrap()
        assert await order_of_send_and_apply(node) == ["apply", ("relay", 1, True)]
        assert node.wal.fsyncs > 0
    finally:
        await node.stop()


# --- the native scan of the file path (node.core.rowscan.relay_scan) -------------------------
def exact_only(node: Node, sub: dict[int, int], budget: int, monkeypatch, own=None) -> tuple[list, int, list]:
    """A cursor read by the exact path alone (no native scanner), in reads of `budget`."""
    with monkeypatch.context() as mp:
        mp.setattr(rowscan, "native", None)
        return reads(node, sub, budget, own)


def reads(node: Node, sub: dict[int, int], budget: int, own=None) -> tuple[list, int, list]:
    cur = WalCursor(node.wal_dir, sub, own)
    got, stops = [], []
    while True:
        frames = cur.read(node.journal.position, budget)
        if not frames:
            return unpacked(got), cur.rows, stops
        got += frames
        stops.append((cur.segment, cur.offset, len(frames)))


@pytest.mark.parametrize("budget", [1, 300, 5000, BUDGET_ALL])
async def test_the_native_file_scan_hands_out_what_the_exact_path_does(tmp_path, monkeypatch, budget):
    """Frames with local rows (some txns wanted: the exact code re-packs them), frames the
    subscriber has in part or whole, segments rotating under small sizes, budgets that end a
    read inside a buffer: the same frames, rows and stopping points either way."""
    assert rowscan.native is not None
    n = Node(tmp_path, segment_bytes_max=4096)
    await n.bootstrap()
    try:
        boundaries = []                        # the writer's lsn after each write: txn boundaries
        for i in range(12):
            await n.write(2, rows=1 + i % 3, with_local=bool(i % 4 == 1))
            boundaries.append(n.core.vclock.get(n.core.self_id))
        with open(os.path.join(n.wal_dir, list_segments(n.wal_dir)[1]), "rb") as f:
            data = f.read()
        payloads, rows, _, _ = rowscan.relay_scan(data, fmt.decode_header(data)[1], {}, BUDGET_ALL)
        assert payloads and rows > 0, "the native scan takes plain frames itself"
        me = n.core.self_id
        top = n.core.vclock.get(me)
        for sub in ({}, {me: top // 3}, {me: top - 2}, {me: top}, {me: top, 0: 10**30, 99: 1}):
            for own in (None, (me, boundaries[3]), (me, 0), (me, top), (99, 5)):
                native = reads(n, sub, budget, own)
                assert native == exact_only(n, sub, budget, monkeypatch, own), (sub, own)
                assert native[1] == rows_of(native[0])
    finally:
        await n.stop()


async def test_a_segment_gone_under_the_cursor_ends_the_link_as_a_peer_error_not_a_bug(node):
    """The WAL of a store a rejoin swapped out goes while a closed relay's read may still run
    (nemesis seed 51): that read ends its link as a RemoteProtocolError, which the relay takes
    quietly, not as the FileNotFoundError of a bug of ours, whichever file access met it."""
    await node.write(10)
    cur = WalCursor(node.wal_dir, {})
    assert cur.read(node.journal.position, 1)             # one frame: the cursor stays inside the segment
    assert cur.segment == node.journal.position[0], "on the active segment: its size is the journal's"
    for name in list_segments(node.wal_dir):
        os.remove(os.path.join(node.wal_dir, name))
    with pytest.raises(RemoteProtocolError, match="collected under the relay"):
        cur.read(node.journal.position, BUDGET_ALL)
