"""The replication protocol as the simulated cluster speaks it: the message handlers of both
ends of a link (a mixin of tests/sim/harness.Cluster). Each handler copies the shell function
it names; the rules are the core's (NodeCore, node.core.membership, node.core.replicaset).

Conversation on a link (one Conn; each direction FIFO):
  C: HELLO {greeting}        S: GREETING {greeting}  (SUBSCRIBE links) | refusal
  C: SUBSCRIBE {vclock}      S: SUBSCRIBED, then ROWS ... | need_rejoin
  C: ACK {durable}           (the subscriber's on-disk vclock in the relay's ids)
  JOIN / rejoin / FETCH / REGISTER links: HELLO, then SNAPSHOT or REGISTERED.
Greetings in both directions carry the sender's vclock by uuid and `_cluster`: the own-rows
fence hears them (shell.observe).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from node.cluster_space.idmap import IdMap
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, ClusterTable, Member
from node.core import codec, rowscan
from node.core import messages as m
from node.core.replicaset import relay_wants
from node.core.vclock import VClock
from node.core.rows import GROUP_CLUSTER, Txn, txn_from_wire
from node.core.rowscan import PackedEntry
from node.errors import RemoteProtocolError
from node.wal.gc import behind
from tests.sim import shell
from tests.sim.simnode import Base

if TYPE_CHECKING:
    from tests.sim.harness import Conn
    from tests.sim.simnode import SimNode

CLIENT, SERVER = "client", "server"
ACK_EVERY = 40        # ticks: an ACK goes at least this often on a streaming link (heartbeat_interval_s)
ACK_INTERVAL_MAX = 6  # ticks: a streaming applier considers an ACK every 1..this (ack_interval_s)


class _NoLearn(IdMap):
    def learn(self, peer_id: int, local_id: int) -> None:
        pass


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
                known = core.table.get(s.uuid) is not None and c.kind != "register"
                if p.status != "running" or (core.fence is not None and not (
                        known and "fenced_donor_for_known" in self.workarounds)):
                    return self._refuse(c, "not_ready", 2)   # a fenced node registers nobody
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
            if "expelled_not_uncovered" in self.workarounds:   # rows past the bound are refused anyway
                missing = [rid for rid in missing if (m := core.table.by_id(rid)) is None or
                           m.state != STATE_EXPELLED or sub.get(rid, 0) < m.expelled_lsn]
            if missing:
                self.checker.on_need_rejoin(p, s, sub, missing)
                self.log(f"{p} tells {s} to rejoin: components {missing} below {p.gc_vclock} were collected")
                collected = sorted(u for rid in missing if (u := core.table.uuid_of(rid)) is not None)
                return self._refuse(c, "need_rejoin", shell.REJOIN_RETRY, collected)
            me = core.table.get(s.uuid)      # its own rows past this cut are not echoed back
            c.own = (me.id, core.vclock.get(me.id)) if me is not None and me.state != STATE_ANON else None
            if body.get("fenced") and "fenced_no_own_cut" in self.workarounds:
                c.own = None                 # the workaround: a fenced subscriber wants its own rows back
            hold = {int(k): v for k, v in body["durable"].items()} if "hold_at_durable" in self.workarounds else sub
            if self.rules["holds"] == "register" and p.hold_from(s.uuid, hold, c.sub_anon, self.now):
                self.log(f"{p}: {s} holds its WAL from {hold} (first SUBSCRIBE)")
            elif "hold_at_durable" in self.workarounds:
                p.lower_hold(s.uuid, hold)        # a JOIN whose snapshot it never took held too high
            if not c.sub_anon:
                self.checker.on_held(p, s)
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
            # relay.serve_link: the joiner's hold exists before its snapshot is read
            hold = {k: v for k, v in p.state.vclock.items() if k}
            if c.kind == "rejoin" and "hold_at_durable" in self.workarounds and s.core is not None:
                # a rebuild may not complete: hold from what the member has on disk (it would say so)
                durable = s.core.vclock_by_uuid(s.core.synced)
                hold = {rid: durable.get(u, 0) for rid in hold if (u := p.core.table.uuid_of(rid)) is not None}
            if self.rules["holds"] == "register":
                p.hold_from(s.uuid, hold, c.kind == "fetch", self.now)
            b = p.snapshot()
            self.send(c, CLIENT, "SNAPSHOT", {"table": b.table_rows, "vclock": b.vclock,
                                              "spaces": b.spaces, "data": b.data})

    def _pump_relays(self) -> None:
        for c in list(self.conns.values()):
            if not c.streaming:
                continue
            p = self.nodes[c.server]
            end = p.applied_pos
            if c.cursor >= end:
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
            durable = self.rules["ack"] == "durable"
            sig = (core.synced if durable else core.vclock).signature
            if sig != c.acked_sig or now - c.acked_at >= ACK_EVERY:
                c.acked_sig, c.acked_at = sig, now
                d = core.ack_durable(p.uuid) if durable else core.ack_vclock(p.uuid)
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
            regs = s.core.greeting(p.uuid, body["cluster"], s.wall_us())
            c.core_peer = s.core.peers[p.uuid]
            for t in regs:
                s.submit([t])
                self.log(f"{s} registers from {p}'s greeting: " + ", ".join(
                    f"{o.key[:8]}={o.value['id']}" for o in t.ops))
            a.refused = ""
            c.expel_epoch = s.core.expel_epoch
            c.fenced = s.core.fence is not None       # then only our own rows (subscribe_vclock)
            sub = s.core.subscribe_vclock(p.uuid, body["vclock_uuid"] if c.fenced else None)
            if c.fenced and "fenced_skip_unknown" in self.workarounds:
                # the workaround: members the relay has and this node does not (it registers nobody
                # while fenced) are asked from where the relay is, like every other origin
                sub = sub.to_dict()
                for row in body["cluster"]:
                    if s.core.table.get(row[0]) is None and row[0] != s.uuid:
                        sub[row[1]] = body["vclock_uuid"].get(row[0], 0)
                sub = VClock(sub)
            # (the workarounds "hold_at_durable" and "fenced_no_own_cut" read `durable` and
            # `fenced`: the relay holds its WAL from what the subscriber has on disk, and sends a
            # fenced subscriber its own rows that arrive after it subscribed)
            self.send(c, SERVER, "SUBSCRIBE", {"vclock": sub.to_dict(), "durable": s.core.ack_durable(p.uuid).to_dict(),
                                               "fenced": c.fenced})
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
            if "join_sets_gc_vclock" in self.workarounds:      # as Rejoiner._carry_over does
                s.gc_vclock = {k: v for k, v in base.vclock.items() if k}
            if existed and self.rules["fence"]:
                shell.set_fence(s, f"{s.uuid} rejoined with an empty store", kind="rejoin")
                self.stats["fenced_joins"] += 1
            s.install(base)
            s.identity_active = True            # Lifecycle.go_active -> mark_active
            self.checker.on_held(p, s)          # joined through p (a rebuild's once swapped in)
        else:
            tbl = ClusterTable(Member.from_row(r) for r in base.table_rows)
            base.table_rows.append([s.uuid, tbl.lowest_free_id(), s.addr, STATE_ANON, 0])
            s.meta = {"running": True}
            s.install(base)
            if "join_sets_gc_vclock" in self.workarounds:
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
                    if "fenced_self_expel" in self.workarounds and s.core.fence is not None and \
                            txn.group == GROUP_CLUSTER and any(o.key == s.uuid and o.value.get("state") ==
                                                               STATE_EXPELLED for o in txn.ops):
                        raise RemoteProtocolError(f"row {txn.replica_id}:{txn.lsn} expels this fenced node: "
                                                  "taken after the fence (the workaround)")
                    if txn.group == GROUP_CLUSTER and "peer_history_ids" in self.workarounds and \
                            txn.lsn <= shell.history_bound(p):
                        out = self._receive_history(s, p, txn)
                    else:
                        out = s.core.receive(p.uuid, txn, s.wall_us())
                except RemoteProtocolError as e:
                    self._count_rpe(e)
                    self.log(f"{s} <- {p}: {e}" + (f"; {len(entry)} claimed txns queued first" if entry else ""))
                    if entry:                # as applier.py: claimed rows always reach the WAL
                        s.submit(entry)
                    return self.break_conn(c, "remote protocol error")
                if not out:
                    continue
                if txn.group == GROUP_CLUSTER and "replay_own_rows" in self.workarounds:
                    self._own_rows_back(s, out)
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

    def _own_rows_back(self, s: "SimNode", out: list[Txn]) -> None:
        """The workaround "replay_own_rows": after a power loss the store is the same, so its own
        `_cluster` rows coming back from peers are its own (not history): they state its table."""
        core = s.core
        if core.fence is None or s.meta.get("fence_kind") != "power" or out[0].replica_id != core.self_id:
            return
        for op in out[0].ops:
            v = op.value
            if core.table.get(op.key) is None and core.table.by_id(int(v["id"])) is None:
                core.table.upsert(Member(op.key, int(v["id"]), str(v.get("address") or ""), str(v["state"]),
                                         out[0].lsn, int(v.get("expelled_lsn") or 0)))

    def _receive_history(self, s: "SimNode", p: "SimNode", txn: Txn) -> list[Txn]:
        """The workaround "peer_history_ids": a `_cluster` row of the relay's earlier incarnation
        (at or below its history bound, which the fix would have the relay tell) is received, but
        teaches nothing about the relay's ids."""
        peer = s.core.peers[p.uuid]
        real = peer.map
        if s.core.table.uuid_of(real.to_local.get(txn.replica_id, -1)) != p.uuid:
            return s.core.receive(p.uuid, txn, s.wall_us())       # not the relay's own row
        peer.map = _NoLearn()
        peer.map.to_local, peer.map.to_peer = real.to_local, real.to_peer
        try:
            return s.core.receive(p.uuid, txn, s.wall_us())
        finally:
            peer.map = real

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
