"""The applier bench's backlog (bench/applier.py): the rows a replog master is given while its
replica is stopped, and the floor those same rows set.

Loading: `direct_load` opens the stopped master's data dir as node/server.py does (Store ->
recover -> WalWriter -> NodeCore -> Journal) and submits `core.local_txn(ops)` from several
tasks, so group commit batches them: the WAL holds exactly what as many HTTP writes would leave
there (one frame per transaction). `http_load` writes through a running master over HTTP (PUT
per row for 1-row transactions, POST /v1/txn otherwise), much slower.

The floor: the backlog's WAL frames, read before timing and grouped as the relay groups them
(`backlog_batches`), go through msgpack decode + crc32c + one WAL write per batch + one LMDB
transaction of puts per batch in one tight loop (`floor_run`): what Python can do with no
network, no asyncio, no Txn objects and no id translation."""
from __future__ import annotations

import asyncio
import json
import os
import time

import crc32c
import lmdb
import msgpack

from bench.procs import BenchError
from node import limits
from node.core.replicaset import NodeCore
from node.core.rows import GROUP_DEFAULT, OP_PUT, Op
from node.journal import Journal
from node.storage.store import Store
from node.wal import format as walfmt
from node.wal.reader import iter_segment, list_segments
from node.wal.recovery import recover
from node.wal.writer import WalWriter

SPACE = "bench"
VALUE = "v" * 100                    # every row's value: a 100-byte string
LOAD_TIMEOUT_S = 900.0               # one load over HTTP


def key_of(i: int) -> str:
    return str(i)


def txn_ops(rows: int, txn_rows: int, first: int) -> list[list[Op]]:
    ops = [Op(OP_PUT, SPACE, key_of(first + i), VALUE) for i in range(rows - rows % txn_rows)]
    return [ops[i:i + txn_rows] for i in range(0, len(ops), txn_rows)]



# --- loading a replog master -----------------------------------------------------------------
async def direct_load(data_dir: str, rows: int, txn_rows: int, writers: int, first: int) -> None:
    """Open a stopped node's data dir as node/server.py does and write the backlog through
    the Journal (one frame per transaction, group-committed)."""
    store = Store(os.path.join(data_dir, "store"), sync=False)
    try:
        uuid = store.get_meta("uuid")
        wal_dir = os.path.join(data_dir, "wal")
        res = recover(store, wal_dir, uuid)
        wal = WalWriter(wal_dir, "write", uuid)
        wal.open_last(res.last_valid_end)
        core = NodeCore(uuid, store.table.copy(), store.vclock, hlc_last=store.get_meta("hlc") or 0,
                        spaces=store.space_flags())
        core.knowledge = store.load_knowledge()
        failed: list[BaseException] = []
        journal = Journal(core, store, wal, failed.append)
        journal.start()
        it = iter(txn_ops(rows, txn_rows, first))

        async def writer() -> None:
            for ops in it:  # the shared iterator hands each transaction to one writer
                await journal.submit([core.local_txn(ops, GROUP_DEFAULT, time.time_ns() // 1000)])

        await asyncio.gather(*(writer() for _ in range(writers)))
        await journal.stop()
        if failed:
            raise BenchError(f"direct load failed: {failed[0]!r}")
    finally:
        store.close()


async def http_load(url: str, rows: int, txn_rows: int, clients: int, first: int, ssl=None) -> None:
    import aiohttp

    def bodies():
        for ops in txn_ops(rows, txn_rows, first):
            if txn_rows == 1:
                yield "PUT", f"{url}/v1/spaces/{SPACE}/keys/{ops[0].key}", json.dumps(VALUE).encode()
            else:
                yield "POST", f"{url}/v1/txn", json.dumps(
                    {"ops": [{"op": "put", "space": SPACE, "key": o.key, "value": VALUE} for o in ops]}).encode()

    it = bodies()
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, headers={"Content-Type": "application/json"},
                                     connector=aiohttp.TCPConnector(limit=clients, ssl=ssl or True)) as session:
        async def client() -> None:
            for method, u, body in it:
                async with session.request(method, u, data=body) as r:
                    if r.status != 200:
                        raise BenchError(f"http load: {method} {u} answered {r.status}: {await r.text()}")
                    await r.read()

        await asyncio.wait_for(asyncio.gather(*(client() for _ in range(clients))), LOAD_TIMEOUT_S)


# --- the floor ---------------------------------------------------------------------------------
def backlog_batches(wal_dir: str, after_lsn: int) -> list[list[bytes]]:
    """The frame payloads holding the backlog (data txns past after_lsn), grouped as the
    relay groups them into ROWS messages (relay_batch_bytes_max)."""
    out: list[list[bytes]] = [[]]
    size = 0
    names = list_segments(wal_dir)
    for i, name in enumerate(names):
        for ref in iter_segment(os.path.join(wal_dir, name), is_last=i == len(names) - 1):
            _, txns = walfmt.unpack_frame(ref.body)
            if not any(t[2] == GROUP_DEFAULT and t[1] > after_lsn for t in txns):
                continue
            out[-1].append(ref.body)
            size += len(ref.body)
            if size >= limits.relay_batch_bytes_max:
                out.append([])
                size = 0
    return [b for b in out if b]


def floor_run(batches: list[list[bytes]], out_dir: str) -> tuple[int, float]:
    """Decode each frame as received, write the batch to a WAL file (framed: crc32c + header)
    in one write, put every row into LMDB in one transaction per batch: (rows, seconds)."""
    os.makedirs(out_dir, exist_ok=True)
    env = lmdb.open(os.path.join(out_dir, "store"), map_size=1 << 36, max_dbs=16, sync=False, metasync=False,
                    writemap=False)
    db = env.open_db(b"s:" + SPACE.encode())
    fd = os.open(os.path.join(out_dir, "floor.wal"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    pack = msgpack.Packer(use_bin_type=True).pack
    unpackb, crc, hdr, magic = msgpack.unpackb, crc32c.crc32c, walfmt._HDR.pack, walfmt.FRAME_MAGIC
    rows = 0
    try:
        t0 = time.perf_counter()
        for batch in batches:
            decoded = [unpackb(body, raw=False, strict_map_key=False) for body in batch]
            os.write(fd, b"".join(magic + hdr(len(body), crc(body)) + body for body in batch))
            with env.begin(write=True, db=db) as t:
                put = t.put
                for _, txns in decoded:
                    for rid, lsn, _group, ts, ops in txns:
                        for _kind, _space, key, value in ops:
                            put(key.encode(), pack([value, rid, lsn, ts, False]))
                            lsn += 1
                            rows += 1
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
        env.close()
    return rows, seconds
