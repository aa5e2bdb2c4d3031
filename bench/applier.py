"""Applier throughput: a replica catching up a backlog, replog beside Tarantool (issue 5).

The workload, the same for both systems, per run and per transaction shape:
  1. a fresh master (wal_mode = write) with one space; a replica joins it and catches up;
  2. the replica is stopped (SIGTERM);
  3. the master gets N rows {unsigned key, 100-byte string} as N / txn_rows transactions
     of txn_rows rows (1: N separate single-row transactions; 100: 100-row transactions);
  4. the replica process is started again. The clock runs from just before its exec until
     its durable vclock reaches the master's (replog: `/v1/info` vclock_uuid, polled every
     20 ms over one keep-alive connection; Tarantool: a fiber in the replica polls
     box.info.vclock every 1 ms and writes the CLOCK_MONOTONIC time it saw the target).
     rows/s = N / that time, process start-up included, as in the reference figures.
Neither system checkpoints during a run (replog: --checkpoint-interval-s 86400; Tarantool:
checkpoint_interval = 0), and a replog catch-up that turned into a snapshot rejoin fails
the run instead of reporting a figure.
The two systems alternate (replog run 1, Tarantool run 1, replog run 2, ...); the tables show
medians of --runs runs. Tarantool runs when `tarantool` is on PATH (Debian package
`tarantool`; the Lua scripts are in bench/tarantool/).

Loading the master is not timed. `--load direct` (default) stops the replog master and
writes the backlog in-process through the node's own write path (Store -> recover ->
WalWriter -> NodeCore -> Journal, as node/server.py opens a node, with --writers tasks each
submitting `core.local_txn(ops)` so group commit batches them), then starts it again: the
WAL holds exactly what N HTTP writes would leave there (one frame per transaction). `--load
http` writes through the running master over HTTP instead (PUT per row for 1-row
transactions, POST /v1/txn per transaction otherwise, from --http-clients clients); it is
much slower to load. Tarantool is loaded inside the master by 64 fibers.

Also printed, per shape:
  floor   the same backlog rows (the master's WAL frames, read before timing) through
          msgpack decode + crc32c + one WAL write per 1 MiB relay batch (the received
          frame bytes, not re-encoded) + one LMDB transaction of puts per batch (records
          packed as the store packs them), in one
          tight loop in this process: what Python can do with no network, no asyncio, no
          Txn objects, no id translation. `vs floor` = rows/s / floor rows/s.
  RSS     the replica process's peak resident set (VmHWM from /proc/<pid>/status, read
          while it runs, after it caught up).
  CPU     replica (and master) CPU time during the catch-up, % of one core; and the
          replica's CPU microseconds per row, which other load on the machine disturbs far
          less than rows/s (a starved replica waits longer but does the same work).

    python -m bench.applier                                  # 1M rows, 1- and 100-row txns, 3 runs each
    python -m bench.applier --rows 200000 --runs 1           # a quick look
    python -m bench.applier --only replog --txn-rows 100
    python -m bench.applier --profile --rows 300000 --txn-rows 1   # py-spy on the replica's catch-up
    python -m bench.applier --only replog --gc-stats --replica-prelude "import gc; gc.freeze()"
    python -m bench.applier --only replog --links plain,tls,nomac   # TLS and the per-message MAC, alternating
    python -m bench.applier --links plain,base --baseline /tmp/replog-main   # this tree beside another checkout

`--links` runs replog with each link variant of bench/links.py in turn (replog = sealed
messages, replog+tls = the same inside TLS, replog-nomac = without the per-message tag), so
their figures come from one alternating run and sit in one table.

`--gc-stats` times the replog replica's cyclic garbage collector (gc.callbacks, CPU time of
the collecting thread) and `--replica-prelude` runs a line of Python in the replica before
the node starts: together they let a change be tried on the real workload without editing
node/ (the replica then runs as `python -c <prelude + runpy node>`, otherwise identical).

Figures only: nothing here asserts on timing."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import crc32c
import lmdb
import msgpack

from bench import links as links_mod
from bench.links import SYSTEM, LinkSetup
from bench.common import LoadWatch, dump_json, machine, median, print_load, print_machine, print_table
from bench.procs import (BenchError, ReplogNode, TarantoolNode, code_version, proc_cpu_s, proc_status_kib,
                         wait_for)
from bench.pyspy import child_pid, print_profile, summarize_pyspy
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
ROWS_DEFAULT = 1_000_000
RUNS_DEFAULT = 3
WRITERS_DEFAULT = 64                 # --load direct: concurrent submitting tasks (group commit)
HTTP_CLIENTS_DEFAULT = 32            # --load http: concurrent HTTP clients
TARANTOOL_FIBERS = 64                # Tarantool's loader fibers (group commit in its WAL thread)
TARANTOOL_MEMTX_MB = 1024            # memtx arena of each Tarantool instance (1M rows take ~200 MiB)
CATCHUP_TIMEOUT_S = 600.0            # one catch-up; past it the run fails rather than hangs
LOAD_TIMEOUT_S = 900.0               # one load over HTTP
POLL_S = 0.02                        # replica vclock polling during a catch-up
# No checkpoint during a run (Tarantool's scripts say checkpoint_interval = 0): a checkpoint
# on the restarted master, which has not yet seen the stopped replica's ack, would collect
# the backlog's WAL and turn the catch-up into a rejoin from a snapshot.
NO_CHECKPOINT = ["--checkpoint-interval-s", "86400"]
TARANTOOL_POLL_S = 0.005             # the done file a Tarantool replica writes
MIB = 1024 * 1024


@dataclass
class Run:
    system: str                      # "replog", "tarantool" or "floor"
    txn_rows: int
    rows: int
    seconds: float                   # catch-up: replica exec -> vclock reached the master's
    startup_s: float = float("nan")  # replica exec -> first HTTP answer (replog only)
    peak_rss_kib: int | None = None
    replica_cpu_s: float = float("nan")
    master_cpu_s: float = float("nan")
    load_s: float = float("nan")     # loading the master (not part of the figure)
    rss_anon_kib: int | None = None  # the replica's resident set when it caught up: anonymous
    rss_file_kib: int | None = None  # ... and file-backed (LMDB's map; Tarantool has none)
    gc_cpu_s: float = float("nan")   # --gc-stats: CPU the replica's cyclic GC took (its whole life)
    gc_full: int | None = None       # --gc-stats: full (generation 2) collections

    @property
    def rows_s(self) -> float:
        return self.rows / self.seconds


def key_of(i: int) -> str:
    return str(i)


def txn_ops(rows: int, txn_rows: int, first: int) -> list[list[Op]]:
    ops = [Op(OP_PUT, SPACE, key_of(first + i), VALUE) for i in range(rows - rows % txn_rows)]
    return [ops[i:i + txn_rows] for i in range(0, len(ops), txn_rows)]


# --- loading a replog master -----------------------------------------------------------------
async def _direct_load(data_dir: str, rows: int, txn_rows: int, writers: int, first: int) -> None:
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


async def _http_load(url: str, rows: int, txn_rows: int, clients: int, first: int, ssl=None) -> None:
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


# --- one replog run --------------------------------------------------------------------------
def _stop_all(*nodes) -> None:
    for n in nodes:
        if n is not None:
            n.stop()


def _catch_up(replica, master, master_uuid: str, target: int, rows: int, txn_rows: int) -> Run:
    """The replica process is already started; poll until it holds `target`."""
    c0 = master.cpu_s() or 0.0
    t0 = replica.started_at
    startup = float("nan")
    hwm = None
    deadline = t0 + CATCHUP_TIMEOUT_S
    while True:
        replica.check_alive()
        hwm = replica.peak_rss_kib() or hwm
        lsn = replica.lsn_of(master_uuid)
        now = time.monotonic()
        if startup != startup and lsn > 0:
            startup = now - t0
        if lsn >= target:
            break
        if now > deadline:
            raise BenchError(f"replica did not catch up within {CATCHUP_TIMEOUT_S:.0f} s (at {lsn} of {target})")
        time.sleep(POLL_S)
    seconds = now - t0
    if "rejoin" in replica.log_tail(200):
        raise BenchError(f"{replica.name} rejoined from a snapshot instead of catching up from the WAL")
    hwm = replica.peak_rss_kib() or hwm
    anon, file_backed = replica.rss_split_kib()
    return Run("replog", txn_rows, rows, seconds, startup, hwm, replica.cpu_s() or float("nan"),
               (master.cpu_s() or 0.0) - c0, rss_anon_kib=anon, rss_file_kib=file_backed)


def replog_prepare(base: str, rows: int, txn_rows: int, args: argparse.Namespace, links: str = "plain"
                   ) -> tuple[ReplogNode, ReplogNode, str, int, int, float]:
    """Steps 1-3: master + joined replica, replica stopped, backlog written. Returns the
    nodes (master running, replica stopped), the master's uuid, the lsn before and after
    the backlog, and the seconds the load took. `links`: bench/links.py."""
    setup = LinkSetup(base, args.baseline)
    master = ReplogNode("master", os.path.join(base, "master"), log_level="warning", extra=NO_CHECKPOINT,
                        **setup.node_kwargs(links, "master")).start()
    replica = None
    try:
        master.create_space(SPACE)
        master_uuid = master.info()["uuid"]
        replica = ReplogNode("replica", os.path.join(base, "replica"), peers=[master.address],
                             log_level="warning", extra=NO_CHECKPOINT, **setup.node_kwargs(links, "replica")).start()
        before = master.lsn_of(master_uuid)
        wait_for(lambda: replica.lsn_of(master_uuid) >= before, 60, "the replica to join")
        replica.stop()
        t0 = time.monotonic()
        if args.load == "direct":
            master.stop()
            asyncio.run(_direct_load(master.data_dir, rows, txn_rows, args.writers, 1))
            master.start()
        else:
            asyncio.run(_http_load(master.url, rows, txn_rows, args.http_clients, 1, master.ssl_context))
        load_s = time.monotonic() - t0
        after = master.lsn_of(master_uuid)
        if after - before < rows - rows % txn_rows:
            raise BenchError(f"the master holds {after - before} new rows, expected {rows}")
        return master, replica, master_uuid, before, after, load_s
    except BaseException:
        _stop_all(replica, master)
        raise


# The replica under --replica-prelude / --gc-stats: `python -c` runs the prelude, then the
# node exactly as `python -m node` would (ReplogNode.argv). gc.callbacks time every collection on the thread
# that ran it; the totals are written at exit (the node exits normally on SIGTERM).
_GC_STATS = """
import atexit, gc, json, time
_gc = {{"cpu_s": [0.0, 0.0, 0.0], "n": [0, 0, 0], "t": 0.0}}
def _gc_cb(phase, info):
    if phase == "start":
        _gc["t"] = time.thread_time()
    else:
        g = info["generation"]
        _gc["n"][g] += 1
        _gc["cpu_s"][g] += time.thread_time() - _gc["t"]
