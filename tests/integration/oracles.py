"""Oracles for real-process membership tests (tests/integration/test_membership_*.py).

Built once and used by every test there, because they are the point of issue 16:
- no_fork(nodes): no (origin uuid, lsn) maps to two different contents across every node's WAL
  (`replog wal dump`) and every node's store (range reads: a record carries the origin and lsn
  of the row that wrote it). Rows of local spaces are left out: each node numbers them itself.
- acked_everywhere(nodes, acked): every write a node acknowledged (its PUT answered an lsn) is
  on every node with that value, origin and lsn, unless a later acknowledged write replaced it.
- restart_all(nodes): every node comes back after kill -9.
Plus small views of /v1/info the tests share."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.parse


from tests.integration.harness import REPLOG, ReplogProcess, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))



def _canon(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def wal_rows(node: ReplogProcess, data_dir: str | None = None) -> list[dict]:
    """`replog wal dump` of the node's data dir (or `data_dir`: a lease slot's): every row of
    its WAL, origin uuid resolved."""
    r = subprocess.run(REPLOG + ["wal", "dump", data_dir or node.data_dir], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
    assert r.returncode == 0, f"wal dump {node.name}: {r.stderr}"
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def replicated_spaces(node: ReplogProcess) -> list[str]:
    s, d = node.get("/v1/spaces")
    assert s == 200, (s, d)
    return [sp["name"] for sp in d["spaces"] if not sp["local"]]


def start_joiner(tmp, procs: list, name: str, via: ReplogProcess) -> ReplogProcess:
    """A new node `name` that joins through `via` (its one peer), appended to `procs`; returned
    once it has the cluster's space `kv`."""
    n = ReplogProcess(tmp, name, peers=[via])
    procs.append(n)
    n.start(wait=False)
    wait_for(lambda: "kv" in replicated_spaces(n), 60, f"{name} joined through {via.name}")
    return n


def lose_store_and_rejoin(node: ReplogProcess, via: ReplogProcess) -> None:
    """`node` is killed and loses its store and WAL (its identity files kept); `via` starts, and
    `node` starts again and rejoins through it (its `kv` space is back)."""
    node.kill9()
    shutil.rmtree(os.path.join(node.data_dir, "store"))
    shutil.rmtree(os.path.join(node.data_dir, "wal"))
    via.start()
    node.start(wait=False)
    wait_for(lambda: "kv" in replicated_spaces(node), 60, f"{node.name} rejoined through {via.name}")


def store_records(node: ReplogProcess, space: str) -> dict[str, dict]:
    """Every live key of `space` on `node`: key -> {"key", "value", "origin", "lsn"} (paged)."""
    out: dict[str, dict] = {}
    after = None
    while True:
        q = "?limit=10000" + (f"&after={urllib.parse.quote(after, safe='')}" if after is not None else "")
        s, page = node.get(f"/v1/spaces/{space}/keys{q}")
        assert s == 200, (node.name, space, s, page)
        for item in page["items"]:
            out[item["key"]] = item
        if not page.get("next"):
            return out
        after = page["next"]


def no_fork(nodes: list[ReplogProcess], data_dir_of=None) -> None:
    """No (origin uuid, lsn) maps to two different contents across every node's WAL (all rows
    but local-space ones) and every node's store (each replicated record carries the origin and
    lsn of the row that wrote it). `data_dir_of(node)`: where its WAL is, if not its data dir."""
    seen: dict[tuple[str, int], tuple[str, str]] = {}

    def note(origin: str, lsn: int, content: str, where: str) -> None:
        first = seen.setdefault((origin, lsn), (content, where))
        assert first[0] == content, (f"fork: ({origin}, {lsn}) is {first[0]} in {first[1]} "
                                     f"and {content} in {where}")

    for n in nodes:
        for row in wal_rows(n, data_dir_of(n) if data_dir_of else None):
            if row["group"] == "local" or row["origin"] is None:
                continue
            value = _canon(row["value"]) if row["op"] != "delete" else "-"
            note(row["origin"], row["lsn"], f"{row['op']} {row['space']}/{row['key']}={value}", f"{n.name}'s WAL")
        for space in replicated_spaces(n):
            for key, rec in store_records(n, space).items():
                note(rec["origin"], rec["lsn"], f"put {space}/{key}={_canon(rec['value'])}", f"{n.name}'s store")


