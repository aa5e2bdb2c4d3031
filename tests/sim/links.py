"""The replication links of the simulated cluster (a mixin of tests/sim/harness.Cluster): each
end of a connection drives the production machine of node/core/link/ (a subscription's client
end an ApplierMachine, every server end a RelayMachine), and acts on each Ready in its order,
as the asyncio drivers (node/applier/applier.py, relay.py, stream.py) do: persist (journal entries, WAL
holds: submitted in the call that stepped), then send, then apply, then the effects; advance.

What stays here is what the drivers do with IO, over the simulation's fakes:
- the wire: every message is encoded by node.core.messages and decoded at the other end (tests/sim/wire.py; an
  applier's ROWS through the row scanner when a seeded coin says so, as an applier with the
  native scanner takes it), an ERROR becoming a PeerRefused as node/applier/conn.py makes it;
- the journal (SimNode.submit), the WAL holds (SimNode.hold_all / on_subscribe / on_ack) and
  the registration a JOIN / REGISTER asks for (node/lifecycle.py apply_registration: answered
  once durable);
- the relay's WAL reading: entries from the simulated WAL, each filtered by the production
  filter (node.core.entry txns_relay_frame, relay_wants) with the machine's `sub` and `own`,
  batched by node.core.link.filter rows_batches;
- the client side of JOIN, FETCH_SNAPSHOT and REGISTER is tests/sim/joins.py's.
Time: a machine's `now` is its node's wall clock in seconds (SimNode.wall_us; a tick is TICK_US).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from node import limits
from node.applier.outcome import END, REJOIN, after_link
from node.core import codec, rowscan
from node.core import messages as m
from node.core.entry import txns_relay_frame
from node.core.anon_followers import follower_seen
from node.core.lifecycle_fence import claim_of
from node.core.link import claims
from node.core.link.applier import ApplierMachine, ApplierState, DisproveClaim, Followed, Resubscribe
from node.core.link.filter import rows_batches
from node.core.link.ready import EMPTY, Hold, Persist
from node.core.link.collected import behind, expel_bounds_by_id
from node.core.link.relay import (AckHold, Register, Registered, RelayMachine, RelayState, SendSnapshot,
                                  SnapshotSent, Stream)
from node.errors import PeerRefused, RemoteProtocolError
from tests.sim import shell
from tests.sim.wire import decode, encoded_once

if TYPE_CHECKING:
    from tests.sim.network import Conn
    from tests.sim.simnode import Applier, SimNode

CLIENT, SERVER = "client", "server"
_ROWS, _ERROR, _ACK = m.ROWS, m.ERROR, m.ACK      # (read once: tested per message)
_RELAY_CLOSED, _APPLIER_STOPPED, _FOLLOW = RelayState.CLOSED, ApplierState.STOPPED, ApplierState.FOLLOW
# ticks before a refused link is tried again, by the refusal's code (limits.refused_backoff_s,
# rejoin_retry_s, ... scaled down); a code not here: 20
BACKOFF = {"not_ready": 2, "anon": 5, "need_rejoin": shell.REJOIN_RETRY, "greet_again": 0}


class RelayHost:
    """node/core/link/relay.py RelayContext over a simulated node (node/applier/hosts.py NodeRelayContext)."""
    __slots__ = ("n",)

    def __init__(self, n: "SimNode"):
        self.n = n

    @property
    def core(self):
        return self.n.core

    def greeting(self) -> dict:
        return shell.greeting(self.n)

    def check_peer_greeting(self, theirs: dict) -> None:
        shell.observe(self.n, theirs)

    def status(self) -> tuple[str, str]:
        return self.n.status, ""

    def serves_wal(self) -> bool:
        return True

    def gc_vclock(self) -> dict[int, int]:
        return self.n.gc_vclock


class ApplierHost:
    """node/core/link/applier.py ApplierContext over a simulated node (node/applier/hosts.py NodeApplierContext)."""
    __slots__ = ("n", "a")

    def __init__(self, n: "SimNode", a: "Applier"):
        self.n, self.a = n, a

    def check_peer_greeting(self, theirs: dict) -> None:
        shell.observe(self.n, theirs)

    def claim_link(self, peer_uuid: str) -> None:
        self.a.peer_uuid = peer_uuid
        claims.claim_link(self.n.followers, peer_uuid, self.a)

    def journal_pending(self) -> int:
        n = self.n
        return len(n.queue) + len(n.wal) - n.applied_pos

    def own_claim(self, peer_uuid: str) -> int:
        return claim_of(self.n.own_claims, self.n.core.fence, peer_uuid)

    def going_without(self) -> list[str]:
        return list(self.n.rejoiner.machine.going_without()) if self.n.rejoiner is not None else []


_PAYLOADS: dict[int, tuple[list, bytes]] = {}
PAYLOADS_MAX = 8192     # WAL entries whose frame payload is kept (emptied when full)


def _payload(entry: list) -> bytes:
    """A WAL entry's frame payload, as the journal wrote it (node.wal.format): packed once per
    entry, not once per relay that reads it (an entry is never changed once in a WAL)."""
    hit = _PAYLOADS.get(id(entry))          # (encoded_once's hit, without its call)
    if hit is not None and hit[0] is entry:
        return hit[1]
    return encoded_once(_PAYLOADS, entry, _pack_entry, PAYLOADS_MAX)


def _pack_entry(entry: list) -> bytes:
    return codec.pack([0, entry])


def _refusal(msg: m.Message) -> PeerRefused:
    """An ERROR as node/applier/conn.py's recv raises it."""
    e = PeerRefused(msg["code"], msg["message"])
    e.body = msg.body
    return e