gc.callbacks.append(_gc_cb)
def _gc_dump():
    with open({path!r}, "w") as f:
        json.dump(_gc, f)
atexit.register(_gc_dump)
"""


def _start_replica(replica: ReplogNode, args: argparse.Namespace, gc_path: str) -> None:
    gc_stats = _GC_STATS.format(path=gc_path) if args.gc_stats else ""
    replica.prelude = (replica.prelude + "\n" + gc_stats + "\n" + args.replica_prelude).strip()
    replica.start(wait=False)


def replog_run(base: str, rows: int, txn_rows: int, args: argparse.Namespace, links: str = "plain"
               ) -> tuple[Run, list[list[bytes]]]:
    """One replog run; also returns the backlog's frames in relay batches for the floor."""
    master, replica, master_uuid, before, target, load_s = replog_prepare(base, rows, txn_rows, args, links)
    gc_path = os.path.join(base, "replica-gc.json")
    try:
        _start_replica(replica, args, gc_path)
        run = _catch_up(replica, master, master_uuid, target, target - before, txn_rows)
        run.system = SYSTEM[links]
        run.load_s = load_s
    finally:
        _stop_all(replica, master)
    if args.gc_stats:
        try:
            with open(gc_path) as f:
                st = json.load(f)
            run.gc_cpu_s, run.gc_full = sum(st["cpu_s"]), st["n"][2]
        except (OSError, ValueError, KeyError):
            pass                     # the replica did not exit normally: no figure
    return run, backlog_batches(os.path.join(master.data_dir, "wal"), before)


