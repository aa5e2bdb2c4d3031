"""A deterministic in-process replog cluster that runs the real replication core.

Every node (tests/sim/simnode.py) is a `NodeCore` plus an in-memory journal and state; the
state changes only through `node.core.apply.apply_txn`, the one definition the LMDB store
uses too. This module is the cluster around them: the network, the replication protocol
the shell speaks (applier, relay, JOIN), faults, and the tick loop. Nodes talk
over a simulated network; time is a tick counter; one seeded `random.Random` makes every
choice, so a seed replays the same run exactly.

Rules the harness keeps, each the same as the shell it stands in for:
- local write (server.write): `core.local_txn` for the replicated ops and for the local ops,
  submitted as one journal entry; anonymous nodes refuse replicated writes;
- journal (journal.py, fsync mode): entries are written to the WAL in submission order,
  become durable on sync, then are applied with apply_txn, then `core.commit`; `crash()`
  loses the queue and the written-but-unsynced WAL tail;
- restart (server._open_bootstrapped + wal.recovery): a fresh state from the node's base
  (its bootstrap `_cluster` entry, or its join snapshot) plus every durable WAL txn replayed
  through apply_txn, then `NodeCore(uuid, table.copy(), vclock)`;
- applier (applier.py): connect -> peer's GREETING (its whole core `_cluster`) ->
  `core.greeting` -> persist the registrations -> `core.subscribe_vclock` -> SUBSCRIBE;
  then `core.receive` for each relayed txn and submit its output as one entry with nothing
  in between (`applier_batches` switches to applier.py's batching of plain txns), or, for
  half the messages the row scanner takes, `core.receive_scan` and one entry of what it
  claimed (applier.py's `_receive_scan`); a
  RemoteProtocolError drops the link; every broken link `drop_peer`s and
  reconnects after a backoff with a fresh greeting;
- relay (relay.py): refuses an expelled subscriber, streams only durable WAL entries, in
  WAL order, filtered by `relay_wants` with the SUBSCRIBE vclock and the subscriber's own-rows
  cut (its own rows go back only up to what the relay held of them when it subscribed);
- JOIN (relay.handle_replication + store.install_snapshot): the donor registers the joiner,
  waits until that is durable, snapshots its state (`_cluster`, replicated spaces and
  data, vclock without component 0); the joiner's WAL starts empty; FETCH_SNAPSHOT is the
  same without registration and the anonymous node adds itself as STATE_ANON with the
  lowest free id; REGISTER: the master registers it, then the node re-states itself;
- network: one connection per applier/request; each direction is FIFO (a WebSocket);
  messages of different connections interleave in any order; a partition or a drop breaks
  the connection and loses what it carried.
"""
from __future__ import annotations

import heapq
import random
import uuid as uuidlib
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import msgpack

from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core import codec, rowscan
from node.core import messages as m
from node.core.replicaset import cluster_op, relay_wants
from node.core.entry import PackedEntry
from node.core.rows import (GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_DELETE, OP_PUT, OP_SPACE, Op,
                            Txn, txn_from_wire)
from node.errors import RemoteProtocolError
from tests.sim.checkers import Checker
from tests.sim.simnode import TICK_US, Applier, Base, SimNode

KV = "kv"                      # the replicated space (last-writer-wins)
LOC = "loc"                    # a local space: its rows never leave the node
SKEW_US_MAX = 5 * TICK_US      # node clocks disagree by up to this much
TRACE_LINES_MAX = 60           # lines of recent trace printed with a failure


class SimFailure(AssertionError):
    """An invariant or liveness check failed; the message names the seed and the repro."""


def _roundtrip(obj: Any) -> Any:
    """What crosses a wire or the WAL: msgpack in, msgpack out (tuples become lists)."""
    return msgpack.unpackb(msgpack.packb(obj, use_bin_type=True), raw=False, strict_map_key=False)


# --- network ------------------------------------------------------------------------
CLIENT, SERVER = "client", "server"


