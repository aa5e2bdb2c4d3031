"""The faults a simulated cluster suffers (a mixin of tests/sim/harness.Cluster): process
kills and power losses, a store and WAL lost with the identity kept, a member down for good,
restarts, expels, peer-list changes and partitions. Each copies what the shell does around it
(server.start for a restart: the store opened, then the join machine's exchange of a store
before it goes active, tests/sim/joins.py; server.expel, Node.configure_peers); the checkers
hear of every loss first (tests/sim/checkers.py), so they can tell what may be gone from what
must not.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from node.cluster_space.table import STATE_EXPELLED
from node.core.lifecycle_fence import give_up
from tests.sim import shell

if TYPE_CHECKING:
    from tests.sim.harness import Cluster


class Faults:
    def crash(self: "Cluster", name: str, power: bool = True) -> None:
        """The process dies. `power`: the machine lost power too (whatever is not on disk is
        gone); else a kill, which in wal_mode write keeps what was written (in fsync mode the
        simulation always loses the unsynced tail: the stronger fault)."""
        n = self.node(name)
        if not n.up:
            return
        if n.base is not None:
            self.checker.check_node(n)        # what it did since the last tick, while it has a state
        self.stats["crashes"] += 1
        self._count_crash_windows(n)
        for c in list(self.conns.values()):
            if c.client == n.name or c.server == n.name:
                if c.server == n.name:
                    c.followed = None         # a process that dies writes no follower's entry: it stays linked
                self.break_conn(c, f"{n.name} crashed")
        if power or n.wal_mode == "fsync":
            self.checker.on_power_loss(n)
            lost = n.lose_power()
        else:
            lost = len(n.queue)
            n.queue.clear()
            n.durable = len(n.wal)
        self.log(f"{n} {'loses power' if power else 'is killed'}, losing {lost} entries not on disk")
        self.stats["lost_entries"] += lost
        n.up = False
        n.state, n.core, n.rejoiner = None, None, None
        n.joiner, n.polls = None, {}          # a join under way starts over with the process
        if n.proc == "start":                 # (and so does a start's exchange)
            n.proc = ""
        n.joining.clear()
        n.own_claims, n.claims_disproved = {}, set()
        n.status, n.in_effect = "running", None
        n.followers.clear()
        for a in n.appliers.values():
            a.status = ""

    def _count_crash_windows(self: "Cluster", n) -> None:
        """Which windows of the asynchronous journal and the links a crash fell into (the
        faults test asserts each is reached): rows claimed and not yet on disk; rows on disk
        that a relay has not sent yet; a registration on disk whose snapshot or answer is not
        sent yet (the donor's side of a JOIN); rows the node received and has on disk but has
        not acknowledged."""
        if n.core is None:
            return
        if n.queue or len(n.wal) > n.durable:
            self.stats["crash: claimed, not on disk"] += 1
        mine = [c for c in self.conns.values() if c.server == n.name]
        if any(c.streaming and c.cursor < n.durable for c in mine):
            self.stats["crash: on disk, not sent"] += 1
        if any(c.wait_durable is not None and n.durable >= c.wait_durable for c in mine):
            self.stats["crash: registration on disk, not answered"] += 1
        if any(c.client == n.name and c.streaming and c.acked_sig != n.core.synced.signature
               for c in self.conns.values()):
            self.stats["crash: on disk, not acknowledged"] += 1

    def lose_disk(self: "Cluster", name: str) -> None:
        """A member's store and WAL are lost (its identity file is kept): it restarts empty and
        joins again under its uuid."""
        n = self.node(name)
        assert not n.anon and n.base is not None
        self.crash(name)
        self.checker.on_disk_loss(n)
        n.lose_disk()
        self.stats["disks_lost"] += 1
        self.log(f"{n} loses its store and WAL (its identity is kept)")

    def retire(self: "Cluster", name: str) -> None:
        """A member goes down for good (the operator will expel it)."""
        self.crash(name)
        self.node(name).retired = True
        self.log(f"{name} is down for good")

    def restart(self: "Cluster", name: str) -> None:
        n = self.node(name)
        if n.up or n.retired:
            return
        n.up = True
        if n.base is not None:
            loss = shell.loss_at_open(n) if self.rules["fence"] else None
            if loss is not None:                # server.start: fenced (not rebuilt) once the store is open
                shell.set_fence(n, loss, kind="power")
                self.stats["fenced_restarts"] += 1
            n.power_lost = False
            n.meta["running"] = True
            n.recover()
            n.rejoiner = shell.Rejoiner(self, n)
            self.checker.on_restart(n)
            if not n.anon and n.core.anon:
                # server._start_replication: an anonymous replica started without --anon registers
                # (its own row lost in a crash after it registered: the exchange is idempotent)
                self._start_proc(name, "register", None)
            elif not n.anon:
                self.initialize_from_store(n)      # server._start_replication: the exchange, then active
        elif n.identity_active and not n.proc:
            n.proc, n.proc_via = "join", None      # an empty store and an identity: join again
        for a in n.appliers.values():
            a.retry_at = self.now
        n.proc_retry_at = self.now
        self.log(f"{n} restarts at vclock {n.core.vclock if n.core else '-'}"
                 + (" (fenced)" if n.core is not None and n.core.fence is not None else ""))

    def expel(self: "Cluster", name: str, via: str) -> bool:
        """Expel `name` through `via` (server.expel). On a fenced node that cannot lift its fence
        now, the expel is pending (202): the fence stops waiting for the member at once
        (FenceKeeper.give_up) and the expel row is written once the fence lifts (after_fence)."""
        x, m = self.node(name), self.node(via)
        assert m.ready and not m.core.anon
        if m.status != "running":
            self.stats["refused_expel_not_running"] += 1
            return False
        core = m.core
        if core.table.get(x.uuid) is None and (core.fence is None or x.uuid not in core.fence.waiting_for(core.table, m.uuid)):
            return False                       # 404 no_such_member
        if core.fence is not None and not shell.try_lift(self, m):
            m.meta["given_up"] = give_up(core.fence, m.meta.get("given_up"), x.uuid)
            self.stats["expels_pending_fence"] += 1
            self.log(f"{m} is fenced: it gives up waiting for {x}, its expel is written once the fence lifts")
        else:
            _, txn = core.register_member(x.uuid, x.addr, m.wall_us(), state=STATE_EXPELLED)
            if txn is not None:
                m.submit([txn])
                m.flush()                          # server.expel answers once its row is on disk
            self.log(f"{m} expels {x}")
            for c in list(self.conns.values()):   # server.expel closes its relays to the member
                if c.server == m.name and c.client == x.name:
                    self.break_conn(c, "expelled")
        if x.uuid not in self.expelled:
            self.expelled.append(x.uuid)
            self.expelled_at[x.uuid] = self.now
            self.checker.on_expel(x)
        return True

    def configure_peers(self: "Cluster", name: str, peers: list[str]) -> None:
        """Node.configure_peers (PUT /v1/admin/peers): duplicates collapse. A node still joining
        polls them from its join's next round instead of those it was started with (node/http/api.py
        put_peers; seeds 216015 and 221128 of the full+replace mix: a fence waited for a joiner
        that could join only through a member it was not started with)."""
        n = self.node(name)
        n.peers = list(dict.fromkeys(peers))
        n.join_peers = []
        self.stats["peer_changes"] += 1
        self.log(f"{n} peers := {n.peers}")

    # --- the network ----------------------------------------------------------------------
    def cut(self: "Cluster", a: str, b: str) -> None:
        self.partition([a], [b])

    def partition(self: "Cluster", *groups: list[str]) -> None:
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

