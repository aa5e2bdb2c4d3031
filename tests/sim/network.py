"""The simulated network (a mixin of tests/sim/harness.Cluster): connections, the messages in
flight, and the appliers' connecting and reconnecting (Peering.set_peers, Applier.run's
backoff).

Rules kept here:
- one connection per applier or request; each direction is FIFO (a WebSocket) and carries
  encoded messages (node.core.messages); messages of different connections interleave in any
  order, each taking 0..delay_max ticks (plus a slow link's extra);
- a partition or a drop breaks the connection and loses what it carried; a broken link
  releases its member (claims.release_link), `drop_peer`s the map its greeting built, and is
  tried again after a backoff;
- the appliers in effect are exactly the addresses in effect (none during a rebuild)."""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from node.core import messages as m
from node.core.anon_followers import follower_link_end
from node.core.link import claims
from tests.sim import shell
from tests.sim.links import SERVER
from tests.sim.simnode import Applier, SimNode
from tests.sim.wire import encoded_once

if TYPE_CHECKING:
    from tests.sim.harness import Cluster

_encode_greeting = partial(m.encode_body, m.GREETING)
_ROWS, _GREETING = m.ROWS, m.GREETING
ENCODED_MAX = 256      # greetings whose encoding is kept (the cache is emptied when full)


@dataclass(eq=False)
class Conn:
    id: int
    kind: str                 # "sub" | "join" | "fetch" | "register" | "rejoin"
    client: str               # the subscriber / joiner
    server: str               # the upstream / donor
    addr: str = ""            # "sub": the applier's address (a key of client.appliers)
    open: bool = True
    relay: Any = None         # the server end: node.core.link.relay.RelayMachine
    applier: Any = None       # "sub": the client end, node.core.link.applier.ApplierMachine
    streaming: bool = False   # relay side: SUBSCRIBED went, rows stream (the machine's Stream)
    cursor: int = 0           # relay side: next WAL entry to read
    wait_durable: int | None = None   # JOIN/REGISTER: donor entries that must be durable first
    snapshot: Any = None      # JOIN/FETCH client side: the snapshot being received (a Base)
    acked_sig: int = -1       # client side: core.synced's signature when the last ACK went
    tick_key: tuple = ()      # client side: what the applier's last tick saw (Cluster._acks)
    core_peer: Any = None     # client side: the core's Peer its greeting built (Applier._drop_peer)
    last_at_client: int = 0   # the tick the last message to the client arrives (Network.send)
    last_at_server: int = 0   # ... to the server
    followed: Any = None      # relay side: (the server's FollowerReach, the follower's uuid) it opened

    @property
    def fenced(self) -> bool:
        """Client side: subscribed for its own rows only (fenced)."""
        return self.applier is not None and self.applier.fenced