# --- one Tarantool run -----------------------------------------------------------------------
def tarantool_run(base: str, rows: int, txn_rows: int, args: argparse.Namespace) -> Run:
    env = {"BENCH_MEMTX_MB": str(args.memtx_mb)}
    master = TarantoolNode("master", os.path.join(base, "master"), "applier_master.lua", env).start()
    replica = None
    try:
        replica = TarantoolNode("replica", os.path.join(base, "replica"), "applier_replica.lua",
                                {**env, "BENCH_MASTER": master.address}).start()
        before = int(master.call("info")["vclock"].get("1", 0))      # the replica's registration included
        wait_for(lambda: int(replica.call("info")["vclock"].get("1", 0)) >= before, 60, "the replica to join")
        replica.stop()
        loaded = master.call("load", rows=rows, txn_rows=txn_rows, fibers=TARANTOOL_FIBERS)
        target = int(loaded["vclock"]["1"])
        done_file = os.path.join(base, "caught_up")
        c0 = master.cpu_s() or 0.0
        replica.start(wait=False, env={"BENCH_TARGET_LSN": str(target), "BENCH_DONE_FILE": done_file})
        t0 = replica.started_at

        def done() -> bool:
            replica.check_alive()
            return os.path.exists(done_file)

        wait_for(done, CATCHUP_TIMEOUT_S, "the Tarantool replica to catch up", TARANTOOL_POLL_S)
        with open(done_file) as f:
            seconds = float(f.read()) - t0
        anon, file_backed = replica.rss_split_kib()
        return Run("tarantool", txn_rows, target - before, seconds, float("nan"), replica.peak_rss_kib(),
                   replica.cpu_s() or float("nan"), (master.cpu_s() or 0.0) - c0, float(loaded["seconds"]),
                   anon, file_backed)
    finally:
        _stop_all(replica, master)


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


