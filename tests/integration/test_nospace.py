"""No room, on real processes: the LMDB map set small (`--map-size`), and a small tmpfs as the data
dir (skipped where the machine cannot mount one). The node stays up, serves reads, refuses writes
with 507 `no_space`, says so in /v1/health and /metrics (the NOSPACE alarm), keeps its replication
links, resumes by itself when room returns, and loses nothing it acknowledged."""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import lmdb
import pytest

from node import limits
from tests.integration.harness import PortReservation, ReplogProcess, request, wait_for

VALUE = "v" * 1500
WRITE_ANSWER_S = 3.0         # a write not answered within this is the batch the node keeps


class Writer:
    """Writes one key at a time; a write the node keeps (no room yet) goes on waiting in a thread."""

    def __init__(self, node: ReplogProcess):
        self.node = node
        self.pool = ThreadPoolExecutor(4)
        self.acked: dict[str, object] = {}
        self.kept: dict[str, object] = {}      # key -> future of a write not answered yet

    def put(self, key: str, value=VALUE) -> tuple[int, dict] | None:
        fut = self.pool.submit(request, "PUT", f"{self.node.url}/v1/spaces/kv/keys/{key}", value, timeout=120)
        try:
            status, body = fut.result(WRITE_ANSWER_S)
        except TimeoutError:
            self.kept[key] = fut
            return None
        if status == 200:
            self.acked[key] = value
        return status, body

    def until_refused(self, keys, on_write=None) -> dict:
        for key in keys:
            got = self.put(key)
            if on_write:
                on_write()
            if got is not None and got[0] == 507:
                return got[1]
            assert got is None or got[0] == 200, got
        raise AssertionError("the node never refused a write")

    def settle(self) -> None:
        for key, fut in self.kept.items():
            status, _ = fut.result(60)
            assert status == 200, (key, status)
            self.acked[key] = VALUE


