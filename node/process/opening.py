"""Opening the store: at start, after founding a cluster, after a snapshot is installed, and
after a rejoin swapped in a new store. This part owns the process's `store`, `core` and
`journal` fields: it is the only code that sets them.

Order, every time: store -> recover the WAL into it -> the WAL writer at its valid end -> the
core from the store's `_cluster`, vclock and spaces -> the fence and the holds -> the journal.

Rules kept here:
- A store with `cluster_uuid` set is complete; `cluster_uuid` is written last, so an
  interrupted join leaves a store without it, which is wiped and joined afresh.
- The uuid is the store's; identity files and a lease slot must agree with it, or start-up
  stops with a StorageError naming both.
- A snapshot installed here starts a new WAL at its vclock, and `gc_vclock` says so: a
  subscriber behind it is told to rejoin, never given a gap. Likewise a WAL that starts past
  `gc_vclock` for any other reason (its directory lost) raises it at open (node/wal/gc.py)."""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
import uuid as uuidlib
from typing import TYPE_CHECKING

from node.cluster_space.table import STATE_ANON, STATE_MEMBER, Member
from node.core import messages as m
from node.core.lifecycle_join_events import Install
from node.core.replicaset import NodeCore, cluster_op
from node.core.rows import GROUP_CLUSTER
from node.errors import ConfigError, StorageError
from node.fence import wal_present
from node.identity.signature import InitialSignature, initial_from_wire, initial_to_wire
from node.journal import Journal
from node.process.ports import ENDING
from node.rejoin import WAL_NOT_STARTED, finish_interrupted, receive_snapshot
from node.storage.store import Store
from node.wal.gc import gc_at_wal_start
from node.wal.recovery import recover
from node.wal.writer import WalWriter

if TYPE_CHECKING:
    from node.process.ports import OpeningHost

log = logging.getLogger("replog.node")


