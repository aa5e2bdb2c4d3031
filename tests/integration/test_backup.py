"""Backup and restore on real processes (node/ops/backup.py, node/ops/restore.py): a hot backup
under write load holds every write acknowledged before its point; a restored member takes back its
later rows from its peers before it writes again, and never writes two rows under one lsn; a
backup restored as a new member joins with a new uuid and keeps its data; a whole cluster comes
back from backups of every node."""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

from node.wal.dump import iter_rows
from tests.integration.harness import REPLOG, ReplogProcess, mesh, request, restore, vclocks_converged, wait_for


class Load:
    """Threads writing `<prefix><n>` = n with a counter, each write's answer time kept, until stopped."""

    def __init__(self, node: ReplogProcess, prefix: str, threads: int = 2):
        self.node, self.prefix = node, prefix
        self.acked: dict[str, float] = {}           # key -> wall time its answer arrived
        self.attempted: set[str] = set()
        self._n = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._n += 1
                key = f"{self.prefix}{self._n}"
                self.attempted.add(key)
            s, _ = request("PUT", f"{self.node.url}/v1/spaces/kv/keys/{key}", self._n, timeout=30)
            if s == 200:
                self.acked[key] = time.time()

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        wait_for(lambda: len(self.acked) >= 50, 30, f"load on {self.node.name} going")
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def before(self, t: float) -> set[str]:
        return {k for k, at in self.acked.items() if at < t}


def backup_http(node: ReplogProcess, out: str) -> dict:
    s, man = node.post("/v1/admin/backup", {"to": out}, timeout=120)
    assert s == 200, (s, man)
    return man


