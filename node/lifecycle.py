"""Identity and cluster lifecycle of one node: the data dir lock and identity files, the Qpid
status exchange (store status and signatures, wait for N, initialization, wrong store), going
active, and following a member's new address. Joining and the donor's side of JOIN/REGISTER
are node/join.py's; an orderly cluster shutdown is node/cluster_shutdown.py's (fault points for
tests of all this: node/faults.py).

The decisions are the join machine's (node/core/lifecycle_join.py: whether to wait, catch up,
go active or stop, and the wrong-store rule) over node/identity/signature.py's Qpid rules; this
module gathers their inputs from greetings and the store (the machine's context, through
node/join.py, which drives it) and performs the effects. The process (node/process/node.py)
calls it at fixed places:
  start            open_identity() before the store opens, after_open() once it is open
  every handshake  greeting_fields() into our greeting, observe_greeting() on theirs
  start-up task    initialize_from_store() (a store; no store: node/join.py); then go_active()
  relay            apply_registration() for JOIN/REGISTER (node/join.py does it)
  shutdown         unlock_data_dir()

Rules kept here:
- The Qpid initialization protocol runs when `cluster_wait_for` >= 1. With the default 0 a node
  recovers from its own store and serves at once, as Tarantool does (a power-off of every node
  comes back without help); it still refuses another cluster's store (`wrong store`).
- A store is "dirty" from the moment its node goes active; only an orderly cluster shutdown whose
  agreed final signature equals the store's vclock marks it "clean".
- Damaged identity files, `Cannot recover, no clean store` and `wrong store` end the process with
  one line on stderr (Aborted), never a traceback and never a silent fresh identity."""
from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
import uuid as uuidlib
from typing import TYPE_CHECKING

from node import limits
from node.applier.handshake import PROBE_ERRORS, probe
from node.cluster_space.table import STATE_MEMBER
from node.core.lifecycle_join_rules import wrong_store
from node.core.link import twins
from node.core.membership import greeting_vclock
from node.errors import ConfigError, PeerRefused, StorageError
from node.identity import identity_file as idf
from node.identity.signature import (
    Decision, MemberStatus, StoreStatus, decide_initialization, final_to_wire, initial_to_wire,
    member_status_from_greeting, stored_status,
)
from node.join import Aborted, ApplyResult

if TYPE_CHECKING:
    from node.process.ports import LifecycleHost

log = logging.getLogger("replog.lifecycle")

LOCK_FILE = "replog.lock"            # flock'd by the running node; `admin mark-clean` checks it


# Refusals that pass (node/applier/outcome.py retries them as broken links): said at INFO.
PASSING_REFUSALS = ("not_ready", "silent")


