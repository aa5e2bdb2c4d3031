"""Identity and cluster lifecycle of one node: crash-safe registration on JOIN/REGISTER
(RocketMQ), the Qpid join protocol (wait for N, store status and signatures, initialization,
joining, wrong store), orderly cluster shutdown and address changes (fault points for tests of
all this: node/faults.py).

The decisions come from node/identity/identity_file.py (register codes, the online process)
and node/identity/signature.py (decide_initialization, decide_join); this module gathers their
inputs from greetings and the store and performs the effects. server.py calls it at fixed places:
  start            open_identity() before the store opens, after_open() once it is open
  every handshake  greeting_fields() into our greeting, observe_greeting() on theirs
  start-up task    join_or_bootstrap() (no store) | initialize_from_store(); then go_active()
  relay            apply_registration() for JOIN/REGISTER
  shutdown         request_shutdown() (cluster phases), on_stop() marks the store clean

Rules kept here:
- The joiner's identity.temp is durable before JOIN leaves; the donor applies idempotently for
  one uuid + register code (codes kept in the donor's `_meta`); an unknown outcome retries with
  the same code; only an explicit rejection starts over. A node with an identity or an
  unfinished registration never bootstraps a new cluster.
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from node import limits
from node.applier.applier import PROBE_ERRORS, open_link, probe
from node.cluster_space.table import STATE_MEMBER, ClusterTable, Member
from node.core import messages as m
from node.core.membership import greeting_vclock
from node.errors import ConfigError, PeerRefused, RemoteProtocolError, StorageError
from node.fence import remember_registration
from node.identity import identity_file as idf
from node.identity.signature import (
    Decision, InitialSignature, MemberStatus, Outcome, StoreStatus, decide_initialization, decide_join,
    final_to_wire, initial_from_wire, initial_to_wire, member_status_from_greeting, stored_status,
)

if TYPE_CHECKING:
    from node.server import Node

log = logging.getLogger("replog.lifecycle")

# --- limits (unit last; why on each line) ------------------------------------------------------
poll_timeout_s = 5.0                 # one status poll of one peer (connect + auth + greeting)
wait_backoff_s_max = 1.0             # a forming cluster polls its peers at most this far apart
catch_up_poll_s = 0.05               # how often a catching-up member compares vclocks
address_follow_s = 0.5               # how often appliers are checked against members' new addresses
LOCK_FILE = "replog.lock"            # flock'd by the running node; `admin mark-clean` checks it

class Aborted(StorageError):
    """Start-up cannot go on without an operator (no clean store, wrong store, ...): the process
    prints the message as one line and exits 1."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


def _valid_code(code: Any) -> bool:
    return (isinstance(code, str) and len(code) == 2 * idf.register_code_bytes
            and not code.strip("0123456789abcdef"))


@dataclass(frozen=True, slots=True)
class ApplyResult:
    ok: bool
    id: int = 0
    reason: str = ""
    next_id: int | None = None


