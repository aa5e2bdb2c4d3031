"""The node process: the state its parts share, the parts, and their lifecycle in one order.

Start-up:  lease slot (identity = lease) -> lock the data dir -> identity files -> open the
           store and recover the WAL (opening.py) -> serve HTTP (and the binary client
           protocol) -> background loops -> bootstrap / join / subscribe (appliers).
Shutdown:  the same, backwards, each step under a deadline; errors are collected.

Rules kept here:
- The process makes no protocol decisions: it asks the core and its parts, and performs the
  effects. Each part receives the process through its port (node/process/ports.py) and reads
  nothing else of it; the names a port declares are the names below.
- The shared state (store, core, journal, status, links) is plain attributes; who may write
  which is said in docs/architecture.md ("The process wing")."""
from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import logging
import os
import time

import aiohttp
from aiohttp import web

from node import limits
from node.applier.accept import LinkGuard
from node.cluster_shutdown import ClusterShutdown
from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER
from node.config import Config, plaintext_exposure
from node.core.lifecycle_fence import expels_after_lift
from node.core.replicaset import NodeCore
from node.errors import ConfigError
from node.faults import install_fault_points
from node.fence import FenceKeeper
from node.identity.identity_file import IdentityFileError
from node.identity.lease_handover import hand_over
from node.journal import Journal
from node.join import Aborted, Join
from node.lifecycle import Lifecycle
from node.process import views
from node.process.followers import FollowerAdmin
from node.process.opening import Opening
from node.process.peering import Peering
from node.process.tasks import Tasks
from node.process.writes import Writes
from node.rejoin import Rejoiner
from node.retention import Retention
from node.storage.space import SpaceWatch
from node.storage.store import Store

log = logging.getLogger("replog.node")


