"""A deterministic in-process replog cluster that runs the real replication core.

Every node (tests/sim/simnode.py) is a `NodeCore` plus an in-memory journal, state and store
meta; the state changes only through `node.core.apply.apply_txn`, the one definition the LMDB
store uses too. This module is the cluster around them: nodes, faults, the network and the
tick loop. The links run the production machines (node/core/link/: ApplierMachine,
RelayMachine, the one-link-per-member rule) over the real message codec, driven by tests/sim/links.py as
node/applier/ drives them; the membership shell (fence, rejoin, greetings) is in
tests/sim/shell.py. Time is a tick counter (TICK_US of wall clock each); one seeded
`random.Random` makes every choice, so a seed replays the same run exactly.

Rules the harness keeps, each the same as the shell it stands in for:
- local write (server.write): refused while the node is not running, while it is fenced
  (replicated ops; FenceKeeper.try_lift first) and while a peer holds more of its own rows
  than it has claimed and is one of its upstreams (`own_claims`, Peering.own_rows_awaited);
  `core.local_txn` for the replicated ops and for the local ops, submitted together;
  anonymous nodes refuse replicated writes;
- journal (journal.py) and store: tests/sim/simnode.py (wal_mode fsync or write, checkpoints,
  WAL holds and collection);
- restart (server._open_bootstrapped + wal.recovery): state from the base plus the WAL on
  disk; a power loss in wal_mode write fences the node (FenceKeeper.loss_at_open); a node
  whose store was lost but whose identity file says it went active joins again with its
  uuid and is fenced (the join machine's fenced-join rule, node.core.lifecycle_join);
- applier and relay: the machines decide (tests/sim/links.py says what its drivers do around
  them: the journal, the WAL holds, the registration, reading the WAL); every broken link
  `drop_peer`s the map its greeting built and reconnects after a backoff with a fresh
  greeting; `need_rejoin` goes to the node's Rejoiner (shell.py);
- JOIN, FETCH_SNAPSHOT, REGISTER: the production join machine (node.core.lifecycle_join)
  polls a joiner's peers, decides whom it asks or whether it founds the cluster, and what a
  snapshot installs (tests/sim/joins.py drives it): the joiner's WAL starts
  empty, its `gc_vclock` at the snapshot's vclock; after FETCH_SNAPSHOT the anonymous node adds
  itself as STATE_ANON with the lowest free id; after REGISTER it re-states itself;
- peers (Node.configure_peers / set_peers): a node's configured peers are addresses ("B", or
  "B'", another spelling of B, or the node itself); duplicates collapse; the appliers in
  effect are exactly the configured ones (none during a rebuild);
- network: one connection per applier/request; each direction is FIFO (a WebSocket) and
  carries encoded messages (node.core.messages); messages of different connections
  interleave in any order; a partition or a drop breaks the connection and loses what it
  carried; a relay that ends a link closes it after what it sent.
`rules` turns one fixed rule back to its behaviour before issue 16, to show that a scenario
catches it: "cover" (False: the old rejoin: at once, from any donor, even while an upstream
streams), "keep_local" (False: a rejoin wipes the local spaces too), "fence" (False: never
fenced), "holds" ("first_ack": a hold only from the first ACK, none for a member that never
subscribed), "ack" ("applied" / "claimed": ACKs carry the applied / the claimed vclock), "one_link" (False: no claim, no
older link closed), "cover_links" (False: a rejoin waits for a donor's cover on any link it has
from this node, one that asked for its own rows only or goes without the rows it lacks too: the
rule the full+replace seeds of session 49 were found under). The rules that live in production code are turned back by patching it for
each tick (`_rules_reverted`: NodeCore.ack_durable, claims.claim_link). Otherwise the simulation runs the shell's rules as they are: a shell bug it
finds is fixed in node/ and the run that showed it kept (tests/sim/test_fixed_bugs.py).
The journal is asynchronous, as the shell's: a row is claimed (queued), then written, then on
disk; ACKs carry what is on disk; a crash may fall between any two (tests/sim/faults.py counts
which window each crash fell into).
"""
from __future__ import annotations