class Opening:
    def __init__(self, node: "OpeningHost"):
        self.node = node

    def _new_store(self) -> Store:
        cfg = self.node.cfg
        return Store(os.path.join(self.node.data_dir, "store"), sync=(cfg.wal_mode == "fsync"), map_size=cfg.map_size)

    def open(self, file_uuid: str | None) -> None:
        """At start: finish a rejoin cut short, open the store, settle this node's uuid (the
        store's, else the identity files' or the lease slot's, else a new one), and recover a
        store that has data."""
        node = self.node
        finish_interrupted(node.data_dir)        # a rejoin cut short: its new store, or the old one
        node.store = store = self._new_store()
        node.space.paths = [store.path, node.wal_dir, node.data_dir]
        node.space.sample()
        node.uuid = store.get_meta("uuid") or ""
        if node.uuid and file_uuid and node.uuid != file_uuid:
            raise StorageError(f"identity files in {node.data_dir} name uuid {file_uuid}, the store {node.uuid}")
        wanted = (node.lease.member_uuid if node.lease else None) or file_uuid
        if node.uuid and wanted and node.uuid != wanted:
            raise StorageError(f"store {node.data_dir} belongs to {node.uuid}, the lease slot to {wanted}")
        if not node.uuid:
            node.uuid = wanted or str(uuidlib.uuid4())
            store.set_meta(uuid=node.uuid)
        if store.is_empty:
            self.wipe_partial_join()
            return
        if store.get_meta("anon") is False and node.cfg.anon:
            raise ConfigError("anon", "this store belongs to a registered member; it cannot go back to anonymous")
        loss = None if store.get_meta("anon") or store.get_meta(WAL_NOT_STARTED) else \
            node.fence.loss_at_open(wal_present(node.wal_dir))
        if loss is not None:
            node.fence.set(loss, rebuilt=False)
        self.open_bootstrapped()
        node.life.after_open()

    def wipe_partial_join(self) -> None:
        """An empty store and no WAL, keeping only this node's uuid (a join starts from here),
        if an interrupted join left anything."""
        node = self.node
        store = node.store
        if not (store.spaces or len(store.table) or os.path.isdir(node.wal_dir)):
            return
        log.warning("store: an interrupted join left partial data; starting the join afresh")
        store.close()
        shutil.rmtree(os.path.join(node.data_dir, "store"), ignore_errors=True)
        shutil.rmtree(node.wal_dir, ignore_errors=True)
        node.store = self._new_store()
        node.store.set_meta(uuid=node.uuid)

    def open_bootstrapped(self) -> None:
        """A store that belongs to a cluster: recover the WAL into it, then the core, the fence,
        the holds and the journal, in that order."""
        node, cfg = self.node, self.node.cfg
        store = node.store
        res = recover(store, node.wal_dir, node.uuid, force_recovery=cfg.force_recovery)
        wal = None
        if cfg.wal_mode != "none":
            wal = WalWriter(node.wal_dir, cfg.wal_mode, node.uuid, segment_bytes_max=cfg.segment_bytes_max)
            wal.open_last(res.last_valid_end)
            wal.sync()       # what recovery read may be in the page cache only: the core counts it as on disk
            gc = gc_at_wal_start(node.wal_dir, store.vclock.to_dict(), store.get_meta("gc_vclock") or {})
            if gc is not None:
                # the rows below the WAL's start cannot be relayed: a subscriber behind it rejoins
                log.warning("wal: the WAL starts past what was collected (%s): rows up to %s are no longer here to "
                            "relay, and a subscriber behind that is told to rejoin", store.get_meta("gc_vclock") or {},
                            gc)
                store.set_meta(gc_vclock=gc)
        node.core = NodeCore(node.uuid, store.table.copy(), store.vclock, hlc_last=res.hlc_last,
                             spaces=store.space_flags(), own_history_lsn=int(store.get_meta("own_history_lsn") or 0))
        node.fence.restore()
        if store.get_meta("anon") and not node.core.anon:
            # its registration as a member was recovered, but the node stopped before its store said
            # so: say it now, or no later start of this member looks for a loss (Opening.open)
            log.warning("node: this store registers this node as a member; it is no anonymous replica any more")
            store.set_meta(anon=False)
        store.set_meta(**{WAL_NOT_STARTED: False})         # its WAL starts now: losing it is a loss
        node.fence.mark_running(True)
        # on disk before any write: in wal_mode write a power loss could otherwise take the mark back
        # to an orderly stop's, and the next start would not fence for what the WAL lost
        store.sync()
        node.core.knowledge = store.load_knowledge()
        node.retention.load()
        node.journal = Journal(node.core, store, wal, node.on_fatal, space=node.space)
        node.journal.start()
        log.info("node: store open; vclock %s; %d members", store.vclock, len(store.table))

    async def bootstrap_new_cluster(self, initial: InitialSignature | None = None) -> None:
        """Found a cluster; `initial` (cluster uuid, creation time, founders) is its initial
        signature, set here once and copied by every member that joins."""
        node = self.node
        node.status, node.status_reason = "bootstrapping", "creating a new cluster"
        if initial is None:
            initial = InitialSignature(str(uuidlib.uuid4()), time.time(), (node.uuid,))
        cluster_uuid = initial.cluster_uuid
        store = node.store
        store.put_cluster_member(Member(node.uuid, 1, node.cfg.address, STATE_MEMBER))
        store.set_meta(cluster_name=node.cfg.cluster_name, anon=False, created_s=initial.created_s,
                       founders=list(initial.founders), initial_signature=initial_to_wire(initial),
                       store_status="dirty")
        store.set_meta(cluster_uuid=cluster_uuid)   # last: a store is non-empty from here on
        self.open_bootstrapped()
        node.life.after_open()                      # the founder's identity file
        me = node.core.table.get(node.uuid)
        txn = node.core.local_txn([cluster_op(me)], GROUP_CLUSTER, node.wall_us())
        await node.journal.submit([txn])
        log.info("node: bootstrapped cluster %s as id 1", cluster_uuid)

    async def receive_snapshot(self, conn, theirs: dict, *, join: bool) -> int:
        """The donor's snapshot into the empty store (not complete yet); how many records came.
        join=True: JOIN was sent and REGISTERED received already (node/join.py join_via);
        otherwise FETCH_SNAPSHOT is sent here."""
        if not join:
            await conn.send(m.FETCH_SNAPSHOT)
        _, n = await receive_snapshot(conn, theirs, self.node.store, self.node.wall_us)
        return n

    async def install_snapshot(self, theirs: dict, inst: Install) -> None:
        """Complete the received snapshot as the join machine said (node/core/lifecycle_join.py
        Install): an anonymous replica's id, the fence, where the WAL starts; then open it."""
        node = self.node
        store = node.store
        join = inst.anon_id is None
        if not join:
            store.put_cluster_member(Member(node.uuid, inst.anon_id, node.cfg.address, STATE_ANON))
        initial = initial_from_wire((theirs.get("store") or {}).get("initial"))
        if initial is not None:   # the cluster's initial signature, set once at its creation
            store.set_meta(created_s=initial.created_s, founders=list(initial.founders),
                           initial_signature=initial_to_wire(initial))
        store.set_meta(anon=not join, store_status="dirty", gc_vclock=inst.gc_vclock)
        if inst.fence is not None:
            node.fence.set(inst.fence, rebuilt=True)
        store.set_meta(cluster_uuid=theirs["cluster_uuid"])   # last: a store is non-empty from here on
        self.open_bootstrapped()
        node.life.after_open()
        node.journal.wal and node.journal.wal.rotate(store.vclock.to_dict(), store.table.rows())
        log.info("node: %s via %s: %d rows at vclock %s; this node is id %d",
                 "joined" if join else "fetched a snapshot", theirs["address"], inst.rows, store.vclock,
                 node.core.self_id)

    async def reopen_after_rejoin(self, swap) -> None:
        """The rejoin's new store is complete: close everything that reads the old one, swap it
        in, and start again from it. A backup under way finishes first, from the old store and
        WAL (a new one is refused while the node rejoins). No inbound link is taken meanwhile
        (`links_refused`): one taken while the others closed (each close awaits) outlived the
        swap (nemesis seed 51), its relay reading a WAL that was gone, and it could have read on
        into the new WAL, whose ids are the donor's, under a greeting that stated the old table's."""
        node = self.node
        running = [j.task for j in node.backups if j.task is not None]
        if running:     # each reads the old store and WAL: let it finish (none starts while rejoining)
            log.info("rejoin: %d backup(s) of the old store finish before it is swapped out", len(running))
            await asyncio.wait(running)
        node.links_refused = "this node is swapping in a store rebuilt from a snapshot"
        try:
            for c in list(node.links):
                await c.close()               # relays read the old WAL
            await node.journal.stop()
            node.journal, node.core = None, None
            node.store.close()
            swap(node.data_dir)
            node.store = self._new_store()
            self.open_bootstrapped()
            node.life.after_open()
            node.journal.wal and node.journal.wal.rotate(node.store.vclock.to_dict(), node.store.table.rows())
            if node.status not in ENDING:     # a stop that came meanwhile stands
                node.status, node.status_reason = "running", ""
        finally:
            node.links_refused = None
        node.set_peers(list(node.peers))
