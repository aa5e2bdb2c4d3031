"""WAL + store append throughput: the real Journal, WalWriter and Store, in one process.

A node is built in a temp dir the way node/server.py bootstraps one (store -> recover ->
WalWriter -> NodeCore -> Journal), then many asyncio tasks each claim and submit
transactions (`journal.submit([core.local_txn(ops, GROUP_DEFAULT, now)])`) so group commit
batches them: one WAL write (+ fsync) and one LMDB transaction per batch.

Beside it runs the *floor*: the same rows, grouped as a full group-commit batch, through
msgpack encode + crc32c + one file write (+ fsync) + one LMDB transaction of puts, in one
tight loop with no asyncio, no Txn/Op objects and no resolver. The ratio journal/floor says
how much of the path is bookkeeping rather than unavoidable encode-and-store work.

Each case runs --runs times in a fresh directory; the table shows medians. Figures only:
nothing here asserts on timing.

    python -m bench.wal_append                       # full matrix, ~2-4 min on 2 cores
    python -m bench.wal_append --rows 20000 --runs 1 # a quick look
    python -m bench.wal_append --profile             # where the time goes (pyinstrument)"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import crc32c
import lmdb
import msgpack

from bench.common import MIB, LoadWatch, dump_json, machine, median, print_load, print_machine, print_table
from node import limits
from node.cluster_space.table import STATE_MEMBER, Member
from node.core.replicaset import NodeCore, cluster_op
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, OP_PUT, OP_SPACE, Op
from node.journal import Journal
from node.storage.store import Store
from node.wal.recovery import recover
from node.wal.writer import WalWriter

SPACE = "bench"
VALUE_BYTES = 100                    # every row's value: a 100-character string
ROWS_DEFAULT = 200_000               # rows per run of every case (--single-rows overrides 1-row txns)
WRITERS_DEFAULT = 64                 # concurrent submitting tasks: the most txns one batch can hold
RUNS_DEFAULT = 3
PROFILE_INTERVAL_S = 0.0005          # pyinstrument sampling interval
# Leaf frames where a thread waits rather than works: left out of its busy time.
IDLE_FUNCTIONS = ("epoll.poll", "SimpleQueue.get", "lock.acquire", "select")


@dataclass
class Result:
    kind: str            # "journal" or "floor"
    mode: str            # "write" or "fsync"
    txn_rows: int
    rows: int
    seconds: float
    cpu_seconds: float   # process CPU time (all threads) during the run
    wal_bytes: int
    batches: int
    fsyncs: int

    @property
    def rows_s(self) -> float:
        return self.rows / self.seconds

    @property
    def wal_mib_s(self) -> float:
        return self.wal_bytes / MIB / self.seconds


def _value() -> str:
    return "v" * VALUE_BYTES


def _key(i: int) -> str:
    return f"key{i:010d}"


# --- the real path ----------------------------------------------------------------------
async def open_node(data_dir: str, mode: str) -> tuple[Store, NodeCore, Journal]:
    """Bootstrap a one-node cluster as Node._bootstrap_new_cluster/_open_bootstrapped do,
    and create the space the rows go to."""
    wal_dir = os.path.join(data_dir, "wal")
    store = Store(os.path.join(data_dir, "store"), sync=(mode == "fsync"))
    node_uuid = str(uuidlib.uuid4())
    store.set_meta(uuid=node_uuid)
    store.put_cluster_member(Member(node_uuid, 1, "127.0.0.1:1", STATE_MEMBER))
    store.set_meta(cluster_uuid=str(uuidlib.uuid4()), cluster_name="bench", anon=False,
                   created_s=time.time(), founders=[node_uuid])
    res = recover(store, wal_dir, node_uuid)
    wal = WalWriter(wal_dir, mode, node_uuid)
    wal.open_last(res.last_valid_end)
    core = NodeCore(node_uuid, store.table.copy(), store.vclock, hlc_last=store.get_meta("hlc") or 0,
                     spaces=store.space_flags())
    core.knowledge = store.load_knowledge()

    def on_fatal(e: BaseException) -> None:
        print(f"wal_append: journal failed: {e!r}", file=sys.stderr)

    journal = Journal(core, store, wal, on_fatal)
    journal.start()
    now = time.time_ns() // 1000
    me = core.table.get(node_uuid)
    await journal.submit([core.local_txn([cluster_op(me)], GROUP_CLUSTER, now)])
    await journal.submit([core.local_txn([Op(OP_SPACE, SPACE, "", {"local": False, "conflict": "lww"})],
                                         GROUP_DEFAULT, now)])
    return store, core, journal


def build_txns(rows: int, txn_rows: int) -> list[list[Op]]:
    value = _value()
    ops = [Op(OP_PUT, SPACE, _key(i), value) for i in range(rows - rows % txn_rows)]
    return [ops[i:i + txn_rows] for i in range(0, len(ops), txn_rows)]


async def journal_run(data_dir: str, mode: str, txn_rows: int, rows: int, writers: int,
                      timed: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> Result:
    """`timed` wraps only the measured part (the profiler uses it to skip set-up)."""
    store, core, journal = await open_node(data_dir, mode)
    wal = journal.wal
    assert wal is not None
    txns = build_txns(rows, txn_rows)
    it = iter(txns)
    b0, n0, f0, r0 = wal.bytes_written, journal.batches, wal.fsyncs, journal.rows_written

    async def writer() -> None:
        for ops in it:  # the shared iterator hands each txn to exactly one writer
            await journal.submit([core.local_txn(ops, GROUP_DEFAULT, time.time_ns() // 1000)])

    with timed():
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(writers)))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    res = Result("journal", mode, txn_rows, journal.rows_written - r0, seconds, cpu,
                 wal.bytes_written - b0, journal.batches - n0, wal.fsyncs - f0)
    await journal.stop()
    store.close()
    return res


# --- the floor ----------------------------------------------------------------------------
def floor_run(data_dir: str, mode: str, txn_rows: int, rows: int, batch_rows: int) -> Result:
    """The same rows through encode + crc + write (+ fsync) + LMDB puts, batch_rows at a time."""
    os.makedirs(data_dir, exist_ok=True)
    env = lmdb.open(os.path.join(data_dir, "store"), map_size=1 << 36, max_dbs=16,
                    sync=(mode == "fsync"), metasync=False, writemap=False)
    db = env.open_db(b"s:" + SPACE.encode())
    fd = os.open(os.path.join(data_dir, "floor.wal"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    pack = msgpack.Packer(use_bin_type=True).pack
    value = _value()
    keys = [_key(i) for i in range(rows)]
    wal_bytes = batches = fsyncs = 0
    c0, t0 = time.process_time(), time.perf_counter()
    lsn = 1
    for start in range(0, rows, batch_rows):
        chunk = keys[start:start + batch_rows]
        ts = time.time_ns() // 1000
        body = pack([ts, [[k, value, lsn + j] for j, k in enumerate(chunk)]])
        frame = crc32c.crc32c(body).to_bytes(4, "little") + body
        os.write(fd, frame)
        if mode == "fsync":
            os.fsync(fd)
            fsyncs += 1
        with env.begin(write=True, db=db) as t:
            for j, k in enumerate(chunk):
                t.put(k.encode(), pack([value, 1, lsn + j, ts, False]))
        lsn += len(chunk)
        wal_bytes += len(frame)
        batches += 1
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    os.close(fd)
    env.close()
    return Result("floor", mode, txn_rows, rows, seconds, cpu, wal_bytes, batches, fsyncs)


# --- running the matrix -------------------------------------------------------------------
def rows_for(args: argparse.Namespace, txn_rows: int) -> int:
    return args.single_rows if txn_rows == 1 else args.rows


def floor_batch_rows(txn_rows: int, writers: int) -> int:
    """A full group-commit batch: every writer's txn in one write."""
    return min(writers, limits.group_commit_txns_max) * txn_rows


