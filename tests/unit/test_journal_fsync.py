"""The durability contract of the journal (node/journal.py) by fault injection.

The node is built as node/server.py `_bootstrap_new_cluster` + `_open_bootstrapped` do it:
the node's own member (id 1) put into the store, recovery, a WalWriter continuing the last
segment, NodeCore, Journal, then a `_cluster` txn as the first write.

wal_mode = fsync: the injected fsync records each segment's length when it is synced; a
power loss keeps only that (plus any prefix of the unsynced bytes). wal_mode = write: a
process crash keeps everything written (plus any prefix of the write it died in).
Either way, recovery must hold every transaction whose `journal.submit` returned."""

import asyncio
import errno
import os
import shutil

import pytest

from helpers import UUID_A, open_store, store_state, wal_txns
from node.core.replicaset import NodeCore, cluster_op
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, OP_PUT, OP_SPACE, Op
from node.journal import Journal
from node.wal import format as fmt
from node.wal.reader import list_segments
from node.wal.recovery import recover
from node.wal.writer import WalWriter

WRITERS = 4
TXNS_PER_WRITER = 12
SEGMENT_BYTES_MAX = 700          # a few batches per segment, so crashes fall across rotations
DEADLINE_S = 10                  # a waiter left hanging fails the test instead of the run


class Crash(Exception):
    """The machine (power loss) or the process dies at this point."""


class FaultPoint:
    """Counts calls once armed (after bootstrap) and fires on the `at`-th one."""

    def __init__(self, at: int | None):
        self.at = at
        self.calls = 0
        self.armed = False
        self.fired = False

    def hit(self) -> bool:
        if not self.armed or self.at is None:
            return False
        self.calls += 1
        self.fired = self.calls == self.at
        return self.fired


class Node:
    """The pieces of a bootstrapped node, wired like node/server.py."""

    def __init__(self, data_dir, mode: str, fault: FaultPoint, *, fsync_error: BaseException | None = None,
                 torn_bytes: float = 0.0):
        self.data_dir = data_dir
        self.wal_dir = str(data_dir / "wal")
        self.mode = mode
        self.fault = fault
        self.fsync_error = fsync_error
        self.torn_bytes = torn_bytes
        self.synced: dict[str, int] = {}      # segment -> length at its last fsync
        self.written: dict[str, int] = {}     # segment -> length after its last write
        self.fatal: list[BaseException] = []
        self.store = open_store(data_dir / "store", UUID_A, sync=(mode == "fsync"))
        res = recover(self.store, self.wal_dir, UUID_A)
        self.wal = WalWriter(self.wal_dir, mode, UUID_A, segment_bytes_max=SEGMENT_BYTES_MAX, fsync=self._fsync)
        self.wal.open_last(res.last_valid_end)
        real_write = self.wal.write_batch
        self.wal.write_batch = lambda data: self._write(real_write, data)
        self.core = NodeCore(UUID_A, self.store.table.copy(), self.store.vclock,
                             hlc_last=self.store.get_meta("hlc") or 0, spaces=self.store.space_flags())
        self.core.knowledge = self.store.load_knowledge()
        self.journal = Journal(self.core, self.store, self.wal, self.fatal.append)
        self.journal.start()
        self.wall_us = 1_700_000_000_000_000

    # --- fault points ---------------------------------------------------------------
    def _fsync(self, fd: int) -> None:
        if self.fault.hit():
            raise self.fsync_error or Crash("power loss at fsync")
        self.synced[self.wal.segment] = os.fstat(fd).st_size

    def _write(self, real_write, data: bytes):
        if self.mode == "write" and self.fault.hit():
            # the process dies inside the write: part of the batch reaches the page cache
            n = int(len(data) * self.torn_bytes)
            if n:
                os.write(self.wal._fd, data[:n])
            raise Crash("process crash during write")
        pos = real_write(data)
        self.written[pos[0]] = pos[2]
        return pos

    # --- writes ---------------------------------------------------------------------
    def txn(self, ops, group=GROUP_DEFAULT):
        self.wall_us += 1
        return self.core.local_txn(ops, group, self.wall_us)

    async def bootstrap(self) -> None:
        me = self.core.table.get(UUID_A)
        await self.journal.submit([self.txn([cluster_op(me)], GROUP_CLUSTER)])
        await self.journal.submit([self.txn([Op(OP_SPACE, "data", "", {"local": False, "conflict": "lww"})])])

    async def workload(self) -> tuple[dict[str, int], list[tuple[str, BaseException]]]:
        """WRITERS concurrent clients, each submitting one txn at a time until refused.
        Returns the acknowledged keys (with their lsn) and the refused ones."""
        acked: dict[str, int] = {}
        refused: list[tuple[str, BaseException]] = []

        async def client(w: int) -> None:
            for j in range(TXNS_PER_WRITER):
                key = f"w{w}-{j}"
                txn = self.txn([Op(OP_PUT, "data", key, {"w": w, "j": j})])
                try:
                    await self.journal.submit([txn])
                except (Crash, OSError) as e:
                    refused.append((key, e))
                    return
                acked[key] = txn.lsn

        await asyncio.wait_for(asyncio.gather(*(client(w) for w in range(WRITERS))), DEADLINE_S)
        return acked, refused

    async def stop(self) -> None:
        await asyncio.wait_for(self.journal.stop(), DEADLINE_S)
        self.store.close()


def header_len(path: str) -> int:
    with open(path, "rb") as f:
        return fmt.decode_header(f.read())[1]


