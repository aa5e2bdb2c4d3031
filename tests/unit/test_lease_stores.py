"""Lease stores, manager and runner against real stores: one suite, run on both backends.

`file`: FileLeaseStore in tmp_path. `s3`: S3LeaseStore against moto's real S3 server on
127.0.0.1 (ThreadedMotoServer, one per module; boto3 is never mocked). Lease time comes from
an injected clock where a test is about time; the runner tests use the wall clock with short
leases and wait on conditions with deadlines, never on bare sleeps."""

import asyncio
import concurrent.futures
import fcntl
import json
import logging
import os
import random
import socket
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import boto3
import pytest
from moto.server import ThreadedMotoServer

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:   # tests/unit has no __init__.py and replog is not pip-installed
    sys.path.insert(0, str(REPO))

from node.errors import ConfigError
from node.identity import lease as core
from node.identity.lease import Lease, LeaseLost
from node.identity.lease_manager import LeaseManager
from node.identity.lease_runner import run_lease
from node.identity.lease_store import LeaseStore, LeaseStoreUnavailable, open_store
from tests.waiting import until

BUCKET = "replog-leases"
T0 = 1_700_000_000_000   # fake wall clock start, ms


class Clock:
    def __init__(self, ms: int = T0):
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def start_moto() -> tuple[ThreadedMotoServer, str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    return server, endpoint


@pytest.fixture(scope="module")
def moto_endpoint():
    with pytest.MonkeyPatch.context() as mp:
        for name, value in [("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                            ("AWS_SESSION_TOKEN", "test"), ("AWS_DEFAULT_REGION", "us-east-1")]:
            mp.setenv(name, value)
        server, endpoint = start_moto()
        mp.setenv("REPLOG_S3_ENDPOINT", endpoint)   # open_store() finds the endpoint here
        yield endpoint
        server.stop()


@dataclass
class Backend:
    name: str
    url: str
    breakable: Callable[[], tuple[LeaseStore, Callable[[], None]]]

    def open(self) -> LeaseStore:
        # One store per test: a store holds no lease state (boto3 clients are thread-safe),
        # and building S3 clients is what would make this suite slow.
        if not hasattr(self, "_store"):
            self._store = open_store(self.url)
        return self._store


@pytest.fixture(params=["file", "s3"])
def backend(request, tmp_path):
    if request.param == "file":
        def breakable():
            d = tmp_path / "breakable"
            # An unmounted volume: the directory itself is gone.
            return open_store(f"file://{d}"), lambda: os.rename(d, tmp_path / "gone")
        yield Backend("file", f"file://{tmp_path / 'leases'}", breakable)
        return

    request.getfixturevalue("moto_endpoint")
    servers = []

    def breakable():
        server, endpoint = start_moto()   # its own server, so stopping it harms no other test
        servers.append(server)
        return open_store(f"s3://{BUCKET}/b", endpoint_url=endpoint), server.stop

    yield Backend("s3", f"s3://{BUCKET}/{uuid.uuid4().hex}", breakable)
    for server in servers:
        if server._server_ready_event.is_set():
            server.stop()


def manager(store, task, clock=None, *, slots=1, duration_s=10.0, seed=None):
    return LeaseManager(store, slots, task, duration_s, clock=clock,
                        rng=random.Random(seed if seed is not None else task))


def stored(store, slot) -> Lease:
    body, _ = store.read(slot)
    return core.decode(body, slot)


# --- the store contract -------------------------------------------------------------------

def test_store_creates_once_reads_and_swaps_only_on_a_matching_token(backend):
    store = backend.open()
    assert store.read(0) == (None, None)
    assert store.compare_and_swap(0, b"x", "no-such-token") is False
    assert store.create_if_absent(0, b"one") is True
    assert store.create_if_absent(0, b"two") is False
    body, token = store.read(0)
    assert body == b"one" and token
    assert store.compare_and_swap(0, b"three", "stale") is False
    assert store.compare_and_swap(0, b"three", token) is True
    body2, token2 = store.read(0)
    assert body2 == b"three" and token2 != token
    assert store.compare_and_swap(0, b"four", token) is False   # the old token never matches again
    assert store.read(0)[0] == b"three"


def test_open_store_rejects_bad_urls_as_config_errors():
    for url in ["file://relative/dir", "http://x/y", "s3:///prefix", "leases"]:
        with pytest.raises(ConfigError) as e:
            open_store(url)
        assert e.value.option == "lease_store"


def test_manager_rejects_bad_options_naming_them(tmp_path):
    store = open_store(f"file://{tmp_path}")
    with pytest.raises(ConfigError, match="cluster_size"):
        LeaseManager(store, 0, "t", 10.0)
    with pytest.raises(ConfigError, match="lease_duration_s"):
        LeaseManager(store, 1, "t", 0.01)


# --- bootstrap and racing -------------------------------------------------------------------

def test_bootstrap_creates_each_slot_once_with_a_persistent_uuid(backend):
    a, b = manager(backend.open(), "a", slots=3), manager(backend.open(), "b", slots=3)
    assert a.bootstrap() == 3
    assert b.bootstrap() == 0
    leases = [stored(a.store, s) for s in range(3)]
    assert all(lease.task_id is None and lease.version == 0 for lease in leases)
    assert len({lease.member_uuid for lease in leases}) == 3


def test_racing_managers_get_unique_slots_and_the_rest_get_none(backend):
    n, m = 8, 3
    barrier = threading.Barrier(n)
    results: dict[int, Lease | None] = {}

    def race(i):
        mgr = manager(backend.open(), f"task-{i}", slots=m)
        barrier.wait(timeout=10)
        mgr.bootstrap()
        results[i] = mgr.acquire()

    threads = [threading.Thread(target=race, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert len(results) == n
    winners = {i: lease for i, lease in results.items() if lease is not None}
    assert sorted(lease.slot for lease in winners.values()) == list(range(m))
    assert all(lease.version == 1 for lease in winners.values())
    store = backend.open()
    assert {stored(store, s).task_id for s in range(m)} == {f"task-{i}" for i in winners}
    assert len({lease.member_uuid for lease in winners.values()}) == m


CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from node.identity.lease_manager import LeaseManager
from node.identity.lease_store import open_store
mgr = LeaseManager(open_store(sys.argv[2]), int(sys.argv[3]), sys.argv[4], 30.0)
print("ready", flush=True)
sys.stdin.readline()                       # the parent says go to all at once
mgr.bootstrap()
lease = mgr.acquire()
print(json.dumps(lease and {"slot": lease.slot, "version": lease.version,
                            "member_uuid": lease.member_uuid}), flush=True)
"""


def test_separate_processes_racing_on_the_file_store_get_unique_slots(tmp_path):
    url, n, m = f"file://{tmp_path / 'leases'}", 6, 2
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(REPO), url, str(m), f"proc-{i}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for i in range(n)]
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ready"] * n
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=20)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * n
    results = {f"proc-{i}": json.loads(out.strip().splitlines()[-1]) for i, out in enumerate(outs)}
    winners = {task: r for task, r in results.items() if r is not None}
    assert sorted(r["slot"] for r in winners.values()) == list(range(m))
    assert all(r["version"] == 1 for r in winners.values())
    store = open_store(url)
    for task, r in winners.items():
        lease = stored(store, r["slot"])
        assert (lease.task_id, lease.member_uuid) == (task, r["member_uuid"])


# --- takeover, zombies, release ---------------------------------------------------------------

def test_expired_lease_is_taken_over_at_expiry_with_the_next_version(backend):
    clock = Clock()
    a = manager(backend.open(), "a", clock)
    a.bootstrap()
    first = a.acquire()
    b = manager(backend.open(), "b", clock)
    clock.ms = first.expires_ms - 1
    assert b.acquire() is None                 # still held one ms before expiry
    clock.ms = first.expires_ms                # expiry exactly at now: expired
    got = b.acquire()
    assert (got.slot, got.version, got.task_id) == (0, first.version + 1, "b")
    assert got.member_uuid == first.member_uuid
    assert stored(b.store, 0).task_id == "b"


def test_zombie_renewal_fails_on_the_cas_conflict_with_lease_lost(backend):
    slow, fast = Clock(), Clock()               # the zombie's clock lags: it believes it still holds
    zombie = manager(backend.open(), "zombie", slow)
    zombie.bootstrap()
    old = zombie.acquire()
    fast.ms = old.expires_ms
    heir = manager(backend.open(), "heir", fast)
    assert heir.acquire().version == old.version + 1
    slow.ms = T0 + 1_000                        # well before the zombie's own deadline
    with pytest.raises(LeaseLost, match="held by heir"):
        zombie.renew()
    assert zombie.slot is None and zombie.renew_failures == 1
    assert stored(heir.store, 0).task_id == "heir"


def test_renewal_after_the_deadline_is_lease_lost_and_writes_nothing(backend):
    clock = Clock()
    a = manager(backend.open(), "a", clock)
    a.bootstrap()
    a.acquire()
    before = a.store.read(0)
    clock.ms = a.renew_deadline_ms
    with pytest.raises(LeaseLost, match="deadline"):
        a.renew()
    assert a.store.read(0) == before and a.lease is None


def test_a_wall_clock_stepped_back_does_not_stretch_the_lease_the_local_clock_ends_it(backend):
    """The holder keeps its renewal deadline by its local clock too (CLOCK_BOOTTIME, which nobody
    sets): a wall clock stepped back by more than the safety margin let it serve past the expiry
    the store holds, while another node, by a right clock, could take the slot."""
    wall, local = Clock(), Clock(5_000)
    a = LeaseManager(backend.open(), 1, "a", 10.0, clock=wall, local_clock=local)
    a.bootstrap()
    a.acquire()
    budget = a.renew_deadline_ms - wall.ms
    local.ms += budget - 1
    wall.ms += budget - 1
    assert a.holds_valid_lease() and a.late_ms() < 0
    a.renew()                                            # both clocks start again from the write
    local.ms += budget - 1
    wall.ms -= 60_000                                    # an NTP step back: by the wall, plenty left
    assert a.holds_valid_lease() and a.late_ms() < 0
    local.ms += 2
    assert not a.holds_valid_lease() and a.late_ms() == 1
    before = a.store.read(0)
    with pytest.raises(LeaseLost, match="deadline"):
        a.renew()
    assert a.store.read(0) == before and a.lease is None


def test_graceful_release_then_next_acquire_bumps_the_version_and_keeps_the_member(backend):
    clock = Clock()
    a = manager(backend.open(), "a", clock)
    a.bootstrap()
    first = a.acquire()
    assert a.release() is True and a.lease is None
    released = stored(a.store, 0)
    assert (released.task_id, released.version, released.expires_ms) == (None, first.version, 0)
    b = manager(backend.open(), "b", clock)    # same instant: released, not expired
    got = b.acquire()
    assert got.version == first.version + 1 and got.member_uuid == first.member_uuid
    assert b.wait_for_peers is False


def test_crash_without_release_makes_the_next_holder_wait_for_peers(backend):
    clock = Clock()
    a = manager(backend.open(), "a", clock)
    a.bootstrap()
    first = a.acquire()
    del a                                       # crashed: never released
    clock.ms = first.expires_ms
    b = manager(backend.open(), "b", clock)
    assert b.acquire().version == first.version + 1
    assert b.wait_for_peers is True and b.peer_wait_until_ms == clock.ms + b.duration_ms


def test_refresh_reads_every_slot_and_reports_a_takeover_without_touching_the_held_lease(backend):
    clock = Clock()
    a = manager(backend.open(), "a", clock)
    first = a.acquire()
    assert a.refresh() == ({0: 1}, None)
    clock.ms = first.expires_ms                 # a paused past its expiry; b takes the slot
    b = manager(backend.open(), "b", clock)
    assert b.acquire().version == 2
    versions, lost = a.refresh()
    assert versions == {0: 2} and "held by b at version 2" in lost
    assert a.lease == first, "refresh only reports; the caller stops serving"


def test_corrupt_lease_is_treated_as_expired_and_reported_not_wedging(backend, caplog):
    clock = Clock()
    a = manager(backend.open(), "a", clock, slots=2)
    a.bootstrap()
    a.acquire()                                 # slot 0
    b = manager(backend.open(), "b", clock, slots=2)
    for _ in range(4):                          # slot 1 reaches version 4 in the store
        assert b.acquire().slot == 1 and b.release()
    assert a.refresh() == ({0: 1, 1: 4}, None)  # a reads it again (a peer's claim asked it to)
    a.renew()                                   # and writes what it read with its lease
    old_uuid = stored(a.store, 1).member_uuid
    _, token = a.store.read(1)
    assert a.store.compare_and_swap(1, b"\x00 not a lease {", token)
    c = manager(backend.open(), "c", clock, slots=2)
    with caplog.at_level(logging.WARNING, logger="replog.identity.lease"):
        got = c.acquire()
    assert got.slot == 1 and got.version == 5   # still out-versions what peers saw
    assert got.member_uuid != old_uuid
    assert c.corrupt_seen == 1 and c.last_corrupt.slot == 1 and c.wait_for_peers is True
    assert any("slot 1 is corrupt" in r.getMessage() for r in caplog.records)
    clock.ms += 1_000
    assert c.renew().slot == 1                  # not wedged: the slot works normally again
    assert manager(backend.open(), "d", clock, slots=2).acquire() is None


def _standby_holding_the_owners_slot(store, clock):
    """The owner served slot 0 at version 1 and crashed (no release); once its lease expired a
    standby took the slot (version 2) and has not served. Returns the standby's manager."""
    owner = manager(store, "owner", clock)
    owner.bootstrap()
    owner.acquire()
    assert owner.renew(serving=True).served == 1
    clock.ms += 10_000                                    # expired: no renewal since the crash
    standby = manager(store, "standby", clock)
    lease = standby.acquire()
    assert (lease.version, lease.served) == (2, 1)
    return standby


def test_the_dir_that_served_last_takes_its_slot_from_a_holder_that_has_not_served_and_that_holder_stops(backend):
    store, clock = backend.open(), Clock()
    standby = _standby_holding_the_owners_slot(store, clock)
    clock.ms += 1_000                                     # the standby's lease runs for 9 s more
    assert manager(store, "fresh", clock).acquire() is None, "a node without the slot's data still waits"
    assert manager(store, "later-dir", clock).acquire({0: 2}) is None, "the standby's own dir holds no rows"
    assert manager(store, "later-dir", clock).acquire({0: 2}, {0: 2}) is None, "nor when it says it served at 2"
    back = manager(store, "owner-again", clock)
    lease = back.acquire({0: 1})                          # the owner's dir, stamped at version 1
    assert lease is not None and (lease.task_id, lease.version, lease.served) == ("owner-again", 3, 1)
    assert back.wait_for_peers, "the standby may still run at version 2: peers must see version 3 first"
    with pytest.raises(LeaseLost, match="held by owner-again at version 3"):
        standby.renew()
    assert stored(store, 0).task_id == "owner-again"


def test_a_standby_that_records_serving_first_keeps_the_slot_and_the_old_dir_waits(backend):
    """The standby's swap that records `served` and the owner's takeover race; the store lets
    one land. Here the standby's lands between the owner's read and its swap: the owner's swap
    fails, and on reading again its dir is no longer current (another node serves the member)."""
    store, clock = backend.open(), Clock()
    standby = _standby_holding_the_owners_slot(store, clock)

    class ServesFirst(LeaseStore):
        url = store.url
        def create_if_absent(self, slot, body): return store.create_if_absent(slot, body)
        def read(self, slot): return store.read(slot)
        def compare_and_swap(self, slot, body, token):
            if not raced:
                raced.append(standby.renew(serving=True))
            return store.compare_and_swap(slot, body, token)
        def close(self): store.close()

    raced: list[Lease] = []
    assert manager(ServesFirst(), "owner-again", clock).acquire({0: 1}) is None
    assert raced and raced[0].served == 2
    lease = stored(store, 0)
    assert (lease.task_id, lease.version, lease.served) == ("standby", 2, 2)
    assert standby.renew().version == 2                   # still the standby's


# --- lost answers ------------------------------------------------------------------------------

class LostAnswers(LeaseStore):
    """A real store whose CAS answers get lost: the write lands, the client retries it with
    the same token, and the retry's answer (a conflict) is what the caller sees."""

    def __init__(self, inner: LeaseStore, *, raise_instead: bool = False):
        self.inner, self.url, self.raise_instead = inner, inner.url, raise_instead
        self.enabled, self.false_answers = True, 0

    def create_if_absent(self, slot, body):
        return self.inner.create_if_absent(slot, body)

    def read(self, slot):
        return self.inner.read(slot)

    def compare_and_swap(self, slot, body, token):
        first = self.inner.compare_and_swap(slot, body, token)
        if not (self.enabled and first):
            return first
        if self.raise_instead:
            raise LeaseStoreUnavailable("test: the connection dropped before the answer")
        retry = self.inner.compare_and_swap(slot, body, token)
        self.false_answers += not retry
        return retry


def test_lost_answer_to_a_cas_is_resolved_by_reading_back(backend):
    clock = Clock()
    store = LostAnswers(backend.open())
    a = manager(store, "a", clock, slots=2)
    a.bootstrap()
    got = a.acquire()
    assert (got.slot, got.version) == (0, 1)    # slot 1 untouched: the first write was ours
    clock.ms += 1_000
    assert a.renew().expires_ms == clock.ms + a.duration_ms and a.renewals == 1
    assert a.release() is True
    assert store.false_answers == 3             # every write's answer was lost, and each was settled
    assert stored(store, 1).task_id is None


def test_lost_answer_does_not_hide_a_real_takeover(backend):
    clock = Clock()
    store = LostAnswers(backend.open())
    a = manager(store, "a", clock)
    a.bootstrap()
    first = a.acquire()
    clock.ms = first.expires_ms
    manager(backend.open(), "b", clock).acquire()
    clock.ms = T0 + 1_000
    with pytest.raises(LeaseLost, match="held by b"):
        a.renew()


def test_acquire_whose_outcome_was_unknown_is_recognised_on_the_next_try(backend):
    clock = Clock()
    store = LostAnswers(backend.open(), raise_instead=True)
    a = manager(store, "a", clock, slots=2)
    a.bootstrap()
    with pytest.raises(LeaseStoreUnavailable):
        a.acquire()
    store.enabled = False
    got = a.acquire()
    assert (got.slot, got.version) == (0, 1)    # the landed write, not a second slot
    assert stored(store, 1).task_id is None


def test_renewal_whose_outcome_was_unknown_is_adopted_on_the_next_renewal(backend):
    clock = Clock()
    store = LostAnswers(backend.open(), raise_instead=True)
    store.enabled = False
    a = manager(store, "a", clock)
    a.bootstrap()
    a.acquire()
    store.enabled = True
    clock.ms += 1_000
    with pytest.raises(LeaseStoreUnavailable):
        a.renew()                               # it landed, but we never heard
    store.enabled = False
    clock.ms += 1_000
    got = a.renew()                             # stale token: conflict, then our own write read back
    assert got.expires_ms == clock.ms + a.duration_ms and got.task_id == "a"
    assert a.renewals == 1 and a.renew_failures == 1
    assert stored(store, 0) == got


# --- an unreachable store, and the runner -------------------------------------------------------

def test_unreachable_store_during_renewal_raises_unavailable_and_keeps_the_lease(backend):
    store, cut = backend.breakable()
    clock = Clock()
    a = manager(store, "a", clock)
    a.bootstrap()
    a.acquire()
    cut()
    clock.ms += 1_000
    with pytest.raises(LeaseStoreUnavailable, match="unavailable"):
        a.renew()
    assert a.renew_failures == 1 and a.slot == 0   # not lost yet: the deadline is ahead


async def test_runner_calls_on_lost_once_within_the_lease_duration_when_the_store_is_unreachable(backend):
    store, cut = backend.breakable()
    a = manager(store, "a", None, duration_s=1.6)
    a.bootstrap()
    a.acquire()
    calls: list[tuple[str, int]] = []
    stop = asyncio.Event()
    task = asyncio.create_task(run_lease(a, lambda reason: calls.append((reason, a.now_ms())), stop))
    await until(lambda: a.renewals >= 1, 5, "a first renewal")
    await asyncio.to_thread(cut)
    expires_at_cut = a.expires_ms               # no renewal can succeed after the cut
    reason = await asyncio.wait_for(task, timeout=a.duration_ms / 1000 + 1)
    assert len(calls) == 1 and calls[0][0] == reason
    assert calls[0][1] < expires_at_cut         # stopped before anyone could take the slot
    assert a.renew_failures >= 1


async def test_runner_keeps_renewing_until_stopped_and_then_returns_quietly(backend):
    a = manager(backend.open(), "a", None, duration_s=1.2)
    a.bootstrap()
    a.acquire()
    calls = []
    stop = asyncio.Event()
    task = asyncio.create_task(run_lease(a, calls.append, stop))
    await until(lambda: a.renewals >= 2, 5, "two renewals")
    stop.set()
    assert await asyncio.wait_for(task, timeout=2) is None
    assert calls == [] and a.slot == 0 and a.holds_valid_lease()
    assert a.release() is True


async def test_runner_reports_a_takeover_once(backend):
    a = manager(backend.open(), "a", None, duration_s=0.9)
    a.bootstrap()
    held = a.acquire()
    _, token = a.store.read(0)
    thief = Lease(slot=0, task_id="thief", version=held.version + 1, expires_ms=held.expires_ms + 60_000,
                  member_uuid=held.member_uuid, serial=held.serial + 1, nonce="thief")
    assert a.store.compare_and_swap(0, core.encode(thief), token)
    calls = []
    reason = await asyncio.wait_for(run_lease(a, calls.append, asyncio.Event()), timeout=3)
    assert calls == [reason] and "held by thief" in reason
    assert a.lease is None


async def _runner_gives_up_at_the_deadline_while_a_call_hangs(a: LeaseManager, hang, unhang):
    # One worker thread of our own: the hung call may outlive the test without holding it up.
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    calls = []
    try:
        task = asyncio.create_task(run_lease(a, calls.append, asyncio.Event(), executor=executor))
        await until(lambda: a.renewals >= 1, 5, "a first renewal")
        hang()
        expires_at_hang = a.expires_ms
        reason = await asyncio.wait_for(task, timeout=a.duration_ms / 1000 + 1)
        assert a.now_ms() < expires_at_hang     # gave up before anyone could take the slot
        assert calls == [reason] and "did not answer" in reason
    finally:
        unhang()
        executor.shutdown(wait=False)


async def test_runner_gives_up_at_the_deadline_while_the_file_lock_hangs(tmp_path):
    a = manager(open_store(f"file://{tmp_path}"), "a", None, duration_s=1.2)
    a.bootstrap()
    a.acquire()
    fd = os.open(tmp_path / ".lock", os.O_RDWR)
    # A wedged writer holds the store's lock; every CAS waits on it.
    await _runner_gives_up_at_the_deadline_while_a_call_hangs(
        a, lambda: fcntl.flock(fd, fcntl.LOCK_EX), lambda: os.close(fd))


async def test_runner_gives_up_at_the_deadline_while_s3_does_not_answer(moto_endpoint):
    a = manager(open_store(f"s3://{BUCKET}/{uuid.uuid4().hex}"), "a", None, duration_s=1.2)
    a.bootstrap()
    a.acquire()
    # A black hole: connections are accepted by the kernel and never answered.
    hole = socket.create_server(("127.0.0.1", 0))
    silent = open_store(a.store.url, endpoint_url=f"http://127.0.0.1:{hole.getsockname()[1]}",
                        timeout_s=2.0)

    def hang():
        a.store = silent                        # the network path to S3 now swallows requests
    await _runner_gives_up_at_the_deadline_while_a_call_hangs(a, hang, hole.close)
