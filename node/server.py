"""The node process: owns the store, the WAL, the core, the journal, the HTTP server,
the appliers and the relays, and runs their lifecycle in one order.

Start-up:  open store -> recover WAL -> load `_cluster` into the core -> serve HTTP
           -> bootstrap / join / subscribe (appliers).
Shutdown:  the same, backwards, each step under a deadline; errors are collected.
The node makes no protocol decisions itself: it asks the core and performs the effects."""
from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import logging
import os
import shutil
import time
import uuid as uuidlib

import aiohttp
from aiohttp import web

from node import limits
from node.applier.accept import LinkGuard
from node.applier.applier import Applier, open_link
from node.applier.conn import Conn
from node.applier.relay import Relay
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, Member
from node.config import Config, plaintext_exposure
from node.core import messages as m
from node.core.replicaset import NodeCore, cluster_op
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_SPACE, Op
from node.core.vclock import VClock
from node.errors import ClientError, ConfigError, PeerRefused, RemoteProtocolError, StorageError
from node.identity.identity_file import IdentityFileError
from node.identity.signature import InitialSignature, initial_from_wire, initial_to_wire
from node.cluster_shutdown import ClusterShutdown
from node.journal import Journal
from node.faults import install_fault_points
from node.fence import FenceKeeper, wal_present
from node.lifecycle import Aborted, Lifecycle
from node.rejoin import Rejoiner, finish_interrupted, receive_snapshot
from node.retention import Retention
from node.storage.space import SpaceWatch
from node.storage.store import STORE_FORMAT_VERSION, Store
from node.wal.format import FORMAT_VERSION as WAL_FORMAT_VERSION
from node.wal.recovery import recover
from node.wal.writer import WalWriter

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
        self.store: Store | None = None
        self.core: NodeCore | None = None
        self.journal: Journal | None = None
        self.uuid = ""
        self.status = "loading"
        self.status_reason = "opening the store"
        self.appliers: dict[str, Applier] = {}
        self.followers: dict[str, Applier] = {}   # member uuid -> the one applier linked to it (Applier.claim)
        self.relays: set[Relay] = set()
        self.links: set[Conn] = set()    # every inbound replication link, from accept (relays: subscribed ones)
        self.link_guard = LinkGuard()    # bounds on links still in their handshake (node/applier/accept.py)
        self.http_session: aiohttp.ClientSession | None = None
        self.stopped = asyncio.Event()
        self.fatal: BaseException | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task] = set()
        self.started_at = time.time()
        self.lease = None    # node.identity.lease_node.LeaseIdentity when identity = "lease"
        self.life = Lifecycle(self)   # identity files, join protocol (node/lifecycle.py)
        self.cluster_shutdown = ClusterShutdown(self)   # orderly cluster shutdown (node/cluster_shutdown.py)
        self.retention = Retention(self)   # who holds the WAL; checkpoints (node/retention.py)
        self.fence = FenceKeeper(self)     # own-rows fence after a loss (node/fence.py)
        self.rejoiner = Rejoiner(self)     # need_rejoin answers and safe rebuilds (node/rejoin.py)
        self.peers: list[str] = list(cfg.peers)   # the replication sources in effect (PUT /v1/admin/peers)
        # peer uuid -> (lsn of our own component it says it holds, its address): writes wait for
        # those rows while that peer is one of our upstreams (own_rows_awaited)
        self.own_claims: dict[str, tuple[int, str]] = {}
        # peers that claimed to hold our own rows and, streaming to us, did not send them
        # (Applier.check_claim): their claims are not believed again while this node runs
        self.claims_disproved: set[str] = set()
        self.task_failures: dict[str, dict] = {}   # task name -> {"failures", "error"} (note_failure)
        # the NOSPACE alarm: writes refused with 507 while the disk or the map is full (node/storage/space.py)
        self.space = SpaceWatch([], cfg.disk_reserve_bytes, lambda: self.store)
        self.backups: list = []      # node.ops.backup.BackupJob in progress (POST /v1/admin/backup)
        self._vclock_uuid: dict[str, int] = {}      # vclock_uuid()'s cache, and what it was built from
        self._vclock_ids: dict[str, int] = {}       # the same vclock by local id, as answers show it
        self._vclock_uuid_at: tuple = ()
        self.client_server = None   # the binary client protocol's listener (node/clientproto/listener.py)

    # --- small helpers ---------------------------------------------------------------
    def extra_metrics(self) -> list:
        return self.lease.metrics() if self.lease else []

    @staticmethod
    def wall_us() -> int:
        return time.time_ns() // 1000

    @property
    def options_digest(self) -> str:
        return hashlib.sha256(json.dumps(self.cfg.must_match(), sort_keys=True).encode()).hexdigest()[:16]

    def greeting(self) -> dict:
        table = self.core.table if self.core else None
        return {
            "uuid": self.uuid,
            "cluster_uuid": self.store.get_meta("cluster_uuid") if self.store else None,
            "cluster_name": self.cfg.cluster_name,
            "options_digest": self.options_digest,
            "options": self.cfg.must_match(),
            "anon": self.cfg.anon,
            "address": self.cfg.address,
            "cluster": table.rows() if table else [],
            "status": self.status,
            "lease": self.lease.greeting_field() if self.lease else None,
            # our own `_cluster` rows up to here are an earlier incarnation's (all of them while a
            # rebuilt store is fenced): peers take no ids from them (Peer.history_lsn)
            "own_history_lsn": self._own_history_lsn(),
            **self.life.greeting_fields(),   # store status, signatures, vclock by uuid (join protocol)
        }

    def _own_history_lsn(self) -> int:
        core = self.core
        if core is None:
            return 0
        return limits.lsn_max if core.fence is not None and core.fence.rebuilt else core.own_history_lsn

    def check_peer_greeting(self, theirs: dict) -> None:
        """Checks beyond check_greeting: lease fencing (raises PeerRefused)."""
        if self.lease:
            self.lease.check_peer(theirs)
        self.life.observe_greeting(theirs)
        self.fence.on_greeting(theirs)
        vu = theirs.get("vclock_uuid")
        own = vu.get(self.uuid) if isinstance(vu, dict) else None
        uuid = theirs["uuid"]
        if uuid in self.claims_disproved:
            return
        if isinstance(own, int) and own > self.own_claims.get(uuid, (0, ""))[0] \
                and (uuid in self.own_claims or len(self.own_claims) < limits.members_max):
            # A peer says it holds more of this node's own rows than this node does (a
            # replacement container, a rejoin, or a lost unsynced tail): they come back by
            # SUBSCRIBE, and writes wait for them so no lsn of ours is ever used twice.
            self.own_claims[uuid] = (own, theirs["address"])

    def disprove_claim(self, uuid: str, have: int) -> None:
        """An upstream caught us up without the rows of ours it said it holds: it lied (or its
        store lost them since), so its word neither holds writes nor raises a fence's target."""
        claim = max(self.own_claims.pop(uuid, (0, ""))[0],
                    self.core.fence.heard.get(uuid, 0) if self.core.fence is not None else 0)
        if len(self.claims_disproved) < limits.members_max:
            self.claims_disproved.add(uuid)
        if self.core.fence is not None:
            self.core.fence.heard[uuid] = min(self.core.fence.heard.get(uuid, have), have)
        log.warning("node: %s said it holds this node's rows up to lsn %d and sent them only up to %d: its claim "
                    "is not believed", uuid, claim, have)

    def own_rows_awaited(self) -> tuple[int, str] | None:
        """(lsn, peer) of this node's own rows that one of its upstreams says it holds and this
        node has not claimed yet. Only an upstream can send them back, so only an upstream's
        claim is believed, and only while it is one: a peer that is not (a client greeting
        this node's relay) cannot hold its writes, and removing a peer ends its claim."""
        have = self.core.claimed.get(self.core.self_id)
        upstreams = {a.peer_uuid for a in self.appliers.values()} | set(self.appliers)
        best: tuple[int, str] | None = None
        for uuid, (lsn, address) in list(self.own_claims.items()):
            if lsn <= have:
                del self.own_claims[uuid]            # they came back
            elif (uuid in upstreams or address in upstreams) and (best is None or lsn > best[0]):
                best = (lsn, f"{address} ({uuid[:8]})")
        return best

    def spawn(self, coro, name: str) -> asyncio.Task:
        t = asyncio.create_task(coro, name=name)
        self._tasks.add(t)
        t.add_done_callback(self._task_done)
        return t

    def _task_done(self, t: asyncio.Task) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            self.on_fatal(t.exception())

    def supervise(self, name: str, run) -> asyncio.Task:
        """Run the long-lived loop `run()` (a coroutine function) under supervision: a failure
        that is not the disk's is a bug, logged with its traceback, counted (/v1/info "tasks",
        /metrics), and the loop starts again after task_restart_s; a StorageError stops the node."""
        async def supervised() -> None:
            while True:
                try:
                    await run()
                    return
                except asyncio.CancelledError:
                    raise
                except StorageError:
                    raise                                  # the disk: spawn's callback stops the node
                except Exception as e:  # noqa: BLE001 - the one place this task's failures are mapped
                    self.note_failure(name, e)
                await asyncio.sleep(limits.task_restart_s)
        return self.spawn(supervised(), name)

    def note_failure(self, name: str, e: BaseException) -> None:
        """An unexpected exception in a task that goes on (or a link that stops): our bug, said
        loudly, with its traceback, and kept where operators look."""
        log.error("%s failed (a bug; the node serves on): %s: %s", name, type(e).__name__, e, exc_info=e)
        f = self.task_failures.setdefault(name, {"failures": 0, "error": ""})
        f["failures"] += 1
        f["error"] = f"{type(e).__name__}: {e}"[:500]

    def on_fatal(self, e: BaseException) -> None:
        if self.fatal is None:
            self.fatal = e
            log.critical("node: stopping after a fatal error: %s", e, exc_info=e)
            self.status, self.status_reason = "failed", str(e)
            self.stopped.set()

    # --- start-up ----------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.cfg
        if cfg.identity == "lease":
            # A stateless container: take an identity slot first; it decides uuid and data dir.
            from node.identity.lease_node import LeaseIdentity
            self.lease = LeaseIdentity(self)
            await self.lease.acquire()
            self.wal_dir = os.path.join(self.data_dir, "wal")
        install_fault_points()
        os.makedirs(self.data_dir, exist_ok=True)
        self.life.lock_data_dir()
        file_uuid = self.life.open_identity()    # a damaged identity file ends start-up here
        finish_interrupted(self.data_dir)        # a rejoin cut short: its new store, or the old one
        self.store = Store(os.path.join(self.data_dir, "store"), sync=(cfg.wal_mode == "fsync"), map_size=cfg.map_size)
        self.space.paths = [self.store.path, self.wal_dir, self.data_dir]
        self.space.sample()
        self.uuid = self.store.get_meta("uuid") or ""
        if self.uuid and file_uuid and self.uuid != file_uuid:
            raise StorageError(f"identity files in {self.data_dir} name uuid {file_uuid}, the store {self.uuid}")
        wanted = (self.lease.member_uuid if self.lease else None) or file_uuid
        if self.uuid and wanted and self.uuid != wanted:
            raise StorageError(f"store {self.data_dir} belongs to {self.uuid}, the lease slot to {wanted}")
        if not self.uuid:
            self.uuid = wanted or str(uuidlib.uuid4())
            self.store.set_meta(uuid=self.uuid)
        if self.store.is_empty:
            self._wipe_partial_join()
        else:
            self._check_store_matches()
            loss = None if self.store.get_meta("anon") else self.fence.loss_at_open(wal_present(self.wal_dir))
            if loss is not None:
                self.fence.set(loss, rebuilt=False)
            self._open_bootstrapped()
            self.life.after_open()
        self.http_session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=5))
        from node.http.api import make_app
        app = make_app(self)
        from node.http import listener
        self._runner = await listener.start(app, cfg.host, cfg.port, ssl_context=cfg.server_ssl, access_log=None,
                                            handle_signals=False, shutdown_timeout=limits.http_drain_s)
        log.info("node %s listening on %s%s (data %s)", self.uuid, cfg.listen,
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
                from node.errors import ConfigError
                raise ConfigError("client_listen", f"cannot listen on {self.cfg.client_listen}: {e.strerror}") from None
            log.warning("node: the client protocol's default port %d is taken (%s); listening on a free one",
                        port, e.strerror)
            await self.client_server.start(host, 0, ssl_context=self.cfg.server_ssl)
        log.info("node: binary client protocol on %s:%d%s", host, self.client_server.port,
                 " over TLS" if self.cfg.tls else "")

    def _wipe_partial_join(self) -> None:
        if self.store.spaces or len(self.store.table) or os.path.isdir(self.wal_dir):
            log.warning("store: an interrupted join left partial data; starting the join afresh")
            self._wipe_store()

    def _wipe_store(self) -> None:
        """An empty store and no WAL, keeping only this node's uuid (a join starts from here)."""
        uid = self.uuid
        self.store.close()
        shutil.rmtree(os.path.join(self.data_dir, "store"), ignore_errors=True)
        shutil.rmtree(self.wal_dir, ignore_errors=True)
        self.store = Store(os.path.join(self.data_dir, "store"), sync=(self.cfg.wal_mode == "fsync"),
                           map_size=self.cfg.map_size)
        self.store.set_meta(uuid=uid)

    def _check_store_matches(self) -> None:
        was_anon = self.store.get_meta("anon")
        if was_anon is False and self.cfg.anon:
            from node.errors import ConfigError
            raise ConfigError("anon", "this store belongs to a registered member; it cannot go back to anonymous")

    def _open_bootstrapped(self) -> None:
        store = self.store
        res = recover(store, self.wal_dir, self.uuid, force_recovery=self.cfg.force_recovery)
        wal = None
        if self.cfg.wal_mode != "none":
            wal = WalWriter(self.wal_dir, self.cfg.wal_mode, self.uuid, segment_bytes_max=self.cfg.segment_bytes_max)
            wal.open_last(res.last_valid_end)
            wal.sync()       # what recovery read may be in the page cache only: the core counts it as on disk
        store.sync()
        self.core = NodeCore(self.uuid, store.table.copy(), store.vclock, hlc_last=res.hlc_last,
                             spaces=store.space_flags(), own_history_lsn=int(store.get_meta("own_history_lsn") or 0))
        self.fence.restore()
        self.fence.mark_running(True)
        self.core.knowledge = store.load_knowledge()
        self.retention.load()
        self.journal = Journal(self.core, store, wal, self.on_fatal, space=self.space)
        self.journal.start()
        log.info("node: store open; vclock %s; %d members", store.vclock, len(store.table))

    async def _start_replication(self) -> None:
        cfg = self.cfg
        try:
            if self.core is None:
                if cfg.anon:
                    await self._bootstrap_anon()
                else:
                    await self._join_or_bootstrap()    # founds a cluster when no peer has one
            else:
                await self.life.initialize_from_store()   # Qpid: wait for N, clean/dirty, wrong store
                if not cfg.anon and self.core.anon:
                    await self._register_anon()
        except (Aborted, IdentityFileError, ConfigError) as e:   # ConfigError: a must-match option differs
            self.life.abort(e)
            return
        if self.lease:
            await self.lease.wait_ready()   # a slot taken from a holder that did not release: peers fence it first
        await self.life.go_active()
        self.status, self.status_reason = "running", ""
        tune_gc()
        self.set_peers(list(self.peers))

    async def _bootstrap_new_cluster(self, initial: InitialSignature | None = None) -> None:
        """Found a cluster; `initial` (cluster uuid, creation time, founders) is its initial
        signature, set here once and copied by every member that joins."""
        self.status, self.status_reason = "bootstrapping", "creating a new cluster"
        if initial is None:
            initial = InitialSignature(str(uuidlib.uuid4()), time.time(), (self.uuid,))
        cluster_uuid = initial.cluster_uuid
        self.store.put_cluster_member(Member(self.uuid, 1, self.cfg.address, STATE_MEMBER))
        self.store.set_meta(cluster_name=self.cfg.cluster_name, anon=False, created_s=initial.created_s,
                            founders=list(initial.founders), initial_signature=initial_to_wire(initial),
                            store_status="dirty")
        self.store.set_meta(cluster_uuid=cluster_uuid)   # last: a store is non-empty from here on
        self._open_bootstrapped()
        self.life.after_open()                           # the founder's identity file
        me = self.core.table.get(self.uuid)
        txn = self.core.local_txn([cluster_op(me)], GROUP_CLUSTER, self.wall_us())
        await self.journal.submit([txn])
        log.info("node: bootstrapped cluster %s as id 1", cluster_uuid)

    async def _join_or_bootstrap(self) -> None:
        """No store: join through a running peer (crash-safe registration, then its snapshot);
        if every peer is fresh too, the lowest uuid among all of us bootstraps and the others
        join it. See Lifecycle.join_or_bootstrap."""
        await self.life.join_or_bootstrap()

    async def _bootstrap_anon(self) -> None:
        self.status, self.status_reason = "joining", "fetching a snapshot (anonymous)"
        while True:
            for address in self.peers:
                try:
                    conn, theirs = await open_link(self, self.http_session, address)
                except (PeerRefused, RemoteProtocolError, ConnectionError, OSError, asyncio.TimeoutError,
                        aiohttp.ClientError) as e:
                    log.info("anon: %s not usable yet: %s", address, e)
                    continue
                try:
                    if theirs["cluster_uuid"] and theirs["status"] == "running":
                        await self._fetch_snapshot(conn, theirs, join=False)
                        return
                    await conn.send(m.BYE)
                except (RemoteProtocolError, ConnectionError, asyncio.TimeoutError, aiohttp.ClientError) as e:
                    log.warning("anon: fetching a snapshot from %s failed: %s", address, e)
                    self._wipe_partial_join()
                finally:
                    await conn.close()
            await asyncio.sleep(0.5)

    async def _fetch_snapshot(self, conn, theirs: dict, *, join: bool, existed: bool = False) -> None:
        """Install the donor's snapshot. join=True: JOIN was sent and REGISTERED received
        already (Lifecycle.join_via); otherwise FETCH_SNAPSHOT is sent here. `existed`: this
        uuid was a member before (identity kept, store lost): the store is fenced (node/fence.py)."""
        if not join:
            await conn.send(m.FETCH_SNAPSHOT)
        vclock, n = await receive_snapshot(conn, theirs, self.store, self.wall_us)
        if join:
            if self.store.table.get(self.uuid) is None:
                raise RemoteProtocolError("the donor's snapshot does not register this node")
            me = self.store.table.get(self.uuid)
            if me is not None and self.store.vclock.get(me.id):
                existed = True       # the snapshot already holds rows of this node's own origin
        else:
            me = Member(self.uuid, self.store.table.lowest_free_id(), self.cfg.address, STATE_ANON)
            self.store.put_cluster_member(me)
        initial = initial_from_wire((theirs.get("store") or {}).get("initial"))
        if initial is not None:   # the cluster's initial signature, set once at its creation
            self.store.set_meta(created_s=initial.created_s, founders=list(initial.founders),
                                initial_signature=initial_to_wire(initial))
        # A subscriber behind the snapshot is told to rejoin here, never given a gap (this WAL
        # starts at the snapshot).
        self.store.set_meta(anon=not join, store_status="dirty",
                            gc_vclock={k: v for k, v in self.store.vclock.items() if k})
        if join and existed:
            self.fence.set(f"this node ({self.uuid}) rejoined with an empty store: its peers may hold rows it wrote "
                           "before", rebuilt=True)
        self.store.set_meta(cluster_uuid=theirs["cluster_uuid"])   # last: a store is non-empty from here on
        self._open_bootstrapped()
        self.life.after_open()
        self.journal.wal and self.journal.wal.rotate(self.store.vclock.to_dict(), self.store.table.rows())
        log.info("node: %s via %s: %d rows at vclock %s; this node is id %d",
                 "joined" if join else "fetched a snapshot", theirs["address"], n, vclock, self.core.self_id)

    async def _register_anon(self) -> None:
        """An anonymous replica restarted without --anon becomes a member: every master
        registers its uuid; it keeps its uuid, its local id and its local rows. See
        Lifecycle.register_anon (crash-safe, like JOIN)."""
        await self.life.register_anon()

    # --- run-time changes ----------------------------------------------------------------
    def configure_peers(self, peers: list[str]) -> list[asyncio.Task]:
        """The replication sources from now on (PUT /v1/admin/peers); see set_peers."""
        self.peers = list(dict.fromkeys(peers))
        return self.set_peers(self.peers)

    def set_peers(self, peers: list[str]) -> list[asyncio.Task]:
        """Make the appliers exactly `peers` (one per address; two addresses of one member keep
        one link: Applier.claim); returns the tasks stopping removed appliers (awaited by
        `PUT /v1/admin/peers` so the answer means the links are down)."""
        stopping = []
        for addr in list(self.appliers):
            if addr not in peers:
                a = self.appliers.pop(addr)
                stopping.append(self.spawn(a.stop(), f"stop-applier-{addr}"))
        for addr in peers:
            if addr not in self.appliers and addr != self.cfg.address:
                a = Applier(self, addr)
                self.appliers[addr] = a
                a.start()
        return stopping

    async def register_member(self, uuid: str, address: str, state: str = STATE_MEMBER) -> int:
        local_id, txn = self.core.register_member(uuid, address, self.wall_us(), state=state)
        if txn is not None:
            await self.journal.submit([txn])
        return local_id

    # --- checkpoints and WAL retention (node/retention.py) --------------------------------------
    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.checkpoint_interval_s)
            if self.journal is not None and self.journal.wal is not None and not self.rejoiner.running:
                await self.checkpoint()
            gc.collect()    # with the raised thresholds, cyclic garbage is reclaimed here at the latest

    async def checkpoint(self) -> list[str]:
        return await self.retention.checkpoint()

    # --- rejoin (node/rejoin.py) and the own-rows fence (node/fence.py) -------------------------
    async def reopen_after_rejoin(self, swap) -> None:
        """The rejoin's new store is complete: close everything that reads the old one, swap it
        in, and start again from it."""
        for c in list(self.links):
            await c.close()                   # relays read the old WAL
        await self.journal.stop()
        self.journal, self.core = None, None
        self.store.close()
        swap(self.data_dir)
        self.store = Store(os.path.join(self.data_dir, "store"), sync=(self.cfg.wal_mode == "fsync"),
                           map_size=self.cfg.map_size)
        self._open_bootstrapped()
        self.life.after_open()
        self.journal.wal and self.journal.wal.rotate(self.store.vclock.to_dict(), self.store.table.rows())
        self.status, self.status_reason = "running", ""
        self.set_peers(list(self.peers))

    def after_fence(self, given_up: list[str]) -> None:
        """The fence was lifted: what waited for a row under our own id (our new address, the
        expels the operator asked for while it stood)."""
        me = self.core.table.get(self.uuid)
        if me is not None and me.state == STATE_MEMBER and me.address != self.cfg.address and self.status == "running":
            self.spawn(self.register_member(self.uuid, self.cfg.address), "own-address")
        for uuid in given_up:
            mem = self.core.table.get(uuid)
            if mem is not None and mem.state != STATE_EXPELLED:
                self.spawn(self.register_member(uuid, mem.address, state=STATE_EXPELLED), f"expel-{uuid[:8]}")

    # --- client writes ---------------------------------------------------------------------
    def write_check(self) -> None:
        """Whether this node takes client writes now (raises ClientError if not): running, with
        room to write (the NOSPACE alarm). Every client write path calls it (HTTP here, the binary
        protocol in node/clientproto), and replicated_write_check for rows under our own id."""
        if self.status != "running" or self.core is None:
            raise ClientError(503, "not_ready", f"node is {self.status}: {self.status_reason}")
        self.refuse_without_room()

    def replicated_write_check(self) -> None:
        """Writes to replicated spaces, rows under this node's own id: refused on a read-only node
        or an anonymous replica, while the own-rows fence stands (node/fence.py), and while a peer
        says it holds more of this node's rows than it has (they are still coming back)."""
        if self.cfg.read_only or self.core.anon:
            why = "an anonymous replica" if self.core.anon else "read_only"
            raise ClientError(409, "read_only", f"this node is {why}: writes to replicated spaces are refused")
        if self.core.fence is not None and not self.fence.try_lift():
            raise ClientError(503, "own_rows_unconfirmed", self.core.fence_state()[1])
        awaited = self.own_rows_awaited() if self.own_claims else None
        if awaited is not None:
            have = self.core.claimed.get(self.core.self_id)
            raise ClientError(503, "catching_up", f"this node's own earlier rows (lsn {have + 1}..{awaited[0]}) "
                              f"are still coming back from {awaited[1]}, which holds them; retry shortly")

    async def write(self, ops: list[Op]) -> dict:
        self.write_check()
        local_ops, repl_ops = [], []
        for op in ops:
            if op.kind == OP_SPACE:
                sdef_local = bool(op.value.get("local"))
            else:
                sdef_local = self.core.spaces.get(op.space)
                if sdef_local is None:
                    raise ClientError(404, "no_such_space", f"space {op.space!r} does not exist")
            (local_ops if sdef_local else repl_ops).append(op)
        if repl_ops:
            self.replicated_write_check()
        txns = []
        now = self.wall_us()
        if repl_ops:
            txns.append(self.core.local_txn(repl_ops, GROUP_DEFAULT, now))
        if local_ops:
            txns.append(self.core.local_txn(local_ops, GROUP_LOCAL, now))
        await self.journal.submit(txns)
        t = txns[0]
        vclock_uuid = self.vclock_uuid()      # refreshes the cached vclock by local id too
        return {"lsn": t.last_lsn, "vclock": self._vclock_ids, "vclock_uuid": vclock_uuid}

    # --- read-your-writes ------------------------------------------------------------------
    def vclock_uuid(self) -> dict[str, int]:
        """This node's durable vclock by member uuid (replicated rows only), cached per vclock."""
        core = self.core
        if core is None:
            return {}
        at = (id(core), core.vclock.signature, len(core.table))   # a vclock only grows: its sum names it
        if self._vclock_uuid_at != at:
            self._vclock_uuid = core.vclock_by_uuid()
            self._vclock_ids = {str(k): v for k, v in core.vclock.items()}
            self._vclock_uuid_at = at
        return self._vclock_uuid    # shared: callers never change it

    def has_applied(self, vclock_uuid: dict[str, int]) -> bool:
        """Whether this node's durable state holds every row of `vclock_uuid` ({uuid: lsn})."""
        core = self.core
        if core is None:
            return False
        id_of, v = core.table.id_of, core.vclock
        for uuid, lsn in vclock_uuid.items():
            if lsn > 0:
                i = id_of(uuid)
                if i is None or v.get(i) < lsn:
                    return False
        return True

    async def wait_applied(self, vclock_uuid: dict[str, int], timeout_s: float) -> dict[str, int]:
        """Wait until this node has applied `vclock_uuid` (read-your-writes across masters);
        returns the node's vclock by uuid then. Raises ClientError 504 `wait_timeout` after
        timeout_s, and 503 if the node stops serving meanwhile."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.has_applied(vclock_uuid):
            left = deadline - loop.time()
            if left <= 0:
                raise ClientError(504, "wait_timeout", f"this node has not applied {vclock_uuid} within "
                                  f"{timeout_s:g} s (it holds {self.vclock_uuid()})")
            if self.journal is None or self.status not in ("running", "rejoining", "joining"):
                raise ClientError(503, "not_ready", f"node is {self.status}: {self.status_reason}")
            await self.journal.changed(timeout=left)
        return self.vclock_uuid()

    def refuse_without_room(self) -> None:
        """While the NOSPACE alarm is raised a write is refused before it claims anything."""
        alarm = self.space.alarm
        if alarm is not None:
            raise ClientError(507, "no_space", f"writes are refused until there is room: {alarm}")

    async def expel(self, uuid: str) -> dict:
        core = self.core
        if core is None or self.status != "running":
            raise ClientError(503, "not_ready", f"node is {self.status}")
        self.refuse_without_room()
        if core.anon or self.cfg.read_only:
            raise ClientError(409, "read_only", "expel needs a writable member")
        mem = core.table.get(uuid)
        if mem is None and (core.fence is None or uuid not in core.fence.waiting_for(core.table, core.uuid)):
            raise ClientError(404, "no_such_member", f"{uuid} is not in _cluster")
        if uuid == self.uuid:
            raise ClientError(400, "expel_self", "a node cannot expel itself; expel it from another member")
        if core.fence is not None and not self.fence.try_lift():
            # The expel row is a row under our own id: it waits for the fence, which stops waiting
            # for this member now (so a cluster whose every member is fenced can let one go).
            self.fence.give_up(uuid)
            return {"uuid": uuid, "id": mem.id if mem else None, "state": "expel_pending"}
        local_id = await self.register_member(uuid, mem.address, state=STATE_EXPELLED)
        for r in list(self.relays):
            if r.uuid == uuid:
                await r.conn.close()
        return {"uuid": uuid, "id": local_id, "state": STATE_EXPELLED}

    # --- views -------------------------------------------------------------------------
    def info(self) -> dict:
        core = self.core
        vc = core.vclock if core else VClock()
        return {
            "uuid": self.uuid,
            "id": core.self_id if core else None,
            "cluster_uuid": self.store.get_meta("cluster_uuid") if self.store else None,
            "cluster_name": self.cfg.cluster_name,
            "status": self.status,
            "status_reason": self.status_reason,
            "read_only": self.cfg.read_only or bool(core and core.anon),
            "anon": bool(core.anon) if core else self.cfg.anon,
            "address": self.cfg.address,
            "client_port": self.client_server.port if self.client_server else None,
            "wal_mode": self.cfg.wal_mode,
            "vclock": {str(k): v for k, v in vc.items()},
            "vclock_uuid": core.vclock_by_uuid() if core else {},
            "upstreams": [a.info() for a in self.appliers.values()],
            "downstreams": [r.info() for r in self.relays],
            "uptime_s": round(time.time() - self.started_at, 3),
            "lease": self.lease.info() if self.lease else None,
            "wal": self._wal_info(),
            "tasks": self.task_failures,
            "own_rows_fence": self.fence.info(),
            "rejoin": {"needed_by": sorted(self.rejoiner.need), "blocked": self.rejoiner.blocked} if self.rejoiner.need
            else None,
            "space": self.space.now(),
            "versions": {"protocol": [m.PROTOCOL_VERSION_MIN, m.PROTOCOL_VERSION], "store_format": STORE_FORMAT_VERSION,
                         "wal_format": WAL_FORMAT_VERSION},     # docs/upgrade.md
        }

    def _wal_info(self) -> dict:
        from node.wal.reader import list_segments
        return {"segments": len(list_segments(self.wal_dir)),
                "gc_vclock": {str(k): v for k, v in (self.store.get_meta("gc_vclock") or {}).items()}
                if self.store else {}}

    def cluster_view(self) -> dict:
        core = self.core
        if core is None:
            return {"members": []}
        out = []
        for mem in self.store.table.members():
            ids = {o: i for (o, mu), i in core.knowledge.items() if mu == mem.uuid}
            ids[self.uuid] = mem.id
            out.append({"uuid": mem.uuid, "id": mem.id, "address": mem.address, "state": mem.state,
                        "lsn": core.vclock.get(mem.id), "ids": ids})
        return {"members": out}

    # --- shutdown -------------------------------------------------------------------------
    async def request_shutdown(self, cluster: bool, **phase) -> dict:
        """Orderly shutdown of this node, or (cluster=true) of every member, which marks every
        store clean; answered before it happens. `phase` carries a coordinator's steps
        (ClusterShutdown.request)."""
        self.shutdown_cluster = cluster
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
        self.status, self.status_reason = "stopping", "shutting down"
        for a in list(self.appliers.values()):
            await step(f"applier {a.address}", a.stop())
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        # Every inbound link, not only subscribed relays: one still in its handshake would
        # otherwise hold the HTTP server's drain until its peer gave up. Links accepted from
        # here on close themselves (status is "stopping").
        links = list(self.links)
        if links:
            await step("replication links", asyncio.gather(*(c.close() for c in links)))
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