import contextlib
import heapq
import random
import uuid as uuidlib
from collections import Counter, deque
from typing import Any, Callable
from unittest import mock

from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER
from node.core.replicaset import NodeCore, cluster_op
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_DELETE, OP_PUT, OP_SPACE, Op, Txn
from node.core.link import claims
from tests.sim import shell
from tests.sim.checkers import Checker
from tests.sim.faults import Faults
from tests.sim.joins import Joins
from tests.sim.links import Links
from tests.sim.network import Conn, Network
from tests.sim.simnode import TICK_US, Base, SimNode

KV = "kv"                      # the replicated space (last-writer-wins)
LOC = "loc"                    # a local space: its rows never leave the node
SKEW_US_MAX = 5 * TICK_US      # node clocks disagree by up to this much
TRACE_LINES_MAX = 60           # lines of recent trace printed with a failure
LET_GO_ATTEMPTS = 3            # attempts in a row blocked only by an expelled member's rows, before the operator acts


_REJOIN_IDLE = shell.RejoinState.IDLE
_AS_THEY_ARE = contextlib.nullcontext()   # no rule turned back: nothing patched for the tick


class SimFailure(AssertionError):
    """An invariant or liveness check failed; the message names the seed and the repro."""


class Cluster(Faults, Network, Links, Joins):
    def __init__(self, seed: int, *, repro: str = "", verbose: bool = False):
        self.seed = seed
        self.repro = repro
        self.verbose = verbose
        self.rng = random.Random(seed)
        self.cluster_uuid = str(uuidlib.UUID(int=seed, version=4))   # (drawn from no stream)
        self.now = 0
        self._vclocks_seen: tuple = ((), 0)    # quiet(): every vclock as last looked at, and since when
        self.nodes: dict[str, SimNode] = {}
        self.by_uuid: dict[str, SimNode] = {}
        self.conns: dict[int, Conn] = {}
        self.registering: list[Conn] = []      # JOIN / REGISTER links whose registration is not durable yet
        self._encoded: dict[int, tuple[dict, bytes]] = {}   # id(greeting) -> (it, its encoding) (Network.send)
        self._conn_ids = 0
        # the messages in flight: tick due -> (conn id, to, type, data) in the order sent, and
        # a heap of the ticks that have some (Network.send)
        self._due: dict[int, list[tuple[int, str, int | None, bytes | None]]] = {}
        self._due_at: list[int] = []
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
        # chance that an applier decodes a ROWS message with the row scanner (node.core.rowscan:
        # the machine's `receive_scan`); the rest take the exact path, txn by txn
        self.scan_rows_p = 0.5
        self.checkpoint_every = 0       # mean ticks between a node's checkpoints (0: none)
        self.anon_ttl = 400             # ticks an anonymous replica's hold lasts (anon_ttl_s)
        self.rules = {"cover": True, "keep_local": True, "fence": True, "holds": "register", "ack": "durable", "one_link": True,
                      "cover_links": True}
        self.stats: Counter = Counter()
        self.trace: deque[str] = deque(maxlen=globals()["TRACE_LINES_MAX"])
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
    def add_node(self, name: str, *, anon: bool = False, wal_mode: str = "fsync") -> SimNode:
        u = str(uuidlib.UUID(int=self.rng.getrandbits(128), version=4))
        n = SimNode(self, name, u, self.rng.randint(-SKEW_US_MAX, SKEW_US_MAX), anon)
        n.wal_mode = wal_mode
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
        n.meta = {"running": True}
        n.install(Base([[n.uuid, 1, n.addr, STATE_MEMBER, 0]], {}, {}, {}))
        n.rejoiner = shell.Rejoiner(self, n)
        n.identity_active = True
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
        assert n.anon and n.base is not None and (n.rejoiner is None or n.rejoiner.task is None)
        self._start_proc(name, "register", via)

    def _start_proc(self, name: str, proc: str, via: str | None) -> None:
        n = self.node(name)
        n.proc, n.proc_via, n.proc_retry_at = proc, via, self.now
        self.log(f"{n} starts {proc}" + (f" via {via}" if via else ""))

    # --- writes --------------------------------------------------------------------------------
    def value(self, n: SimNode) -> dict:
        self.stats["values"] += 1
        return {"by": n.uuid, "n": self.stats["values"]}

    def txn(self, name: str, ops: list[tuple]) -> list[Txn] | None:
        """A client transaction, as server.write splits it: ops are (kind, space, key[, value])
        with kind "put" | "delete"; a put without value writes a fresh value that names its
        writer. Returns the txns submitted, or None if refused (node down or anonymous)."""
        n = self.node(name)
        if not n.ready or n.proc or n.status != "running":
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
        if repl and n.core.expelled_reason() is not None:
            self.stats["refused_expelled_writes"] += 1      # Writes._refuse_if_expelled
            return None
        if repl and n.core.fence is not None and not shell.try_lift(self, n):
            self.stats["refused_fenced_writes"] += 1
            return None
        if repl and shell.own_rows_awaited(self, n):
            self.stats["refused_catching_up"] += 1
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
            with self._rules_reverted():
                self._tick()
        except SimFailure:
            raise
        except Exception as e:  # a core assertion or error: re-raised with the seed and the trace
            raise self.fail(f"{type(e).__name__} inside the simulated cluster: {e}") from e

    def _rules_reverted(self) -> contextlib.AbstractContextManager:
        """The `rules` that live in production code, turned back by patching it for the tick."""
        if self.rules["ack"] not in ("applied", "claimed") and self.rules["one_link"]:
            return _AS_THEY_ARE
        stack = contextlib.ExitStack()
        if self.rules["ack"] == "applied":      # ACKs say the applied vclock is on disk
            stack.enter_context(mock.patch.object(NodeCore, "ack_durable", NodeCore.ack_vclock))
        elif self.rules["ack"] == "claimed":    # ... or the claimed one
            stack.enter_context(mock.patch.object(
                NodeCore, "ack_durable", lambda core, u: core.peers[u].map.vclock_to_peer(core.claimed)))
        if not self.rules["one_link"]:          # any link may follow any member
            stack.enter_context(mock.patch.object(
                claims, "claim_link", lambda followers, uuid, link: followers.__setitem__(uuid, link)))
        return stack

    def _tick(self) -> None:
        self.now = now = self.now + 1
        due, due_at, conns, deliver = self._due, self._due_at, self.conns, self._deliver   # (never replaced)
        # what is due by now, by tick due, then in the order sent (what the deliveries send due
        # now goes into a new list for this tick, taken after this one: it was sent after)
        while due_at and due_at[0] <= now:
            for cid, to, mtype, data in due.pop(heapq.heappop(due_at)):
                c = conns.get(cid)
                if c is not None:
                    deliver(c, to, mtype, data)
        self._serve_registrations()
        self._pump_relays()
        self._connect()
        self._journals()
        self._acks()
        self._membership()
        drop_p = self.drop_p
        if drop_p:
            draw = self.rng.random
            for c in list(self.conns.values()):
                if draw() < drop_p:
                    self.break_conn(c, "dropped")
        self.checker.check()

    def _journals(self) -> None:
        rng = self.rng
        for n in self.nodes.values():
            if not n.up or n.core is None:       # (not n.ready)
                continue
            if n.queue and rng.random() < self.write_p:
                n.write_some(1 + int(rng.random() * len(n.queue)))
            if len(n.wal) > n.durable and rng.random() < (self.sync_p if n.sync_p is None else n.sync_p):
                n.sync()

    def _membership(self) -> None:
        """Per node, what its shell's background tasks do: checkpoints (Node._checkpoint_loop),
        the fence's watch (FenceKeeper.watch) and the rejoin's (Rejoiner.watch)."""
        every = self.checkpoint_every
        for n in self.nodes.values():
            if not n.up or n.core is None:       # (not n.ready)
                continue
            rejoiner = n.rejoiner
            if every and rejoiner.machine.state is _REJOIN_IDLE and self.rng.random() * every < 1:   # (task is None)
                self.checkpoint(n)
            if n.core.fence is not None:
                shell.try_lift(self, n)
            rejoiner.step()

    def checkpoint(self, n: SimNode) -> int:
        reading, registering = [], False      # (one pass over the links)
        for c in self.conns.values():
            if c.server == n.name:
                if c.streaming:
                    reading.append(c.cursor)
                if c.kind in ("join", "rejoin", "register"):
                    registering = True
        collected = n.checkpoint(self.now, self.anon_ttl, reading, self.rules["holds"] == "register")
        self.stats["checkpoints"] += 1
        if registering or n.joining:
            # a member registers here (its JOIN is served) or has joined and not yet subscribed
            self.stats["checkpoints while a member registers"] += 1
            self.stats["entries collected while a member registers"] += collected
        if collected:
            self.stats["wal_entries_collected"] += collected
            if n.lapse:                  # an anonymous node with no row of its own (holds.lapsing)
                self.stats["entries collected where holds lapse"] += collected
            self.log(f"{n} checkpoints and collects {collected} WAL entries; gc_vclock {n.gc_vclock}")
        return collected

    def swap_after_rejoin(self, n: SimNode, base: Base, was_anon: bool = False,
                          discarded: set[str] | frozenset[str] = frozenset()) -> None:
        """Node.reopen_after_rejoin: every link closed, the new store swapped in, reopened.
        `discarded`: expelled members whose rows the operator let the rebuild lose."""
        for c in list(self.conns.values()):
            if c.client == n.name or c.server == n.name:
                self.break_conn(c, f"{n.name} swaps in a rebuilt store")
        n.base, n.wal, n.durable, n.base_pos, n.wal_gc = None, [], 0, 0, 0
        n.install(base)
        n.gc_vclock = {k: v for k, v in base.vclock.items() if k}
        n.in_effect = None
        self.stats["rejoins"] += 1
        self.log(f"{n} rebuilt: id {n.core.self_id}, vclock {n.core.vclock}")
        self.checker.on_rebuild(n, was_anon, discarded)

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
        """Nothing in flight, nothing to persist, no fence, no rejoin under way, every link in
        effect streaming and caught up (a second address of a member followed through another,
        the node itself, an expelled member's refusal and a member down for good excepted)."""
        conns = self.conns
        if any(m[0] in conns for q in self._due.values() for m in q):   # (self.in_flight(), stopping at the first)
            return False
        for n in self.nodes.values():
            if n.retired:
                continue
            if not n.up or n.proc or n.queue or len(n.wal) != n.durable or n.status != "running":
                return False
            if n.core is None:
                continue
            if (n.core.fence is not None and n.uuid not in self.expelled) or n.rejoiner.task is not None:
                return False                # (an expelled member hears nobody: it may stay fenced)
            for addr in n.links():
                a = n.appliers.get(addr)
                p = self.nodes[shell.resolve(addr)]
                if p.retired or (p is n and a is not None and a.refused == "self"):
                    continue
                if a is not None and a.refused == "duplicate" and any(
                        b.conn is not None and b.conn.streaming and b.conn.server == p.name for b in n.appliers.values()):
                    continue
                if a is None or a.conn is None or not a.conn.streaming:
                    me = p.core.table.get(n.uuid) if p.core else None
                    if a is not None and a.refused == "expelled" and me is not None and me.state == STATE_EXPELLED:
                        continue
                    return False
                if a.conn.cursor < p.applied_pos:
                    return False
        return self._without_looked_again()

    def _without_looked_again(self) -> bool:
        """A node that goes without rows (RejoinMachine.going_without) asks for a donor again
        every retry interval, since a node that covers it may have come about meanwhile (full
        seed 11470): quiet only once each such node's last attempt came after every vclock
        was last seen to change."""
        going = [n.rejoiner.machine for n in self.nodes.values()
                 if n.rejoiner is not None and n.core is not None and n.rejoiner.machine.going_without()]
        if not going:
            return True
        sig = tuple(tuple(n.core.vclock.items()) if n.core is not None else () for n in self.nodes.values())
        if sig != self._vclocks_seen[0]:
            self._vclocks_seen = (sig, self.now)
        since = self._vclocks_seen[1]
        return all(not mc.running and mc.last_try > since for mc in going)

    def run_until_quiet(self, max_ticks: int = 2000) -> None:
        self.run_until(self.quiet, max_ticks, "quiet (every link caught up, nothing in flight)")

    def settle(self, max_ticks: int = 2000) -> None:
        """Liveness: heal everything, restart everyone, calm the network, run until quiet (the
        operator following what fences say meanwhile)."""
        self.heal()
        self.drop_p = 0.0
        for n in list(self.nodes.values()):
            self.restart(n.name)
        self.run_until(lambda: not self._follow_fences() and not self._let_go() and self.quiet(), max_ticks,
                       "quiet (every link caught up, nothing in flight)")

    def _let_go(self) -> bool:
        """The operator lets a node discard an expelled member's rows that no donor has (POST
        /v1/admin/rejoin), once LET_GO_ATTEMPTS attempts in a row found no donor only for want
        of those (docs/operations.md "A node that cannot rejoin": it holds them in its snapshot
        alone and lacks members' rows every upstream collected; full+replace seed 204848).
        Whether it did."""
        did = False
        for n in self.nodes.values():
            mc = n.rejoiner.machine if n.rejoiner is not None and n.core is not None else None
            if mc is not None and mc.running:
                continue                         # an attempt under way: its outcome is not known yet
            lacked = frozenset(mc.closest_lacked) if mc is not None and mc.need and not mc.discard else frozenset()
            if not lacked or not all(n.core.table.expelled(u) for u in lacked):
                n.let_go_seen = (frozenset(), 0)
                continue
            if n.let_go_seen[0] != lacked:
                n.let_go_seen = (lacked, mc.attempts)
            elif mc.attempts - n.let_go_seen[1] >= LET_GO_ATTEMPTS:
                mc.allow_discard(lacked)
                self.stats["rows let go by the operator"] += 1
                self.log(f"{n} finds no donor that has the rows of expelled "
                         f"{sorted(self.by_uuid[u].name for u in lacked)} it alone holds: the operator lets them go")
                did = True
        return did

    def _follow_fences(self) -> bool:
        """The operator does what a fence's status says when its node waits for rows only an
        anonymous replica or an expelled member holds (OwnRowsFence.explain): it adds that
        node's address to the fenced node's peers (PUT /v1/admin/peers), and the rows come back
        from it (no member takes a member's rows from an expelled one). Whether it did."""
        did = False
        for n in self.nodes.values():
            fence = n.core.fence if n.core is not None else None
            if fence is None:
                continue
            own, table = n.core.vclock.get(n.core.self_id), n.core.table
            for m in self.nodes.values():
                gone = fence.is_expelled(table, m.uuid)
                if (m.uuid in fence.anonymous or gone) and fence.heard.get(m.uuid, 0) > own \
                        and m.name not in n.peers and m is not n and m.uuid not in fence.given_up:
                    n.peers.append(m.name)
                    what = "an expelled member" if gone else "an anonymous replica"
                    self.stats["peers_added_for_fence"] += 1
                    self.log(f"{n} is fenced on rows {what}, {m}, holds: the operator adds {m} to its peers")
                    did = True
        return did

    def describe(self) -> str:
        lines = []
        for n in self.nodes.values():
            if n.core is None:
                lines.append(f"  {n}: up={n.up} proc={n.proc or '-'} (no core)")
                continue
            links = []
            for addr in n.links():
                a = n.appliers.get(addr)
                st = "none" if a is None or a.conn is None else ("streaming" if a.conn.streaming else "handshake")
                links.append(f"{addr}:{st}{'/' + a.refused if a and a.refused else ''}")
            fence = n.core.fence_state()[1] if n.core.fence is not None else ""
            lines.append(f"  {n}: up={n.up} proc={n.proc or '-'} status={n.status} mode={n.wal_mode} "
                         f"id={n.core.self_id} vclock={n.core.vclock} gc={n.gc_vclock} "
                         f"claimed={n.core.claimed} queue={len(n.queue)} wal={len(n.wal)}/{n.durable} "
                         f"table={ {m.uuid[:8]: m.id for m in n.core.table.members()} } links[{', '.join(links)}]"
                         + (f" fenced: {fence}" if fence else "")
                         + (f" rejoin: {n.rejoiner.need} {n.rejoiner.blocked}" if n.rejoiner.need else ""))
        return "\n".join(lines)
