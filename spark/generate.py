"""Synthetic WALs for the analysis: a small simulated cluster, written with replog's own WAL
writer and row encoding. Deterministic from the seed.

    python -m spark.generate OUT --nodes 8 --rows 1000000 --seed 1 [--segment-bytes N] [--corrupt]

What it exercises (each node's WAL holds the ids that node gave, so the analysis has to
translate them through that node's `_cluster` history):
- a bootstrap master and members that join it; later members join mid-run in PAIRS, through two
  different masters at the same moment, so both registrars give the same lowest-free id to two
  different uuids and every other node remaps one of them (the resolver,
  `resolve_cluster_replace`, decides exactly as a node does);
- an anonymous replica that fetched its snapshot before the masters registered everyone: its own
  local id is one the masters later give to somebody else;
- every node writes its own `_cluster` row for a member before any row of that member, in the
  same frame (a "greeting" registration when it meets an origin's rows first), and follows
  the remote `_cluster` rows it applies; joiners start from a snapshot (first header vclock > 0);
- rows of a local space (group LOCAL, vclock component 0) on every node, multi-row transactions,
  deletes, hot keys written from several masters under replication lag (vclock-concurrent writes);
- frames of several transactions, rotation across several segments, nodes that stall for a while;
- optional corruption (`--corrupt`): one node applies one replicated row with other content.
Rules: rows written count the rows origins write (client and local-space rows); at the end every
node has applied every replicated row (a healthy run has no divergence). `manifest.json` in OUT
records the ground truth: nodes, uuids, each node's final ids, the corruption."""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import uuid as uuidlib
from dataclasses import dataclass, field

from node.cluster_space.resolver import resolve_cluster_replace
from node.cluster_space.table import STATE_ANON, STATE_MEMBER, ClusterTable, Member
from node.core.rows import (CLUSTER_SPACE, GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_CLUSTER,
                            OP_DELETE, OP_PUT, OP_SPACE, Op, Txn)
from node.wal import format as fmt
from node.wal.writer import WalWriter

segment_bytes_default = 8 * 1024 * 1024   # rotates a 1M-row node into several segments
txns_per_frame_max = 64                   # one applier batch: a frame of up to this many txns
pull_txns_max = 6                         # txns a node applies from one origin per pull
hot_share = 0.05                          # share of writes that go to a few hot keys
local_share = 0.05                        # share of transactions written to the local space
stall_share = 0.03                        # each node once stops pulling for this share of the run
step_us_max = 400                         # simulated time between two client writes


@dataclass
class LogTxn:
    """One replicated transaction in its origin's log (ids are the origin's own)."""
    lsn: int
    last_lsn: int
    group: int
    timestamp: int
    ops: list                   # wire ops, shared by every node that applies it


@dataclass
class SimNode:
    name: str
    uuid: str
    data_dir: str
    table: ClusterTable
    vclock: dict[int, int]                          # local id -> lsn; 0 counts local rows
    wal: WalWriter
    cursor: dict[str, int] = field(default_factory=dict)   # origin uuid -> next index in its log
    pending: list = field(default_factory=list)     # txn wires of the frame being built
    unlogged: list = field(default_factory=list)    # own replicated txns in `pending`
    hlc: int = 0
    stall: tuple[float, float] = (2.0, 2.0)          # [from, to) as a share of rows written
    durable_vclock: dict[int, int] = field(default_factory=dict)
    durable_rows: list = field(default_factory=list)

    @property
    def own_id(self) -> int:
        return self.table.id_of(self.uuid)  # type: ignore[return-value]

    @property
    def anon(self) -> bool:
        return self.table.get(self.uuid).state == STATE_ANON  # type: ignore[union-attr]

    def now(self, wall_us: int) -> int:
        self.hlc = wall_us if wall_us > self.hlc else self.hlc + 1
        return self.hlc

    def mark_durable(self) -> None:
        self.durable_vclock = {k: v for k, v in self.vclock.items() if v}
        self.durable_rows = self.table.rows()

    def flush(self, wall_us: int, logs: dict[str, list[LogTxn]]) -> None:
        """Write the pending transactions as one frame; rotate first when the segment is full.
        Own transactions reach the origin's log (what relays read) only once written."""
        if not self.pending:
            return
        if self.wal.needs_rotation:
            self.wal.rotate(self.durable_vclock, self.durable_rows)
        for i in range(0, len(self.pending), txns_per_frame_max):
            self.wal.write_batch(fmt.encode_frame(self.pending[i:i + txns_per_frame_max], wall_us))
        self.pending = []
        if self.unlogged:
            logs[self.uuid].extend(self.unlogged)
            self.unlogged = []
        self.mark_durable()