class Acked:
    """Writes acknowledged by the cluster: (space, key) -> (value, origin uuid, lsn), as the
    PUT answered. A later acknowledged write to the same key supersedes the earlier one."""

    def __init__(self) -> None:
        self.writes: dict[tuple[str, str], tuple] = {}
        self._uuids: dict[str, str] = {}

    def put(self, node: ReplogProcess, space: str, key: str, value) -> dict:
        d = node.kv_put(space, key, value)
        self.record(node, space, key, value, d["lsn"])
        return d

    def record(self, node: ReplogProcess, space: str, key: str, value, lsn: int) -> None:
        """A write `node` acknowledged under `lsn` (its own origin's), however it was made."""
        self.writes[(space, key)] = (value, self.uuid_of(node), lsn)

    def uuid_of(self, node: ReplogProcess) -> str:
        """node's uuid, asked once (a node here keeps its uuid through every fault)."""
        if node.name not in self._uuids:
            self._uuids[node.name] = node.uuid()
        return self._uuids[node.name]


def missing_acked(nodes: list[ReplogProcess], acked: Acked) -> list[str]:
    missing = []
    spaces = {sp for sp, _ in acked.writes}
    for n in nodes:
        try:
            have = {sp: store_records(n, sp) for sp in spaces}
        except AssertionError as e:          # not serving reads (yet): everything is missing there
            missing.append(f"{n.name}: {e}")
            continue
        for (sp, key), (value, origin, lsn) in acked.writes.items():
            rec = have[sp].get(key)
            got = (rec["value"], rec["origin"], rec["lsn"]) if rec else None
            if got != (value, origin, lsn):
                missing.append(f"{n.name}: {sp}/{key} is {got}, acknowledged as {(value, origin, lsn)}")
    return missing


def acked_everywhere(nodes: list[ReplogProcess], acked: Acked, timeout: float = 30.0) -> None:
    """Every acknowledged write is readable, with its value, origin and lsn, on every node
    (waiting up to `timeout` for replication to deliver it)."""
    last: list[str] = []

    def check() -> bool:
        last[:] = missing_acked(nodes, acked)
        return not last
    try:
        wait_for(check, timeout, "every acknowledged write on every node")
    except AssertionError as e:
        raise AssertionError(f"{e}: {len(last)} missing, e.g. {last[:5]}") from None


def restart_all(nodes: list[ReplogProcess]) -> None:
    """kill -9 every node, start them all again: each comes back healthy and running."""
    for n in nodes:
        n.kill9()
    for n in nodes:
        n.start(wait=False)
    for n in nodes:
        n.wait_healthy(60)
        wait_for(lambda: n.info()["status"] == "running", 30, f"{n.name} running after kill -9")


# --- views ----------------------------------------------------------------------------------------

def downstreams_of(node: ReplogProcess, uuid: str) -> list[dict]:
    return [d for d in node.info()["downstreams"] if d["uuid"] == uuid]


def readable(node: ReplogProcess, key: str, space: str = "kv") -> bool:
    return node.kv_get(space, key)[0] == 200


def expel_bound(node: ReplogProcess, uuid: str) -> int | None:
    """The member's accepted bound if the node's `_cluster` says it is expelled, else None."""
    m = node.cluster().get(uuid) or {}
    return m.get("expelled_lsn") if m.get("state") == "expelled" else None


def upstream(node: ReplogProcess, address: str) -> dict:
    return next((u for u in node.info()["upstreams"] if u["address"] == address), {})


def log_since_last_start(node: ReplogProcess) -> str:
    return node.log_text().rsplit("===== start #", 1)[-1]