class Lifecycle:
    def __init__(self, node: "Node"):
        self.node = node
        self.proposal = (str(uuidlib.uuid4()), time.time())   # for a new cluster, if we found it
        self.peers_seen: dict[str, dict] = {}                 # uuid -> last greeting (both directions)
        self.advertised: dict[str, str] = {}                  # uuid -> the address its last greeting gave
        self.moved_from: dict[str, set[str]] = {}             # uuid -> addresses it advertised before
        self.refusals: dict[str, str] = {}                    # peer address -> the refusal last logged
        self._lock_fd: int | None = None
        self._register_lock = asyncio.Lock()

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

    def may_bootstrap(self) -> bool:
        """Only a node that never registered anywhere may found a cluster."""
        return self.member_cluster_uuid() is None

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
        if node.store is None:
            return {}
        st = self.my_status()
        return {
            "store": {"status": st.status.value, "initial": initial_to_wire(st.initial),
                      "final": final_to_wire(st.final), "proposal": list(st.proposal) if st.proposal else None},
            "vclock_uuid": node.core.vclock_by_uuid() if node.core else {},
            "wait_for": self.cfg.cluster_wait_for,
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

    async def poll_peers(self, timeout: float = poll_timeout_s) -> dict[str, dict | BaseException]:
        """One handshake with every configured peer (greetings only, then BYE)."""
        node = self.node

        async def one(address: str) -> tuple[str, dict | BaseException]:
            try:
                return address, await probe(node, node.http_session, address, timeout)
            except PROBE_ERRORS as e:
                if isinstance(e, PeerRefused) and self.refusals.get(address) != str(e):
                    # a lasting reason (secret, TLS certificate, cluster): logged once per change
                    self.refusals[address] = str(e)
                    log.warning("peer %s refused: %s", address, e)
                return address, e

        peers = [a for a in self.node.peers if a != self.cfg.address]
        return dict(await asyncio.gather(*(one(a) for a in peers)))

    @staticmethod
    def _notes(polled: dict[str, dict | BaseException]) -> str:
        refused = [f"{a} refused: {e}" for a, e in polled.items() if isinstance(e, PeerRefused)]
        return ("; " + "; ".join(refused)) if refused else ""

    def _check_wrong_store(self, polled: dict[str, dict | BaseException]) -> None:
        """Peers that answered all belong to another cluster than ours: abort (Qpid: wrong store)."""
        mine = self.member_cluster_uuid()
        if mine is None:
            return
        ours = [a for a, g in polled.items() if isinstance(g, dict) and g.get("cluster_uuid") in (mine, None)]
        other = {a: (g.get("cluster_uuid") if isinstance(g, dict) else str(g)) for a, g in polled.items()
                 if (isinstance(g, dict) and g.get("cluster_uuid") not in (mine, None))
                 or (isinstance(g, PeerRefused) and g.code == "wrong_cluster")}
        if other and not ours:
            what = "; ".join(f"{a}: {c}" for a, c in sorted(other.items()))
            raise Aborted(f"wrong store: this node belongs to cluster {mine}, the peers it found do not ({what})",
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

    # --- no store: join a cluster, or found one ------------------------------------------------------
    async def join_or_bootstrap(self) -> None:
        """Join through a running peer; if every peer is fresh too, the lowest uuid among all
        of us bootstraps (after `cluster_wait_for` members exchanged status) and the others join it."""
        node, cfg = self.node, self.cfg
        wait_for = cfg.cluster_wait_for
        node.status, node.status_reason = "joining", "looking for a booted peer"
        peers = [a for a in node.peers if a != cfg.address]
        if not peers and wait_for <= 1:
            if not self.may_bootstrap():
                raise Aborted(f"this node is a member of cluster {self.member_cluster_uuid()} (identity file in "
                              f"{node.data_dir}) but has an empty store and no peers to rejoin through",
                              "start it with --peers of its cluster, or remove the identity files to found a new cluster")
            await node._bootstrap_new_cluster(InitialSignature(self.proposal[0], self.proposal[1], (node.uuid,)))
            return
        delay = limits.reconnect_backoff_min_s
        while True:
            polled = await self.poll_peers()
            self._check_wrong_store(polled)
            self.check_must_match(polled)
            running = [(a, g) for a, g in polled.items()
                       if isinstance(g, dict) and g.get("cluster_uuid") and g.get("status") == "running"]
            failed: list[str] = []
            for address, theirs in running:
                try:
                    await self.join_via(address, theirs)
                    return
                except idf.RegistrationPending as e:
                    log.warning("join via %s: %s", address, e)
                    failed.append(f"{address}: {e}")
                except PeerRefused as e:
                    if e.code == "expelled":
                        raise Aborted(f"this node ({node.uuid}) was expelled from cluster "
                                      f"{theirs['cluster_uuid']}: {e.message}") from None
                    log.warning("join via %s refused: %s", address, e)
                    failed.append(f"{address} refused: {e}")
                except (RemoteProtocolError, ConnectionError, OSError, asyncio.TimeoutError,
                        aiohttp.ClientError) as e:
                    log.warning("join via %s failed: %s; retrying", address, e)
                    failed.append(f"{address}: {e}")
                    node._wipe_partial_join()
            if failed:
                node.status, node.status_reason = "joining", "join failed, retrying: " + "; ".join(failed)
            notes = self._notes(polled)
            fresh = {a: g["uuid"] for a, g in polled.items() if isinstance(g, dict) and not g.get("cluster_uuid")}
            all_fresh_lowest = len(fresh) == len(peers) and all(node.uuid < u for u in fresh.values())
            if not running and not self.may_bootstrap():
                node.status_reason = f"waiting for a running member of cluster {self.member_cluster_uuid()}{notes}"
            elif not running and wait_for >= 1:
                d = self.decide()
                if d.outcome is Outcome.ABORT and d.code in ("no_clean_store", "different_shutdowns"):
                    # This store is empty: it can only join. Peers whose stores are dirty may be
                    # members that founded or joined this very formation a moment ago and are not
                    # running yet; if they really cannot recover, they abort themselves.
                    node.status = "waiting"
                    node.status_reason = f"{d.message} among the peers; waiting for a running member{notes}"
                elif d.outcome is Outcome.ABORT:
                    raise Aborted(d.message, d.hint)
                elif d.outcome is Outcome.WAIT:
                    node.status = "waiting"
                    node.status_reason = d.message + notes
                elif d.outcome is Outcome.ACTIVATE and all_fresh_lowest:
                    log.info("join: %d initial members exchanged status; this node has the lowest uuid: "
                             "bootstrapping", len(d.active))
                    await node._bootstrap_new_cluster(d.initial)
                    return
                else:
                    node.status = "joining"
                    node.status_reason = (f"{len(d.active) or len(self.peers_seen) + 1} initial members exchanged "
                                          f"status; waiting for a running member to join{notes}")
            elif not running and all_fresh_lowest:
                log.info("join: every peer is fresh and this node has the lowest uuid: bootstrapping")
                founders = tuple(fresh.values()) + (node.uuid,)
                await node._bootstrap_new_cluster(InitialSignature(self.proposal[0], self.proposal[1], founders))
                return
            elif not running:
                node.status_reason = f"waiting for a booted peer ({len(fresh)} of {len(peers)} peers fresh){notes}"
            await asyncio.sleep(delay)
            delay = min(delay * 2, wait_backoff_s_max)

    async def join_via(self, address: str, theirs: dict) -> None:
        """Register through the donor (identity.temp first, idempotent apply, identity after),
        then take its snapshot over the same link."""
        node = self.node
        cluster_uuid = theirs["cluster_uuid"]
        mine = self.member_cluster_uuid()
        if mine is not None and mine != cluster_uuid:
            raise Aborted(f"wrong store: this node's identity belongs to cluster {mine}, {address} to {cluster_uuid}")
        held: dict[str, Any] = {}
        # A uuid that was a member before may have written rows its peers still hold: fenced.
        existed = node.uuid in {r[0] for r in theirs.get("cluster") or ()}
        if not self.uses_identity_files:
            conn, answer = await self.apply_once(address, m.JOIN, None, None)
            if not isinstance(answer, idf.ApplyOk):
                raise RemoteProtocolError(f"JOIN via {address}: {answer}")
        else:
            ident = idf.load_identity(node.data_dir)
            existed = ident is not None and ident.active
            if ident is not None:
                # a member re-joining with an empty store: its registration is final
                conn, answer = await self.apply_once(address, m.JOIN, ident.register_code, None)
                if isinstance(answer, idf.ApplyRejected):
                    raise Aborted(f"identity: {address} refuses this node's registration: {answer.reason}",
                                  "another node may be running with a copy of this data dir")
                if not isinstance(answer, idf.ApplyOk):
                    raise RemoteProtocolError(f"JOIN via {address}: {answer.reason}")
                if answer.replica_id != ident.replica_id:
                    log.info("identity: %s calls this node id %d (the identity file says %d)",
                             address, answer.replica_id, ident.replica_id)
            else:
                async def apply(p: idf.PendingRegistration) -> idf.ApplyAnswer:
                    c, a = await self.apply_once(address, m.JOIN, p.register_code, p.requested_id)
                    if c is not None:
                        held["conn"] = c
                    return a

                try:
                    requested = ClusterTable(Member.from_row(r) for r in theirs["cluster"]).lowest_free_id()
                except (ValueError, TypeError, IndexError, AssertionError):
                    requested = None
                try:
                    ident = await idf.register(node.data_dir, apply, new_uuid=node.uuid, cluster_uuid=cluster_uuid,
                                               requested_id=requested, now_s=time.time())
                except BaseException:
                    if "conn" in held:
                        await held.pop("conn").close()
                    raise
                conn = held.pop("conn")
                log.info("identity: registered as id %d of cluster %s via %s", ident.replica_id, cluster_uuid, address)
        try:
            await node._fetch_snapshot(conn, theirs, join=True, existed=existed)
        finally:
            await conn.close()

    async def apply_once(self, address: str, kind: int, code: str | None,
                         requested_id: int | None):
        """One JOIN/REGISTER carrying the register code. Returns (link kept open after an ok,
        or None; the answer). A timeout or a broken link is an unknown outcome."""
        node = self.node
        try:
            conn, theirs = await open_link(node, node.http_session, address)
        except (RemoteProtocolError, ConnectionError, OSError, asyncio.TimeoutError, aiohttp.ClientError) as e:
            return None, idf.ApplyUnknown(f"{address}: {e}")
        if not theirs.get("cluster_uuid") or theirs.get("status") != "running":
            await conn.close()
            return None, idf.ApplyUnknown(f"{address} is {theirs.get('status')}, not a running member")
        try:
            await conn.send(kind, code=code, id=requested_id)
            if code is not None:
                idf.fault_point("after_apply_sent")
            msg = await conn.expect(m.REGISTERED, timeout=limits.handshake_timeout_s)
        except PeerRefused as e:
            await conn.close()
            if e.code == "register_rejected":
                nxt = (getattr(e, "body", None) or {}).get("next_id")
                return None, idf.ApplyRejected(e.message, nxt if isinstance(nxt, int) and nxt >= 1 else None)
            raise
        except (RemoteProtocolError, ConnectionError, asyncio.TimeoutError, aiohttp.ClientError) as e:
            await conn.close()
            return None, idf.ApplyUnknown(f"{address}: {e}")
        return conn, idf.ApplyOk(msg["id"])

    async def register_anon(self) -> None:
        """An anonymous replica restarted without --anon becomes a member through the same
        crash-safe exchange (REGISTER carries the code); it keeps its uuid, local id and rows."""
        node, cfg = self.node, self.cfg
        node.status, node.status_reason = "registering", "registering an anonymous replica"
        cluster_uuid = node.store.get_meta("cluster_uuid")
        while True:
            for address in node.peers:
                async def apply(p: idf.PendingRegistration, address: str = address) -> idf.ApplyAnswer:
                    c, a = await self.apply_once(address, m.REGISTER, p.register_code, p.requested_id)
                    if c is not None:
                        try:
                            await c.send(m.BYE)
                        except (ConnectionError, RuntimeError, aiohttp.ClientError):
                            pass
                        await c.close()
                    return a

                try:
                    if self.uses_identity_files:
                        await idf.register(node.data_dir, apply, new_uuid=node.uuid, cluster_uuid=cluster_uuid,
                                           requested_id=None, now_s=time.time())
                    else:
                        c, a = await self.apply_once(address, m.REGISTER, None, None)
                        if c is None:
                            raise RemoteProtocolError(str(a))
                        await c.close()
                except (idf.RegistrationPending, PeerRefused, RemoteProtocolError) as e:
                    log.warning("register via %s failed: %s", address, e)
                    continue
                _, txn = node.core.register_member(node.uuid, cfg.address, node.wall_us())
                if txn is not None:
                    await node.journal.submit([txn])
                node.store.set_meta(anon=False)
                log.info("node: registered as a member via %s", address)
                return
            await asyncio.sleep(0.5)

    # --- donor side of JOIN / REGISTER ---------------------------------------------------------------
    async def apply_registration(self, theirs: dict, body: dict) -> ApplyResult:
        """After RocketMQ's CASApplyBrokerId: the same uuid + code is granted the same id however
        often it comes; a code recorded for another registration of that uuid is rejected. Codes
        live in this node's `_meta` ("registrations"); a member registered elsewhere (another
        donor, a founder) has no code here and adopts the first one it brings."""
        node = self.node
        uuid, address = theirs["uuid"], theirs["address"]
        code, requested = body.get("code"), body.get("id")
        if code is not None and not _valid_code(code):
            raise RemoteProtocolError(f"register code {code!r} is not {2 * idf.register_code_bytes} hex digits")
        if requested is not None and (type(requested) is not int or not 1 <= requested <= limits.replica_id_max):
            raise RemoteProtocolError(f"requested id {requested!r} is not an id")
        async with self._register_lock:
            core, store = node.core, node.store
            if code is None:          # a joiner without identity files (lease identity)
                remember_registration(node.data_dir, uuid)
                return ApplyResult(True, await node.register_member(uuid, address))
            codes: dict = store.get_meta("registrations") or {}
            registry = {mem.uuid: (mem.id, str((codes.get(mem.uuid) or [0, ""])[1])) for mem in core.table.members()}
            known = core.table.get(uuid)
            if known is not None and uuid not in codes:
                registry[uuid] = (known.id, code)
            lowest = core.table.lowest_free_id()
            result = idf.apply_registration(registry, uuid, requested, code, lowest)
            if result[0] != "ok":
                nxt = known.id if known is not None else lowest
                log.warning("register: refused %s: %s (next id %d)", uuid, result[1], nxt)
                return ApplyResult(False, reason=str(result[1]), next_id=nxt)
            granted = int(result[1])
            # noted beside the identity first: if this store is lost, its fence still knows this
            # member may hold its rows (node/fence.py)
            remember_registration(node.data_dir, uuid)
            local_id, txn = core.register_member(uuid, address, node.wall_us(), proposed_id=granted)
            assert local_id == granted, (local_id, granted)
            if txn is not None:
                await node.journal.submit([txn])
            if codes.get(uuid) != [granted, code]:
                codes[uuid] = [granted, code]
                store.set_meta(registrations=codes)
            log.info("register: %s is id %d (code %s…)", uuid, granted, code[:8])
            return ApplyResult(True, granted)

    # --- a store: initialization (Qpid) or joining an active cluster ---------------------------------
    async def initialize_from_store(self) -> None:
        node, cfg = self.node, self.cfg
        if cfg.anon or node.core.anon or node.lease is not None:
            return
        wait_for = cfg.cluster_wait_for
        if not [a for a in node.peers if a != cfg.address] and wait_for == 0:
            return
        node.status, node.status_reason = "waiting", "exchanging status with the peers"
        delay = limits.reconnect_backoff_min_s
        while True:
            polled = await self.poll_peers(poll_timeout_s if wait_for else 2.0)
            self._check_wrong_store(polled)
            self.check_must_match(polled)
            mine = self.my_status()
            active = [g for g in polled.values()
                      if isinstance(g, dict) and g.get("cluster_uuid") and g.get("status") == "running"]
            if active:
                theirs = active[0]
                their_initial = initial_from_wire((theirs.get("store") or {}).get("initial"))
                if their_initial is not None and mine.initial is not None:
                    jd = decide_join(their_initial, mine.status, mine.initial)
                    if not jd.update:
                        raise Aborted(jd.message)
                if wait_for:
                    await self.catch_up(theirs)
                return
            if not wait_for:
                return
            d = self.decide()
            if d.outcome is Outcome.WAIT:
                node.status, node.status_reason = "waiting", d.message + self._notes(polled)
                await asyncio.sleep(delay)
                delay = min(delay * 2, wait_backoff_s_max)
                continue
            if d.outcome is Outcome.ABORT:
                raise Aborted(d.message, d.hint)
            if d.outcome is Outcome.CATCH_UP and node.uuid not in d.active:
                source = d.source_for(node.uuid)
                await self.catch_up(self.peers_seen[source])
            log.info("initialization: %s; %d initial members; this node goes active", d.outcome.value,
                     len(d.active) + len(d.catch_up))
            return

    async def catch_up(self, theirs: dict) -> None:
        """Take the updates a member with a clean store (or an active one) has, then go active."""
        node = self.node
        target = greeting_vclock(theirs)
        node.status = "catching_up"
        node.status_reason = f"catching up from {theirs.get('address')} ({theirs.get('uuid')})"
        node.set_peers(list(self.node.peers))
        while True:
            have = node.core.vclock_by_uuid()
            behind = sum(max(0, lsn - have.get(u, 0)) for u, lsn in target.items())
            if not behind:
                log.info("initialization: caught up with %s at %s", theirs.get("address"), target)
                return
            node.status_reason = f"catching up from {theirs.get('address')}: {behind} rows behind"
            await asyncio.sleep(catch_up_poll_s)

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
            await asyncio.sleep(address_follow_s)
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