class Cluster:
    def __init__(self, out: str, seed: int, rows: int, segment_bytes: int, corrupt: bool):
        self.out = out
        self.rng = random.Random(seed)
        self.rows_target = rows
        self.segment_bytes = segment_bytes
        self.corrupt = corrupt
        self.nodes: list[SimNode] = []
        self.by_uuid: dict[str, SimNode] = {}
        self.logs: dict[str, list[LogTxn]] = {}
        self.rows_written = 0
        self.now_us = 1_700_000_000_000_000
        self.hot_keys = max(4, rows // 2000)
        self.corruption: dict | None = None
        self._corrupt_victim: SimNode | None = None

    # --- members -------------------------------------------------------------------
    def _new_uuid(self) -> str:
        return str(uuidlib.UUID(int=self.rng.getrandbits(128), version=4))

    def _add_node(self, name: str, table: ClusterTable, node_uuid: str, vclock: dict[int, int],
                  cursor: dict[str, int]) -> SimNode:
        data_dir = os.path.join(self.out, f"node-{name}")
        wal = WalWriter(os.path.join(data_dir, "wal"), "write", node_uuid, segment_bytes_max=self.segment_bytes)
        n = SimNode(name, node_uuid, data_dir, table, dict(vclock), wal, dict(cursor))
        a = self.rng.uniform(0.05, 0.9)
        n.stall = (a, a + stall_share)
        n.mark_durable()
        self.nodes.append(n)
        self.by_uuid[node_uuid] = n
        if not n.anon:
            self.logs[node_uuid] = []
        # Every node keeps a local space of its own (a LOCAL row, component 0).
        self._write(n, GROUP_LOCAL, [Op(OP_SPACE, "stats", "", {"local": True, "conflict": "lww"})])
        n.flush(self.now_us, self.logs)
        return n

    def bootstrap(self, name: str) -> SimNode:
        u = self._new_uuid()
        table = ClusterTable([Member(u, 1, f"{name}:7301", STATE_MEMBER)])
        n = self._add_node(name, table, u, {}, {})
        self._write(n, GROUP_CLUSTER, [_cluster_op(table.get(u))])  # type: ignore[arg-type]
        self._write(n, GROUP_DEFAULT, [Op(OP_SPACE, s, "", {"local": False, "conflict": "lww"})
                                       for s in ("kv", "events")])
        n.flush(self.now_us, self.logs)
        return n

    def join(self, name: str, registrar: SimNode, anon: bool = False) -> SimNode:
        """JOIN (or FETCH_SNAPSHOT): the newcomer starts from the registrar's state."""
        u = self._new_uuid()
        registrar.flush(self.now_us, self.logs)
        if anon:
            # Not registered anywhere: the replica puts itself in its own _cluster only.
            table = registrar.table.copy()
            table.upsert(Member(u, table.lowest_free_id(), f"{name}:7301", STATE_ANON))
        else:
            rid = registrar.table.lowest_free_id()
            res = resolve_cluster_replace(registrar.table, u, rid, f"{name}:7301", STATE_MEMBER, from_self=True)
            registrar.table.upsert(res.member)
            self._write(registrar, GROUP_CLUSTER, [_cluster_op(res.member)])
            registrar.flush(self.now_us, self.logs)
            table = registrar.table.copy()
        cursor = dict(registrar.cursor)
        cursor[registrar.uuid] = len(self.logs[registrar.uuid])
        vclock = {k: v for k, v in registrar.vclock.items() if k != 0}
        return self._add_node(name, table, u, vclock, cursor)

    # --- writing -------------------------------------------------------------------
    def _write(self, n: SimNode, group: int, ops: list[Op]) -> None:
        component = 0 if group == GROUP_LOCAL else n.own_id
        lsn = n.vclock.get(component, 0) + 1
        txn = Txn(n.own_id, lsn, group, n.now(self.now_us), tuple(ops))
        n.vclock[component] = txn.last_lsn
        wire = txn.to_wire()
        n.pending.append(wire)
        if group != GROUP_LOCAL and not n.anon:
            n.unlogged.append(LogTxn(lsn, txn.last_lsn, group, txn.timestamp, wire[4]))

    def client_txn(self, n: SimNode) -> None:
        rng = self.rng
        local = n.anon or rng.random() < local_share
        r = rng.random()
        size = 1 if r < 0.6 else rng.randint(2, 10) if r < 0.9 else rng.randint(11, 40)
        if local:
            size = rng.randint(1, 3)
            ops = [Op(OP_PUT, "stats", f"s{rng.randrange(64)}", {"n": rng.getrandbits(20)}) for _ in range(size)]
            self._write(n, GROUP_LOCAL, ops)
        else:
            ops = []
            for _ in range(size):
                space = "kv" if rng.random() < 0.8 else "events"
                if rng.random() < hot_share:
                    key = f"hot{rng.randrange(self.hot_keys)}"
                else:
                    key = f"k{rng.randrange(self.rows_target * 2):08d}"
                if rng.random() < 0.1:
                    ops.append(Op(OP_DELETE, space, key))
                else:
                    ops.append(Op(OP_PUT, space, key, {"v": rng.getrandbits(32), "by": n.name}))
            self._write(n, GROUP_DEFAULT, ops)
            if (self.corrupt and self.corruption is None and self.rows_written >= self.rows_target // 2
                    and ops[0].kind == OP_PUT and n is self.nodes[0]):
                victim = self.nodes[1]
                self.corruption = {"node": victim.uuid, "node_name": victim.name, "origin": n.uuid,
                                   "lsn": n.vclock[n.own_id] - size + 1}
                self._corrupt_victim = victim
        self.rows_written += size

    # --- replication -----------------------------------------------------------------
    def _register(self, n: SimNode, member_uuid: str, their_id: int, address: str, state: str,
                  from_self: bool) -> Op | None:
        res = resolve_cluster_replace(n.table, member_uuid, their_id, address, state, from_self=from_self)
        if not res.changed:
            return None
        n.table.upsert(res.member)
        return _cluster_op(res.member)

    def _apply(self, n: SimNode, origin: SimNode, t: LogTxn) -> None:
        if origin.uuid not in n.table:
            # Met the origin before any _cluster row about it: register it first (greeting).
            op = self._register(n, origin.uuid, origin.own_id, f"{origin.name}:7301", STATE_MEMBER, False)
            assert op is not None
            self._write(n, GROUP_CLUSTER, [op])
        rid = n.table.id_of(origin.uuid)
        ops = t.ops
        c = self.corruption
        if c is not None and n is self._corrupt_victim and origin.uuid == c["origin"] and t.lsn == c["lsn"]:
            ops = [[ops[0][0], ops[0][1], ops[0][2], {"corrupted": True}]] + ops[1:]
        n.pending.append([rid, t.lsn, t.group, t.timestamp, ops])
        n.vclock[rid] = t.last_lsn
        if t.timestamp > n.hlc:
            n.hlc = t.timestamp
        if t.group == GROUP_CLUSTER:
            own = []
            for kind, _space, key, value in t.ops:
                if kind == OP_CLUSTER:
                    op = self._register(n, key, value["id"], value["address"], value["state"], key == origin.uuid)
                    if op is not None:
                        own.append(op)
            if own:
                self._write(n, GROUP_CLUSTER, own)

    def pull(self, n: SimNode, limit: int | None) -> bool:
        """Apply what n has not seen yet, up to `limit` txns per origin; True if any."""
        any_applied = False
        for origin_uuid, log in self.logs.items():
            if origin_uuid == n.uuid:
                continue
            i = n.cursor.get(origin_uuid, 0)
            stop = len(log) if limit is None else min(len(log), i + self.rng.randint(1, limit))
            if i >= stop:
                continue
            origin = self.by_uuid[origin_uuid]
            for t in log[i:stop]:
                self._apply(n, origin, t)
            n.cursor[origin_uuid] = stop
            any_applied = True
        n.flush(self.now_us, self.logs)
        return any_applied

    # --- the run -----------------------------------------------------------------------
    def run(self, n_nodes: int) -> None:
        assert n_nodes >= 2, "a cluster of at least two nodes"
        rng = self.rng
        a = self.bootstrap("a")
        self.join("b", a)
        if n_nodes >= 4:
            self.join("c", a)
        if n_nodes >= 3:
            self.join("anon", self.nodes[1], anon=True)
        joiners = n_nodes - len(self.nodes)
        # Joiners come in pairs, through two masters at once: the registrars clash on the id.
        waves: list[tuple[float, list[str]]] = []
        k = 1
        while joiners > 0:
            names = [f"j{k}", f"j{k + 1}"][: min(2, joiners)]
            waves.append((0.15 + 0.5 * len(waves) / max(1, (n_nodes - 4 + 1) // 2), names))
            k += len(names)
            joiners -= len(names)
        while self.rows_written < self.rows_target:
            self.now_us += rng.randint(1, step_us_max)
            done = self.rows_written / self.rows_target
            while waves and done >= waves[0][0]:
                _, names = waves.pop(0)
                masters = [m for m in self.nodes if not m.anon]
                regs = rng.sample(masters, len(names))
                for name, reg in zip(names, regs):
                    self.join(name, reg)
            writers = self.nodes
            w = writers[rng.randrange(len(writers))]
            self.client_txn(w)
            if rng.random() < 0.5:
                w.flush(self.now_us, self.logs)
            for n in self.nodes:
                if n.pending and rng.random() < 0.3:
                    n.flush(self.now_us, self.logs)
                if n.stall[0] <= done < n.stall[1] or rng.random() >= 0.5:
                    continue
                self.pull(n, pull_txns_max)
        # Liveness: everybody catches up, including with the _cluster rows catching up writes.
        for n in self.nodes:
            n.flush(self.now_us, self.logs)
        progress = True
        while progress:
            progress = False
            self.now_us += step_us_max
            for n in self.nodes:
                progress = self.pull(n, None) or progress
        for n in self.nodes:
            n.flush(self.now_us, self.logs)
            n.wal.close()

    def manifest(self, seed: int) -> dict:
        return {
            "seed": seed,
            "rows_written": self.rows_written,
            "nodes": [
                {"name": n.name, "uuid": n.uuid, "dir": os.path.relpath(n.data_dir, self.out),
                 "anon": n.anon, "own_id": n.own_id,
                 "ids": {m.uuid: m.id for m in n.table.members()},
                 "vclock": {n.table.uuid_of(k) if k else "local": v for k, v in sorted(n.vclock.items()) if v}}
                for n in self.nodes
            ],
            "origins": sorted(self.logs),
            "corruption": self.corruption,
        }


def _cluster_op(m: Member) -> Op:
    return Op(OP_CLUSTER, CLUSTER_SPACE, m.uuid, {"id": m.id, "address": m.address, "state": m.state})


def generate(out: str, *, nodes: int = 8, rows: int = 1_000_000, seed: int = 1,
             segment_bytes: int = segment_bytes_default, corrupt: bool = False) -> dict:
    """Write `nodes` node directories under `out` (node-NAME/wal/*.wal) and manifest.json."""
    os.makedirs(out, exist_ok=True)
    if any(name.startswith("node-") for name in os.listdir(out)):
        raise FileExistsError(f"{out} already holds node directories")
    c = Cluster(out, seed, rows, segment_bytes, corrupt)
    c.run(nodes)
    m = c.manifest(seed)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(m, f, indent=1, sort_keys=True)
    return m


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spark.generate", description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--segment-bytes", type=int, default=segment_bytes_default)
    p.add_argument("--corrupt", action="store_true", help="one node applies one row with other content")
    args = p.parse_args(argv)
    if args.nodes < 2 or args.rows < 1:
        p.error("--nodes must be at least 2 and --rows at least 1")
    try:
        m = generate(args.out, nodes=args.nodes, rows=args.rows, seed=args.seed,
                     segment_bytes=args.segment_bytes, corrupt=args.corrupt)
    except FileExistsError as e:
        print(f"generate: {e}", file=sys.stderr)
        return 2
    print(f"generate: {len(m['nodes'])} nodes, {m['rows_written']} rows written under {args.out}"
          + (f"; corrupted {m['corruption']}" if m["corruption"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
