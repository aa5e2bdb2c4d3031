"""The replication protocol as the simulated cluster speaks it: the message handlers of both
ends of a link (a mixin of tests/sim/harness.Cluster). Each handler copies the shell function
it names; the rules are the core's (NodeCore, node.core.membership, node.core.replicaset).

Conversation on a link (one Conn; each direction FIFO):
  C: HELLO {greeting}        S: GREETING {greeting}  (SUBSCRIBE links) | refusal
  C: SUBSCRIBE {vclock, durable, own_rows}   S: SUBSCRIBED, then ROWS ... | need_rejoin {collected}
  C: ACK {durable}           (the subscriber's on-disk vclock in the relay's ids)
  S: HEARTBEAT               (caught up: every row of the subscriber's its greeting claimed was sent)
  JOIN / rejoin / FETCH / REGISTER links: HELLO, then SNAPSHOT or REGISTERED.
Greetings in both directions carry the sender's vclock by uuid and `_cluster`: the own-rows
fence hears them (shell.observe).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core import codec, rowscan
from node.core import messages as m
from node.core.replicaset import relay_wants
from node.core.vclock import VClock
from node.core.rows import GROUP_CLUSTER, Txn, txn_from_wire
from node.core.entry import PackedEntry
from node.errors import RemoteProtocolError
from node.core.link.relay import behind
from tests.sim import shell
from tests.sim.simnode import Base

if TYPE_CHECKING:
    from tests.sim.harness import Conn
    from tests.sim.simnode import SimNode

CLIENT, SERVER = "client", "server"
ACK_EVERY = 40        # ticks: an ACK goes at least this often on a streaming link (heartbeat_interval_s)
ACK_INTERVAL_MAX = 6  # ticks: a streaming applier considers an ACK every 1..this (ack_interval_s)
HEARTBEAT_TICKS = 2   # ticks between a caught-up relay's heartbeats (heartbeat_interval_s)


class Protocol:
    # --- relay side ----------------------------------------------------------------------
    def _on_server(self, c: "Conn", s: "SimNode", p: "SimNode", kind: str, body: Any) -> None:
        core = p.core
        if kind == "HELLO":                  # relay.serve_link
            if core is None:
                return self._refuse(c, "not_ready", 2)
            if body["uuid"] == p.uuid:
                return self._refuse(c, "self", 20)        # check_greeting
            shell.observe(p, body)                        # check_peer_greeting
            c.sub_anon = bool(body.get("anon"))
            me = core.table.get(s.uuid)
            if me is not None and me.state == STATE_EXPELLED:
                return self._refuse(c, "expelled", 20)
            if c.kind == "sub":
                self.send(c, CLIENT, "GREETING", shell.greeting(p))
            elif c.kind in ("join", "register", "rejoin"):
                if core.anon:
                    return self._refuse(c, "anon", 5)
                if p.status != "running":
                    return self._refuse(c, "not_ready", 2)
                known = core.table.get(s.uuid)
                if core.fence is not None and (known is None or known.state != STATE_MEMBER):
                    return self._refuse(c, "not_ready", 2)   # a fenced node registers nobody new
                p.registered.add(s.uuid)      # fence.remember_registration, before it is answered
                _, txn = core.register_member(s.uuid, s.addr, p.wall_us())
                if txn is not None:
                    p.submit([txn])
                    self.log(f"{p} registers {s} as id {txn.ops[0].value['id']} (lsn {txn.lsn})")
                # the relay awaits the registration's durability, or nothing if it had none
                c.wait_durable = p.submitted if txn is not None else 0
            else:
                c.wait_durable = 0
        elif kind == "SUBSCRIBE":            # Relay.run
            sub = {int(k): v for k, v in body["vclock"].items()}
            missing = behind(sub, p.gc_vclock)
            if missing:
                self.checker.on_need_rejoin(p, s, sub, missing)
                self.log(f"{p} tells {s} to rejoin: components {missing} below {p.gc_vclock} were collected")
                # the collected rows by uuid: the subscriber asks whether another upstream has them
                return self._refuse(c, "need_rejoin", shell.REJOIN_RETRY, core.vclock_by_uuid(VClock(p.gc_vclock)))
            me = core.table.get(s.uuid)      # its own rows past this cut are not echoed back ...
            c.own = (me.id, core.vclock.get(me.id)) if me is not None and me.state != STATE_ANON else None
            if body.get("own_rows"):
                c.own = None                 # ... unless it is fenced and wants them back
            durable = {int(k): v for k, v in body["durable"].items()}
            if self.rules["holds"] == "register" and p.on_subscribe(s.uuid, durable, c.sub_anon, self.now):
                self.log(f"{p}: {s} holds its WAL from {durable} (SUBSCRIBE durable)")
            if not c.sub_anon and not behind(durable, p.gc_vclock):
                self.checker.on_held(p, s)      # (what was collected before it ever came cannot be held)
            if self.rules["one_link"]:
                for old in [x for x in self.conns.values() if x.server == p.name and x.client == s.name
                            and x.streaming and x is not c]:
                    self.break_conn(old, "replaced by a newer subscription")
            c.streaming, c.cursor, c.sub_vclock = True, p.wal_gc, sub
            self.send(c, CLIENT, "SUBSCRIBED", None)
        elif kind == "ACK":                  # Relay._recv_loop -> Retention.on_ack
            if c.streaming:
                p.on_ack(s.uuid, {int(k): v for k, v in body.items()}, c.sub_anon, self.now)
        else:
            raise AssertionError(kind)

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
                continue
            # relay.serve_link: the joiner holds all that is here before its snapshot is read,
            # until it subscribes and says where it is (it may take its snapshot elsewhere)
            if self.rules["holds"] == "register":
                p.hold_all(s.uuid, c.kind == "fetch", self.now)
            b = p.snapshot()
            self.send(c, CLIENT, "SNAPSHOT", {"table": b.table_rows, "vclock": b.vclock,
                                              "spaces": b.spaces, "data": b.data})

    def _pump_relays(self) -> None:
        for c in list(self.conns.values()):
            if not c.streaming:
                continue
            p = self.nodes[c.server]
            # an anonymous subscriber of a wal_mode write node gets only rows on disk
            end = p.durable if c.sub_anon and p.wal_mode == "write" else p.applied_pos
            if c.cursor >= end:
                # caught up: it heartbeats (only until the subscriber has checked its peer's claim:
                # the simulation sends no heartbeat that changes nothing)
                if not c.claim_checked and self.now >= c.hb_at:
                    c.hb_at = self.now + HEARTBEAT_TICKS
                    self.send(c, CLIENT, "HEARTBEAT", None, delay=1)
                continue
            if self.relay_batch_max:
                end = min(end, c.cursor + 1 + int(self.rng.random() * self.relay_batch_max))
            frames = []
            for entry in p.wal[c.cursor:end]:
                keep = [w for w in (t.to_wire() for t in entry) if relay_wants(w, c.sub_vclock, c.own)]
                if keep:
                    frames.append(keep)
            c.cursor = end
            if frames:
                self.send(c, CLIENT, "ROWS", frames)

    # --- applier side --------------------------------------------------------------------------
    def _acks(self) -> None:
        """Applier._stream: an ACK with the applied and the on-disk vclock, in the relay's ids."""
        now = self.now
        for c in list(self.conns.values()):
            if not c.streaming or c.ack_at > now:
                continue
            c.ack_at = now + 1 + int(self.rng.random() * ACK_INTERVAL_MAX)
            s, p = self.nodes[c.client], self.nodes[c.server]
            core = s.core
            rule = self.rules["ack"]         # "durable"; "applied", "claimed": the rules it must not be
            acked = core.synced if rule == "durable" else core.vclock if rule == "applied" else core.claimed
            sig = acked.signature
            if sig != c.acked_sig or now - c.acked_at >= ACK_EVERY:
                c.acked_sig, c.acked_at = sig, now
                d = core.ack_durable(p.uuid) if rule == "durable" else core.ack_vclock(p.uuid) \
                    if rule == "applied" else core.peers[p.uuid].map.vclock_to_peer(acked)
                if core.claimed.signature != core.synced.signature:
                    self.stats["acks while claimed rows are not on disk"] += 1
                self.send(c, SERVER, "ACK", d.to_dict())

    def _on_client(self, c: "Conn", s: "SimNode", p: "SimNode", kind: str, body: Any) -> None:
        if kind == "GREETING":               # Applier.run_once
            shell.observe(s, body)
            a = s.appliers[c.addr]
            owner = s.followers.get(p.uuid)
            if self.rules["one_link"] and owner is not None and owner != c.addr:     # Applier.claim
                self.stats["refused_duplicate"] += 1
                a.refused = a.status = "duplicate"
                return self.break_conn(c, f"duplicate: {p} is already followed through {owner}", 20)
            s.followers[p.uuid] = c.addr
            s.greetings += 1
            a.peer_vclock = dict(body["vclock_uuid"])
            regs = s.core.greeting(p.uuid, body["cluster"], s.wall_us(), body["own_history_lsn"])
            c.core_peer = s.core.peers[p.uuid]
            for t in regs:
                s.submit([t])
                self.log(f"{s} registers from {p}'s greeting: " + ", ".join(
                    f"{o.key[:8]}={o.value['id']}" for o in t.ops))
            a.refused = ""
            c.expel_epoch = s.core.expel_epoch
            c.fenced = s.core.fence is not None       # then only our own rows (subscribe_vclock)
            sub = s.core.subscribe_vclock(p.uuid, body["vclock_uuid"] if c.fenced else None, body["cluster"])
            # durable: what it has on disk (the relay holds its WAL from there); own_rows: fenced,
            # it wants its own rows back past the relay's own-rows cut
            self.send(c, SERVER, "SUBSCRIBE", {"vclock": sub.to_dict(), "durable": s.core.ack_durable(p.uuid).to_dict(),
                                               "own_rows": c.fenced})
        elif kind == "HEARTBEAT":            # Applier._stream: the relay sent all it held
            if not c.claim_checked and not s.pending:
                c.claim_checked = True
                shell.check_claim(self, s, p)
        elif kind == "SUBSCRIBED":
            a = s.appliers[c.addr]
            a.status = "follow"
            s.rejoiner.on_follow(c.addr)
        elif kind == "ROWS":
            self._on_rows(c, s, p, body)
        elif kind == "SNAPSHOT":
            self.break_conn(c, "snapshot received (BYE)", 0)
            base = Base(body["table"], {int(k): v for k, v in body["vclock"].items()},
                        {k: tuple(v) for k, v in body["spaces"].items()}, body["data"])
            if c.kind == "rejoin" or (s.rejoiner is not None and s.rejoiner.conn is c):
                s.rejoiner.snapshot = base       # node/rejoin.py receive_snapshot
                return
            self._install_snapshot(c, s, p, base)
        elif kind == "REGISTERED":
            self.break_conn(c, "registered (BYE)", 0)
            _, txn = s.core.register_member(s.uuid, s.addr, s.wall_us())
            if txn is not None:
                s.submit([txn])
            s.anon, s.proc = False, ""
            s.identity_active = True
            self.stats["anon_registrations"] += 1
            self.log(f"{s} registered via {p}; its own id stays {s.core.self_id}")
            self._on_member(s)
        else:
            raise AssertionError(kind)

    def _install_snapshot(self, c: "Conn", s: "SimNode", p: "SimNode", base: Base) -> None:
        """Node._fetch_snapshot: JOIN (a member; fenced if its uuid wrote before) or FETCH."""
        if c.kind == "join":
            me = next((r for r in base.table_rows if r[0] == s.uuid), None)
            if me is None:
                self.stats["join_unregistered_snapshot"] += 1
                self.log(f"{s}: {p}'s snapshot does not register it; retrying")
                return
            existed = s.identity_active or bool(base.vclock.get(me[1]))
            s.meta = {"running": True}
            if existed and self.rules["fence"]:
                shell.set_fence(s, f"{s.uuid} rejoined with an empty store", kind="rejoin")
                self.stats["fenced_joins"] += 1
            s.install(base)
            s.gc_vclock = {k: v for k, v in base.vclock.items() if k}   # a subscriber behind it rejoins
            s.identity_active = True            # Lifecycle.go_active -> mark_active
            self.checker.on_held(p, s)          # joined through p (a rebuild's once swapped in)
        else:
            tbl = ClusterTable(Member.from_row(r) for r in base.table_rows)
            base.table_rows.append([s.uuid, tbl.lowest_free_id(), s.addr, STATE_ANON, 0])
            s.meta = {"running": True}
            s.install(base)
            s.gc_vclock = {k: v for k, v in base.vclock.items() if k}
        s.rejoiner = shell.Rejoiner(self, s)
        s.proc = ""
        s.donor_uuid, s.installed_at = p.uuid, self.now
        self.stats["joins" if c.kind == "join" else "anon_fetches"] += 1
        self.log(f"{s} {'joined' if c.kind == 'join' else 'fetched a snapshot'} via {p}: "
                 f"id {s.core.self_id}, vclock {s.core.vclock}" + (" (fenced)" if s.core.fence else ""))
        self.checker.on_install(s)
        self._on_member(s)

    def _on_rows(self, c: "Conn", s: "SimNode", p: "SimNode", body: Any) -> None:
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
                    self._count_rpe(e)
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

    def _count_rpe(self, e: RemoteProtocolError) -> None:
        self.stats["remote_protocol_errors"] += 1
        self.stats["rpe: " + str(e).split(": ", 1)[-1].split(" is ")[-1][:60]] += 1

    def _receive_scanned(self, c: "Conn", s: "SimNode", p: "SimNode", body: Any) -> bool:
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
            self._count_rpe(e)
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