def floor_run(batches: list[list[bytes]], out_dir: str, txn_rows: int) -> Run:
    """Decode each frame as received, write the batch to a WAL file (framed: crc32c + header)
    in one write, put every row into LMDB in one transaction per batch."""
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
    return Run("floor", txn_rows, rows, seconds)


# --- profiling the replica ------------------------------------------------------------------
def profile_run(base: str, rows: int, txn_rows: int, args: argparse.Namespace) -> dict[str, Any]:
    """One replog catch-up with the replica started under `py-spy record` (raw collapsed
    stacks, per thread, idle frames included so waiting can be told from work)."""
    pyspy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(pyspy):
        raise BenchError("py-spy is not installed (pip install py-spy into the venv)")
    master, replica, master_uuid, before, target, _ = replog_prepare(base, rows, txn_rows, args, args.links[0])
    raw = os.path.join(base, "replica.pyspy.txt")
    try:
        argv = [pyspy, "record", "--format", "raw", "--threads", "--rate", str(args.profile_rate), "-o", raw]
        argv += ["--gil"] if args.profile_gil else ["--idle"]
        replica._spawn(argv + ["--"] + replica.argv(), {"PYTHONUNBUFFERED": "1"})
        child = wait_for(lambda: child_pid(replica.pid), 30, "py-spy's child")
        proxy = _PidView(replica, child)
        run = _catch_up(proxy, master, master_uuid, target, target - before, txn_rows)
        os.kill(child, signal.SIGTERM)       # py-spy writes its output when its child exits
        replica.proc.wait(60)
    finally:
        _stop_all(replica, master)
    doc = summarize_pyspy(raw, args.top)
    doc.update(rows=run.rows, txn_rows=txn_rows, seconds_under_profiler=run.seconds,
               rows_s_under_profiler=run.rows_s, rate_hz=args.profile_rate, raw=raw,
               gil=args.profile_gil)
    return doc


