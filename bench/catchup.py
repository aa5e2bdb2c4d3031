"""One catch-up of the applier bench (bench/applier.py): a master, a replica that joined it and
was stopped, the backlog written (bench/backlog.py), the replica started again and timed from
its exec until its vclock reaches the master's. `replog_run` and `tarantool_run` are one run
of each system; `profile_run` is a replog run with the replica under py-spy."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from bench.backlog import SPACE, backlog_batches, direct_load, http_load
from bench.links import SYSTEM, LinkSetup
from bench.procs import BenchError, ReplogNode, TarantoolNode, proc_cpu_s, proc_status_kib, wait_for
from bench.pyspy import child_pid, pyspy_path, summarize_pyspy

TARANTOOL_FIBERS = 64                # Tarantool's loader fibers (group commit in its WAL thread)
CATCHUP_TIMEOUT_S = 600.0            # one catch-up; past it the run fails rather than hangs
POLL_S = 0.02                        # replica vclock polling during a catch-up
# No checkpoint during a run (Tarantool's scripts say checkpoint_interval = 0): a checkpoint
# on the restarted master, which has not yet seen the stopped replica's ack, would collect
# the backlog's WAL and turn the catch-up into a rejoin from a snapshot.
NO_CHECKPOINT = ["--checkpoint-interval-s", "86400"]
TARANTOOL_POLL_S = 0.005             # the done file a Tarantool replica writes


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
            asyncio.run(direct_load(master.data_dir, rows, txn_rows, args.writers, 1))
            master.start()
        else:
            asyncio.run(http_load(master.url, rows, txn_rows, args.http_clients, 1, master.ssl_context))
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


# --- profiling the replica ------------------------------------------------------------------
def profile_run(base: str, rows: int, txn_rows: int, args: argparse.Namespace) -> dict[str, Any]:
    """One replog catch-up with the replica started under `py-spy record` (raw collapsed
    stacks, per thread, idle frames included so waiting can be told from work)."""
    pyspy = pyspy_path()
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

