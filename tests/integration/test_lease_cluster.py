"""Lease identity on real `replog serve` processes (issue 7), plus the fencing and
wait-for-peers rules of LeaseIdentity exercised in-process against a real file store.

- A 3-slot cluster on a `file://` store: a node killed with -9 is replaced by a fresh
  container (empty data dir) that takes the slot once it expires, serves as the same
  member uuid, and `_cluster` keeps 3 members everywhere; a stale holder is fenced.
- The same bootstrap against moto's S3 server (ThreadedMotoServer in this process, the
  children reach it through REPLOG_S3_ENDPOINT): unique slots, one cluster; an orderly
  stop releases the slot; losing the store stops the others before their leases expire.
- A node whose renewals fail (its lease directory vanishes) answers 503, refuses writes and
  exits 1 before its lease could be taken by another node.
Leases are short (3-4 s) so expiry is quick; every wait is a condition with a deadline."""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import urllib.request

import aiohttp
import boto3
import pytest
from moto.server import ThreadedMotoServer

from node.applier.handshake import open_link
from node.config import Config
from node.errors import PeerRefused, RemoteProtocolError
from node.identity import lease as core
from node.identity.lease import LeaseLost
from node.identity.lease_manager import LeaseManager, wall_clock_ms
from node.identity.lease_node import LeaseIdentity, NoLeaseSlot
from node.identity.lease_store import open_store
from node.server import Node
from tests.integration.harness import REPLOG, ReplogProcess, free_port, mesh_nodes, silent_address, wait_for
from tests.integration.oracles import REPO, replicated_spaces
from tests.waiting import until

BUCKET = "replog-leases"


def lease_flags(store: str, size: int, duration_s: float) -> list[str]:
    return ["--identity", "lease", "--lease-store", store, "--cluster-size", str(size),
            "--lease-duration-s", str(duration_s)]


def lease_cluster(tmp, n: int, store: str, duration_s: float) -> list[ReplogProcess]:
    """n fresh lease-identity nodes listing each other, started together (they race for slots)."""
    nodes = mesh_nodes(tmp, n, prefix="c", extra=lease_flags(store, n, duration_s))
    for node in nodes:
        node.start(wait=False)
    return nodes


def running_lease_cluster(tmp, procs: list, n: int, duration_s: float, space: str = "kv") -> list[ReplogProcess]:
    """lease_cluster on a file:// store under `tmp`, every node healthy, `space` created on the
    first node and replicated to every other."""
    nodes = lease_cluster(tmp, n, f"file://{tmp}/leases", duration_s)
    procs.extend(nodes)
    for node in nodes:
        node.wait_healthy(60)
    nodes[0].create_space(space)
    for node in nodes[1:]:
        wait_for(lambda: space in replicated_spaces(node), 30, f"the space on {node.name}")
    return nodes