class _PidView:
    """The replica as _catch_up sees it, when the process to watch is py-spy's child."""

    def __init__(self, node: ReplogNode, pid: int):
        self.node, self._pid = node, pid
        self.started_at = node.started_at

    def check_alive(self) -> None:
        self.node.check_alive()

    def log_tail(self, n: int) -> str:
        return self.node.log_tail(n)

    def lsn_of(self, uuid: str) -> int:
        return self.node.lsn_of(uuid)

    def peak_rss_kib(self) -> int | None:
        return proc_status_kib(self._pid, "VmHWM")

    def cpu_s(self) -> float | None:
        return proc_cpu_s(self._pid)

    def rss_split_kib(self) -> tuple[int | None, int | None]:
        return proc_status_kib(self._pid, "RssAnon"), proc_status_kib(self._pid, "RssFile")


# --- the matrix --------------------------------------------------------------------------------
def summarize(runs: list[Run]) -> dict[str, Any]:
    r = runs[0]
    return {
        "system": r.system, "txn_rows": r.txn_rows, "rows": r.rows, "runs": len(runs),
        "seconds": median(x.seconds for x in runs),
        "rows_s": median(x.rows_s for x in runs),
        "each_rows_s": [round(x.rows_s) for x in runs],
        "startup_s": median(x.startup_s for x in runs),
        "peak_rss_mib": median((x.peak_rss_kib or float("nan")) / 1024 for x in runs),
        "end_rss_anon_mib": median((x.rss_anon_kib or float("nan")) / 1024 for x in runs),
        "end_rss_file_mib": median((x.rss_file_kib or float("nan")) / 1024 for x in runs),
        "replica_cpu_pct": median(100.0 * x.replica_cpu_s / x.seconds for x in runs),
        # CPU per row moves much less than rows/s when other work shares the machine
        "replica_cpu_us_row": median(1e6 * x.replica_cpu_s / x.rows for x in runs),
        "master_cpu_pct": median(100.0 * x.master_cpu_s / x.seconds for x in runs),
        "load_s": median(x.load_s for x in runs),
        "gc_cpu_s": median(x.gc_cpu_s for x in runs),
    }


