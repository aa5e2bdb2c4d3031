"""One simulated node: its state (the StateView of node.core.apply over dicts), its
journal (queue -> WAL -> durable) and its lifecycle (bootstrap/snapshot base, recovery).

Rules kept here, as in journal.py, storage/store.py and server._open_bootstrapped:
- entries are written in submission order; sync makes the written tail durable, then
  applies it with apply_txn, then advances the core's durable vclock;
- a restart rebuilds state from the base plus the durable WAL only, and builds a new
  NodeCore from that state (its knowledge from the state's, its HLC from the WAL);
- a snapshot holds the replicated spaces and data, `_cluster`, and the vclock without 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from node.cluster_space.table import ClusterTable, Member
from node.core.apply import apply_txn
from node.core.replicaset import NodeCore
from node.core.rows import Txn
from node.core.vclock import VClock

if TYPE_CHECKING:
    from tests.sim.harness import Cluster, Conn

WALL_BASE_US = 1_000_000_000   # wall clock at tick 0
TICK_US = 1000                 # one tick of wall time


# --- state --------------------------------------------------------------------------
@dataclass
class Base:
    """What a node's state starts from before its own WAL: bootstrap or a snapshot."""
    table_rows: list[list]
    vclock: dict[int, int]
    spaces: dict[str, tuple[bool, str]]
    data: dict[str, dict[str, list]]


class SimState:
    """The StateView of node.core.apply over dicts (the LMDB store's in-memory twin)."""

    def __init__(self, base: Base):
        self.table = ClusterTable(Member.from_row(r) for r in base.table_rows)
        self.vclock = VClock(base.vclock)
        self.spaces: dict[str, tuple[bool, str]] = dict(base.spaces)
        self.data: dict[str, dict[str, list]] = {s: {k: list(r) for k, r in d.items()} for s, d in base.data.items()}
        self.knowledge: dict[tuple[str, str], int] = {}

    def space(self, name: str) -> tuple[bool, str] | None:
        return self.spaces.get(name)

    def create_space(self, name: str, local: bool, conflict: str) -> None:
        self.spaces[name] = (local, conflict)
        self.data.setdefault(name, {})

    def get(self, space: str, key: str) -> list | None:
        r = self.data[space].get(key)
        return None if r is None else list(r)

    def put(self, space: str, key: str, record: list) -> None:
        self.data[space][key] = list(record)

    def delete(self, space: str, key: str) -> None:
        self.data[space].pop(key, None)

    def put_member(self, m: Member) -> None:
        pass    # apply_txn has already upserted the member into self.table

    def put_knowledge(self, origin_uuid: str, member_uuid: str, their_id: int) -> None:
        self.knowledge[(origin_uuid, member_uuid)] = their_id


# --- nodes ---------------------------------------------------------------------------
@dataclass
class Applier:
    conn: "Conn | None" = None
    retry_at: int = 0
    refused: str = ""          # the last refusal reason ("" while none)


class SimNode:
    def __init__(self, cluster: "Cluster", name: str, uuid: str, skew_us: int, anon: bool):
        self.cluster = cluster
        self.name = name
        self.uuid = uuid
        self.addr = f"{name.lower()}.sim:7301"
        self.skew_us = skew_us
        self.anon = anon                      # configured anonymous (until it registers)
        self.up = True
        self.base: Base | None = None         # None: fresh, never bootstrapped or joined
        self.wal: list[list[Txn]] = []        # entries (frames) in WAL order
        self.durable = 0                      # entries wal[:durable] survive a crash
        self.queue: list[list[Txn]] = []      # submitted, not yet written
        self.state: SimState | None = None
        self.core: NodeCore | None = None
        self.peers: list[str] = []            # names of the upstreams this node subscribes to
        self.appliers: dict[str, Applier] = {}
        self.proc: str = ""                   # "join" | "fetch" | "register" while one is wanted
        self.proc_via: str | None = None      # the donor the operator named, if any
        self.proc_conn: Conn | None = None
        self.proc_retry_at = 0

    def __repr__(self) -> str:
        return f"{self.name}({self.uuid[:8]})"

    @property
    def ready(self) -> bool:
        return self.up and self.core is not None

    @property
    def submitted(self) -> int:
        return len(self.wal) + len(self.queue)

    def wall_us(self) -> int:
        return WALL_BASE_US + self.cluster.now * TICK_US + self.skew_us

    # --- journal ----------------------------------------------------------------------
    def submit(self, entry: list[Txn]) -> None:
        assert self.ready and entry
        self.queue.append(entry)

    def write_some(self, n: int) -> None:
        self.wal.extend(self.queue[:n])
        del self.queue[:n]

    def sync(self) -> None:
        """fsync: the written tail becomes durable, then state, then the core's vclock."""
        new = self.wal[self.durable:]
        self.durable = len(self.wal)
        txns = [t for e in new for t in e]
        for t in txns:
            apply_txn(self.state, t, self.uuid)
        self.core.commit(txns)

    def flush(self) -> None:
        self.write_some(len(self.queue))
        self.sync()

    # --- lifecycle ----------------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild state and core from the base and the durable WAL, as a restart does."""
        assert self.base is not None
        self.state = SimState(self.base)
        # as Store.install_records: the HLC starts above every record of the snapshot
        hlc = max((r[3] for recs in self.base.data.values() for r in recs.values()), default=0)
        for entry in self.wal[:self.durable]:
            for t in entry:
                apply_txn(self.state, t, self.uuid)
                hlc = max(hlc, t.timestamp)
        self.core = NodeCore(self.uuid, self.state.table.copy(), self.state.vclock, hlc_last=hlc,
                             spaces={n: d[0] for n, d in self.state.spaces.items()})
        self.core.knowledge = dict(self.state.knowledge)

    def install(self, base: Base) -> None:
        assert self.base is None and not self.wal
        self.base = base
        self.recover()

    def snapshot(self) -> Base:
        """store.snapshot(): replicated spaces and data, `_cluster`, vclock without 0."""
        st = self.state
        spaces = {n: d for n, d in st.spaces.items() if not d[0]}
        return Base(st.table.rows(), {k: v for k, v in st.vclock.items() if k != 0}, spaces,
                    {n: {k: list(r) for k, r in st.data.get(n, {}).items()} for n in spaces})