class Lifecycle:
    def __init__(self, node: "LifecycleHost"):
        self.node = node
        self.proposal = (str(uuidlib.uuid4()), time.time())   # for a new cluster, if we found it
        self.peers_seen: dict[str, dict] = {}                 # uuid -> last greeting (both directions)
        self.advertised: dict[str, str] = {}                  # uuid -> the address its last greeting gave
        self.moved_from: dict[str, set[str]] = {}             # uuid -> addresses it advertised before
        self.refusals: dict[str, str] = {}                    # peer address -> the refusal last logged
        self._lock_fd: int | None = None

    @property
    def cfg(self):
        return self.node.cfg

    @property
    def uses_identity_files(self) -> bool:
        return self.node.lease is None    # lease identity: the slot is the identity

    # --- start: data dir lock, identity files, store facts -----------------------------------------
    def lock_data_dir(self) -> None:
        if self.node.lease is not None:
            return      # a lease slot's holder is fenced by version, not by a local lock
        path = os.path.join(self.node.data_dir, LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StorageError(f"data dir {self.node.data_dir} is in use by another replog process") from None
        self._lock_fd = fd
        self._refuse_a_stopped_twin()

    def _refuse_a_stopped_twin(self) -> None:
        """A process on this dir stopped as the younger of two processes of its member, with no
        fence up (node/core/link/twins.py): it may hold rows under lsns the other one used."""
        path = os.path.join(self.node.data_dir, twins.STOPPED_FILE)
        try:
            with open(path, "rb") as f:
                note = f.read(4096).decode("utf-8", "replace")
        except FileNotFoundError:
            return
        raise ConfigError("data_dir", f"{self.node.data_dir} served a process that stopped as the younger of two "
                          f"processes of its member ({path}: {note[:600]}); it may hold rows under lsns the other "
                          "used. Discard this directory, or take its data as a new member (replog backup, then "
                          "replog restore --as-new-member); remove the file only if that process wrote nothing")

    def unlock_data_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def open_identity(self) -> str | None:
        """Read identity / identity.temp (a damaged file is a hard error naming it); the uuid
        they name, which the store must agree with."""
        if not self.uses_identity_files:
            return None
        d = self.node.data_dir
        ident = idf.load_identity(d)
        pending = None if ident is not None else idf.load_pending(d)
        found = ident or pending
        return found.uuid if found else None

    def after_open(self) -> None:
        """A store was opened with data: keep its facts and its identity file consistent."""
        node, store = self.node, self.node.store
        if store.get_meta("initial_signature") is None:
            _, initial, _ = stored_status(store.get_meta)
            store.set_meta(initial_signature=initial_to_wire(initial))
        if not self.uses_identity_files or node.core.anon:
            return
        cluster_uuid = store.get_meta("cluster_uuid")
        ident = idf.load_identity(node.data_dir)
        if ident is None:
            if idf.load_pending(node.data_dir) is None:
                self._write_identity(cluster_uuid, node.core.self_id)
        elif ident.cluster_uuid != cluster_uuid:
            raise Aborted(f"wrong store: identity file {os.path.join(node.data_dir, idf.IDENTITY_FILE)} names "
                          f"cluster {ident.cluster_uuid}, the store belongs to cluster {cluster_uuid}")

    def _write_identity(self, cluster_uuid: str, replica_id: int) -> None:
        """A member whose store exists without an identity file (a founder, or a store from
        before identity files): commit one from the store, with a fresh register code."""
        node = self.node
        ident = idf.Identity(node.uuid, replica_id, idf.new_register_code(), cluster_uuid, time.time())
        idf.commit_identity(node.data_dir, ident)
        codes = node.store.get_meta("registrations") or {}
        codes[node.uuid] = [replica_id, ident.register_code]
        node.store.set_meta(registrations=codes)
        log.info("identity: %s is id %d of cluster %s", node.uuid, replica_id, cluster_uuid)

    def member_cluster_uuid(self) -> str | None:
        """The cluster this node belongs to: its store's, else its identity files'."""
        node = self.node
        cu = node.store.get_meta("cluster_uuid") if node.store else None
        if cu or not self.uses_identity_files:
            return cu
        found = idf.load_identity(node.data_dir) or idf.load_pending(node.data_dir)
        return found.cluster_uuid if found else None

    # --- status exchange -----------------------------------------------------------------------------
    def my_status(self) -> MemberStatus:
        node = self.node
        status, initial, final = stored_status(node.store.get_meta, transient=self.cfg.transient)
        if status in (StoreStatus.EMPTY, StoreStatus.TRANSIENT):
            return MemberStatus(node.uuid, status, None, None, node.options_digest, self.proposal)
        return MemberStatus(node.uuid, status, initial, final if status is StoreStatus.CLEAN else None,
                            node.options_digest)

    def greeting_fields(self) -> dict:
        node = self.node
        # A member whose store was lost (its identity files name its cluster) is no fresh node:
        # it says so, and a newcomer polling it waits for that cluster instead of founding its own
        # (node.core.lifecycle_join is_fresh).
        member_of = None if node.store is not None and node.store.get_meta("cluster_uuid") \
            else self.member_cluster_uuid()
        fields = {"member_of": member_of} if member_of else {}
        if node.store is None:
            return fields
        st = self.my_status()
        return {
            "store": {"status": st.status.value, "initial": initial_to_wire(st.initial),
                      "final": final_to_wire(st.final), "proposal": list(st.proposal) if st.proposal else None},
            # what it holds or is writing (claimed): a fenced member counts rows of its own that
            # are still on their way to our disk (node.core.lifecycle_fence hear_greeting)
            "vclock_uuid": node.core.vclock_by_uuid(node.core.claimed) if node.core else {},
            "wait_for": self.cfg.cluster_wait_for,
            **fields,
        }

    def observe_greeting(self, theirs: dict) -> None:
        """Every handshake, either side: remember the peer's status (the Qpid exchange) and
        take a member's new address from the member itself (RocketMQ's re-register step)."""
        if theirs.get("anon"):
            return
        if theirs["uuid"] not in self.peers_seen and len(self.peers_seen) >= limits.members_max:
            return            # more peers than a cluster has members: a peer inventing uuids
        self.peers_seen[theirs["uuid"]] = theirs
        address = theirs.get("address")
        before = self.advertised.get(theirs["uuid"])
        if isinstance(address, str) and address:
            if before and before != address:
                self.moved_from.setdefault(theirs["uuid"], set()).add(before)
            self.advertised[theirs["uuid"]] = address
        node = self.node
        core = node.core
        if core is None or node.journal is None or node.status not in ("running", "catching_up"):
            return
        mem = core.table.get(theirs["uuid"])
        if mem is not None and mem.state == STATE_MEMBER and isinstance(address, str) and address \
                and address != mem.address and core.fence is None:
            _, txn = core.register_member(mem.uuid, address, node.wall_us())
            if txn is not None:
                node.journal.submit_nowait([txn], want_future=False)
                log.info("_cluster: %s moved from %s to %s (its greeting says so)", mem.uuid, mem.address, address)

    async def poll_peers(self, timeout: float = limits.peer_poll_timeout_s) -> dict[str, dict | BaseException]:
        """One handshake with every configured peer (greetings only, then BYE)."""
        node = self.node

        async def one(address: str) -> tuple[str, dict | BaseException]:
            try:
                return address, await probe(node, node.http_session, address, timeout)
            except PROBE_ERRORS as e:
                if isinstance(e, PeerRefused) and self.refusals.get(address) != str(e):
                    # a lasting reason (secret, TLS certificate, cluster): logged once per change; a
                    # peer stopping, swapping in a rebuilt store or not joined yet (`not_ready`), or
                    # one that heard nothing from us for a moment (`silent`), passes: said at INFO
                    self.refusals[address] = str(e)
                    log.log(logging.INFO if e.code in PASSING_REFUSALS else logging.WARNING,
                            "peer %s refused: %s", address, e)
                return address, e

        peers = [a for a in self.node.peers if a != self.cfg.address]
        return dict(await asyncio.gather(*(one(a) for a in peers)))

    def check_wrong_store(self, polled: dict[str, dict | BaseException]) -> None:
        """Peers that answered all belong to another cluster than ours: abort (Qpid: wrong store;
        the rule: node.core.lifecycle_join_rules.wrong_store)."""
        what = wrong_store(self.member_cluster_uuid(), polled)
        if what is not None:
            raise Aborted(f"wrong store: this node belongs to cluster {self.member_cluster_uuid()}, the peers it "
                          f"found do not ({what})",
                          "start it with an empty data dir to join them, or point --peers at its own cluster")

    def check_must_match(self, polled: dict[str, dict | BaseException]) -> None:
        """A peer refused this starting node for a must-match option: the configuration is
        wrong here (or there), and retrying cannot help: stop, naming the option and both values."""
        for address, e in sorted(polled.items()):
            if not isinstance(e, PeerRefused) or e.code not in ("cluster_name", "options"):
                continue
            body = getattr(e, "body", None) or {}
            option = body.get("option") if isinstance(body.get("option"), str) else None
            if option is None:
                raise ConfigError(e.code, f"{address} refuses this node: {e.message}")
            ours = self.cfg.cluster_name if option == "cluster_name" else self.cfg.must_match().get(option)
            raise ConfigError(option, f"must be the same on every member: this node has {ours!r}, "
                                      f"{address} has {body.get('value')!r}")

    def decide(self) -> Decision:
        members = {self.node.uuid: self.my_status()}
        for u, g in self.peers_seen.items():
            st = member_status_from_greeting(g)
            if st is not None:
                members[u] = st
        return decide_initialization(list(members.values()), max(1, self.cfg.cluster_wait_for))

    def abort(self, e: BaseException) -> None:
        """End start-up without a traceback: the CLI prints str(e) as one line and exits 1."""
        node = self.node
        log.error("%s", e)
        hint = getattr(e, "hint", "")
        if hint:
            log.error("hint: %s", hint)
        if node.fatal is None:
            node.fatal = e
            node.status, node.status_reason = "failed", str(e)
            node.stopped.set()

    async def apply_registration(self, theirs: dict, body: dict) -> ApplyResult:
        """The donor's side of JOIN / REGISTER, asked by a relay (node/join.py Join)."""
        return await self.node.join.apply_registration(theirs, body)

    # --- a store: initialization (Qpid) or joining an active cluster ---------------------------------
    async def initialize_from_store(self) -> None:
        """A member's store: the Qpid exchange before going active, as the join machine decides
        it (node.core.lifecycle_join start_with_store, driven by node/join.py). An anonymous
        replica and a lease slot take no part in it."""
        node, cfg = self.node, self.cfg
        if cfg.anon or node.core.anon or node.lease is not None:
            return
        await node.join.initialize_from_store()

    async def catch_up(self, theirs: dict) -> None:
        """Take the updates a member with a clean store (or an active one) has, then go active."""
        node = self.node
        target = greeting_vclock(theirs)
        node.status = "catching_up"
        node.status_reason = f"catching up from {theirs.get('address')} ({theirs.get('uuid')})"
        node.set_peers(list(self.node.peers))
        while True:
            target = self._still_held(target, theirs.get("uuid"))
            have = node.core.vclock_by_uuid()
            behind = sum(max(0, lsn - have.get(u, 0)) for u, lsn in target.items())
            if not behind and not node.rejoiner.running:     # (after a rejoin under way: it shows the status)
                log.info("initialization: caught up with %s at %s", theirs.get("address"), target)
                return
            node.status_reason = f"catching up from {theirs.get('address')}: {behind} rows behind"
            await asyncio.sleep(limits.catch_up_poll_s)

    def _still_held(self, target: dict[str, int], peer_uuid: str | None) -> dict[str, int]:
        """The catch-up target, lowered to what the peer says it holds in its latest greeting
        on our link to it: a greeting counts rows it was still writing (greeting_fields), and a
        peer that crashed before writing them, or lost rows written but not synced, holds
        fewer now. Waiting for those would wait until their origin writes that far again."""
        for a in self.node.appliers.values():
            mach = a.machine
            if mach is not None and mach.greeting is not None and mach.peer_uuid == peer_uuid:
                latest = mach.peer_vclock
                return {u: min(lsn, latest.get(u, 0)) for u, lsn in target.items()}
        return target

    async def go_active(self) -> None:
        """The store is in use from now on (dirty); a member whose address changed says so."""
        node, store = self.node, self.node.store
        if self.uses_identity_files and not node.core.anon:
            idf.mark_active(node.data_dir)     # before the first row it may write (node/fence.py)
        if store.get_meta("store_status") != StoreStatus.DIRTY.value:
            store.set_meta(store_status=StoreStatus.DIRTY.value)
            store.sync()
        me = node.core.table.get(node.uuid)
        if me is not None and me.state == STATE_MEMBER and me.address != self.cfg.address and node.core.fence is None:
            log.info("_cluster: this node's address changed from %s to %s", me.address, self.cfg.address)
            await node.register_member(node.uuid, self.cfg.address)
        node.supervise("follow-addresses", self.follow_addresses)

    async def follow_addresses(self) -> None:
        """An applier whose peer moved (the peer's greetings advertised the applier's address
        before and another one since) follows it to the new address."""
        node = self.node
        while True:
            await asyncio.sleep(limits.address_follow_s)
            if node.core is None or node.status != "running":
                continue
            for addr, a in list(node.appliers.items()):
                if a.status == "follow":
                    continue
                # an applier that never got a greeting there: the member that advertised it
                u = a.peer_uuid or next((m for m, before in self.moved_from.items() if addr in before), None)
                if not u:
                    continue
                new = self.advertised.get(u)
                mem = node.core.table.get(u)
                if new and new != addr and addr in self.moved_from.get(u, ()) and new not in node.appliers \
                        and new != self.cfg.address and mem is not None and mem.state == STATE_MEMBER:
                    log.info("applier: %s moved from %s to %s; following it", u, addr, new)
                    node.configure_peers([p for p in node.peers if p != addr] + [new])