def run_matrix(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    variants = {SYSTEM[v]: v for v in args.links} if "replog" in args.systems else {}
    systems = list(variants) + [s for s in ("tarantool",) if s in args.systems]
    for txn_rows in args.txn_rows:
        runs: dict[str, list[Run]] = {s: [] for s in systems + ["floor"]}
        for i in range(args.runs):
            for system in systems:
                base = tempfile.mkdtemp(prefix=f"applier-{system}-{txn_rows}-", dir=args.dir)
                try:
                    if system in variants:
                        run, batches = replog_run(base, args.rows, txn_rows, args, variants[system])
                        extra = ""
                        if system == systems[0]:     # the floor once per round, beside the first variant
                            fl = floor_run(batches, os.path.join(base, "floor"), txn_rows)
                            runs["floor"].append(fl)
                            extra = f"; floor {fl.rows_s:,.0f} rows/s"
                        del batches
                    else:
                        run = tarantool_run(base, args.rows, txn_rows, args)
                        extra = ""
                finally:
                    if not args.keep:
                        shutil.rmtree(base, ignore_errors=True)
                runs[system].append(run)
                if not args.json:
                    print(f"  {system:9} {txn_rows:>3}-row txns run {i + 1}/{args.runs}: {run.rows:,} rows in "
                          f"{run.seconds:.2f} s = {run.rows_s:,.0f} rows/s (start-up {run.startup_s:.2f} s, "
                          f"peak RSS {(run.peak_rss_kib or 0) / 1024:.0f} MiB [at the end: anon {(run.rss_anon_kib or 0) / 1024:.0f}, "
                          f"file {(run.rss_file_kib or 0) / 1024:.0f}], load {run.load_s:.1f} s"
                          + (f", GC {run.gc_cpu_s:.2f} CPU-s / {run.gc_full} full" if run.gc_full is not None else "")
                          + f"){extra}"
                          + (f" [{base}]" if args.keep else ""), file=sys.stderr, flush=True)
        summary = {s: summarize(r) for s, r in runs.items() if r}
        fl = summary.get("floor")
        for s in summary.values():
            s["vs_floor"] = s["rows_s"] / fl["rows_s"] if fl else float("nan")
        if "replog" in summary and "tarantool" in summary:
            summary["replog"]["vs_tarantool"] = summary["replog"]["rows_s"] / summary["tarantool"]["rows_s"]
        out += list(summary.values())
    return out


def print_cases(cases: list[dict[str, Any]]) -> None:
    gc = any(c["gc_cpu_s"] == c["gc_cpu_s"] for c in cases)
    rows = [[c["system"], c["txn_rows"], c["rows"], c["runs"], c["rows_s"], c["seconds"], c["startup_s"],
             c["peak_rss_mib"], c["replica_cpu_pct"], c["replica_cpu_us_row"], c["master_cpu_pct"]]
            + ([c["gc_cpu_s"]] if gc else [])
            + [c["vs_floor"], c.get("vs_tarantool", float("nan")), " ".join(f"{x:,}" for x in c["each_rows_s"])]
            for c in cases]
    print_table(["system", "txn rows", "rows", "runs", "rows/s", "catch-up s", "start-up s", "peak RSS MiB",
                 "replica CPU %", "replica CPU us/row", "master CPU %"] + (["GC CPU-s"] if gc else [])
                + ["vs floor", "vs Tarantool", "each run rows/s"], rows)


# --- command line -------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.applier", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=ROWS_DEFAULT, help="backlog rows per run (default %(default)s)")
    p.add_argument("--runs", type=int, default=RUNS_DEFAULT, help="runs per system and shape (default %(default)s)")
    p.add_argument("--txn-rows", default="1,100", help="rows per transaction: 1, 100 or 1,100 (default %(default)s)")
    p.add_argument("--only", choices=("replog", "tarantool"), help="run one system (the floor runs with replog)")
    p.add_argument("--links", default="plain",
                   help="replog link variants to run in alternation: plain, tls, nomac, base, comma-separated "
                        "(bench/links.py; default %(default)s)")
    p.add_argument("--baseline", metavar="DIR", default=None,
                   help="with --links ...,base: another replog checkout whose nodes run as replog-base (bench/links.py)")
    p.add_argument("--load", choices=("direct", "http"), default="direct",
                   help="how the replog master gets its backlog (default %(default)s; see the module doc)")
    p.add_argument("--writers", type=int, default=WRITERS_DEFAULT, help="--load direct: submitting tasks")
    p.add_argument("--http-clients", type=int, default=HTTP_CLIENTS_DEFAULT, help="--load http: clients")
    p.add_argument("--memtx-mb", type=int, default=TARANTOOL_MEMTX_MB, help="Tarantool memtx_memory in MiB")
    p.add_argument("--gc-stats", action="store_true",
                   help="replog replica: time its cyclic GC (gc.callbacks) and print GC CPU-s per run")
    p.add_argument("--replica-prelude", metavar="PYTHON", default="",
                   help="replog replica: Python run before the node starts, to try a change without editing "
                        "node/, e.g. \"import gc; gc.freeze()\" or \"import node.limits as L; "
                        "L.applier_pending_rows_max = 20000\"")
    p.add_argument("--dir", default=None, help="where temp data dirs go (default: the system temp dir)")
    p.add_argument("--keep", action="store_true", help="keep each run's data dirs and logs")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.add_argument("--profile", action="store_true",
                   help="instead of the matrix: one replog catch-up (last --txn-rows, first --links) under py-spy")
    p.add_argument("--profile-rate", type=int, default=200, help="with --profile: samples per second")
    p.add_argument("--profile-gil", action="store_true",
                   help="with --profile: sample only the thread holding the GIL (where CPU goes)")
    p.add_argument("--top", type=int, default=20, help="with --profile: functions per table")
    a = p.parse_args(argv)
    a.txn_rows = [int(x) for x in a.txn_rows.split(",") if x.strip()]
    if not a.txn_rows or min(a.txn_rows) < 1 or max(a.txn_rows) > limits.txn_ops_max:
        p.error(f"--txn-rows: each is 1..{limits.txn_ops_max}")
    if a.rows < max(a.txn_rows) or a.runs < 1 or a.writers < 1 or a.http_clients < 1:
        p.error("--rows, --runs, --writers and --http-clients must be positive (and rows >= txn rows)")
    try:
        a.links = links_mod.parse(a.links, a.baseline)
    except ValueError as e:
        p.error(str(e))
    a.systems = ("replog", "tarantool") if a.only is None else (a.only,)
    a.tarantool = shutil.which("tarantool")
    if "tarantool" in a.systems and not a.tarantool:
        if a.only == "tarantool":
            p.error("tarantool is not on PATH (apt-get install -y tarantool)")
        a.systems = ("replog",)
    a.dir = a.dir or tempfile.gettempdir()
    return a


def tarantool_version() -> str:
    try:
        return subprocess.run(["tarantool", "--version"], capture_output=True, text=True, timeout=10).stdout.split("\n")[0]
    except (OSError, subprocess.SubprocessError):
        return "-"


def _children_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mach = machine(args.dir)
    mach["tarantool"] = tarantool_version() if args.tarantool else "not installed"
    mach["code"] = code_version()
    watch, c0, t0 = LoadWatch(), _children_cpu_s(), time.perf_counter()
    if args.profile:
        base = tempfile.mkdtemp(prefix="applier-profile-", dir=args.dir)
        doc = profile_run(base, args.rows, args.txn_rows[-1], args)
        load = watch.stop(_children_cpu_s() - c0)
        if args.json:
            dump_json({"machine": mach, "load": load, "profile": doc})
        else:
            print_machine(mach)
            print(f"code:    {mach['code']}")
            print_load(load, mach["nproc"])
            print()
            print_profile(doc)
        return 0
    cases = run_matrix(args)
    load = watch.stop(_children_cpu_s() - c0)
    total_s = time.perf_counter() - t0
    if args.json:
        dump_json({"machine": mach, "load": load, "args": {k: v for k, v in vars(args).items()
                                                           if k not in ("tarantool",)},
                   "total_s": total_s, "cases": cases})
        return 0
    print_machine(mach)
    print(f"code:    {mach['code']}")
    print(f"tarantool: {mach['tarantool']}")
    print_load(load, mach["nproc"])
    print(f"workload: {args.rows:,} rows {{key, 100-byte string}} backlog, wal_mode write, replica restarted and "
          f"timed from exec to vclock = master's; load {args.load}; {args.runs} runs each, alternating; "
          f"total {total_s:.0f} s\n")
    print_cases(cases)
    for txn_rows in args.txn_rows:
        c = {x["system"]: x for x in cases if x["txn_rows"] == txn_rows}
        parts = []
        if "replog" in c and "tarantool" in c:
            parts.append(f"replog/Tarantool = {c['replog']['vs_tarantool']:.3f}")
        if "floor" in c:
            parts += [f"{s}/floor = {c[s]['vs_floor']:.3f}" for s in ("replog", "tarantool") if s in c]
        for s in links_mod.VARIANTS:                  # --links: each variant beside plain
            if s in c and "replog" in c:
                parts.append(f"{s}/replog rows/s = {c[s]['rows_s'] / c['replog']['rows_s']:.3f} (replica CPU "
                             f"{c[s]['replica_cpu_us_row']:.2f} vs {c['replog']['replica_cpu_us_row']:.2f} us/row)")
        print(f"{txn_rows}-row txns: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