class Network:
    def reachable(self: "Cluster", a: str, b: str) -> bool:
        return not self.blocked or frozenset((a, b)) not in self.blocked

    def _open(self: "Cluster", kind: str, client: SimNode, server: SimNode, addr: str = "") -> Conn:
        self._conn_ids += 1
        c = Conn(self._conn_ids, kind, client.name, server.name, addr)
        self.conns[c.id] = c
        return c

    def send(self: "Cluster", c: Conn, to: str, mtype: int | None, body: Any, delay: int | None = None) -> None:
        """One message on the wire, encoded (`body`: a ROWS message's bytes, else its fields;
        `mtype` None: the sender closes the connection after what it sent). `delay`: ticks it
        takes, drawn from the seed's stream when None."""
        if not c.open:
            return
        if delay is None:
            delay = int(self.rng.random() * (self.delay_max + 1))
        at = self.now + delay
        if self.slow:
            at += self.slow.get((c.client, c.server), 0)
        if to == SERVER:                     # messages on one direction of a link keep their order
            if at < c.last_at_server:
                at = c.last_at_server
            c.last_at_server = at
        else:
            if at < c.last_at_client:
                at = c.last_at_client
            c.last_at_client = at
        if mtype is None or mtype == _ROWS:
            data = body
        elif mtype == _GREETING:             # a node's greeting is one object while it holds (shell.greeting)
            data = encoded_once(self._encoded, body, _encode_greeting, ENCODED_MAX)
        else:
            data = m.encode_body(mtype, body)
        q = self._due.get(at)
        if q is None:                        # (a list per tick due: it keeps the order sent)
            q = self._due[at] = []
            heapq.heappush(self._due_at, at)
        q.append((c.id, to, mtype, data))

    def break_conn(self: "Cluster", c: Conn, why: str, backoff: int | None = None) -> None:
        if not c.open:
            return
        c.open = False
        c.relay.close()
        self.conns.pop(c.id, None)
        s, p = self.nodes[c.client], self.nodes[c.server]
        if c.followed is not None:           # node/applier/relay.py serve_link: follower_link_ended
            reach, uuid = c.followed
            own = p.core.claimed.get(p.core.self_id) if p.core is not None else 0
            entry, bound = follower_link_end(p.anon_followers.get(uuid), own,
                                             p.core is not None and p.core.fence is not None)
            if reach.closed(uuid, bound, entry is not None) and entry is not None:
                p.anon_followers[uuid] = entry             # (its entry, as Retention writes it)
        delay = backoff if backoff is not None else self.rng.randint(1, 4)
        self.stats["link_breaks"] += 1
        if c.kind != "sub" and not why.endswith("(BYE)"):
            # a JOIN, rejoin, FETCH or REGISTER cut short: what it carried is lost
            self.stats[f"lost {c.kind} link"] += 1
        if c.kind == "sub":
            a = c.applier.host.a
            if a.conn is c:
                a.conn, a.retry_at = None, self.now + delay
                if a.status == "follow":
                    a.status = ""
            claims.release_link(s.followers, a.peer_uuid, a)  # Applier.release
            c.applier.stop()
            if s.ready and c.core_peer is not None:         # Applier._drop_peer
                s.core.drop_peer(p.uuid, c.core_peer)
        elif s.proc_conn is c:
            s.proc_conn, s.proc_retry_at = None, self.now + delay
        self.log(f"link {s.name}<-{p.name} ({c.kind}) breaks: {why}")

    def in_flight(self: "Cluster") -> int:
        return sum(1 for q in self._due.values() for m in q if m[0] in self.conns)

    def apply_links(self: "Cluster", s: SimNode) -> None:
        """Node.set_peers: the appliers are exactly the addresses in effect."""
        links = s.links()
        key = (tuple(links), len(s.appliers))
        if key == s.links_applied:
            return
        s.links_applied = key
        for addr in list(s.appliers):
            if addr not in links:
                a = s.appliers.pop(addr)
                if a.conn is not None:
                    self.break_conn(a.conn, "removed from peers")

    def _connect(self: "Cluster") -> None:
        now = self.now
        for s in self.nodes.values():
            if not s.up:
                continue
            if s.proc and s.proc_conn is None and now >= s.proc_retry_at:
                self._start_request(s)
            if s.core is None:                  # (not s.ready)
                continue
            links = s.peers if s.in_effect is None else s.in_effect       # (s.links())
            if s.links_applied != (tuple(links), len(s.appliers)):        # (apply_links' own test first)
                self.apply_links(s)
            if s.proc:
                continue
            appliers = s.appliers
            for addr in links:
                a = appliers.get(addr)
                if a is None:
                    a = appliers[addr] = Applier(addr)
                    s.links_applied = ()
                if a.conn is not None or now < a.retry_at:
                    continue
                p = self.nodes[shell.resolve(addr)]
                if not p.up or not self.reachable(s.name, p.name):
                    a.retry_at = self.now + 1 + int(self.rng.random() * 4)
                    continue
                a.conn = self.open_request("sub", s, p, addr)