def run_case(base: str, kind: str, mode: str, txn_rows: int, rows: int, writers: int) -> Result:
    d = tempfile.mkdtemp(prefix=f"wal_append-{kind}-", dir=base)
    try:
        if kind == "journal":
            return asyncio.run(journal_run(d, mode, txn_rows, rows, writers))
        return floor_run(d, mode, txn_rows, rows, floor_batch_rows(txn_rows, writers))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def summarize(results: list[Result]) -> dict[str, Any]:
    r = results[0]
    return {
        "kind": r.kind, "mode": r.mode, "txn_rows": r.txn_rows, "rows": r.rows, "runs": len(results),
        "rows_s": median(x.rows_s for x in results),
        "wal_mib_s": median(x.wal_mib_s for x in results),
        "seconds": median(x.seconds for x in results),
        "cpu_pct": median(100.0 * x.cpu_seconds / x.seconds for x in results),
        "rows_per_batch": median(x.rows / max(1, x.batches) for x in results),
        "fsyncs": median(x.fsyncs for x in results),
        "each_rows_s": [round(x.rows_s) for x in results],
    }


def run_matrix(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for txn_rows in args.txn_rows:
        for mode in args.modes:
            by_kind: dict[str, dict[str, Any]] = {}
            for kind in ("journal", "floor"):
                rows = rows_for(args, txn_rows)
                results = []
                for i in range(args.runs):
                    res = run_case(args.dir, kind, mode, txn_rows, rows, args.writers)
                    results.append(res)
                    if not args.json:
                        print(f"  {kind:7} {mode:5} {txn_rows:>3}-row txns run {i + 1}/{args.runs}: "
                              f"{res.rows_s:,.0f} rows/s ({res.seconds:.2f} s)", file=sys.stderr)
                by_kind[kind] = summarize(results)
            j, f = by_kind["journal"], by_kind["floor"]
            j["ratio_to_floor"] = j["rows_s"] / f["rows_s"]
            f["ratio_to_floor"] = 1.0
            out += [j, f]
    return out


# --- profiling ----------------------------------------------------------------------------
def _top_functions(session, n: int) -> list[tuple[str, float, float]]:
    """(function at file:line, self seconds, inclusive busy seconds), largest self time
    first. Inclusive time leaves out waiting (IDLE_FUNCTIONS) below the function and counts
    a function once per stack even when it recurses."""
    selfs: dict[str, float] = {}
    incl: dict[str, float] = {}
    root = session.root_frame()
    if root is None:
        return []

    def name(fr) -> str:
        return f"{fr.function} ({fr.file_path_short}:{fr.line_no})"

    def walk(fr, on_stack: frozenset) -> float:
        """Returns the idle seconds in fr's subtree."""
        if fr.is_synthetic:
            return 0.0
        nm = name(fr)
        child_time = sum(c.time for c in fr.children if not c.is_synthetic)
        own = fr.time - child_time
        selfs[nm] = selfs.get(nm, 0.0) + own
        idle = own if nm.startswith(IDLE_FUNCTIONS) else 0.0
        for c in fr.children:
            idle += walk(c, on_stack | {nm})
        if nm not in on_stack:
            incl[nm] = incl.get(nm, 0.0) + fr.time - idle
        return idle

    walk(root, frozenset())
    top = sorted(selfs.items(), key=lambda kv: -kv[1])[:n]
    return [(nm, s, incl.get(nm, 0.0)) for nm, s in top]


async def _profiled_journal_run(d: str, mode: str, txn_rows: int, rows: int, writers: int):
    """Profile both threads: the event loop (claims, futures, the commit loop) and the
    executor thread that runs Journal._persist (encode, write, LMDB)."""
    from pyinstrument import Profiler

    worker: dict[str, Profiler] = {}

    def start_worker_profiler() -> None:
        p = Profiler(interval=PROFILE_INTERVAL_S, async_mode="disabled")
        p.start()
        worker["p"] = p

    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, initializer=start_worker_profiler)
    loop.set_default_executor(pool)
    main = Profiler(interval=PROFILE_INTERVAL_S, async_mode="disabled")
    sessions: dict[str, Any] = {}

    @contextlib.contextmanager
    def timed():
        # The worker thread's profiler runs from the thread's start (set-up writes are
        # two tiny batches); the loop thread's covers only the measured part.
        main.start()
        try:
            yield
        finally:
            sessions["main"] = main.stop()

    res = await journal_run(d, mode, txn_rows, rows, writers, timed)
    worker_session = await loop.run_in_executor(None, lambda: worker["p"].stop())
    return res, sessions["main"], worker_session


