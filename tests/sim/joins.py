"""The client side of JOIN, FETCH_SNAPSHOT and REGISTER in the simulated cluster (a mixin of
tests/sim/harness.Cluster), as node/join.py's `Join` drives the production join machine
(node.core.lifecycle_join): greet, ask, take REGISTERED and the snapshot, each answer stepped
into the machine, which decides what a snapshot installs (the fenced-join rule, an anonymous
replica's id, where the WAL starts); then perform its effects in order. A rebuild's snapshot is
the rejoiner's (tests/sim/shell.py Rejoiner, as node/rejoin.py's).

What stays here is the driver's IO over the simulation's fakes: the request sent once the
donor's greeting came, the snapshot assembled from its messages, and the simulated store it
becomes (SimNode.install). Which donor is asked is the simulation's (the operator's `via`, or
any member: tests/sim/network.py _start_request), as are the waits before a retry (BACKOFF);
`rules["fence"]` False turns the fence an Install carries back (never fenced)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from node.cluster_space.table import STATE_ANON
from node.core import messages as m
from node.core.lifecycle_join import JoinMachine
from node.core.lifecycle_join_events import (EXPELLED, REFUSED, Abort, Ask, AskFailed, BecomeMember, IdGranted, Install,
                                             Installed, SnapshotReceived, WipePartial)
from node.errors import PeerRefused
from tests.sim import shell
from tests.sim.links import BACKOFF, SERVER
from tests.sim.simnode import Base

if TYPE_CHECKING:
    from tests.sim.harness import Cluster
    from tests.sim.network import Conn
    from tests.sim.simnode import SimNode

REQUESTS = {"join": m.JOIN, "rejoin": m.JOIN, "fetch": m.FETCH_SNAPSHOT, "register": m.REGISTER}


class JoinHost:
    """node/core/lifecycle_join.py JoinContext over a simulated node (node/join.py Join): the
    simulation names each request's donor (the operator's `via`, or any member), so the
    machine only asks; there is no status exchange (`decide`), and one cluster."""
    __slots__ = ("n",)
    wait_for, proposal, data_dir = 0, ("", 0.0), ""

    def __init__(self, n: "SimNode"):
        self.n = n

    @property
    def uuid(self) -> str:
        return self.n.uuid

    def peers(self) -> list[str]:
        return list(self.n.peers)

    def member_cluster_uuid(self) -> str | None:
        return None

    def went_active(self) -> bool | None:
        return self.n.identity_active          # its identity file says so (kept with a lost store)

    def decide(self, *_):
        raise AssertionError("the simulation names the donor: no status exchange")

    my_status = seen = decide              # (no store's Qpid exchange either)

    def members_seen(self) -> int:
        return 1


class Joins:
    def _start_request(self: "Cluster", s: "SimNode") -> None:
        """The node wants a request and none is under way (Network._connect): which donor."""
        if s.proc_via is not None and not self.nodes[s.proc_via].retired:
            donors = [self.nodes[s.proc_via]]
        else:
            donors = [m for m in self.members() if m is not s and m.ready]
        donors = [d for d in donors if d.up and self.reachable(s.name, d.name)]
        if not donors:
            s.proc_retry_at = self.now + self.rng.randint(1, 4)
            return
        s.proc_conn = self.open_request(s.proc, s, self.rng.choice(donors))

    def _request_step(self: "Cluster", c: "Conn", msg: Any) -> None:
        """The driver's IO of one request: greet, ask, take REGISTERED and the snapshot. A
        request the node's join wants (its proc) is the join machine's (node.core.lifecycle_join,
        as node/join.py drives it); a rebuild's snapshot is the rejoiner's (node/rejoin.py)."""
        s, p = self.nodes[c.client], self.nodes[c.server]
        j = s.joiner if s.proc_conn is c else None
        if isinstance(msg, PeerRefused):
            self.stats[f"refused_{msg.code}"] += 1
            if j is not None and j.asking == p.addr:
                j.step(AskFailed(p.addr, msg.message, EXPELLED if msg.code == "expelled" else REFUSED), self.now)
            self.break_conn(c, f"refused: {msg.code}", BACKOFF.get(msg.code, 20))
            return self._join_act(c, s, p, j)
        if msg.type == m.GREETING:
            if s.proc_conn is not c:
                return self.send(c, SERVER, REQUESTS[c.kind], {})
            if j is None or j.done:
                j = s.joiner = JoinMachine(JoinHost(s))
            elif j.asking is not None:        # the last request's link broke before it was answered
                j.step(AskFailed(j.asking, "the link broke"), self.now)
                self._join_act(c, s, p, j)
            j.ask(p.addr, REQUESTS[c.kind], msg.body)
            self._join_act(c, s, p, j)
        elif msg.type == m.REGISTERED:
            if j is not None:
                j.step(IdGranted(p.addr, msg["id"]), self.now)
                self._join_act(c, s, p, j)
        elif msg.type == m.SNAPSHOT:
            c.snapshot = Base([list(r) for r in msg["cluster"]], dict(msg["vclock"]),
                              {n: (d.get("local", False), d.get("conflict", "lww")) for n, d in msg["spaces"].items()}, {})
        elif msg.type == m.SNAPSHOT_ROWS:
            c.snapshot.data.setdefault(msg["space"], {}).update((k, r) for k, r in msg["rows"])
        elif msg.type == m.SNAPSHOT_END:
            base, c.snapshot = c.snapshot, None
            for name in base.spaces:
                base.data.setdefault(name, {})
            self.break_conn(c, "snapshot received (BYE)", 0)
            if j is None:
                s.rejoiner.snapshot = base       # node/rejoin.py receive_snapshot
                return
            c.snapshot = base                    # (what Install makes the store)
            j.step(SnapshotReceived(p.addr, base.table_rows, base.vclock), self.now)
            self._join_act(c, s, p, j)
        else:
            self.break_conn(c, f"unexpected {msg.name}")

    def _join_act(self: "Cluster", c: "Conn", s: "SimNode", p: "SimNode", j: "JoinMachine | None") -> None:
        """Join._drive: the machine's effects, in order (its status notes: a simulated node shows none)."""
        if j is None:
            return
        while rd := j.ready():
            for e in rd.effects:
                t = type(e)
                if t is Ask:
                    self.send(c, SERVER, e.kind, {})
                elif t is Install:
                    self._install(c, s, p, e)
                    j.step(Installed(e.address), self.now)
                elif t is BecomeMember:
                    self._registered(c, s, p)
                elif t is WipePartial:           # (a simulated store is installed whole or not at all)
                    if c.snapshot is not None:
                        self.stats["join_unregistered_snapshot"] += 1
                        self.log(f"{s}: {p}'s snapshot does not register it; retrying")
                else:
                    assert type(e) is Abort, e   # start-up stops
                    s.proc = ""
                    self.stats["joins_aborted"] += 1
                    self.log(f"{s} stops joining: {e.message}")
            j.advance(rd)

    def _registered(self: "Cluster", c: "Conn", s: "SimNode", p: "SimNode") -> None:
        self.break_conn(c, "registered (BYE)", 0)
        _, txn = s.core.register_member(s.uuid, s.addr, s.wall_us())
        if txn is not None:
            s.submit([txn])
        s.anon, s.proc = False, ""
        s.identity_active = True
        self.stats["anon_registrations"] += 1
        self.log(f"{s} registered via {p}; its own id stays {s.core.self_id}")
        self._on_member(s)

    def _install(self: "Cluster", c: "Conn", s: "SimNode", p: "SimNode", e: Install) -> None:
        """Opening.install_snapshot, as the join machine's Install says (`rules["fence"]` False:
        never fenced)."""
        base, c.snapshot = c.snapshot, None
        join = e.anon_id is None
        if not join:
            base.table_rows.append([s.uuid, e.anon_id, s.addr, STATE_ANON, 0])
        s.meta = {"running": True}
        if e.fence is not None and self.rules["fence"]:
            shell.set_fence(s, e.fence, kind="rejoin")
            self.stats["fenced_joins"] += 1
        s.install(base)
        s.gc_vclock = dict(e.gc_vclock)         # a subscriber behind it rejoins
        if join:
            s.identity_active = True            # Lifecycle.go_active -> mark_active
            self.checker.on_held(p, s)          # joined through p (a rebuild's once swapped in)
        s.rejoiner = shell.Rejoiner(self, s)
        s.proc = ""
        s.donor_uuid, s.installed_at = p.uuid, self.now
        self.stats["joins" if join else "anon_fetches"] += 1
        self.log(f"{s} {'joined' if join else 'fetched a snapshot'} via {p}: "
                 f"id {s.core.self_id}, vclock {s.core.vclock}" + (" (fenced)" if s.core.fence else ""))
        self.checker.on_install(s)
        self._on_member(s)