def backup_cli(node: ReplogProcess, out: str) -> dict:
    r = subprocess.run(REPLOG + ["backup", node.data_dir, "--to", out], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r
    with open(os.path.join(out, "MANIFEST.json")) as f:
        return json.load(f)


def keys_of(node: ReplogProcess, space: str = "kv") -> dict[str, object]:
    out, after = {}, None
    while True:
        q = f"/v1/spaces/{space}/keys?limit=10000" + (f"&after={after}" if after else "")
        s, d = node.get(q)
        assert s == 200, (s, d)
        out.update({i["key"]: i for i in d["items"]})
        if d["next"] is None:
            return out
        after = d["next"]


def fill(node: ReplogProcess, rows: int) -> None:
    """Rows written 1,000 to a transaction, so the store is worth copying."""
    for start in range(0, rows, 1000):
        ops = [{"op": "put", "space": "kv", "key": f"fill{i}", "value": "x" * 100} for i in range(start, start + 1000)]
        s, d = node.post("/v1/txn", {"ops": ops}, timeout=60)
        assert s == 200, (s, d)


def one_row_per_lsn(*data_dirs: str) -> dict:
    """(origin, lsn) -> the row, over the WALs of all nodes; fails if any two differ."""
    seen: dict[tuple, tuple] = {}
    for d in data_dirs:
        for row in iter_rows(d):
            if row["group"] == "local":
                continue
            key = (row["origin"], row["lsn"])
            what = (row["op"], row["space"], row["key"], json.dumps(row["value"], sort_keys=True))
            assert seen.setdefault(key, what) == what, f"{key} is {seen[key]} on one node and {what} in {d}"
    return seen


@pytest.mark.parametrize("take", [backup_http, backup_cli], ids=["http", "cli"])
def test_a_backup_under_write_load_restores_every_write_acknowledged_before_its_point(tmp_path, procs, take):
    n = ReplogProcess(tmp_path, "n", extra=["--segment-bytes-max", str(1 << 20), "--checkpoint-interval-s", "0.2"])
    procs.append(n)
    n.start()
    n.create_space("kv")
    fill(n, 20_000)
    out = str(tmp_path / "backup")
    with Load(n, "c", threads=3) as load:
        started = time.time()
        man = take(n, out)
        wait_for(lambda: any(at > man["point_s"] for at in load.acked.values()), 30, "writes after the backup")
    during = [k for k, at in load.acked.items() if started < at < man["point_s"]]
    assert during, "writes were acknowledged while the backup ran"
    must = load.before(man["point_s"])
    r = ReplogProcess(tmp_path, "restored")
    restored = restore(out, r.data_dir)
    assert restored["uuid"] == man["uuid"]
    procs.append(r)
    r.start()
    assert r.uuid() == man["uuid"], "the node answering is the restored one"
    have = keys_of(r)
    missing = must - set(have)
    assert not missing, f"{len(missing)} writes acknowledged before the backup are missing: {sorted(missing)[:5]}"
    assert all(f"fill{i}" in have for i in range(20_000))
    phantom = {k for k in have if k.startswith("c")} - load.attempted
    assert not phantom, phantom
    assert not [f for f in os.listdir(n.data_dir) if f.endswith(".hold")], "the backup's WAL hold is released"


def test_a_restored_member_takes_back_its_later_rows_from_its_peers_before_it_writes_again(tmp_path, procs):
    a, b, c = mesh(tmp_path, 3)
    procs.extend([a, b, c])
    a.create_space("kv")
    wait_for(lambda: all(n.get("/v1/spaces/kv/keys")[0] == 200 for n in (b, c)), 20, "kv everywhere")
    for i in range(10):
        b.kv_put("kv", f"b{i}", i)
    out = str(tmp_path / "b-backup")
    backup_http(b, out)
    for i in range(10, 20):                             # acknowledged after the backup, held by A and C
        b.kv_put("kv", f"b{i}", i)
    bu = b.uuid()
    wait_for(lambda: all(n.info()["vclock_uuid"].get(bu) == b.info()["vclock_uuid"][bu] for n in (a, c)), 20,
             "A and C hold all of B's rows")
    last = b.info()["vclock_uuid"][bu]
    b.kill9()
    os.rename(b.data_dir, b.data_dir + ".lost")
    restored = restore(out, b.data_dir)
    assert restored["vclock"][bu] < last, "the backup misses B's later rows"
    b.start(wait=False)
    answers = []

    def write_now():
        s, d = b.put("/v1/spaces/kv/keys/after", "new")
        answers.append((s, d.get("error", {}).get("code") if s != 200 else d["lsn"]))
        return d if s == 200 else None

    d = wait_for(write_now, 60, "B accepts a write", interval=0.05)
    refused = {a_[1] for a_ in answers[:-1]}
    assert refused <= {"catching_up", "not_ready", "own_rows_unconfirmed"}, answers
    assert d["lsn"] > last, f"B wrote under an lsn of its own origin used before: {answers}"
    assert all(b.kv_get("kv", f"b{i}")[0] == 200 for i in range(20)), "B's later rows came back"
    wait_for(lambda: vclocks_converged([a, b, c]), 30, "vclocks converge")
    for n in (a, b, c):
        n.stop()
    one_row_per_lsn(a.data_dir, b.data_dir, c.data_dir)


def test_a_backup_restored_as_a_new_member_joins_with_a_new_uuid_and_keeps_its_data(tmp_path, procs):
    a, b = mesh(tmp_path, 2)
    procs.extend([a, b])
    a.create_space("kv")
    wait_for(lambda: b.get("/v1/spaces/kv/keys")[0] == 200, 20, "kv on B")
    for i in range(10):
        b.kv_put("kv", f"b{i}", i)
    out = str(tmp_path / "b-backup")
    backup_http(b, out)
    bu = b.uuid()
    c = ReplogProcess(tmp_path, "c", peers=[a, b])
    restored = restore(out, c.data_dir, "--as-new-member")
    assert restored["uuid"] != bu and restored["backup_uuid"] == bu
    assert not os.path.exists(os.path.join(c.data_dir, "identity")), "the old member's identity stays behind"
    procs.append(c)
    c.start()
    cu = c.uuid()
    assert cu == restored["uuid"]
    wait_for(lambda: all(n.cluster().get(cu, {}).get("state") == "member" for n in (a, b, c)), 30,
             "every node has C as a member")
    assert len({a.cluster()[cu]["id"], a.cluster()[bu]["id"]}) == 2
    got = c.kv_get("kv", "b3")
    assert got[0] == 200 and got[1]["origin"] == bu, "B's rows stay B's on the new member"
    for n, peers in ((a, [b, c]), (b, [a, c])):
        n.set_peers(peers)
    c.kv_put("kv", "from-c", 1)
    b.kv_put("kv", "from-b-after", 1)
    wait_for(lambda: all(n.kv_get("kv", "from-c")[0] == 200 for n in (a, b)), 30, "C's write everywhere")
    assert a.kv_get("kv", "from-c")[1]["origin"] == cu
    wait_for(lambda: c.kv_get("kv", "from-b-after")[0] == 200, 30, "B goes on as itself")
    assert os.path.exists(os.path.join(c.data_dir, "identity")), "C registered and has its own identity"


def test_a_whole_cluster_restored_from_backups_of_every_node_has_every_write_acknowledged_before_each_point(
        tmp_path, procs):
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    nodes[0].create_space("kv")
    wait_for(lambda: all(n.get("/v1/spaces/kv/keys")[0] == 200 for n in nodes), 20, "kv everywhere")
    loads = [Load(n, f"{n.name}-", threads=1) for n in nodes]
    points = {}
    for ld in loads:
        ld.__enter__()
    try:
        for n in nodes:                                  # one after another, under load on every node
            points[n.name] = backup_http(n, str(tmp_path / f"{n.name}-backup"))["point_s"]
    finally:
        for ld in loads:
            ld.__exit__()
    for n in nodes:
        n.kill9()
    for n in nodes:
        os.rename(n.data_dir, n.data_dir + ".lost")
        restore(str(tmp_path / f"{n.name}-backup"), n.data_dir)
    for n in nodes:
        n.start(wait=False)
    for n in nodes:
        n.wait_healthy(60)
    wait_for(lambda: vclocks_converged(nodes), 60, "the restored cluster converges")
    for n in nodes:
        have = set(keys_of(n))
        for ld in loads:
            missing = ld.before(points[ld.node.name]) - have
            assert not missing, f"{n.name} lacks {len(missing)} writes {ld.node.name} acknowledged before its backup"
    for n in nodes:
        wait_for(lambda n=n: n.put("/v1/spaces/kv/keys/again-" + n.name, 1)[0] == 200, 30, f"{n.name} writes")
    wait_for(lambda: vclocks_converged(nodes), 30, "converged after new writes")
    for n in nodes:
        n.stop()
    one_row_per_lsn(*(n.data_dir for n in nodes))


def test_backup_and_restore_refuse_what_they_cannot_do_with_a_clear_answer(tmp_path, procs):
    (tmp_path / "token").write_text("s3cret")
    n = ReplogProcess(tmp_path, "n", extra=["--token-file", str(tmp_path / "token")], token="s3cret")
    procs.append(n)
    n.start()
    n.create_space("kv")
    n.kv_put("kv", "k", 1)
    assert n.post("/v1/admin/backup", {"to": str(tmp_path / "b")}, token="")[0] == 401
    for relative in ("relative", "relative/dir", "./b"):    # (the node's working directory exists)
        s, d = n.post("/v1/admin/backup", {"to": relative})
        assert s == 400 and d["error"]["code"] == "bad_destination" and "absolute" in d["error"]["message"], d
    s, d = n.post("/v1/admin/backup", {"to": str(tmp_path / "no" / "such" / "dir")})
    assert s == 400 and d["error"]["code"] == "bad_destination", d
    s, d = n.post("/v1/admin/backup", {"to": n.data_dir})
    assert s == 409 and d["error"]["code"] == "destination_exists", d
    s, d = n.post("/v1/admin/backup", {"to": 5})
    assert s == 400 and d["error"]["code"] == "bad_body", d
    good = str(tmp_path / "b")
    assert n.post("/v1/admin/backup", {"to": good})[0] == 200
    assert not [f for f in os.listdir(tmp_path) if ".tmp-" in f], "no half-made backup left behind"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(REPLOG + list(args), capture_output=True, text=True, timeout=60)

    def one_line(r: subprocess.CompletedProcess, code: int, text: str) -> None:
        assert r.returncode == code and "Traceback" not in r.stderr, r
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("replog: error:") and text in lines[0], r.stderr

    one_line(cli("backup", str(tmp_path / "nothing"), "--to", str(tmp_path / "x")), 2, "not a directory")
    one_line(cli("restore", good, "--data-dir", n.data_dir), 2, "is not empty")
    one_line(cli("restore", str(tmp_path), "--data-dir", str(tmp_path / "r0")), 2, "not a replog backup")
    damaged = str(tmp_path / "damaged")
    subprocess.run(["cp", "-r", good, damaged], check=True)
    wal = os.path.join(damaged, "wal", sorted(os.listdir(os.path.join(damaged, "wal")))[-1])
    with open(wal, "r+b") as f:
        f.seek(os.path.getsize(wal) - 3)
        f.write(b"\xff")
    one_line(cli("restore", damaged, "--data-dir", str(tmp_path / "r1")), 2, "does not match the manifest")
    newer = str(tmp_path / "newer")
    subprocess.run(["cp", "-r", good, newer], check=True)
    man = json.load(open(os.path.join(newer, "MANIFEST.json")))
    man["store_format"] += 1
    json.dump(man, open(os.path.join(newer, "MANIFEST.json"), "w"))
    one_line(cli("restore", newer, "--data-dir", str(tmp_path / "r2")), 2, "newer than this replog reads")
    assert not os.path.exists(tmp_path / "r1") and not os.path.exists(tmp_path / "r2")