def profile(args: argparse.Namespace) -> dict[str, Any]:
    mode, txn_rows = args.modes[0], args.txn_rows[-1]
    rows = rows_for(args, txn_rows)
    d = tempfile.mkdtemp(prefix="wal_append-profile-", dir=args.dir)
    try:
        res, main_s, worker_s = asyncio.run(_profiled_journal_run(d, mode, txn_rows, rows, args.writers))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    doc: dict[str, Any] = {"case": {"mode": mode, "txn_rows": txn_rows, "rows": rows, "writers": args.writers,
                                    "rows_s_under_profiler": res.rows_s, "seconds": res.seconds}}
    for label, sess in (("event_loop_thread", main_s), ("persist_thread", worker_s)):
        top = _top_functions(sess, args.top + len(IDLE_FUNCTIONS))
        idle = sum(s for nm, s, _ in top if nm.startswith(IDLE_FUNCTIONS))
        doc[label] = {"sampled_s": sess.duration, "idle_s": idle,
                      "top": [{"function": nm, "self_s": s, "inclusive_s": i}
                              for nm, s, i in top if not nm.startswith(IDLE_FUNCTIONS)][:args.top]}
        if args.profile_html:
            from pyinstrument.renderers import HTMLRenderer
            path = f"{args.profile_html}.{label}.html"
            with open(path, "w", encoding="utf-8") as f:
                f.write(HTMLRenderer().render(sess))
            doc[label]["html"] = path
    return doc