class Links:
    # --- the wire ------------------------------------------------------------------------
    def open_request(self, kind: str, client: "SimNode", server: "SimNode", addr: str = "") -> "Conn":
        """A new link from client to server; its first message (the client's GREETING) sent."""
        c = self._open(kind, client, server, addr)
        c.relay = RelayMachine(RelayHost(server), authenticated=client.uuid, peer=client.name)
        if kind == "sub":
            a = client.appliers[addr]
            c.applier = ApplierMachine(client.core, ApplierHost(client, a), addr, authenticated=server.uuid)
            c.applier.start(shell.greeting(client))
            self._applier_act(c, c.applier.ready())
        else:
            self.send(c, SERVER, m.GREETING, shell.greeting(client))
        return c

    def _deliver(self, c: "Conn", to: str, mtype: int | None, data: bytes | None) -> None:
        if mtype is None:                    # the peer closed the connection (after what it sent)
            return self.break_conn(c, "closed by the relay" if to == CLIENT else "closed by the subscriber")
        scan = None
        if mtype == _ROWS and self.scan_rows_p and self.rng.random() < self.scan_rows_p:
            scan = rowscan.scan_rows if rowscan.native is not None else rowscan.scan_rows_py
        try:
            msg: Any = decode(mtype, data, scan)
        except RemoteProtocolError as e:
            self._count_rpe(e)
            return self.break_conn(c, f"undecodable message: {e}")
        if msg.type == _ERROR:
            msg = _refusal(msg)
        elif msg.type == _ROWS and "scan" in msg.body:
            self.stats["rows messages scanned"] += 1
        if to == SERVER:
            self._relay_step(c, msg)
        elif c.applier is not None:
            self._applier_step(c, msg)
        else:
            self._request_step(c, msg)

    def _count_rpe(self, e: RemoteProtocolError) -> None:
        self.stats["remote_protocol_errors"] += 1
        self.stats["rpe: " + str(e).split(": ", 1)[-1].split(" is ")[-1][:60]] += 1

    # --- relay side (node/applier/relay.py serve_link, stream.py Relay) --------------------------------
    def _relay_step(self, c: "Conn", inp: Any) -> None:
        mach = c.relay
        if mach.state is _RELAY_CLOSED:
            return
        mach.step(inp, self.nodes[c.server].wall_us() / 1e6)
        self._relay_act(c, mach)

    def _relay_act(self, c: "Conn", mach: RelayMachine) -> None:
        rd = mach.ready()
        if rd is EMPTY:                      # nothing to act on (advance of EMPTY is a no-op)
            return
        s, p = self.nodes[c.client], self.nodes[c.server]
        for h in rd.persist:                 # WAL holds, in place before the answer goes
            if type(h) is Persist:           # an own `_cluster` txn (expels a greeting stated)
                p.submit(h.entry.txns)
                self.log(f"{p} expels as {s}'s greeting states: " + ", ".join(
                    o.key[:8] for t in h.entry.txns for o in t.ops))
                continue
            assert type(h) is Hold, h
            if h.anon:                       # Retention.follower, before the hold
                entry = follower_seen(p.anon_followers, h.uuid, s.addr, self.now, self.anon_ttl)
                if entry is not None:
                    p.anon_followers[h.uuid] = entry
                # (past anon_followers_max the driver refuses it: no run has that many)
                assert h.uuid in p.anon_followers, "a follower past anon_followers_max"
                p.reach.opened(h.uuid)       # its link is open in reach until it ends (break_conn)
                c.followed = (p.reach, h.uuid)
            if self.rules["holds"] != "register":
                continue
            if h.durable is None:
                p.hold_all(h.uuid, h.anon, self.now)
            elif p.on_subscribe(h.uuid, h.durable, h.anon, self.now):
                self.log(f"{p}: {s} holds its WAL from {h.durable} (SUBSCRIBE durable)")
        for snd in rd.send:
            if snd.mtype == _ERROR and snd.body["code"] == "need_rejoin":
                missing = behind(mach.sub, p.gc_vclock, expel_bounds_by_id(p.core.table, mach.greeting))
                self.checker.on_need_rejoin(p, s, mach.sub, missing)
                self.log(f"{p} tells {s} to rejoin: components {missing} below {p.gc_vclock} were collected")
            self.send(c, CLIENT, snd.mtype, snd.body)
        for a in rd.apply:
            assert type(a) is AckHold, a
            p.on_ack(a.uuid, a.durable, a.anon, self.now)
        mach.advance(rd)
        for e in rd.effects:
            t = type(e)
            if t is Register:
                self._register(c, s, p)
            elif t is SendSnapshot:
                self._send_snapshot(c, p)
                return self._relay_step(c, SnapshotSent())
            elif t is Stream:
                self._stream(c, s, p, mach)
            else:                            # Stop: the connection closes after what was sent
                self.send(c, CLIENT, None, None)

    def _register(self, c: "Conn", s: "SimNode", p: "SimNode") -> None:
        """Lifecycle.apply_registration: noted beside the identity (fence.remember_registration),
        registered, answered once durable (`_serve_registrations`)."""
        p.registered.add(s.uuid)
        _, txn = p.core.register_member(s.uuid, s.addr, p.wall_us())
        if txn is not None:
            p.submit([txn])
            self.log(f"{p} registers {s} as id {txn.ops[0].value['id']} (lsn {txn.lsn})")
        c.wait_durable = p.submitted if txn is not None else 0
        self.registering.append(c)

    def _serve_registrations(self) -> None:
        """Lifecycle.apply_registration returns once the registration is durable."""
        if not self.registering:
            return
        for c in list(self.registering):
            if not c.open or c.wait_durable is None:
                self.registering.remove(c)
                continue
            s, p = self.nodes[c.client], self.nodes[c.server]
            if p.durable < c.wait_durable:
                continue
            c.wait_durable = None
            self.registering.remove(c)
            self._relay_step(c, Registered(True, p.core.table.id_of(s.uuid)))

    def _send_snapshot(self, c: "Conn", p: "SimNode") -> None:
        """node/applier/stream.py send_snapshot: SNAPSHOT {meta}, SNAPSHOT_ROWS*, SNAPSHOT_END."""
        b = p.snapshot()
        self.send(c, CLIENT, m.SNAPSHOT, {"vclock": b.vclock, "cluster": b.table_rows,
                                          "spaces": {n: {"local": d[0], "conflict": d[1]} for n, d in b.spaces.items()}})
        for space, recs in b.data.items():
            rows = [[k, r] for k, r in recs.items()]
            for i in range(0, len(rows), limits.snapshot_chunk_rows_max):
                self.send(c, CLIENT, m.SNAPSHOT_ROWS, {"space": space, "rows": rows[i:i + limits.snapshot_chunk_rows_max]})
        self.send(c, CLIENT, m.SNAPSHOT_END, {})

    def _stream(self, c: "Conn", s: "SimNode", p: "SimNode", mach: RelayMachine) -> None:
        """Relay.run: one link per subscriber (an older one closes), then rows from the WAL."""
        if self.rules["one_link"]:
            for old in [x for x in self.conns.values() if x.server == p.name and x.client == s.name
                        and x.streaming and x is not c]:
                self.break_conn(old, "replaced by a newer subscription")
        if not mach.anon and not p.lapse and not behind(mach.durable, p.gc_vclock, {}):
            # (what was collected before it ever came cannot be held; on an anonymous node with
            # no row of its own every hold lapses with the TTL: node.core.holds.lapsing)
            self.checker.on_held(p, s)
        c.streaming, c.cursor = True, p.wal_gc
        mach.sent_rows(p.wall_us() / 1e6)

    def _pump_relays(self) -> None:
        """Relay._send_loop, one turn per tick: the entries on disk (or written, wal_mode write)
        past the cursor, as the production filter cuts them, or a heartbeat when due. (A relay's
        node's clock and WAL positions are read once per tick: nothing here writes its WAL.)"""
        nodes = self.nodes
        servers: dict[str, tuple] = {}      # name -> (node, its wall clock in s, applied_pos, durable if write)
        for c in [c for c in self.conns.values() if c.streaming]:
            mach = c.relay
            at = servers.get(c.server)
            if at is None:
                p = nodes[c.server]
                at = servers[c.server] = (p, p.wall_us() / 1e6, p.applied_pos,
                                          p.durable if p.wal_mode == "write" else None)
            p, now, end, on_disk = at
            if on_disk is not None and mach.anon:
                end = on_disk        # an anonymous subscriber of a wal_mode write node gets only rows on disk
            if c.cursor >= end:
                if now >= mach.next_heartbeat_at():     # (the driver's timer: it reads, and asks, first)
                    if self._greeting_holds(c, mach):
                        mach.tick(now, int(now * 1e6))
                    self._relay_act(c, mach)
                continue
            if self.relay_batch_max:
                end = min(end, c.cursor + 1 + int(self.rng.random() * self.relay_batch_max))
            frames = []
            sub, own = mach.sub, mach.own
            for entry in p.wal[c.cursor:end]:
                frame, _ = txns_relay_frame(entry, _payload(entry), 0, sub, own)
                if frame is not None:
                    frames.append(frame)
            c.cursor = end
            if not self._greeting_holds(c, mach):    # Relay._send_loop, after every read
                self._relay_act(c, mach)
                continue
            if frames:
                garble = (c.client, c.server) in self.garble_next_rows
                if garble:
                    self.garble_next_rows.discard((c.client, c.server))
                    frames.append(codec.pack([0, [["not", "a", "txn"]]]))
                for batch in rows_batches(frames):
                    self.send(c, CLIENT, m.ROWS, m.encode_rows(batch))
                mach.sent_rows(now)

    def _greeting_holds(self, c: "Conn", mach: RelayMachine) -> bool:
        """RelayMachine.rows_may_go; when it says no, the link stops streaming (its ERROR
        greet_again is in the machine's Ready)."""
        if mach.rows_may_go():
            return True
        c.streaming = False
        if mach.anon_cut:
            self.stats["links greeted again: their relay registered"] += 1
        return False

    # --- applier side (node/applier/applier.py Applier) -------------------------------------
    def _applier_step(self, c: "Conn", msg: Any) -> None:
        mach = c.applier
        if mach.state is _APPLIER_STOPPED:
            return
        mach.step(msg, self.nodes[c.client].wall_us() / 1e6)
        self._applier_act(c, mach.ready())

    def _applier_act(self, c: "Conn", rd) -> None:
        """Applier._take + _act: persist what the step claimed, then send, apply, effects."""
        mach = c.applier
        if rd is EMPTY and (c.core_peer is not None or mach.core_peer is None):
            return                           # nothing to act on, no greeting newly taken
        s, p = self.nodes[c.client], self.nodes[c.server]
        for x in rd.persist:
            s.submit(x.entry.txns)
        if c.core_peer is None and mach.core_peer is not None:     # the greeting was taken
            c.core_peer = mach.core_peer
            s.greetings += 1
            a = s.appliers[c.addr]
            a.refused, a.peer_vclock = "", mach.peer_vclock
            for x in rd.persist:
                self.log(f"{s} registers from {p}'s greeting: " + ", ".join(
                    f"{o.key[:8]}={o.value['id']}" for t in x.entry.txns for o in t.ops))
        for snd in rd.send:
            if snd.mtype == _ACK:
                core = s.core
                c.acked_sig = core.synced.signature
                if core.claimed.signature != core.synced.signature:
                    self.stats["acks while claimed rows are not on disk"] += 1
            self.send(c, SERVER, snd.mtype, snd.body)
        for x in rd.apply:
            if type(x) is Followed:
                s.appliers[c.addr].status = "follow"
                s.rejoiner.on_follow(c.addr)
            elif type(x) is DisproveClaim:
                shell.disprove_claim(self, s, p, x.have)
        mach.advance(rd)
        stop = rd.stop if rd.effects else None       # (a Ready's stop is one of its effects)
        if stop is not None:
            self._applier_stopped(c, s, stop.error)

    def _applier_stopped(self, c: "Conn", s: "SimNode", e: BaseException | None) -> None:
        """Applier.run: node/applier/outcome.py's after_link maps the link's end to the
        applier's status and next step; the waits are the simulation's (BACKOFF, in ticks)."""
        nxt = after_link(e, 0.0)
        a = c.applier.host.a
        if nxt.status is not None:
            a.status = nxt.status
        if nxt.then == REJOIN:
            s.rejoiner.on_need_rejoin(c.addr, e.message, getattr(e, "needed", {}))
        elif nxt.status == "duplicate":
            s.rejoiner.on_duplicate(c.addr)
        if isinstance(e, PeerRefused):
            self.stats[f"refused_{e.code}"] += 1
            a.refused = e.code
            return self.break_conn(c, f"refused: {e.code}", BACKOFF.get(e.code, 20))
        if isinstance(e, Resubscribe):
            self.stats["resubscribes"] += 1
        elif isinstance(e, RemoteProtocolError):
            self._count_rpe(e)
            self.log(f"{s} <- {c.server}: {e}")
        assert nxt.then != END, f"the applier link to {c.server} failed: {nxt.error}"
        self.break_conn(c, nxt.error or "BYE", 0 if nxt.delay == 0 else None)

    def _acks(self) -> None:
        """Time passes for a following applier whose node applied, synced, lifted its fence
        or took an expel since its last turn (the driver's tick, as Applier._back_pressure
        ticks while the journal works): ACKs of what became applied or durable, and a fresh
        SUBSCRIBE when the fence or an expel bound asks for one. (Nothing else changes what
        a tick would do: an ACK due for time alone goes with the next heartbeat's step.)"""
        keys: dict[str, tuple] = {}
        nodes = self.nodes
        for c in [c for c in self.conns.values() if c.applier is not None and c.applier.state is _FOLLOW]:
            mach = c.applier
            if mach.state is not _FOLLOW or not c.open:      # (an earlier tick's act may stop it)
                continue
            key = keys.get(c.client)
            if key is None:
                core = nodes[c.client].core
                key = keys[c.client] = (core.vclock.signature, core.synced.signature, core.expel_epoch, core.fence is None)
            if key != c.tick_key:
                c.tick_key = key
                mach.tick(nodes[c.client].wall_us() / 1e6)
                self._applier_act(c, mach.ready())