def metric(node: ReplogProcess, name: str) -> float:
    """One sample of a Prometheus metric (summed over labels); 0 if absent."""
    with urllib.request.urlopen(node.url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def assert_one_cluster_of(nodes: list[ReplogProcess], uuids: set[str]) -> None:
    infos = [n.info() for n in nodes]
    assert len({i["cluster_uuid"] for i in infos}) == 1, [i["cluster_uuid"] for i in infos]
    for n in nodes:
        members = n.cluster()
        assert set(members) == uuids, f"{n.name}: _cluster is {sorted(members)}, expected {sorted(uuids)}"
        assert all(m["state"] == "member" for m in members.values()), members


class ExitWatch:
    """What a node showed from now until its process exited: the last lease expiry it reported
    (its last successful renewal), its first 503 health answer, and the status of a write tried
    right then."""

    def __init__(self, node: ReplogProcess, timeout_ms: int):
        self.started_ms = wall_clock_ms()
        self.last_expiry_ms: int | None = None
        self.health_503: dict | None = None
        self.write_status: int | None = None
        self.exited_ms: int | None = None
        self.returncode: int | None = None
        waiter = threading.Thread(target=self._wait_exit, args=(node, timeout_ms), daemon=True)
        waiter.start()    # stamps the exit as it happens, not at the next poll
        while waiter.is_alive():
            try:
                status, info = node.get("/v1/info", timeout=1)
                if status == 200 and info["lease"]["expires_ms"]:
                    self.last_expiry_ms = info["lease"]["expires_ms"]
                status, body = node.get("/v1/health", timeout=1)
                if status == 503 and self.health_503 is None:
                    self.health_503 = body
                    self.write_status = node.put("/v1/spaces/kv", {"local": False}, timeout=1)[0]
            except OSError:
                pass   # the process is exiting: the loop ends with the waiter
            waiter.join(0.02)   # polling interval while watching a process

    def _wait_exit(self, node: ReplogProcess, timeout_ms: int) -> None:
        try:
            self.returncode = node.proc.wait(timeout_ms / 1000)
        except subprocess.TimeoutExpired:
            return
        self.exited_ms = wall_clock_ms()

    def assert_stopped_serving_then_exited(self, node: ReplogProcess) -> None:
        assert self.returncode == 1, f"{node.name} exited with {self.returncode} (None: still running)\n" \
                                     f"{node.log_tail()}"
        assert self.health_503 is not None and self.health_503["status"] == "lease_lost", self.health_503
        assert re.match(r"lease slot \d+ lost: ", self.health_503["reason"]), self.health_503
        assert self.write_status == 503, f"a write got {self.write_status} after the lease was lost"
        assert self.last_expiry_ms is not None and self.exited_ms < self.last_expiry_ms, \
            f"{node.name} exited at {self.exited_ms}, not before its lease expired at {self.last_expiry_ms}"
        assert "not released" in node.log_text(), "a lost lease must not be released"


class StaleLease:
    """The lease part of a zombie: the slot and version it held before it was paused."""

    def __init__(self, slot: int, version: int):
        self.slot, self.version = slot, version

    def greeting_field(self) -> dict:
        return {"slot": self.slot, "version": self.version, "seen": {}}

    def check_peer(self, theirs: dict) -> None:
        pass


async def zombie_handshake(address: str, uuid: str, slot: int, version: int) -> PeerRefused | None:
    """Handshake with a real node as member `uuid` holding `slot` at `version`; the refusal, or None."""
    node = Node(Config(identity="lease", cluster_size=3, lease_store="file:///unused", listen="127.0.0.1:9"))
    node.uuid = uuid
    node.lease = StaleLease(slot, version)
    async with aiohttp.ClientSession() as session:
        try:
            conn, _ = await open_link(node, session, address)
        except PeerRefused as e:
            return e
        await conn.close()
    return None


# --- real processes, file:// store ------------------------------------------------------------

def test_killed_node_is_replaced_by_a_fresh_container_as_the_same_member(tmp_path, procs):
    store = f"file://{tmp_path}/leases"
    nodes = lease_cluster(tmp_path, 3, store, duration_s=3)
    procs.extend(nodes)
    for n in nodes:
        n.wait_healthy(60)
    infos = {n.name: n.info() for n in nodes}
    assert sorted(i["lease"]["slot"] for i in infos.values()) == [0, 1, 2], "two nodes took the same slot"
    assert all(i["lease"]["version"] == 1 and i["uuid"] == i["lease"]["member_uuid"] for i in infos.values())
    uuids = {i["uuid"] for i in infos.values()}
    wait_for(lambda: all(len(n.cluster()) == 3 for n in nodes), 30, "_cluster of 3 on every node")
    assert_one_cluster_of(nodes, uuids)

    victim, others = nodes[2], nodes[:2]
    before = infos[victim.name]
    slot, version, uuid = before["lease"]["slot"], before["lease"]["version"], before["uuid"]
    assert os.path.isdir(os.path.join(victim.data_dir, f"slot-{slot}")), "data dir is not chosen per slot"
    wait_for(lambda: metric(victim, "replog_lease_renewals_total") >= 1, 10, "a renewal shown in /metrics")
    victim.create_space("kv")
    victim.kv_put("kv", "before", {"by": "victim"})
    wait_for(lambda: all(n.kv_get("kv", "before")[0] == 200 for n in others), 20, "victim's row replicated")

    victim.kill9()
    # the victim's port, still reserved by the victim: no other test's node took it meanwhile
    fresh = ReplogProcess(tmp_path, "fresh", port=victim.port, peers=others, extra=lease_flags(store, 3, 3))
    procs.append(fresh)
    assert not os.path.exists(fresh.data_dir), "the replacement must start with an empty data dir"
    fresh.start(wait=False)
    fresh.wait_healthy(60)

    after = fresh.info()
    assert after["uuid"] == uuid, "the replacement did not come back as the slot's member"
    assert (after["lease"]["slot"], after["lease"]["version"]) == (slot, version + 1)
    # The killed holder never released, so the new one waited until both peers had seen its version.
    assert after["lease"]["peer_wait"]["outcome"] == "confirmed", after["lease"]["peer_wait"]
    assert after["lease"]["peer_wait"]["confirmed"] == sorted(o.address for o in others)
    status, row = fresh.kv_get("kv", "before")
    assert (status, row["value"], row["origin"]) == (200, {"by": "victim"}, uuid), (status, row)
    for o in others:
        assert o.info()["lease"]["seen"][str(slot)] == version + 1
    wait_for(lambda: all(len(n.cluster()) == 3 for n in [*others, fresh]), 20, "3 members on the replacement")
    assert_one_cluster_of([*others, fresh], uuids)

    fresh.kv_put("kv", "after", {"by": "fresh"})
    wait_for(lambda: all(o.kv_get("kv", "after")[0] == 200 for o in others), 30, "the replacement's row replicated")
    assert all(o.kv_get("kv", "after")[1]["origin"] == uuid for o in others)

    # Fencing: the killed holder coming back with its old version is refused by a peer.
    refusal = asyncio.run(zombie_handshake(others[0].address, uuid, slot, version))
    assert refusal is not None and refusal.code == "lease_fenced", refusal
    assert f"version {version + 1}" in refusal.message
    assert metric(others[0], "replog_lease_fenced_total") >= 1


def test_failed_renewal_stops_serving_and_exits_before_the_lease_expires(tmp_path, procs):
    lease_dir = tmp_path / "leases"
    duration_ms = 4000
    node = ReplogProcess(tmp_path, "solo", extra=lease_flags(f"file://{lease_dir}", 1, duration_ms / 1000))
    procs.append(node)
    node.start()
    wait_for(lambda: metric(node, "replog_lease_renewals_total") >= 1, 10, "a successful renewal")
    assert metric(node, "replog_lease_renew_failures_total") == 0

    shutil.move(str(lease_dir), str(tmp_path / "leases.gone"))   # the store is gone: renewals fail
    watch = ExitWatch(node, 3 * duration_ms)
    watch.assert_stopped_serving_then_exited(node)
    assert watch.exited_ms - watch.started_ms < duration_ms
    assert "lease renewal failed" in node.log_text(), "the loss was not caused by failing renewals"


def test_a_write_served_after_the_loop_stalled_past_the_lease_is_refused_and_not_written(tmp_path, procs):
    """The event loop blocked past the lease (a frozen VM, a disk stall on its thread: here the
    fault point stall_write, as a PUT begins) runs what waited before the renewal's timer. Before
    `serving()` (node/identity/lease_node.py) this PUT was claimed, written and answered 200
    after the slot could be another node's. (A SIGSTOP'd process is different: its wait for
    events ends interrupted when it goes on, and the loop runs its timers first.)"""
    duration_s = 2.0
    node = ReplogProcess(tmp_path, "solo", extra=lease_flags(f"file://{tmp_path}/leases", 1, duration_s))
    node.env = {"REPLOG_FAULT_POINT": "stall_write:1"}
    procs.append(node)
    node.start()
    node.create_space("kv")
    status, answer = node.put("/v1/spaces/kv/keys/stalled", {"v": 1}, timeout=30)
    assert status == 503, f"the write was answered {status} {answer} after the lease ran out"
    assert answer["error"]["code"] == "not_ready", answer
    assert "lease" in answer["error"]["message"] and "deadline" in answer["error"]["message"], answer
    assert "fault point stall_write" in node.log_text(), "the loop did not stall"
    assert node.proc.wait(10) == 1, "the node did not exit after its lease ran out"
    keys = [row.get("key") for row in slot_wal_rows(node)]
    assert "stalled" not in keys, keys


def test_a_holder_stalled_past_its_lease_while_a_fresh_container_took_its_slot_forks_nothing(tmp_path, procs):
    """The zombie: a holder's event loop stalls (the fault point stall_write, for
    ZOMBIE_STALL_S, as its first PUT begins) past its lease; a fresh container takes the slot
    over, joins as the same member and writes. When the stall ends, the old holder's PUT must
    not be written or acknowledged, nor anything it holds sent on the links its peers still have
    open (shorter than `peer_timeout_s`): else two rows name one (origin, lsn). Before
    `serving()` and the receiving side's fencing, the PUT was answered 200 and written under an
    lsn the new holder had used."""
    store, duration_s = f"file://{tmp_path}/leases", 2.0
    nodes = mesh_nodes(tmp_path, 3, prefix="c", extra=lease_flags(store, 3, duration_s))
    procs.extend(nodes)
    zombie, others = nodes[2], nodes[:2]
    zombie.env = {"REPLOG_FAULT_POINT": f"stall_write:1:{ZOMBIE_STALL_S:g}"}
    for n in nodes:
        n.start(wait=False)
    for n in nodes:
        n.wait_healthy(60)
    others[0].create_space("kv")
    wait_for(lambda: all("kv" in replicated_spaces(n) for n in nodes), 20, "the space on every node")
    for n in others:
        n.kv_put("kv", f"by-{n.name}", {"v": 1})
    wait_for(lambda: all(n.kv_get("kv", f"by-{o.name}")[0] == 200 for n in nodes for o in others), 20,
             "the first rows everywhere")
    uuid = zombie.uuid()

    answer: dict = {}
    putting = threading.Thread(target=lambda: answer.update(r=zombie.put("/v1/spaces/kv/keys/zombie", {"by": "old"},
                                                                          timeout=60)), daemon=True)
    putting.start()
    wait_for(lambda: "fault point stall_write" in zombie.log_text(), 10, "the old holder's loop stalled")
    fresh = ReplogProcess(tmp_path, "fresh", peers=[o.address for o in others], extra=lease_flags(store, 3, duration_s))
    procs.append(fresh)
    fresh.start(wait=False)
    fresh.wait_healthy(60)
    assert fresh.uuid() == uuid, "the fresh container did not take the stalled holder's slot"
    assert fresh.kv_put("kv", "fresh", {"by": "new"})["lsn"] >= 1
    assert putting.is_alive(), f"the stall ended before the new holder wrote: raise ZOMBIE_STALL_S ({answer})"

    putting.join(60)
    status, body = answer["r"]
    assert status != 200, f"the old holder acknowledged a write after its lease ran out: {body}"
    assert zombie.proc.wait(15) == 1, "the old holder did not exit"
    rows: dict[tuple[str, int], tuple[str, str]] = {}
    for n in [*others, fresh, zombie]:
        for row in slot_wal_rows(n):
            if row["origin"] is None or row["group"] == "local":
                continue
            what = f"{row['op']} {row['space']}/{row['key']}={json.dumps(row.get('value'), sort_keys=True)}"
            first = rows.setdefault((row["origin"], row["lsn"]), (what, n.name))
            assert first[0] == what, f"fork: ({row['origin']}, {row['lsn']}) is {first} and {what} in {n.name}"
    assert not any(k[0] == uuid and v[0].startswith("put kv/zombie=") for k, v in rows.items()), \
        "the old holder wrote its PUT after its lease ran out"
    wait_for(lambda: all(o.kv_get("kv", "fresh")[0] == 200 for o in others), 20, "the new holder's row replicated")


def test_a_node_back_on_a_slot_dir_another_holder_made_stale_starts_empty_and_forks_nothing(tmp_path, procs):
    """Persistent volumes: c2 serves slot k and stops (releasing it); a fresh container takes
    slot k, writes as the same member, and stops; c2 starts again on its old slot dir while its
    only peer is paused. Served as it was, that dir took c2's next write under an lsn the fresh
    holder had used, acknowledged it, and no peer ever took it: a fork (node/identity/slot_dir.py)."""
    store = f"file://{tmp_path}/leases"
    # c1 stays paused while c2 starts and is refused a write: seconds on a busy machine. Its lease
    # must outlast that, or it loses its slot paused and c2 has no peer to follow when it is back.
    nodes = mesh_nodes(tmp_path, 2, prefix="c", extra=lease_flags(store, 2, 15.0))
    procs.extend(nodes)
    for n in nodes:
        n.start(wait=False)
    for n in nodes:
        n.wait_healthy(60)
    c1, c2 = nodes
    c1.create_space("kv")
    wait_for(lambda: all("kv" in replicated_spaces(n) for n in nodes), 20, "the space on both")
    uuid = c2.uuid()
    c2.kv_put("kv", "a", {"by": "c2"})
    wait_for(lambda: c1.kv_get("kv", "a")[0] == 200, 20, "c2's row on c1")
    (slot,) = [d for d in os.listdir(c2.data_dir) if d.startswith("slot-")]
    c2.stop()                                               # releases the slot

    fresh = ReplogProcess(tmp_path, "fresh", peers=[c1.address], extra=lease_flags(store, 2, 15.0))
    procs.append(fresh)
    fresh.start()
    assert fresh.uuid() == uuid
    b = fresh.kv_put("kv", "b", {"by": "fresh"})
    wait_for(lambda: c1.kv_get("kv", "b")[0] == 200, 20, "the fresh holder's row on c1")
    fresh.stop()

    c1.proc.send_signal(signal.SIGSTOP)                     # c2's only peer cannot say how far it is
    try:
        c2.start(wait=False)
        wait_for(lambda: answers(c2), 30, "c2 answering HTTP")
        status, body = c2.put("/v1/spaces/kv/keys/c", {"by": "c2-again"}, timeout=5)
        assert status != 200, f"c2 took a write on its stale slot dir: {body}"
        assert "is stale" in c2.log_text()
    finally:
        c1.proc.send_signal(signal.SIGCONT)
    c2.wait_healthy(60)
    wait_for(lambda: c2.kv_get("kv", "b")[0] == 200, 30, "the fresh holder's row on c2")
    c = c2.kv_put("kv", "c", {"by": "c2-again"})
    assert c["lsn"] > b["lsn"], (b, c)
    assert [d for d in os.listdir(c2.data_dir) if d.startswith(f"{slot}.stale-")], "the stale dir was not kept"
    wait_for(lambda: c1.kv_get("kv", "c")[0] == 200, 20, "c2's new row on c1")
    rows: dict[tuple[str, int], str] = {}
    for n in (c1, c2):
        for row in slot_wal_rows(n):
            if row["origin"] is not None and row["group"] != "local":
                what = f"{row['op']} {row['space']}/{row['key']}={json.dumps(row.get('value'), sort_keys=True)}"
                assert rows.setdefault((row["origin"], row["lsn"]), what) == what, f"fork at {row}"


def test_a_whole_lease_cluster_restarted_at_once_keeps_its_data_every_node_back_on_its_own_slot(tmp_path, procs):
    """Persistent volumes, every node killed, then started one after another in the order that
    gives each the slot of another (the first free slot went to whoever asked first). Before,
    every node then held a slot it had no data of: the cluster came back running and empty,
    its data left behind in the slot dirs (node/identity/lease.py choose_slot)."""
    nodes = lease_cluster(tmp_path, 3, f"file://{tmp_path}/leases", 2.0)
    procs.extend(nodes)
    for n in nodes:
        n.wait_healthy(60)
    nodes[0].create_space("kv")
    wait_for(lambda: all("kv" in replicated_spaces(n) for n in nodes), 20, "the space on every node")
    nodes[0].kv_put("kv", "a", {"v": 1})
    wait_for(lambda: all(n.kv_get("kv", "a")[0] == 200 for n in nodes), 20, "the row on every node")
    before = {n.name: (n.info()["lease"]["slot"], n.uuid()) for n in nodes}
    for n in nodes:
        n.kill9()
    for n in sorted(nodes, key=lambda n: (before[n.name][0] - 1) % 3):   # own slot 1 first, then 2, then 0
        took = n.log_text().count("serving as member")
        n.start(wait=False)
        wait_for(lambda: n.log_text().count("serving as member") > took, 30, f"{n.name} taking a slot")
    for n in nodes:
        n.wait_healthy(60)
    after = {n.name: (n.info()["lease"]["slot"], n.uuid()) for n in nodes}
    assert after == before, "a node came back on another node's slot"
    for n in nodes:
        status, row = n.kv_get("kv", "a")
        assert (status, row["value"]) == (200, {"v": 1}), f"{n.name}: {status} {row}"


def answers(n: ReplogProcess) -> bool:
    try:
        n.get("/v1/health", timeout=1)
        return True
    except OSError:
        return False


ZOMBIE_STALL_S = 8.0        # past the 2 s lease, the fresh container's start and its first write; < peer_timeout_s


def slot_wal_rows(n: ReplogProcess) -> list[dict]:
    """`replog wal dump` of a lease node's slot directory."""
    (slot_dir,) = [d for d in os.listdir(n.data_dir) if d.startswith("slot-") and ".stale-" not in d]
    r = subprocess.run(REPLOG + ["wal", "dump", os.path.join(n.data_dir, slot_dir)], capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert r.returncode == 0, f"wal dump {n.name}: {r.stderr}"
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


# --- real processes, S3 (moto) ------------------------------------------------------------------

@pytest.fixture
def moto_s3(monkeypatch):
    for name, value in [("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                        ("AWS_SESSION_TOKEN", "test"), ("AWS_DEFAULT_REGION", "us-east-1")]:
        monkeypatch.setenv(name, value)   # the children inherit these
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    monkeypatch.setenv("REPLOG_S3_ENDPOINT", endpoint)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    stopped = []
    yield client, lambda: stopped or stopped.append(server.stop())
    if not stopped:
        server.stop()


def test_s3_three_nodes_race_for_three_slots(tmp_path, procs, moto_s3):
    s3, stop_s3 = moto_s3
    duration_ms = 4000
    nodes = lease_cluster(tmp_path, 3, f"s3://{BUCKET}/cluster-a", duration_s=duration_ms / 1000)
    procs.extend(nodes)
    for n in nodes:
        n.wait_healthy(60)

    def slot_object(slot: int) -> dict:
        return json.loads(s3.get_object(Bucket=BUCKET, Key=f"cluster-a/{slot}.json")["Body"].read())

    infos = [n.info() for n in nodes]
    assert sorted(i["lease"]["slot"] for i in infos) == [0, 1, 2], "two nodes took the same slot"
    for i in infos:
        obj = slot_object(i["lease"]["slot"])
        assert (obj["task_id"], obj["member_uuid"], obj["version"]) == (i["lease"]["task_id"], i["uuid"], 1)
    uuids = {i["uuid"] for i in infos}
    wait_for(lambda: all(len(n.cluster()) == 3 for n in nodes), 30, "_cluster of 3 on every node")
    assert_one_cluster_of(nodes, uuids)

    # Orderly stop: the slot goes back to the bucket, free, with its member uuid and version.
    leaving = infos[2]
    assert nodes[2].stop() == 0, nodes[2].log_tail()
    obj = slot_object(leaving["lease"]["slot"])
    assert (obj["task_id"], obj["member_uuid"], obj["version"]) == (None, leaving["uuid"], 1)

    # The bucket goes away: the remaining nodes stop serving and exit before their leases expire.
    stop_s3()
    watches: dict[str, ExitWatch] = {}
    threads = [threading.Thread(target=lambda n=n: watches.__setitem__(n.name, ExitWatch(n, 3 * duration_ms)))
               for n in nodes[:2]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for n in nodes[:2]:
        watches[n.name].assert_stopped_serving_then_exited(n)
        assert watches[n.name].exited_ms - watches[n.name].started_ms < duration_ms
    # The nodes ran with --log-level debug and AWS_SESSION_TOKEN set: the AWS SDK's request
    # headers (the token, the signatures) are its DEBUG output, which is not the node's.
    for n in nodes:
        assert "x-amz-security-token" not in n.log_text().lower(), f"{n.name} logged the S3 session token"


# --- LeaseIdentity in-process: fencing and the wait for peers -----------------------------------

def lease_node(tmp_path, *, size: int = 3, duration_s: float = 2.0, peers: tuple[str, ...] = ()) -> Node:
    cfg = Config(identity="lease", lease_store=f"file://{tmp_path}/leases", cluster_size=size,
                 lease_duration_s=duration_s, data_dir=str(tmp_path / "data"), peers=peers,
                 listen=f"127.0.0.1:{free_port()}")      # an address only: this Node never listens
    return Node(cfg)


def greeting(slot: int, version: int, seen: dict | None = None, address: str = "127.0.0.1:7399") -> dict:
    return {"uuid": "peer-uuid", "address": address,
            "lease": {"slot": slot, "version": version, "seen": {str(k): v for k, v in (seen or {}).items()}}}


async def test_check_peer_refuses_versions_older_than_those_read_from_the_store(tmp_path):
    other = LeaseManager(open_store(f"file://{tmp_path}/leases"), 3, "other-task", 30.0)
    other.bootstrap()
    assert other.acquire().slot == 0                        # slot 0 held at version 1 by someone else
    node = lease_node(tmp_path)
    lease = LeaseIdentity(node, exit_at_once_on_loss=False)   # a loss must not end pytest
    await lease.acquire()
    try:
        assert (lease.slot, lease.version) == (1, 1)
        assert node.data_dir == os.path.join(str(tmp_path / "data"), "slot-1")
        assert lease.greeting_field() == {"slot": 1, "version": 1, "seen": {"0": 1, "1": 1}}

        # Versions read from the store at acquisition fence.
        with pytest.raises(PeerRefused) as e:
            lease.check_peer(greeting(0, 0))
        assert e.value.code == "lease_fenced" and "slot 0 at version 0" in e.value.message

        # A peer's word is a hint, not a fact: slot 2 claimed at version 3 (the store has it at 0)
        # makes the node read the store again, and then fences nobody on its account.
        lease.check_peer(greeting(2, 3))
        await wait_verified(lease, 1)
        lease.check_peer(greeting(2, 2))                    # not refused: version 3 was never real
        lease.check_peer(greeting(0, 1, seen={2: 5}))
        await wait_verified(lease, 2)
        lease.check_peer(greeting(2, 4))
        assert 2 not in lease.seen and lease.manager.known_versions.get(2, 0) == 0, "an unverified claim was kept"

        # A version the store really holds is learned at the re-read, and fences from then on.
        third = LeaseManager(open_store(f"file://{tmp_path}/leases"), 3, "third-task", 30.0)
        assert third.acquire().slot == 2                    # slot 2 at version 1, in the store
        lease.check_peer(greeting(2, 1))                    # the hint: a version above what we read
        await wait_verified(lease, 3)
        assert lease.seen[2] == 1 and lease.manager.known_versions[2] == 1
        with pytest.raises(PeerRefused) as e:
            lease.check_peer(greeting(2, 0))
        assert e.value.code == "lease_fenced" and "version 1" in e.value.message
        assert lease.fenced == 2

        with pytest.raises(RemoteProtocolError):
            lease.check_peer({"uuid": "x", "address": "y", "lease": {"slot": "1", "version": 1}})
        with pytest.raises(RemoteProtocolError):
            lease.check_peer({"uuid": "x", "address": "y", "lease": None})

        # A peer whose greeting shows our version counts as having seen it.
        lease.check_peer(greeting(0, 1, seen={1: 1}, address="127.0.0.1:7400"))
        assert "127.0.0.1:7400" in lease.peers_confirmed
        assert node.status == "loading"                     # nothing so far touched the node's state
    finally:
        await lease.release()
    assert lease.released is True


async def wait_verified(lease: LeaseIdentity, n: int) -> None:
    """Until the node has re-read the lease store n times (each a peer's claim asked for)."""
    await until(lambda: lease.verifications >= n, 10, f"{n} re-reads (have {lease.verifications})")


async def test_a_fake_claim_of_a_newer_version_of_our_slot_changes_nothing(tmp_path):
    node = lease_node(tmp_path, size=1)
    lease = LeaseIdentity(node, exit_at_once_on_loss=False)   # a loss must not end pytest
    await lease.acquire()
    try:
        lease.check_peer(greeting(0, 1, seen={0: 2 ** 62}))   # "someone holds your slot at 2^62"
        await wait_verified(lease, 1)
        assert lease.lost_reason is None and node.fatal is None and not node.stopped.is_set()
        assert lease.seen == {0: 1} and lease.manager.known_versions == {0: 1}
        lease.manager.renew()                                  # what the next renewal writes
        stored = core.decode(open(tmp_path / "leases" / "0.json", "rb").read(), 0)
        assert stored.known_versions == {0: 1}, "a peer's claim reached the lease store"
    finally:
        await lease.release()
    assert lease.released is True


async def test_a_newer_version_of_our_own_slot_in_the_store_means_the_lease_is_lost(tmp_path):
    node = lease_node(tmp_path, size=1)
    lease = LeaseIdentity(node, exit_at_once_on_loss=False)   # a loss must not end pytest
    await lease.acquire()
    try:
        # Another node took the slot over (its clock says our lease expired): version 2 in the store.
        ahead = LeaseManager(open_store(f"file://{tmp_path}/leases"), 1, "new-holder", 2.0,
                             clock=lambda: wall_clock_ms() + 60_000)
        assert ahead.acquire().version == 2
        lease.check_peer(greeting(0, 2, address="127.0.0.1:7402"))   # the new holder greets us
        await asyncio.wait_for(node.stopped.wait(), 5.0)       # re-read, lost, told to stop
        assert node.status == "lease_lost"                     # health 503 and writes refused
        assert isinstance(node.fatal, LeaseLost) and "taken over" in lease.lost_reason
        with pytest.raises(PeerRefused) as e:
            lease.check_peer(greeting(0, 2, address="127.0.0.1:7401"))
        assert e.value.code == "lease_lost"
    finally:
        await lease.release()
    assert lease.released is None, "a lost lease must not be released"
    assert lease.info()["state"] == "lost"


async def test_takeover_without_release_waits_for_peers_until_the_deadline(tmp_path):
    # A holder that never released: its lease was written with a clock 10 s behind, so it has expired.
    past = LeaseManager(open_store(f"file://{tmp_path}/leases"), 1, "crashed-task", 0.5,
                        clock=lambda: wall_clock_ms() - 10_000)
    past.bootstrap()
    assert past.acquire().version == 1
    with silent_address() as unreachable:            # no test's node answers there meanwhile
        node = lease_node(tmp_path, size=1, duration_s=1.0, peers=(unreachable,))
        lease = LeaseIdentity(node, exit_at_once_on_loss=False)   # a loss must not end pytest
        await lease.acquire()
        node.http_session = aiohttp.ClientSession()
        try:
            assert (lease.slot, lease.version) == (0, 2)
            assert lease.peer_wait_until_ms is not None and not lease.ready()
            assert lease.info()["state"] == "waiting_for_peers"
            await asyncio.wait_for(lease.wait_ready(), 5.0)
            assert wall_clock_ms() >= lease.peer_wait_until_ms
            assert lease.peer_wait_outcome == "timed_out" and lease.peers_confirmed == set()
            assert lease.ready() and lease.info()["state"] == "held"
        finally:
            await node.http_session.close()
            await lease.release()
    assert core.decode(open(tmp_path / "leases" / "0.json", "rb").read(), 0).task_id is None


async def test_a_node_told_to_stop_while_every_slot_is_held_ends_start_up_with_a_reason(tmp_path):
    holder = LeaseManager(open_store(f"file://{tmp_path}/leases"), 1, "holder-task", 30.0)
    holder.bootstrap()
    assert holder.acquire().slot == 0
    node = lease_node(tmp_path, size=1)
    lease = LeaseIdentity(node, exit_at_once_on_loss=False)
    node.stopped.set()                                      # SIGTERM while waiting for a slot
    with pytest.raises(NoLeaseSlot) as e:
        await asyncio.wait_for(lease.acquire(), 5.0)
    assert "all 1 slots" in str(e.value) and "held by other nodes" in str(e.value)
    assert lease.slot is None and node.data_dir == str(tmp_path / "data")
    await lease.release()
    assert core.decode(open(tmp_path / "leases" / "0.json", "rb").read(), 0).task_id == "holder-task"