def print_profile(doc: dict[str, Any]) -> None:
    c = doc["case"]
    print(f"profile: journal, {c['mode']} mode, {c['txn_rows']}-row txns, {c['rows']:,} rows, {c['writers']} writers: "
          f"{c['rows_s_under_profiler']:,.0f} rows/s under the profiler ({c['seconds']:.2f} s wall)")
    for label in ("event_loop_thread", "persist_thread"):
        sec = doc[label]
        busy = max(sec["sampled_s"] - sec["idle_s"], 1e-9)
        print(f"\n{label}: sampled {sec['sampled_s']:.2f} s, waiting {sec['idle_s']:.2f} s, busy {busy:.2f} s; "
              "top functions by self time (% of busy):")
        print_table(["function", "self s", "self %", "incl s", "incl %"],
                    [[t["function"], t["self_s"], 100.0 * t["self_s"] / busy, t["inclusive_s"],
                      100.0 * t["inclusive_s"] / busy] for t in sec["top"]])
        if "html" in sec:
            print(f"(tree: {sec['html']})")


# --- command line ---------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.wal_append", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=ROWS_DEFAULT, help="rows per run (default %(default)s)")
    p.add_argument("--single-rows", type=int, default=None,
                   help="rows per run for 1-row txns (default: --rows)")
    p.add_argument("--txn-rows", default="1,100", help="rows per transaction, comma-separated (default %(default)s)")
    p.add_argument("--modes", default="write,fsync", help="WAL modes, comma-separated: write,fsync (default %(default)s)")
    p.add_argument("--writers", type=int, default=WRITERS_DEFAULT, help="concurrent submitting tasks (default %(default)s)")
    p.add_argument("--runs", type=int, default=RUNS_DEFAULT, help="runs per case; the table shows medians (default %(default)s)")
    p.add_argument("--dir", default=None, help="where temp data dirs go (default: the system temp dir)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.add_argument("--profile", action="store_true",
                   help="instead of the matrix, profile the journal once (first --modes, last --txn-rows)")
    p.add_argument("--profile-html", metavar="PREFIX", help="with --profile: also write pyinstrument HTML trees")
    p.add_argument("--top", type=int, default=20, help="with --profile: functions to list per thread (default %(default)s)")
    a = p.parse_args(argv)
    a.single_rows = a.rows if a.single_rows is None else a.single_rows
    a.txn_rows = [int(x) for x in a.txn_rows.split(",") if x.strip()]
    a.modes = [x.strip() for x in a.modes.split(",") if x.strip()]
    for m in a.modes:
        if m not in ("write", "fsync"):
            p.error(f"--modes: {m!r} is not write or fsync")
    if not a.txn_rows or min(a.txn_rows) < 1 or max(a.txn_rows) > limits.txn_ops_max:
        p.error(f"--txn-rows: each is 1..{limits.txn_ops_max}")
    if a.rows < max(a.txn_rows) or a.single_rows < 1 or a.writers < 1 or a.runs < 1:
        p.error("--rows, --single-rows, --writers and --runs must be positive (and rows >= txn rows)")
    a.dir = a.dir or tempfile.gettempdir()
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mach = machine(args.dir)
    if args.profile:
        watch, c0 = LoadWatch(), time.process_time()
        doc = profile(args)
        load = watch.stop(time.process_time() - c0)
        if args.json:
            dump_json({"machine": mach, "load": load, "profile": doc})
        else:
            print_machine(mach)
            print_load(load, mach["nproc"])
            print()
            print_profile(doc)
        return 0
    watch, c0, t0 = LoadWatch(), time.process_time(), time.perf_counter()
    cases = run_matrix(args)
    total_s = time.perf_counter() - t0
    load = watch.stop(time.process_time() - c0)
    if args.json:
        dump_json({"machine": mach, "load": load, "value_bytes": VALUE_BYTES, "writers": args.writers,
                   "total_s": total_s, "cases": cases})
        return 0
    sys.stderr.flush()
    print_machine(mach)
    print_load(load, mach["nproc"])
    print(f"\nWAL + LMDB append, {VALUE_BYTES}-byte values, {args.writers} writers, median of {args.runs} runs "
          f"(total {total_s:.0f} s); floor = encode + crc + write{'/fsync' if 'fsync' in args.modes else ''}"
          f" + LMDB puts, one full batch at a time, no asyncio")
    print_table(
        ["case", "mode", "txn rows", "rows/run", "rows/s", "WAL MiB/s", "rows/batch", "CPU %", "vs floor"],
        [[c["kind"], c["mode"], c["txn_rows"], c["rows"], c["rows_s"], c["wal_mib_s"], c["rows_per_batch"],
          c["cpu_pct"], f"{c['ratio_to_floor']:.2f}"] for c in cases])
    return 0


if __name__ == "__main__":
    sys.exit(main())
