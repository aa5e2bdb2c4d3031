"""The client side of JOIN, FETCH_SNAPSHOT and REGISTER in the simulated cluster (a mixin of
tests/sim/harness.Cluster), as node/join.py's `Join` drives the production join machine
(node.core.lifecycle_join). A node that joins (`proc` "join": a new node, or a member that lost
its store) runs the machine's rounds (JoinMachine.start): it polls its peers (a greeting
exchange with each over the simulated network, as Lifecycle.poll_peers), and the machine
decides from what came back: ask the running peers in turn, found the cluster (the lowest
uuid, once every peer answered fresh), wait its backoff and poll again, or stop. A member
restarted with its store (`proc` "start") runs the machine's exchange of a store
(JoinMachine.start_with_store, as Lifecycle.initialize_from_store): a quick poll of its peers
before it goes active. With `cluster_wait_for` 0 and one cluster, the Qpid decision over store
statuses and the wrong-store stop are not reached here (tests/unit/test_lifecycle_join.py reaches them). An
anonymous replica's FETCH_SNAPSHOT and REGISTER are one request to one donor each (`ask`), as
Join.fetch_anon and register_anon make them; which donor is the simulation's (the
operator's `via`, or any member), as are the waits before a retry (BACKOFF). A rebuild's
snapshot is the rejoiner's (tests/sim/shell.py Rejoiner, as node/rejoin.py's).

What stays here is the driver's IO over the simulation's fakes: the polls (a poll's link
lost, refused, or unanswered within POLL_TICKS is the error the machine reads for that
peer), the request sent once the donor's greeting came, the snapshot assembled from its
messages, the simulated store it becomes (SimNode.install), and the founding
(Cluster.bootstrap). A simulated cluster is one cluster: a node that founds one while
another node has a store fails the run. `rules["fence"]` False turns the fence an Install
carries back (never fenced)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from node import limits
from node.cluster_space.table import STATE_ANON
from node.core import messages as m
from node.core.lifecycle_join import JoinMachine, JoinState
from node.core.lifecycle_join_events import (EXPELLED, REFUSED, Abort, Activated, Ask, AskFailed, BecomeMember,
                                             Bootstrap, Bootstrapped, IdGranted, Install, Installed, PollPeers,
                                             Polled, SnapshotReceived, WipePartial)
from node.errors import PeerRefused
from node.identity.signature import InitialSignature, MemberStatus, StoreStatus
from tests.sim import shell
from tests.sim.links import BACKOFF, SERVER
from tests.sim.simnode import Base

if TYPE_CHECKING:
    from tests.sim.harness import Cluster
    from tests.sim.network import Conn
    from tests.sim.simnode import SimNode

REQUESTS = {"join": m.JOIN, "rejoin": m.JOIN, "fetch": m.FETCH_SNAPSHOT, "register": m.REGISTER}
# a poll's wait for a peer's greeting (limits.peer_poll_timeout_s, peer_poll_quick_timeout_s),
# and the join machine's backoff between rounds (reconnect_backoff_min_s ..
# join_wait_backoff_s_max), in ticks
POLL_TICKS, POLL_QUICK_TICKS = 20, 8
JOIN_BACKOFF_MIN, JOIN_BACKOFF_MAX = 1, 8


class JoinHost:
    """node/core/lifecycle_join.py JoinContext over a simulated node (node/join.py Join): its
    peers are its configured ones (the operator lists the cluster's members for a new node);
    one cluster, whose uuid a node's identity names once it went active; `cluster_wait_for`
    0, so no Qpid exchange of stores (`decide`)."""
    __slots__ = ("n",)
    wait_for, data_dir = 0, ""

    def __init__(self, n: "SimNode"):
        self.n = n

    @property
    def uuid(self) -> str:
        return self.n.uuid

    @property
    def proposal(self) -> tuple[str, float]:
        return self.n.cluster.cluster_uuid, 0.0

    def peers(self) -> list[str]:
        n = self.n
        return [a for a in (n.join_peers or n.peers) if a != n.name]

    def member_cluster_uuid(self) -> str | None:
        return self.n.cluster.cluster_uuid if self.n.identity_active else None

    def went_active(self) -> bool | None:
        return self.n.identity_active          # its identity file says so (kept with a lost store)

    def decide(self, *_):
        raise AssertionError("cluster_wait_for is 0 in the simulation: no Qpid exchange of stores")

    seen = decide

    def my_status(self) -> MemberStatus:
        """A member's store: dirty from its first start. (The simulation's greetings carry no
        store status, so the machine never compares the initial signature this stands in for.)"""
        return MemberStatus(self.n.uuid, StoreStatus.DIRTY, InitialSignature(self.n.cluster.cluster_uuid, 0.0,
                                                                             (self.n.uuid,)), None, "")

    def members_seen(self) -> int:
        return 1


class Joins:
    def start_fresh(self: "Cluster", *names: str) -> None:
        """Nodes with empty stores start with each other as peers (node/join.py
        join_or_bootstrap): the join machine decides who founds the cluster and who joins it."""
        for name in names:
            self.node(name).peers = [x for x in names if x != name]
            self._start_proc(name, "join", None)

    def _start_request(self: "Cluster", s: "SimNode") -> None:
        """The node wants a request and none is under way (Network._connect, each tick from
        proc_retry_at): a join's next step, or a fetch's or a register's next try."""
        if s.proc in ("join", "start"):
            return self._join_round(s)
        if s.proc_via is not None and not self.nodes[s.proc_via].retired:
            donors = [self.nodes[s.proc_via]]
        else:
            donors = [x for x in self.members() if x is not s and x.ready]
        donors = [d for d in donors if d.up and self.reachable(s.name, d.name)]
        if not donors:
            s.proc_retry_at = self.now + self.rng.randint(1, 4)
            return
        d = self.rng.choice(donors)
        s.proc_conn = self.open_request(s.proc, s, d, d.name)

    # --- a join's rounds (Join.join_or_bootstrap, Join._drive) ------------------------------------
    def initialize_from_store(self: "Cluster", s: "SimNode") -> None:
        """Lifecycle.initialize_from_store, at a start with a store (an anonymous replica takes
        no part): the machine's exchange of a store (JoinMachine.start_with_store: a quick poll
        of the peers). Until it is over the node is not active: status "waiting", no writes,
        no appliers (`proc` "start"); its relays serve."""
        j = s.joiner = JoinMachine(JoinHost(s), JOIN_BACKOFF_MIN, JOIN_BACKOFF_MAX)
        j.start_with_store(self.now)
        if not j.done:
            s.proc, s.proc_via = "start", None
        self._join_act(s, j)

    def _join_round(self: "Cluster", s: "SimNode") -> None:
        j = s.joiner
        if s.proc == "start" and (j is None or j.done):
            return self.initialize_from_store(s)
        if s.proc == "join" and (j is None or j.done or not j.rounds):   # the process starts (again)
            if not s.peers and not s.identity_active:
                # the operator starts a new node with the cluster's members as its peers (the one
                # it named first); once joined, the mesh makes them its peers, or, without the
                # mesh, the scenario configures them
                s.join_peers = ([s.proc_via] if s.proc_via else []) + [
                    x.name for x in self.members() if x is not s and x.name != s.proc_via]
            j = s.joiner = JoinMachine(JoinHost(s), JOIN_BACKOFF_MIN, JOIN_BACKOFF_MAX)
            j.start(self.now)
        elif j.state is JoinState.POLLING:
            if not self._polls_in(s, j):
                s.proc_retry_at = self.now + 1
                return
        elif j.state is JoinState.ASKING:       # the request's link broke before it was answered
            j.step(AskFailed(j.asking, "the link broke"), self.now)
        elif j.state is JoinState.WAITING:
            j.tick(self.now)
        self._join_act(s, j)

    def _poll(self: "Cluster", s: "SimNode", j: JoinMachine, quick: bool) -> None:
        """Lifecycle.poll_peers: a greeting exchange with every peer at once; a peer down or cut
        off answers with an error at once."""
        s.polls = {}
        for addr in j.host.peers():
            p = self.nodes[shell.resolve(addr)]
            if not p.up or not self.reachable(s.name, p.name):
                self.stats["polls of a peer down or cut off"] += 1
                s.polls[addr] = ConnectionError(f"{addr} is {'down' if not p.up else 'cut off'}")
            else:
                s.polls[addr] = self.open_request("poll", s, p, addr)
        s.poll_until = self.now + (POLL_QUICK_TICKS if quick else POLL_TICKS)
        self.stats["join polls"] += 1
        self._polls_in(s, j)

    def _polls_in(self: "Cluster", s: "SimNode", j: JoinMachine) -> bool:
        """Whether every poll is over (answered, refused, broken, or past its time); if so, the
        machine steps what they gave (Polled)."""
        late = self.now >= s.poll_until
        for addr, x in s.polls.items():
            if isinstance(x, (dict, BaseException)):
                continue
            if not x.open:
                s.polls[addr] = ConnectionError(f"{addr}: the link broke")
            elif late:
                self.stats["polls timed out"] += 1
                self.break_conn(x, "poll timed out", 0)
                s.polls[addr] = TimeoutError(f"{addr} did not greet in time")
            else:
                return False
        polled, s.polls = s.polls, {}
        j.step(Polled(polled), self.now)
        return True

    def _poll_answer(self: "Cluster", c: "Conn", s: "SimNode", msg: Any) -> None:
        """A polled peer's greeting or refusal (probe: greet and leave)."""
        j = s.joiner
        if isinstance(msg, PeerRefused):
            self.stats["polls refused"] += 1
            answer: Any = msg
            self.break_conn(c, f"poll refused: {msg.code} (BYE)", 0)
        elif msg.type == m.GREETING:
            answer = msg.body
            self.break_conn(c, "polled (BYE)", 0)
        else:
            return self.break_conn(c, f"unexpected {msg.name}", 0)
        if j is not None and j.state is JoinState.POLLING and s.polls.get(c.addr) is c:
            s.polls[c.addr] = answer
            if self._polls_in(s, j):
                self._join_act(s, j)

    def _ask_donor(self: "Cluster", s: "SimNode", j: JoinMachine, e: Ask) -> None:
        """Join.join_via: a new link to the donor, JOIN once its greeting came."""
        p = self.nodes[shell.resolve(e.address)]
        if not p.up or not self.reachable(s.name, p.name):
            j.step(AskFailed(e.address, f"{e.address} is not reachable"), self.now)
            return
        s.proc_conn = self.open_request("join", s, p, e.address)

    # --- the wire -----------------------------------------------------------------------------
    def _request_step(self: "Cluster", c: "Conn", msg: Any) -> None:
        """The driver's IO of one request: greet, ask, take REGISTERED and the snapshot. A
        request the node's join wants (its proc) is the join machine's (node.core.lifecycle_join,
        as node/join.py drives it); a rebuild's snapshot is the rejoiner's (node/rejoin.py)."""
        s, p = self.nodes[c.client], self.nodes[c.server]
        if c.kind == "poll":
            return self._poll_answer(c, s, msg)
        j = s.joiner if s.proc_conn is c else None
        if isinstance(msg, PeerRefused):
            self.stats[f"refused_{msg.code}"] += 1
            self.break_conn(c, f"refused: {msg.code}", BACKOFF.get(msg.code, 20))
            if j is not None and j.asking == c.addr:
                j.step(AskFailed(c.addr, msg.message, EXPELLED if msg.code == "expelled" else REFUSED), self.now)
                self._join_act(s, j, c)
            return
        if msg.type == m.GREETING:
            if s.proc_conn is not c:
                return self.send(c, SERVER, REQUESTS[c.kind], {})
            if c.kind == "join":                 # the machine asked this donor (Ask went at poll time)
                return self.send(c, SERVER, m.JOIN, {})
            if j is None or j.done:
                j = s.joiner = JoinMachine(JoinHost(s))
            elif j.asking is not None:        # the last request's link broke before it was answered
                j.step(AskFailed(j.asking, "the link broke"), self.now)
                self._join_act(s, j, c)
            j.ask(c.addr, REQUESTS[c.kind], msg.body)
            self._join_act(s, j, c)
        elif msg.type == m.REGISTERED:
            if j is not None:
                j.step(IdGranted(c.addr, msg["id"]), self.now)
                self._join_act(s, j, c)
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
            j.step(SnapshotReceived(c.addr, base.table_rows, base.vclock), self.now)
            self._join_act(s, j, c)
        else:
            self.break_conn(c, f"unexpected {msg.name}")

    def _join_act(self: "Cluster", s: "SimNode", j: JoinMachine, c: "Conn | None" = None) -> None:
        """Join._drive: the machine's effects, in order (its status notes: a simulated node shows
        none); `c` the link of the request the machine heard of last. A round that joined nobody
        waits the machine's backoff (proc_retry_at)."""
        while rd := j.ready():
            for note in rd.apply:
                if note.status is not None:
                    s.status = note.status
            for e in rd.effects:
                t = type(e)
                if t is PollPeers:
                    self._poll(s, j, e.timeout_s <= limits.peer_poll_quick_timeout_s)
                elif t is Ask:
                    if j.rounds:
                        self._ask_donor(s, j, e)
                    else:
                        self.send(c, SERVER, e.kind, {})
                elif t is Install:
                    self._install(c, s, self.nodes[c.server], e)
                    j.step(Installed(e.address), self.now)
                elif t is BecomeMember:
                    self._registered(c, s, self.nodes[c.server])
                elif t is WipePartial:           # (a simulated store is installed whole or not at all)
                    if c is not None and c.snapshot is not None:
                        self.stats["join_unregistered_snapshot"] += 1
                        self.log(f"{s}: {c.server}'s snapshot does not register it; retrying")
                elif t is Bootstrap:
                    self._found(s, e)
                    j.step(Bootstrapped(), self.now)
                elif t is Activated:
                    self.log(f"{s}: {e.why}")
                else:
                    assert type(e) is Abort, e
                    self._stop_joining(s, e.message)
            j.advance(rd)
        if s.proc == "start" and j.state is JoinState.DONE:     # Lifecycle.go_active
            s.proc, s.status = "", "running"
            self.stats["starts after the status exchange"] += 1
            self.log(f"{s} goes active after polling its peers")
        if j.state is JoinState.WAITING:
            s.proc_retry_at = max(self.now + 1, int(j.retry_at + 0.999))
        elif j.state is JoinState.POLLING:
            s.proc_retry_at = self.now + 1

    def _stop_joining(self: "Cluster", s: "SimNode", why: str) -> None:
        """Abort: start-up stops, and with it the process (the CLI prints one line and exits
        1). The operator starts it again once it fixed what the line says (its peers: the
        workload's last step), unless it expelled the member: then it is down for good."""
        s.proc, s.status = "", "running"
        self.stats["joins_aborted"] += 1
        self.log(f"{s} stops joining: {why}")
        for c in [c for c in self.conns.values() if s.name in (c.client, c.server)]:
            self.break_conn(c, f"{s.name} stopped", 0)
        s.up = False
        s.joiner, s.polls = None, {}
        if s.uuid in self.expelled:
            s.retired = True

    def _found(self: "Cluster", s: "SimNode", e: Bootstrap) -> None:
        """Opening.bootstrap_new_cluster. One simulated cluster: no other node may have a store."""
        others = [x for x in self.nodes.values() if x is not s and (x.base is not None or x.identity_active)]
        if others:
            raise self.fail(f"{s} founds a cluster ({e.why}) while {others} belong to one: two clusters")
        self.stats["clusters founded by the exchange"] += 1
        self.log(f"{s}: {e.why}")
        self.bootstrap(s.name)
        s.proc, s.join_peers = "", []

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
            if any(x is not s and x.up and x.proc == "join" for x in self.nodes.values()):
                self.stats["joins while another node joins"] += 1
            self.checker.on_held(p, s)          # joined through p (a rebuild's once swapped in)
        s.rejoiner = shell.Rejoiner(self, s)
        s.proc, s.join_peers = "", []
        s.donor_uuid, s.installed_at = p.uuid, self.now
        self.stats["joins" if join else "anon_fetches"] += 1
        self.log(f"{s} {'joined' if join else 'fetched a snapshot'} via {p}: "
                 f"id {s.core.self_id}, vclock {s.core.vclock}" + (" (fenced)" if s.core.fence else ""))
        self.checker.on_install(s)
        self._on_member(s)
