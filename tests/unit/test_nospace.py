"""No room: a full disk or a full LMDB map (node/storage/space.py, node/journal.py, the WAL
writer). A batch that finds no room is kept and lands when room returns, its waiters answered
then; nothing of it is lost, nothing is written twice, and the node's other failures stay fatal."""
import asyncio
import errno
import os
import threading

import lmdb
import pytest

from helpers import ADDR_A, UUID_A, wal_txns
from node.cluster_space.table import STATE_MEMBER, Member
from node.core.replicaset import NodeCore, cluster_op
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, OP_PUT, OP_SPACE, Op
from node.errors import NoSpaceError, StorageError
from node.journal import Journal
from node.storage.space import SpaceWatch
from node.storage.store import Store
from node.wal import format as fmt
from node.wal import writer as walwriter
from node.wal.reader import SegmentScan, iter_segment, list_segments
from node.wal.writer import WalWriter
from tests.waiting import until

DEADLINE_S = 10


class Pieces:
    """A bootstrapped node's store, WAL, core and journal, wired as node/server.py does."""

    def __init__(self, tmp, map_size: int = 1 << 26):
        self.wal_dir = str(tmp / "wal")
        self.store = Store(str(tmp / "store"), map_size=map_size)
        self.store.put_cluster_member(Member(UUID_A, 1, ADDR_A, STATE_MEMBER))
        self.store.set_meta(uuid=UUID_A, cluster_uuid="cluster-1")
        self.wal = WalWriter(self.wal_dir, "write", UUID_A)
        self.core = NodeCore(UUID_A, self.store.table.copy(), self.store.vclock, spaces=self.store.space_flags())
        self.space = SpaceWatch([str(tmp)], 0, lambda: self.store)
        self.fatal: list[BaseException] = []
        self.journal = Journal(self.core, self.store, self.wal, self.fatal.append, space=self.space)
        self.journal.start()
        self.wall_us = 1_700_000_000_000_000

    def txn(self, ops, group=GROUP_DEFAULT):
        self.wall_us += 1
        return self.core.local_txn(ops, group, self.wall_us)

    async def bootstrap(self) -> None:
        await self.journal.submit([self.txn([cluster_op(self.core.table.get(UUID_A))], GROUP_CLUSTER)])
        await self.journal.submit([self.txn([Op(OP_SPACE, "kv", "", {"local": False, "conflict": "lww"})])])

    def put(self, key: str, value) -> asyncio.Future:
        return self.journal.submit_nowait([self.txn([Op(OP_PUT, "kv", key, value)])])

    def hold_writes(self, monkeypatch) -> tuple[threading.Event, threading.Event]:
        """The WAL's next writes block in their thread until the test lets them go: (entered,
        release). Only an executor thread may block so (a batch too big for the loop)."""
        entered, release = threading.Event(), threading.Event()
        real_write = self.wal.write_batch

        def held_write(data):
            entered.set()
            assert release.wait(DEADLINE_S), "the test never let the write go"
            return real_write(data)
        monkeypatch.setattr(self.wal, "write_batch", held_write)
        return entered, release

    async def stop(self) -> None:
        await asyncio.wait_for(self.journal.stop(), DEADLINE_S)
        self.store.close()


async def _until_kept(p: Pieces, values) -> tuple[list[tuple[str, int]], asyncio.Future, str]:
    """Write one txn at a time until one is not answered: the journal keeps it. Returns the
    acknowledged (key, lsn)s, the kept txn's future and its key."""
    acked = []
    for i, value in enumerate(values):
        key = f"k{i % 8}"
        lsn = p.core.claimed.get(1) + 1
        fut = p.put(key, value)
        try:
            await asyncio.wait_for(asyncio.shield(fut), 2)
        except asyncio.TimeoutError:
            return acked, fut, key
        acked.append((key, lsn))
    raise AssertionError("the map never filled")


async def test_a_batch_that_finds_the_map_full_is_kept_and_lands_once_pages_are_free(tmp_path):
    p = Pieces(tmp_path, map_size=1 << 20)
    await p.bootstrap()
    reader = p.store.env.begin()      # a long reader (a backup): pages it sees are not reused
    acked, kept, key = await _until_kept(p, ("x" * 1500 for _ in range(10_000)))
    assert isinstance(p.journal.nospace, NoSpaceError) and p.journal.nospace.kind == "map"
    assert p.space.alarm is not None and "map is full" in p.space.alarm and p.fatal == []
    assert p.store.get("kv", key).lsn < p.core.claimed.get(1), "the kept write is not in the store yet"
    later = p.put("later", 1)                         # queued behind the kept batch
    reader.abort()
    await asyncio.wait_for(asyncio.gather(kept, later), DEADLINE_S)
    assert p.space.alarm is None and p.journal.nospace is None and p.fatal == []
    last = p.core.claimed.get(1)
    assert p.store.vclock.get(1) == last and p.store.get("kv", "later").lsn == last
    lsns = [t.lsn for t in wal_txns(p.wal_dir)]
    assert lsns == list(range(1, last + 1)), "every lsn in the WAL once, in order"
    await p.stop()