def power_loss_image(node: Node, dst, unsynced_kept: float) -> str:
    """The WAL as the disk holds it after power loss: each segment cut to its last fsync
    (a segment never synced by write_batch keeps the header rotate() synced), plus a
    prefix of the unsynced bytes of the last segment."""
    shutil.copytree(node.wal_dir, dst)
    names = list_segments(str(dst))
    for i, name in enumerate(names):
        path = os.path.join(dst, name)
        size = os.path.getsize(path)
        durable = node.synced.get(name) or header_len(path)
        if i == len(names) - 1:
            durable += int((size - durable) * unsynced_kept)
        with open(path, "r+b") as f:
            f.truncate(durable)
    return str(dst)


def check_recovered(tmp_path, image: str, acked: dict[str, int], label: str) -> dict:
    """Recover the image into a store that lost everything (only the bootstrap entry
    written outside the WAL): every acknowledged transaction must come back."""
    store = open_store(tmp_path / f"recovered-{label}", UUID_A)
    recover(store, image, UUID_A)
    missing = [k for k in acked if store.get("data", k) is None]
    assert not missing, f"acknowledged but lost after the crash: {missing}"
    assert store.vclock.get(1) >= max(acked.values(), default=2)
    # the WAL holds a gap-free prefix of the claimed lsns
    lsns = sorted(t.lsn for t in wal_txns(image) if t.component == 1)
    assert lsns == list(range(1, len(lsns) + 1))
    state = store_state(store)
    store.close()
    return state


@pytest.mark.parametrize("unsynced_kept", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("crash_at", [1, 2, 4, 7])
async def test_fsync_mode_keeps_every_acknowledged_write_through_power_loss(tmp_path, crash_at, unsynced_kept):
    node = Node(tmp_path / "node", "fsync", FaultPoint(crash_at))
    await node.bootstrap()
    node.fault.armed = True
    acked, refused = await node.workload()
    assert node.fault.fired, "the workload ended before the crash point"
    assert len(node.fatal) == 1 and isinstance(node.fatal[0], Crash)
    assert refused and all(isinstance(e, Crash) for _, e in refused)
    acked["bootstrap"] = 2
    await node.stop()

    image = power_loss_image(node, tmp_path / "image", unsynced_kept)
    fresh = check_recovered(tmp_path, image, {k: v for k, v in acked.items() if k != "bootstrap"}, "fresh")
    # the node's own store, as it was left, recovers to the same state from the same WAL
    store = open_store(tmp_path / "node" / "store", UUID_A)
    recover(store, image, UUID_A)
    assert store_state(store)["data"] == fresh["data"]
    store.close()


@pytest.mark.parametrize("torn_bytes", [0.0, 0.5, 0.99])
@pytest.mark.parametrize("crash_at", [1, 3, 6])
async def test_write_mode_keeps_every_acknowledged_write_through_a_process_crash(tmp_path, crash_at, torn_bytes):
    node = Node(tmp_path / "node", "write", FaultPoint(crash_at), torn_bytes=torn_bytes)
    await node.bootstrap()
    node.fault.armed = True
    acked, refused = await node.workload()
    assert node.fault.fired
    assert len(node.fatal) == 1 and isinstance(node.fatal[0], Crash)
    assert refused and all(isinstance(e, Crash) for _, e in refused)
    # the process is gone: the files hold every completed write and part of the last one
    last = list_segments(node.wal_dir)[-1]
    size = os.path.getsize(os.path.join(node.wal_dir, last))
    assert size >= node.written.get(last, header_len(os.path.join(node.wal_dir, last)))
    image = shutil.copytree(node.wal_dir, tmp_path / "image")
    await node.stop()
    check_recovered(tmp_path, str(image), acked, "fresh")


async def test_a_failing_fsync_fails_every_waiter_and_calls_on_fatal(tmp_path):
    error = OSError(errno.EIO, "Input/output error")
    node = Node(tmp_path / "node", "fsync", FaultPoint(3), fsync_error=error)
    await node.bootstrap()
    durable_before = node.core.vclock.get(1)
    node.fault.armed = True
    acked, refused = await node.workload()
    # every waiter got an answer (the deadline would have fired otherwise): each client
    # was acknowledged until the failure, then refused with the failure itself
    assert len(refused) == WRITERS
    assert refused and all(e is error for _, e in refused)
    assert node.fatal == [error]
    assert node.journal.failed is error
    assert node.journal.pending == 0, "what failed is answered: nothing is left to drain"
    with pytest.raises(OSError):
        node.journal.submit_nowait([node.txn([Op(OP_PUT, "data", "late", 1)])])
    # nothing that failed to persist counts as durable or reached the store
    assert node.core.vclock.get(1) == node.store.vclock.get(1) == max(acked.values(), default=durable_before)
    for key, _ in refused:
        assert node.store.get("data", key) is None
    for key in acked:
        assert node.store.get("data", key) is not None
    await node.stop()


async def test_fsync_mode_syncs_every_batch_before_acknowledging_it(tmp_path):
    node = Node(tmp_path / "node", "fsync", FaultPoint(None))
    await node.bootstrap()
    acked, refused = await node.workload()
    assert not refused and len(acked) == WRITERS * TXNS_PER_WRITER
    assert node.wal.fsyncs == node.journal.batches
    assert node.journal.batches < node.journal.txns_written      # group commit shares fsyncs
    # with nothing lost, the synced lengths are the whole files
    for name in list_segments(node.wal_dir):
        path = os.path.join(node.wal_dir, name)
        assert node.synced.get(name, header_len(path)) == os.path.getsize(path)
    await node.stop()