@dataclass(eq=False)
class Conn:
    id: int
    kind: str                 # "sub" | "join" | "fetch" | "register"
    client: str               # the subscriber / joiner
    server: str               # the upstream / donor
    open: bool = True
    streaming: bool = False   # relay side: SUBSCRIBE received
    cursor: int = 0           # relay side: next WAL entry to read
    sub_vclock: dict[int, int] = field(default_factory=dict)
    own: tuple[int, int] | None = None       # relay side: the subscriber's own rows cut (relay_wants)
    wait_durable: int | None = None   # JOIN/REGISTER: donor entries that must be durable first
    expel_epoch: int = 0      # client side: core.expel_epoch when it subscribed


class Cluster:
    def __init__(self, seed: int, *, repro: str = "", verbose: bool = False):
        self.seed = seed
        self.repro = repro
        self.verbose = verbose
        self.rng = random.Random(seed)
        self.now = 0
        self.nodes: dict[str, SimNode] = {}
        self.by_uuid: dict[str, SimNode] = {}
        self.conns: dict[int, Conn] = {}
        self._conn_ids = 0
        self._heap: list[tuple[int, int, int, str, str, Any]] = []
        self._seq = 0
        self._link_last: dict[tuple[int, str], int] = {}
        self.blocked: set[frozenset] = set()
        self.expelled: list[str] = []          # uuids the operator expelled
        self.expelled_at: dict[str, int] = {}  # uuid -> tick of its (first) expel
        self.mesh = True                       # joiners subscribe to every member and vice versa
        # fault knobs (the workload turns them up; scripted scenarios keep them calm)
        self.delay_max = 2                     # ticks a message may take
        self.drop_p = 0.0                      # chance per tick that an open link breaks
        self.write_p = 0.8                     # chance per tick that a journal writes
        self.sync_p = 0.8                      # chance per tick that written entries are synced
        self.relay_batch_max = 3               # WAL entries a relay reads per tick (0: all there are)
        self.slow: dict[tuple[str, str], int] = {}   # (client, server) -> extra ticks on that link
        # (client, server) links whose next ROWS message gets a malformed txn appended
        self.garble_next_rows: set[tuple[str, str]] = set()
        # False: each `receive` output is one entry, as the core's contract says. True: do what
        # node/applier/applier.py does since 2fbaf3f (consecutive plain txns of one ROWS message
        # share one entry, submitted after the message), its bug included.
        self.applier_batches = True     # as applier.py; False: one entry per receive() output
        # chance that a ROWS message goes as applier.py sends a scannable one: through the row
        # scanner (node.core.rowscan) and `receive_scan`; the rest take `receive` txn by txn
        self.scan_rows_p = 0.5
        # Checker 9 (HLC) skips records a joiner got in its snapshot while this is set: the
        # known shell bug (the HLC is not seeded from a snapshot), see test_scenarios.py.
        self.hlc_skips_snapshot_records = False  # the shell bug it covered is fixed
        self.stats: Counter = Counter()
        self.trace: deque[str] = deque(maxlen=TRACE_LINES_MAX)
        self.checker = Checker(self)

    # --- reporting ------------------------------------------------------------------------
    def log(self, msg: str) -> None:
        line = f"[t{self.now}] {msg}"
        self.trace.append(line)
        if self.verbose:
            print(line)

    def fail(self, what: str) -> SimFailure:
        trace = "\n".join(self.trace)
        return SimFailure(f"seed {self.seed}: {what}\nrepro: {self.repro or f'seed {self.seed}'}\n"
                          f"--- last trace lines ---\n{trace}")

    # --- nodes ------------------------------------------------------------------------------
    def add_node(self, name: str, *, anon: bool = False) -> SimNode:
        u = str(uuidlib.UUID(int=self.rng.getrandbits(128), version=4))
        n = SimNode(self, name, u, self.rng.randint(-SKEW_US_MAX, SKEW_US_MAX), anon)
        self.nodes[name] = n
        self.by_uuid[u] = n
        return n

    def node(self, name_or_node: "str | SimNode") -> SimNode:
        return name_or_node if isinstance(name_or_node, SimNode) else self.nodes[name_or_node]

    def members(self) -> list[SimNode]:
        """Bootstrapped, non-anonymous, not expelled (the operator's view)."""
        return [n for n in self.nodes.values()
                if n.base is not None and not n.anon and n.uuid not in self.expelled]

    def bootstrap(self, name: str) -> SimNode:
        n = self.node(name)
        n.install(Base([[n.uuid, 1, n.addr, STATE_MEMBER, 0]], {}, {}, {}))
        me = n.core.table.get(n.uuid)
        n.submit([n.core.local_txn([cluster_op(me)], GROUP_CLUSTER, n.wall_us())])
        n.submit([n.core.local_txn([Op(OP_SPACE, KV, "", {"local": False, "conflict": "lww"})],
                                   GROUP_DEFAULT, n.wall_us())])
        self.log(f"{n} bootstraps the cluster")
        self.checker.on_install(n)
        return n

    def join(self, name: str, via: str | None = None) -> None:
        self._start_proc(name, "join", via)

    def fetch_anon(self, name: str, via: str | None = None) -> None:
        assert self.node(name).anon
        self._start_proc(name, "fetch", via)

    def register_anon(self, name: str, via: str | None = None) -> None:
        n = self.node(name)
        assert n.anon and n.base is not None
        self._start_proc(name, "register", via)

    def _start_proc(self, name: str, proc: str, via: str | None) -> None:
        n = self.node(name)
        n.proc, n.proc_via, n.proc_retry_at = proc, via, self.now
        self.log(f"{n} starts {proc}" + (f" via {via}" if via else ""))

    def crash(self, name: str) -> None:
        n = self.node(name)
        if not n.up:
            return
        lost = len(n.queue) + len(n.wal) - n.durable
        self.log(f"{n} crashes, losing {lost} unsynced entries")
        self.stats["crashes"] += 1
        self.stats["lost_entries"] += lost
        n.up = False
        for c in list(self.conns.values()):
            if c.client == n.name or c.server == n.name:
                self.break_conn(c, f"{n.name} crashed")
        n.queue.clear()
        del n.wal[n.durable:]
        n.state, n.core = None, None

    def restart(self, name: str) -> None:
        n = self.node(name)
        if n.up:
            return
        n.up = True
        if n.base is not None:
            n.recover()
            self.checker.on_restart(n)
        for a in n.appliers.values():
            a.retry_at = self.now
        n.proc_retry_at = self.now
        self.log(f"{n} restarts at vclock {n.core.vclock if n.core else '-'}")

    def expel(self, name: str, via: str) -> None:
        x, m = self.node(name), self.node(via)
        assert m.ready and not m.core.anon
        _, txn = m.core.register_member(x.uuid, x.addr, m.wall_us(), state=STATE_EXPELLED)
        if txn is not None:
            m.submit([txn])
        if x.uuid not in self.expelled:
            self.expelled.append(x.uuid)
            self.expelled_at[x.uuid] = self.now
        self.log(f"{m} expels {x}")
        for c in list(self.conns.values()):   # server.expel closes its relays to the member
            if c.server == m.name and c.client == x.name:
                self.break_conn(c, "expelled")

    # --- writes --------------------------------------------------------------------------------
    def value(self, n: SimNode) -> dict:
        self.stats["values"] += 1
        return {"by": n.uuid, "n": self.stats["values"]}

    def txn(self, name: str, ops: list[tuple]) -> list[Txn] | None:
        """A client transaction, as server.write splits it: ops are (kind, space, key[, value])
        with kind "put" | "delete"; a put without value writes a fresh value that names its
        writer. Returns the txns submitted, or None if refused (node down or anonymous)."""
        n = self.node(name)
        if not n.ready or n.proc:
            return None
        repl, local = [], []
        for o in ops:
            kind, space, key = o[0], o[1], o[2]
            if kind == "put":
                op = Op(OP_PUT, space, key, o[3] if len(o) > 3 else self.value(n))
            else:
                op = Op(OP_DELETE, space, key)
            if space == LOC:
                if n.state.space(LOC) is None and not local:
                    local.append(Op(OP_SPACE, LOC, "", {"local": True, "conflict": "lww"}))
                local.append(op)
            else:
                if n.state.space(space) is None:
                    return None          # the space has not reached this node yet: 404
                repl.append(op)
        if repl and n.core.anon:
            self.stats["refused_anon_writes"] += 1
            return None
        txns = []
        if repl:
            txns.append(n.core.local_txn(repl, GROUP_DEFAULT, n.wall_us()))
        if local:
            txns.append(n.core.local_txn(local, GROUP_LOCAL, n.wall_us()))
        self.checker.on_local_txns(n, txns)
        n.submit(txns)
        self.stats["writes"] += 1
        self.log(f"{n} writes " + "; ".join(f"{t.replica_id}:{t.lsn} " + ",".join(
            f"{'put' if o.kind == OP_PUT else 'del' if o.kind == OP_DELETE else 'space'} {o.space}/{o.key}"
            for o in t.ops) for t in txns))
        return txns

    def put(self, name: str, key: str, value: Any = None, space: str = KV) -> list[Txn] | None:
        return self.txn(name, [("put", space, key) + (() if value is None else (value,))])

    # --- network ------------------------------------------------------------------------------
    def cut(self, a: str, b: str) -> None:
        self.partition([a], [b])

    def partition(self, *groups: list[str]) -> None:
        for i, g in enumerate(groups):
            for h in groups[i + 1:]:
                for a in g:
                    for b in h:
                        self.blocked.add(frozenset((a, b)))
        for c in list(self.conns.values()):
            if not self.reachable(c.client, c.server):
                self.break_conn(c, "partitioned")
        self.log(f"partition {' | '.join(','.join(g) for g in groups)}")

    def heal(self) -> None:
        self.blocked.clear()
        self.log("network healed")

    def reachable(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self.blocked

    def _open(self, kind: str, client: SimNode, server: SimNode) -> Conn:
        self._conn_ids += 1
        c = Conn(self._conn_ids, kind, client.name, server.name)
        self.conns[c.id] = c
        return c

    def send(self, c: Conn, to: str, kind: str, body: Any) -> None:
        if not c.open:
            return
        at = self.now + self.rng.randint(0, self.delay_max) + self.slow.get((c.client, c.server), 0)
        at = max(at, self._link_last.get((c.id, to), 0))
        self._link_last[(c.id, to)] = at
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, c.id, to, kind, _roundtrip(body)))

    def break_conn(self, c: Conn, why: str, backoff: int | None = None) -> None:
        if not c.open:
            return
        c.open = False
        self.conns.pop(c.id, None)
        self._link_last.pop((c.id, CLIENT), None)
        self._link_last.pop((c.id, SERVER), None)
        s, p = self.nodes[c.client], self.nodes[c.server]
        delay = backoff if backoff is not None else self.rng.randint(1, 4)
        self.stats["link_breaks"] += 1
        if c.kind == "sub":
            a = s.appliers.get(p.name)
            if a is not None and a.conn is c:
                a.conn, a.retry_at = None, self.now + delay
            if s.ready:
                s.core.drop_peer(p.uuid)
        elif s.proc_conn is c:
            s.proc_conn, s.proc_retry_at = None, self.now + delay
        self.log(f"link {s.name}<-{p.name} ({c.kind}) breaks: {why}")

    def in_flight(self) -> int:
        return sum(1 for m in self._heap if m[2] in self.conns)

    # --- message handlers --------------------------------------------------------------------
    def _deliver(self, c: Conn, to: str, kind: str, body: Any) -> None:
        s, p = self.nodes[c.client], self.nodes[c.server]
        if to == SERVER:
            self._on_server(c, s, p, kind, body)
        else:
            self._on_client(c, s, p, kind, body)

    def _refuse(self, c: Conn, why: str, backoff: int) -> None:
        s = self.nodes[c.client]
        if c.kind == "sub":
            s.appliers[c.server].refused = why
        self.stats[f"refused_{why}"] += 1
        self.break_conn(c, f"refused: {why}", backoff)

    def _on_server(self, c: Conn, s: SimNode, p: SimNode, kind: str, body: Any) -> None:
        core = p.core
        if kind == "HELLO":
            if core is None:
                return self._refuse(c, "not_ready", 2)
            me = core.table.get(s.uuid)
            if me is not None and me.state == STATE_EXPELLED:
                return self._refuse(c, "expelled", 20)
            if c.kind == "sub":
                self.send(c, CLIENT, "GREETING", core.table.rows())
            elif c.kind in ("join", "register"):
                if core.anon:
                    return self._refuse(c, "anon", 5)
                _, txn = core.register_member(s.uuid, s.addr, p.wall_us())
                if txn is not None:
                    p.submit([txn])
                    self.log(f"{p} registers {s} as id {txn.ops[0].value['id']} (lsn {txn.lsn})")
                # the relay awaits the registration's durability, or nothing if it had none
                c.wait_durable = p.submitted if txn is not None else 0
            else:
                c.wait_durable = 0
        elif kind == "SUBSCRIBE":
            c.streaming, c.cursor, c.sub_vclock = True, 0, {int(k): v for k, v in body.items()}
            me = core.table.get(s.uuid)      # as relay.py: its own rows past this cut are not echoed
            c.own = (me.id, core.vclock.get(me.id)) if me is not None and me.state != STATE_ANON else None
        else:
            raise AssertionError(kind)

    def _on_client(self, c: Conn, s: SimNode, p: SimNode, kind: str, body: Any) -> None:
        if kind == "GREETING":
            regs = s.core.greeting(p.uuid, body, s.wall_us())
            for t in regs:
                s.submit([t])
                self.log(f"{s} registers from {p}'s greeting: " + ", ".join(
                    f"{o.key[:8]}={o.value['id']}" for o in t.ops))
            s.appliers[p.name].refused = ""
            c.expel_epoch = s.core.expel_epoch
            self.send(c, SERVER, "SUBSCRIBE", s.core.subscribe_vclock(p.uuid).to_dict())
        elif kind == "ROWS":
            entry: list[Txn] = []       # only with applier_batches: plain txns waiting to share a frame
            if (s.name, p.name) in self.garble_next_rows:
                self.garble_next_rows.discard((s.name, p.name))
                body = list(body) + [[["not", "a", "txn"]]]
            if self.scan_rows_p and self.rng.random() < self.scan_rows_p and self._receive_scanned(c, s, p, body):
                return
            for frame in body:
                for w in frame:
                    try:
                        txn = txn_from_wire(w)
                        out = s.core.receive(p.uuid, txn, s.wall_us())
                    except RemoteProtocolError as e:
                        self.stats["remote_protocol_errors"] += 1
                        self.stats["rpe: " + str(e).split(": ", 1)[-1].split(" is ")[-1][:60]] += 1
                        self.log(f"{s} <- {p}: {e}" + (f"; {len(entry)} claimed txns queued first" if entry else ""))
                        if entry:                # as applier.py: claimed rows always reach the WAL
                            s.submit(entry)
                        return self.break_conn(c, "remote protocol error")
                    if not out:
                        continue
                    if self.applier_batches and len(out) == 1 and txn.group != GROUP_CLUSTER:
                        entry.append(out[0])
                        continue
                    if entry:
                        s.submit(entry)
                        entry = []
                    s.submit(out)
            if entry:
                s.submit(entry)
            if s.core.expel_epoch != c.expel_epoch:     # as applier.py's Resubscribe
                self.stats["resubscribes"] += 1
                self.break_conn(c, "expelled member's bound grew: resubscribe", 0)
        elif kind == "SNAPSHOT":
            self.break_conn(c, "snapshot received (BYE)", 0)
            base = Base(body["table"], {int(k): v for k, v in body["vclock"].items()},
                        {k: tuple(v) for k, v in body["spaces"].items()}, body["data"])
            if c.kind == "join":
                if not any(r[0] == s.uuid for r in base.table_rows):
                    self.stats["join_unregistered_snapshot"] += 1
                    self.log(f"{s}: {p}'s snapshot does not register it; retrying")
                    return
                s.install(base)
            else:
                tbl = ClusterTable(Member.from_row(r) for r in base.table_rows)
                base.table_rows.append([s.uuid, tbl.lowest_free_id(), s.addr, STATE_ANON, 0])
                s.install(base)
            s.proc = ""
            s.donor_uuid, s.installed_at = p.uuid, self.now
            self.stats["joins" if c.kind == "join" else "anon_fetches"] += 1
            self.log(f"{s} {'joined' if c.kind == 'join' else 'fetched a snapshot'} via {p}: "
                     f"id {s.core.self_id}, vclock {s.core.vclock}")
            self.checker.on_install(s)
            self._on_member(s)
        elif kind == "REGISTERED":
            self.break_conn(c, "registered (BYE)", 0)
            _, txn = s.core.register_member(s.uuid, s.addr, s.wall_us())
            if txn is not None:
                s.submit([txn])
            s.anon, s.proc = False, ""
            self.stats["anon_registrations"] += 1
            self.log(f"{s} registered via {p}; its own id stays {s.core.self_id}")
            self._on_member(s)
        else:
            raise AssertionError(kind)

    def _receive_scanned(self, c: Conn, s: SimNode, p: SimNode, body: Any) -> bool:
        """As applier.py's `_receive_scan`: the message as it goes on the wire; if the row
        scanner takes it, the core claims whole runs (`receive_scan`) and what it took is one
        entry. False when the scanner refuses the message (the exact path then runs)."""
        data = m.encode_rows([codec.pack([0, frame]) for frame in body])
        scan = rowscan.scan_rows(data) if rowscan.native is not None else rowscan.scan_rows_py(data)
        if scan is None:
            return False
        self.stats["rows messages scanned"] += 1
        ranges: list[tuple[int, int, int]] = []
        try:
            if s.core.receive_scan(p.uuid, scan, ranges, s.wall_us()) is None:
                return False            # a row the core refuses exactly: the exact path runs
        except RemoteProtocolError as e:
            self.stats["remote_protocol_errors"] += 1
            self.stats["rpe: " + str(e).split(": ", 1)[-1].split(" is ")[-1][:60]] += 1
            self.log(f"{s} <- {p}: {e} (scanned)" + (f"; {len(ranges)} claimed ranges queued first" if ranges else ""))
            if ranges:                  # as applier.py: claimed rows always reach the WAL
                s.submit(PackedEntry(scan, ranges).txns)
            self.break_conn(c, "remote protocol error")
            return True
        if ranges:
            s.submit(PackedEntry(scan, ranges).txns)
        if s.core.expel_epoch != c.expel_epoch:     # as applier.py's Resubscribe
            self.stats["resubscribes"] += 1
            self.break_conn(c, "expelled member's bound grew: resubscribe", 0)
        return True

    def _on_member(self, n: SimNode) -> None:
        """The operator lists a new node in everyone's peers (full mesh; anonymous replicas
        only subscribe)."""
        if not self.mesh:
            return
        members = [m.name for m in self.members() if m is not n]
        n.peers = list(members)
        if n.anon:
            return
        for m in self.nodes.values():
            if m is not n and m.base is not None and m.uuid not in self.expelled and n.name not in m.peers:
                m.peers.append(n.name)

    # --- the tick -----------------------------------------------------------------------------
    def tick(self) -> None:
        try:
            self._tick()
        except SimFailure:
            raise
        except Exception as e:  # a core assertion or error: re-raised with the seed and the trace
            raise self.fail(f"{type(e).__name__} inside the simulated cluster: {e}") from e

    def _tick(self) -> None:
        self.now += 1
        while self._heap and self._heap[0][0] <= self.now:
            _, _, cid, to, kind, body = heapq.heappop(self._heap)
            c = self.conns.get(cid)
            if c is not None:
                self._deliver(c, to, kind, body)
        self._serve_snapshots()
        self._pump_relays()
        self._connect()
        self._journals()
        if self.drop_p:
            for c in list(self.conns.values()):
                if self.rng.random() < self.drop_p:
                    self.break_conn(c, "dropped")
        self.checker.check()

    def _serve_snapshots(self) -> None:
        for c in list(self.conns.values()):
            if c.wait_durable is None:
                continue
            p, s = self.nodes[c.server], self.nodes[c.client]
            if p.durable < c.wait_durable:
                continue
            c.wait_durable = None
            if c.kind == "register":
                self.send(c, CLIENT, "REGISTERED", p.core.table.id_of(s.uuid))
            else:
                b = p.snapshot()
                self.send(c, CLIENT, "SNAPSHOT", {"table": b.table_rows, "vclock": b.vclock,
                                                  "spaces": b.spaces, "data": b.data})

    def _pump_relays(self) -> None:
        for c in list(self.conns.values()):
            if not c.streaming:
                continue
            p = self.nodes[c.server]
            if c.cursor >= p.durable:
                continue
            end = p.durable if not self.relay_batch_max else \
                min(p.durable, c.cursor + self.rng.randint(1, self.relay_batch_max))
            frames = []
            for entry in p.wal[c.cursor:end]:
                keep = [w for w in (t.to_wire() for t in entry) if relay_wants(w, c.sub_vclock, c.own)]
                if keep:
                    frames.append(keep)
            c.cursor = end
            if frames:
                self.send(c, CLIENT, "ROWS", frames)

    def _connect(self) -> None:
        for s in self.nodes.values():
            if not s.up:
                continue
            if s.proc and s.proc_conn is None and self.now >= s.proc_retry_at:
                self._start_request(s)
            if not s.ready or s.proc:
                continue
            for name in list(s.appliers):
                if name not in s.peers:
                    a = s.appliers.pop(name)
                    if a.conn is not None:
                        self.break_conn(a.conn, "removed from peers")
            for name in s.peers:
                a = s.appliers.setdefault(name, Applier())
                if a.conn is not None or self.now < a.retry_at:
                    continue
                p = self.nodes[name]
                if not p.up or not self.reachable(s.name, p.name):
                    a.retry_at = self.now + self.rng.randint(1, 4)
                    continue
                a.conn = self._open("sub", s, p)
                self.send(a.conn, SERVER, "HELLO", s.uuid)

    def _start_request(self, s: SimNode) -> None:
        if s.proc_via is not None:
            donors = [self.nodes[s.proc_via]]
        else:
            donors = [m for m in self.members() if m is not s and m.ready]
        donors = [d for d in donors if d.up and self.reachable(s.name, d.name)]
        if not donors:
            s.proc_retry_at = self.now + self.rng.randint(1, 4)
            return
        d = self.rng.choice(donors)
        s.proc_conn = self._open(s.proc, s, d)
        self.send(s.proc_conn, SERVER, "HELLO", s.uuid)

    def _journals(self) -> None:
        for n in self.nodes.values():
            if not n.ready:
                continue
            if n.queue and self.rng.random() < self.write_p:
                n.write_some(self.rng.randint(1, len(n.queue)))
            if len(n.wal) > n.durable and self.rng.random() < self.sync_p:
                n.sync()

    # --- running ---------------------------------------------------------------------------------
    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.tick()

    def run_until(self, cond: Callable[[], bool], max_ticks: int = 500, what: str = "condition") -> None:
        for _ in range(max_ticks):
            if cond():
                return
            self.tick()
        if not cond():
            raise self.fail(f"{what} not reached within {max_ticks} ticks\n{self.describe()}")

    def quiet(self) -> bool:
        """Nothing in flight, nothing to persist, every link streaming and caught up."""
        if self.in_flight():
            return False
        for n in self.nodes.values():
            if not n.up or n.proc or n.queue or len(n.wal) != n.durable:
                return False
            if n.core is None:
                continue
            for name in n.peers:
                a = n.appliers.get(name)
                p = self.nodes[name]
                if a is None or a.conn is None or not a.conn.streaming:
                    me = p.core.table.get(n.uuid) if p.core else None
                    if a is not None and a.refused == "expelled" and me is not None and me.state == STATE_EXPELLED:
                        continue
                    return False
                if a.conn.cursor < p.durable:
                    return False
        return True

    def run_until_quiet(self, max_ticks: int = 2000) -> None:
        self.run_until(self.quiet, max_ticks, "quiet (every link caught up, nothing in flight)")

    def settle(self, max_ticks: int = 2000) -> None:
        """Liveness: heal everything, restart everyone, calm the network, run until quiet."""
        self.heal()
        self.drop_p = 0.0
        for n in list(self.nodes.values()):
            self.restart(n.name)
        self.run_until_quiet(max_ticks)

    def describe(self) -> str:
        lines = []
        for n in self.nodes.values():
            if n.core is None:
                lines.append(f"  {n}: up={n.up} proc={n.proc or '-'} (no core)")
                continue
            links = []
            for name in n.peers:
                a = n.appliers.get(name)
                st = "none" if a is None or a.conn is None else ("streaming" if a.conn.streaming else "handshake")
                links.append(f"{name}:{st}{'/' + a.refused if a and a.refused else ''}")
            lines.append(f"  {n}: up={n.up} proc={n.proc or '-'} id={n.core.self_id} vclock={n.core.vclock} "
                         f"claimed={n.core.claimed} queue={len(n.queue)} wal={len(n.wal)}/{n.durable} "
                         f"table={ {m.uuid[:8]: m.id for m in n.core.table.members()} } links[{', '.join(links)}]")
        return "\n".join(lines)