def tune_gc() -> None:
    """After start-up, before appliers and client load: what exists now lives as long as
    the process, so freeze it (never scanned again), and make young collections rare
    (node/limits.py says why)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(limits.gc_gen0_objects, limits.gc_gen1_collections, limits.gc_gen2_collections)


class Node:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.data_dir = os.path.abspath(cfg.data_dir)
        self.wal_dir = os.path.join(self.data_dir, "wal")
        # set by the opening part only (node/process/opening.py)
        self.store: Store | None = None
        self.core: NodeCore | None = None
        self.journal: Journal | None = None
        self.uuid = ""
        self.status = "loading"
        self.status_reason = "opening the store"
        self.fatal: BaseException | None = None
        self.stopped = asyncio.Event()
        self.started_at = time.time()
        self.appliers: dict = {}     # peer address -> Applier (set_peers)
        self.followers: dict = {}    # member uuid -> the one applier linked to it (claims.claim_link)
        self.relays: set = set()     # subscribed relays (node/applier/relay.py)
        self.links: set = set()      # every inbound replication link, from accept (relays: subscribed ones)
        self.links_refused: str | None = None   # why inbound links are refused now (a rebuilt store swapped in)
        self.link_guard = LinkGuard()    # bounds on links still in their handshake (node/applier/accept.py)
        self.http_session: aiohttp.ClientSession | None = None
        self.client_server = None    # the binary client protocol's listener (node/clientproto/listener.py)
        self.backups: list = []      # node.ops.backup.BackupJob in progress (POST /v1/admin/backup)
        self.lease = None            # node.identity.lease_node.LeaseIdentity when identity = "lease"
        self._runner: web.AppRunner | None = None
        # the NOSPACE alarm: writes refused with 507 while the disk or the map is full (node/storage/space.py)
        self.space = SpaceWatch([], cfg.disk_reserve_bytes, lambda: self.store)

        # --- the parts; each gets this process through its port ---
        self.tasks = Tasks(self.on_fatal)                # every background task
        self.opening = Opening(self)                     # store, core, journal: opened here only
        self.peering = Peering(self, cfg.peers)          # greetings, claims on our rows, appliers
        self.writes = Writes(self)                       # client writes, `_cluster` rows, read-your-writes
        self.life = Lifecycle(self)                      # identity files, status exchange (node/lifecycle.py)
        self.join = Join(self, self.life)                # join, found, register (node/join.py)
        self.cluster_shutdown = ClusterShutdown(self)    # orderly cluster shutdown (node/cluster_shutdown.py)
        self.retention = Retention(self)                 # who holds the WAL; checkpoints (node/retention.py)
        self.fence = FenceKeeper(self)                   # own-rows fence after a loss (node/fence.py)
        self.rejoiner = Rejoiner(self)                   # need_rejoin answers and safe rebuilds (node/rejoin.py)
        self.follower_admin = FollowerAdmin(self)        # the operator's view of the anonymous followers

        # --- the names the ports declare, served by the parts ---
        t, p, w = self.tasks, self.peering, self.writes
        self.spawn, self.supervise, self.note_failure = t.spawn, t.supervise, t.note_failure
        self.task_failures = t.failures                  # task name -> {"failures", "error"}
        self.greeting, self.check_peer_greeting = p.greeting, p.check_peer_greeting
        self.twin_refused, self.run = p.twin_refused, p.run
        self.disprove_claim, self.own_rows_awaited = p.disprove_claim, p.own_rows_awaited
        self.own_rows_unheeded = p.own_rows_unheeded
        self.set_peers, self.configure_peers = p.set_peers, p.configure_peers
        self.write_check, self.replicated_write_check = w.write_check, w.replicated_write_check
        self.ack_check = w.ack_check
        self.refuse_without_room, self.write, self.expel = w.refuse_without_room, w.write, w.expel
        self.register_member = w.register_member
        self.vclock_uuid, self.has_applied, self.wait_applied = w.vclock_uuid, w.has_applied, w.wait_applied
        self.reopen_after_rejoin = self.opening.reopen_after_rejoin
        self.followers_view, self.forget_followers = self.follower_admin.view, self.follower_admin.forget
        self.allow_rejoin_discard = self.rejoiner.allow_discard

    # --- state the parts keep ------------------------------------------------------------------
    @property
    def peers(self) -> list[str]:
        """The replication sources in effect (PUT /v1/admin/peers; node/reload.py before start)."""
        return self.peering.peers

    @peers.setter
    def peers(self, peers: list[str]) -> None:
        self.peering.peers[:] = peers

    @property
    def own_claims(self) -> dict[str, tuple[int, str]]:
        return self.peering.own_claims

    @property
    def claims_disproved(self) -> set[str]:
        return self.peering.claims_disproved

    @property
    def options_digest(self) -> str:
        return hashlib.sha256(json.dumps(self.cfg.must_match(), sort_keys=True).encode()).hexdigest()[:16]

    @staticmethod
    def wall_us() -> int:
        return time.time_ns() // 1000

    def extra_metrics(self) -> list:
        return self.lease.metrics() if self.lease else []

    def info(self) -> dict:
        return views.info(self)

    def cluster_view(self) -> dict:
        return views.cluster_view(self)

    def on_fatal(self, e: BaseException) -> None:
        if self.fatal is None:
            self.fatal = e
            log.critical("node: stopping after a fatal error: %s", e, exc_info=e)
            self.status, self.status_reason = "failed", str(e)
            self.stopped.set()

    # --- start-up ----------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.cfg
        if cfg.identity == "lease":
            # A stateless container: take an identity slot first; it decides uuid and data dir.
            from node.identity.lease_node import LeaseIdentity
            self.lease = LeaseIdentity(self)
            await self.lease.acquire()
            self.wal_dir = os.path.join(self.data_dir, "wal")
        install_fault_points()
        try:
            os.makedirs(self.data_dir, exist_ok=True)
            self.life.lock_data_dir()
        except (FileExistsError, NotADirectoryError):
            raise ConfigError("data_dir", f"{self.data_dir} is not a directory") from None
        except OSError as e:                     # read-only, not ours, a filesystem nothing is made in
            raise ConfigError("data_dir", f"cannot write in {self.data_dir}: {e.strerror}") from None
        file_uuid = self.life.open_identity()    # a damaged identity file ends start-up here
        self.opening.open(file_uuid)
        self.http_session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=5))
        from node.http.api import make_app
        from node.http import listener
        try:
            self._runner = await listener.start(make_app(self), cfg.host, cfg.port, ssl_context=cfg.server_ssl,
                                                access_log=None, handle_signals=False,
                                                shutdown_timeout=limits.http_drain_s)
        except OSError as e:
            raise ConfigError("listen", f"cannot listen on {cfg.listen}: {e.strerror}") from None
        log.info("node %s listening on %s as run %s%s (data %s)", self.uuid, cfg.listen, self.run,
                 " over TLS" + (" (links need a client certificate)" if cfg.tls_client_auth else "")
                 if cfg.tls else "", self.data_dir)
        if cfg.client_address is not None:
            await self._start_client_protocol()
        exposed = plaintext_exposure(cfg)
        if exposed:
            log.warning("node: %s", exposed)
        self.spawn(self._start_replication(), "start-replication")
        self.supervise("checkpoint", self._checkpoint_loop)
        self.supervise("own-rows-fence", self.fence.watch)
        self.supervise("rejoin", self.rejoiner.watch)
        self.supervise("space-watch", self.space.run)

    async def _start_client_protocol(self) -> None:
        """The binary client protocol's listener (node/clientproto/). A port set by client_listen
        that cannot be had is a config error; the derived one, taken by something else, gives way
        to any free port (clients learn it from GET /v1/client)."""
        from node.clientproto.listener import ClientServer
        host, port = self.cfg.client_address
        self.client_server = ClientServer(self)
        try:
            await self.client_server.start(host, port, ssl_context=self.cfg.server_ssl)
        except OSError as e:
            if self.cfg.client_listen:
                raise ConfigError("client_listen", f"cannot listen on {self.cfg.client_listen}: {e.strerror}") from None
            log.warning("node: the client protocol's default port %d is taken (%s); listening on a free one",
                        port, e.strerror)
            await self.client_server.start(host, 0, ssl_context=self.cfg.server_ssl)
        log.info("node: binary client protocol on %s:%d%s", host, self.client_server.port,
                 " over TLS" if self.cfg.tls else "")

    async def _start_replication(self) -> None:
        """No store: bootstrap (anonymous: a snapshot) or join (node/join.py), which founds a
        cluster when no peer has one. A store: the Qpid exchange (wait for N, clean/dirty,
        wrong store), and an anonymous replica started without --anon registers. Then active."""
        cfg = self.cfg
        try:
            if self.core is None:
                if cfg.anon:
                    await self.join.fetch_anon()
                else:
                    await self.join.join_or_bootstrap()
            else:
                await self.life.initialize_from_store()
                if not cfg.anon and self.core.anon:
                    await self.join.register_anon()
        except (Aborted, IdentityFileError, ConfigError) as e:   # ConfigError: a must-match option differs
            self.life.abort(e)
            return
        if self.lease:
            await self.lease.wait_ready()   # a slot taken from a holder that did not release: peers fence it first
            await self.lease.mark_serving()  # before any lsn of this member is claimed here
        await self.life.go_active()
        self.status, self.status_reason = "running", ""
        tune_gc()
        self.set_peers(list(self.peers))

    # --- run time ------------------------------------------------------------------------------
    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.checkpoint_interval_s)
            if self.journal is not None and self.journal.wal is not None and not self.rejoiner.running:
                await self.checkpoint()
            gc.collect()    # with the raised thresholds, cyclic garbage is reclaimed here at the latest

    async def checkpoint(self) -> list[str]:
        return await self.retention.checkpoint()

    def after_fence(self, given_up: list[str]) -> None:
        """The fence was lifted (node/fence.py): what waited for a row under our own id (our new
        address, the expels the operator asked for while it stood)."""
        me = self.core.table.get(self.uuid)
        if me is not None and me.state == STATE_MEMBER and me.address != self.cfg.address and self.status == "running":
            self.spawn(self.register_member(self.uuid, self.cfg.address), "own-address")
        for uuid, address in expels_after_lift(self.core, given_up):
            self.spawn(self.register_member(uuid, address, state=STATE_EXPELLED), f"expel-{uuid[:8]}")

    # --- shutdown ------------------------------------------------------------------------------
    async def request_shutdown(self, cluster: bool, **phase) -> dict:
        """Orderly shutdown of this node, or (cluster=true) of every member, which marks every
        store clean; answered before it happens. `phase` carries a coordinator's steps
        (ClusterShutdown.request)."""
        return await self.cluster_shutdown.request(cluster, phase)

    async def stop(self) -> list[BaseException]:
        errors: list[BaseException] = []

        async def step(name: str, coro) -> None:
            try:
                await asyncio.wait_for(coro, limits.shutdown_deadline_s)
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # shutdown collects every cleanup error and goes on
                why = f"took longer than {limits.shutdown_deadline_s:.0f} s" if isinstance(e, asyncio.TimeoutError) \
                    else f"{type(e).__name__}: {e}"
                log.error("shutdown: %s failed: %s", name, why)
                errors.append(e)

        # A start-up that failed before serving says why in one line (the CLI's), not in stop lines.
        served = self._runner is not None
        if served:
            log.info("node: stopping %s", f"after a fatal error: {self.fatal}" if self.fatal is not None else "on request")
        began = time.monotonic()
        if served and self.lease is not None:   # before the links close: a peer takes the rows only here
            try:
                await hand_over(self)              # bounded by limits.lease_handover_s
            except Exception as e:  # noqa: BLE001 - the stop goes on without it
                log.error("shutdown: lease hand-over failed: %s: %s", type(e).__name__, e)
                errors.append(e)
        self.status, self.status_reason = "stopping", "shutting down"
        for a in list(self.appliers.values()):
            await step(f"applier {a.address}", a.stop())
        self.tasks.cancel_all()
        await self.tasks.join()
        # Every inbound link, not only subscribed relays: one still in its handshake would
        # otherwise hold the HTTP server's drain until its peer gave up. Links accepted from
        # here on close themselves (status is "stopping").
        links = list(self.links)
        if links:
            await step("replication links", asyncio.gather(*(c.close(going_away=True) for c in links)))
        if self.backups:   # before the HTTP server goes (their requests are answered) and the store closes
            from node.ops.backup_node import abandon_backups
            await abandon_backups(self.backups, "the node is stopping")
        if self.client_server is not None:
            await step("client protocol", self.client_server.stop())
        if self._runner:
            await step("http", self._runner.cleanup())
        if self.http_session:
            await step("http client", self.http_session.close())
        if self.journal:
            await step("journal", self.journal.stop())
        if self.lease:
            await step("lease release", self.lease.release())
        if self.store:
            try:
                self.fence.mark_running(False)
                self.cluster_shutdown.on_stop()   # an agreed cluster shutdown marks the store clean
                self.store.sync()
                self.store.close()
            except Exception as e:  # noqa: BLE001 - collected, reported by the caller
                errors.append(e)
        self.life.unlock_data_dir()
        self.status = "stopped"
        if served:
            log.info("node: stopped in %.2f s%s", time.monotonic() - began,
                     f" with {len(errors)} cleanup errors (logged above)" if errors else "")
        return errors