def metric(node: ReplogProcess, name: str, labels: str = "") -> float | None:
    with urllib.request.urlopen(node.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def all_there(node: ReplogProcess, acked: dict) -> bool:
    return all(node.kv_get("kv", k)[0] == 200 for k in acked)


def test_a_full_map_refuses_writes_keeps_links_serves_reads_and_resumes_when_a_reader_lets_go(tmp_path, procs):
    ra, rb = PortReservation(), PortReservation()     # held until the test ends (procs releases them)
    a = ReplogProcess(tmp_path, "a", reservation=ra, peers=[f"127.0.0.1:{rb.port}"], extra=["--map-size", str(1 << 21)])
    b = ReplogProcess(tmp_path, "b", reservation=rb, peers=[f"127.0.0.1:{ra.port}"])
    procs += [a, b]
    a.start(wait=False), b.start(wait=False)
    a.wait_healthy(60), b.wait_healthy(60)
    a.create_space("kv")
    wait_for(lambda: b.get("/v1/spaces/kv/keys")[0] == 200, 20, "kv on B")
    # Another process holds a read transaction on A's store (as `replog backup` does): LMDB may not
    # reuse the pages it sees, so A's map fills although A only overwrites a few keys.
    env = lmdb.open(os.path.join(a.data_dir, "store"), readonly=True, lock=True, max_dbs=limits.store_spaces_max + 8)
    reader = env.begin()
    w = Writer(a)
    refusal = w.until_refused(f"k{i % 16}-{i // 16 % 2}" for i in range(100_000))
    assert refusal["error"]["code"] == "no_space" and "map is full" in refusal["error"]["message"], refusal
    health = a.get("/v1/health")
    assert health[0] == 503 and health[1]["status"] == "no_space" and health[1]["alarms"] == ["NOSPACE"], health
    assert metric(a, "replog_alarm", '{alarm="NOSPACE"}') == 1
    assert a.info()["space"]["kind"] == "map"
    key = next(iter(w.acked))
    assert a.kv_get("kv", key)[0] == 200, "reads are served"
    for i in range(20):                                 # B goes on writing; A's applier must pause, not die
        b.kv_put("kv", f"b{i}", i)
    wait_for(lambda: next(u for u in a.info()["upstreams"])["status"] == "paused", 20, "A's applier paused")
    subscribed = a.log_text().count("subscribed to")
    time.sleep(limits.peer_timeout_s + 2)               # longer than a silent link lives: the link must stay up
    assert next(u for u in a.info()["upstreams"])["status"] == "paused"
    assert [d["status"] for d in b.info()["downstreams"]] == ["subscribed"]
    assert a.log_text().count("subscribed to") == subscribed, "A's link to B was not re-made"
    assert a.put("/v1/spaces/kv/keys/refused", 1)[0] == 507
    reader.abort()
    env.close()
    w.settle()                                          # the kept write lands by itself
    wait_for(lambda: a.get("/v1/health")[0] == 200, 20, "A healthy again")
    assert metric(a, "replog_alarm", '{alarm="NOSPACE"}') == 0
    assert a.kv_put("kv", "after", 1)["lsn"] > 0
    wait_for(lambda: a.kv_get("kv", "b19")[0] == 200, 20, "B's rows reach A")
    wait_for(lambda: all_there(b, w.acked), 20, "A's acknowledged rows on B")
    a.kill9()
    a.start()
    assert all_there(a, w.acked) and all(a.kv_get("kv", f"b{i}")[0] == 200 for i in range(20))


def test_a_map_too_small_to_recover_stops_start_with_one_line_and_a_larger_one_loses_nothing(tmp_path, procs):
    n = ReplogProcess(tmp_path, "n", extra=["--map-size", str(limits.store_map_bytes_min)])
    procs.append(n)
    n.start()
    n.create_space("kv")
    w = Writer(n)
    warned = []

    def look() -> None:
        if not warned:
            s, h = n.get("/v1/health")
            if s == 200 and h.get("warnings"):
                warned.append(h["warnings"])

    w.until_refused((f"key{i}" for i in range(100_000)), on_write=look)
    assert warned and "raise map_size" in warned[0][0], "health warned before the map was full"
    n.kill9()
    out = subprocess.run(n.argv(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("replog: error:")]
    assert len(lines) == 1 and "map is full" in lines[0] and "raise map_size" in lines[0], out.stderr
    assert f"map_size {limits.store_map_bytes_min} bytes" in lines[0], lines
    n.extra = ["--map-size", str(1 << 26)]
    n.start()
    assert all_there(n, w.acked)
    assert all_there(n, w.kept), "the write the node kept was in its WAL: recovered"


@contextlib.contextmanager
def tmpfs(path: str, size_bytes: int):
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", path], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)


def fill(path: str, leave_bytes: int) -> str:
    """A file in `path` that leaves about `leave_bytes` free on its file system."""
    st = os.statvfs(path)
    filler = os.path.join(path, "filler")
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave_bytes))
    return filler


@pytest.mark.parametrize("reserve", [0, 4 << 20], ids=["write-fails", "reserve-reached"])
def test_a_full_disk_refuses_writes_and_resumes_when_space_is_freed(tmp_path, procs, reserve):
    n = ReplogProcess(tmp_path, "n", extra=["--disk-reserve-bytes", str(reserve), "--segment-bytes-max", str(1 << 20)])
    with tmpfs(n.data_dir, 48 << 20):
        procs.append(n)
        n.start()
        n.create_space("kv")
        filler = fill(n.data_dir, reserve + (6 << 20))
        w = Writer(n)
        refusal = w.until_refused(f"k{i}" for i in range(100_000))
        assert refusal["error"]["code"] == "no_space", refusal
        assert n.get("/v1/health")[1]["status"] == "no_space"
        assert n.info()["space"]["kind"] == "disk"
        if reserve:
            # A write slow to answer on a loaded machine is not one the node keeps: with a reserve each is
            # answered (acknowledged or refused) while the disk is still full; one kept waits for room.
            for key, fut in list(w.kept.items()):
                status, _ = fut.result(60)
                assert status in (200, 507), (key, status)
                if status == 200:
                    w.acked[key] = VALUE
                del w.kept[key]
            assert "disk_reserve_bytes" in refusal["error"]["message"]
        assert n.kv_get("kv", next(iter(w.acked)))[0] == 200
        os.unlink(filler)
        w.settle()
        wait_for(lambda: n.get("/v1/health")[0] == 200, 20, "healthy once space is back")
        n.kv_put("kv", "after", 1)
        n.kill9()
        n.start()
        assert all_there(n, w.acked) and n.kv_get("kv", "after")[0] == 200
        n.stop()