async def test_a_wal_write_that_finds_the_disk_full_leaves_nothing_and_lands_when_room_returns(tmp_path, monkeypatch):
    p = Pieces(tmp_path)
    await p.bootstrap()
    real_write = os.write
    full = {"on": True}

    def write(fd, data):
        if full["on"] and fd == p.wal._fd:
            real_write(fd, bytes(data)[: len(data) // 2])     # half of it lands, then no room
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(walwriter.os, "write", write)
    end = p.wal.end
    fut = p.put("a", "value")
    await until(lambda: p.journal.nospace is not None, DEADLINE_S, "the journal to meet the full disk")
    assert not fut.done() and p.journal.nospace is not None and p.journal.nospace.kind == "disk"
    assert os.path.getsize(os.path.join(p.wal_dir, p.wal.segment)) == end, "the half-written frame was cut off"
    assert p.journal.position[1] == end
    full["on"] = False
    await asyncio.wait_for(fut, DEADLINE_S)
    assert p.space.alarm is None and p.store.get("kv", "a").value == "value"
    assert [t.lsn for t in wal_txns(p.wal_dir)] == [1, 2, 3]
    await p.stop()


async def test_a_disk_failure_that_is_not_a_full_disk_still_stops_the_node(tmp_path, monkeypatch):
    p = Pieces(tmp_path)
    await p.bootstrap()

    def broken(fd, data):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(walwriter.os, "write", broken)
    with pytest.raises(OSError):
        await asyncio.wait_for(p.put("a", 1), DEADLINE_S)
    assert p.fatal and p.journal.nospace is None
    monkeypatch.undo()
    p.store.close()


def test_a_segment_that_cannot_be_created_for_lack_of_room_leaves_no_file(tmp_path, monkeypatch):
    w = WalWriter(str(tmp_path / "wal"), "write", UUID_A)

    def short(fd, data):
        return 0                                  # the disk took nothing

    monkeypatch.setattr(walwriter.os, "write", short)
    with pytest.raises(OSError) as e:
        w.rotate({1: 5}, [[UUID_A, 1, ADDR_A, STATE_MEMBER, 0]])
    assert e.value.errno == errno.ENOSPC
    assert os.listdir(w.dir) == [] and w.needs_rotation
    monkeypatch.undo()
    w.rotate({1: 5}, [[UUID_A, 1, ADDR_A, STATE_MEMBER, 0]])
    w.write_batch(fmt.encode_frame([[1, 6, GROUP_DEFAULT, 1, [[OP_PUT, "kv", "k", 1]]]], 1))
    scan = SegmentScan("", None)
    assert len(list(iter_segment(os.path.join(w.dir, list_segments(w.dir)[0]), is_last=True, scan=scan))) == 1
    w.close()


def test_the_store_blames_a_failed_write_on_room_only_when_room_is_short(tmp_path):
    s = Store(str(tmp_path / "store"), map_size=1 << 20)
    assert isinstance(s.write_failed("w", lmdb.MapFullError("full")), NoSpaceError)
    nospace = s.write_failed("w", lmdb.Error(f"mdb_txn_commit: {os.strerror(errno.ENOSPC)}"))
    assert isinstance(nospace, NoSpaceError) and nospace.kind == "disk"
    eio = s.write_failed("w", lmdb.Error(f"mdb_txn_commit: {os.strerror(errno.EIO)}"))
    assert type(eio) is StorageError, "an I/O error with gigabytes free is a broken disk"
    s.close()


def test_space_warns_before_the_map_fills_and_raises_the_alarm_below_the_disk_reserve(tmp_path):
    s = Store(str(tmp_path / "store"), map_size=1 << 20)
    w = SpaceWatch([str(tmp_path)], 0, lambda: s)
    w.sample()
    assert w.alarm is None and w.warnings() == []
    i = 0
    while s.space()["map_used"] < 0.92 * s.space()["map_size"]:
        s.set_meta(**{f"filler{i}": "x" * 3000})
        i += 1
    w.sample()
    assert w.alarm is None and any("map is 9" in x for x in w.warnings()), w.warnings()
    huge = SpaceWatch([str(tmp_path)], 1 << 62, lambda: s)      # more reserve than any disk has
    huge.sample()
    assert huge.alarm is not None and "disk_reserve_bytes" in huge.alarm and huge.info()["alarms"] == ["NOSPACE"]
    s.close()


def test_space_samples_after_every_part_of_the_reserve_the_wal_took_however_fast_writes_come(tmp_path):
    """A writer faster than the timed sample must not run through the reserve between two samples:
    the journal reports the WAL's byte counter after every batch, and a part of the reserve taken
    since the last sample makes the watch sample at once."""
    from node import limits
    reserve = 1 << 62                                            # more than any disk has: a sample raises it
    w = SpaceWatch([str(tmp_path)], reserve, lambda: None)
    part = reserve // limits.space_sample_reserve_parts
    w.wrote(part - 1)
    assert w.alarm is None and w.disk_free is None, "less than a part written: no sample yet"
    w.wrote(part)
    assert w.alarm is not None and w.disk_free is not None, "a part written: sampled, and the reserve is short"
    none = SpaceWatch([str(tmp_path)], 0, lambda: None)          # no reserve: nothing to watch per batch
    none.wrote(1 << 40)
    assert none.disk_free is None
