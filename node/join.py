"""Joining a cluster, founding one, and the donor's side of JOIN / REGISTER: the crash-safe
registration after RocketMQ (identity.temp durable before JOIN leaves, the donor applies
idempotently per uuid + register code) and the Qpid rule for who founds a formation.

Whom to ask, whether to found the cluster, when to try again or stop, and how a snapshot is
installed are the join machine's (node/core/lifecycle_join.py, which the simulation drives
too); `Join` is its driver, over the network, the identity files (node/identity/
identity_file.py: register codes) and the store (node/process/opening.py). The status
exchange the machine reads (polled greetings, peers seen, this node's proposal) is
node/lifecycle.py's. The process calls:
  start-up task    join_or_bootstrap() (no store) | fetch_anon() (an anonymous replica with no
                   store) | register_anon() (an anonymous replica restarted without --anon)
  relay            apply_registration() for JOIN/REGISTER (through Lifecycle)
  rejoin           apply_once() (node/rejoin.py)

Rules kept here:
- The joiner's identity.temp is durable before JOIN leaves; the donor applies idempotently for
  one uuid + register code (codes kept in the donor's `_meta`); an unknown outcome retries with
  the same code; only an explicit rejection starts over.
- Registrations on the donor are serialized (one lock): check, grant and submit the `_cluster`
  row for one uuid at a time."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from node import limits
from node.applier.handshake import PROBE_ERRORS, open_link
from node.core import messages as m
from node.core.lifecycle_join import JoinMachine, JoinState
from node.core.lifecycle_join_events import (BROKEN, EXPELLED, IDENTITY_REJECTED, PENDING, REFUSED, WRONG_CLUSTER,
                                             Abort, Activated, Ask, AskFailed, BecomeMember, Bootstrap, Bootstrapped,
                                             CatchUp, CaughtUp, IdGranted, Install, Installed, PollPeers, Polled,
                                             SnapshotReceived, WipePartial)
from node.errors import PeerRefused, RemoteProtocolError, StorageError
from node.fence import remember_registration
from node.identity import identity_file as idf

if TYPE_CHECKING:
    from node.process.ports import JoinHost, StatusExchange

log = logging.getLogger("replog.lifecycle")


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


class Join:
    """The driver of the join machine (node.core.lifecycle_join) for the process, and its
    context: it polls peers, registers, receives and installs snapshots, founds the cluster,
    and shows the machine's status."""

    def __init__(self, node: "JoinHost", life: "StatusExchange"):
        self.node = node
        self.life = life
        self._register_lock = asyncio.Lock()
        self._asked: Ask | None = None          # the request under way
        self._conn = None                        # fetch_anon: the link the request goes over

    @property
    def cfg(self):
        return self.node.cfg

    # --- what the machine reads (JoinContext) ---------------------------------------------------
    uuid = property(lambda self: self.node.uuid)
    wait_for = property(lambda self: self.cfg.cluster_wait_for)
    proposal = property(lambda self: self.life.proposal)
    data_dir = property(lambda self: self.node.data_dir)

    def peers(self) -> list[str]:
        return [a for a in self.node.peers if a != self.cfg.address]

    def member_cluster_uuid(self) -> str | None:
        return self.life.member_cluster_uuid()

    def went_active(self) -> bool | None:
        if not self.life.uses_identity_files:
            return None
        ident = idf.load_identity(self.node.data_dir)
        return ident is not None and ident.active

    def decide(self):
        return self.life.decide()

    def members_seen(self) -> int:
        return len(self.life.peers_seen) + 1

    def my_status(self):
        return self.life.my_status()

    def seen(self, uuid: str) -> dict:
        return self.life.peers_seen[uuid]

    # --- no store: join a cluster, or found one ------------------------------------------------------
    async def join_or_bootstrap(self) -> None:
        """Join through a running peer; if every peer is fresh too, the lowest uuid among all
        of us bootstraps (after `cluster_wait_for` members exchanged status) and the others join it."""
        mach = JoinMachine(self)
        mach.start(time.monotonic())
        await self._drive(mach)

    async def initialize_from_store(self) -> None:
        """A member with a store (node/lifecycle.py initialize_from_store): the Qpid exchange."""
        mach = JoinMachine(self)
        mach.start_with_store(time.monotonic())
        await self._drive(mach)

    async def fetch_anon(self) -> None:
        """An anonymous replica without a store: a snapshot from the first running peer."""
        node = self.node
        node.status, node.status_reason = "joining", "fetching a snapshot (anonymous)"
        mach = JoinMachine(self)
        while True:
            for address in node.peers:
                try:
                    conn, theirs = await open_link(node, node.http_session, address)
                except PROBE_ERRORS as e:
                    log.info("anon: %s not usable yet: %s", address, e)
                    continue
                try:
                    if theirs["cluster_uuid"] and theirs["status"] == "running":
                        self._conn = conn
                        mach.ask(address, m.FETCH_SNAPSHOT, theirs)
                        await self._drive(mach)
                        if mach.done:
                            return
                    else:
                        await conn.send(m.BYE)
                finally:
                    self._conn = None
                    await conn.close()
            await asyncio.sleep(limits.join_retry_s)

    async def _drive(self, mach: JoinMachine) -> None:
        """Act on the machine's Ready until it is done, or idle (a lone request that failed):
        effects in order, each answer stepped in; between rounds, wait out its backoff."""
        while True:
            rd = mach.ready()
            if rd:
                for note in rd.apply:
                    self.node.status_reason = note.reason
                    if note.status is not None:
                        self.node.status = note.status
                for e in rd.effects:
                    await self._perform(mach, e)
                mach.advance(rd)
                continue
            if mach.done or mach.state is JoinState.IDLE:
                return
            assert mach.state is JoinState.WAITING, mach.state
            await asyncio.sleep(max(0.0, mach.retry_at - time.monotonic()))
            mach.tick(time.monotonic())

    async def _perform(self, mach: JoinMachine, e) -> None:
        node, t = self.node, type(e)
        if t is PollPeers:
            polled = await self.life.poll_peers(e.timeout_s)
            self.life.check_wrong_store(polled)
            self.life.check_must_match(polled)
            mach.step(Polled(polled), time.monotonic())
        elif t is Ask:
            self._asked = e
            mach.step(await self._ask(e), time.monotonic())
        elif t is WipePartial:
            node.opening.wipe_partial_join()
        elif t is Install:
            await node.opening.install_snapshot(self._asked.theirs, e)
            mach.step(Installed(e.address), time.monotonic())
        elif t is Bootstrap:
            if e.why:
                log.info("join: %s", e.why)
            await node.opening.bootstrap_new_cluster(e.initial)
            mach.step(Bootstrapped(), time.monotonic())
        elif t is CatchUp:
            await self.life.catch_up(e.theirs)
            mach.step(CaughtUp(), time.monotonic())
        elif t is Activated:
            log.info("%s", e.why)
        elif t is BecomeMember:
            _, txn = node.core.register_member(node.uuid, self.cfg.address, node.wall_us())
            if txn is not None:
                await node.journal.submit([txn])
            node.store.set_meta(anon=False)
            log.info("node: registered as a member via %s", e.address)
        else:
            assert t is Abort, e
            raise Aborted(e.message, e.hint)

    async def _ask(self, e: Ask):
        """One request; what came of it, as the machine's event. Every failure a donor or the
        network can cause is an answer; anything else is a bug or a storage error and stops."""
        address = e.address
        try:
            if e.kind == m.JOIN:
                return await self.join_via(address, e.theirs, e.requested_id)
            if e.kind == m.FETCH_SNAPSHOT:
                n = await self.node.opening.receive_snapshot(self._conn, e.theirs, join=False)
                return SnapshotReceived(address, self.node.store.table.rows(), dict(self.node.store.vclock.items()), n)
            return await self._register_via(address)
        except idf.RegistrationPending as x:
            log.warning("join via %s: %s", address, x)
            return AskFailed(address, str(x), PENDING)
        except PeerRefused as x:
            if x.code != "expelled":
                log.warning("join via %s refused: %s", address, x)
            return AskFailed(address, x.message if x.code == "expelled" else str(x),
                             EXPELLED if x.code == "expelled" else REFUSED)
        except (RemoteProtocolError, ConnectionError, OSError, asyncio.TimeoutError, aiohttp.ClientError) as x:
            log.warning("%s via %s failed: %s; retrying", "join" if e.kind == m.JOIN else "snapshot", address, x)
            return AskFailed(address, str(x), BROKEN)

    async def join_via(self, address: str, theirs: dict, requested: int | None):
        """Register through the donor (identity.temp first, idempotent apply, identity after),
        then take its snapshot over the same link."""
        node = self.node
        cluster_uuid = theirs["cluster_uuid"]
        held: dict[str, Any] = {}
        if not self.life.uses_identity_files:
            conn, answer = await self.apply_once(address, m.JOIN, None, None)
            if not isinstance(answer, idf.ApplyOk):
                raise RemoteProtocolError(f"JOIN via {address}: {answer}")
        else:
            ident = idf.load_identity(node.data_dir)
            if ident is not None:
                # a member re-joining with an empty store: its registration is final
                conn, answer = await self.apply_once(address, m.JOIN, ident.register_code, None)
                if isinstance(answer, idf.ApplyRejected):
                    return AskFailed(address, answer.reason, IDENTITY_REJECTED)
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
                    ident = await idf.register(node.data_dir, apply, new_uuid=node.uuid, cluster_uuid=cluster_uuid,
                                               requested_id=requested, now_s=time.time())
                except BaseException:
                    if "conn" in held:
                        await held.pop("conn").close()
                    raise
                conn = held.pop("conn")
                log.info("identity: registered as id %d of cluster %s via %s", ident.replica_id, cluster_uuid, address)
        try:
            n = await node.opening.receive_snapshot(conn, theirs, join=True)
        finally:
            await conn.close()
        return SnapshotReceived(address, node.store.table.rows(), dict(node.store.vclock.items()), n)

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
        node = self.node
        node.status, node.status_reason = "registering", "registering an anonymous replica"
        mach = JoinMachine(self)
        while True:
            for address in node.peers:
                mach.ask(address, m.REGISTER, {})
                await self._drive(mach)
                if mach.done:
                    return
            await asyncio.sleep(limits.join_retry_s)

    async def _register_via(self, address: str):
        node = self.node
        cluster_uuid = node.store.get_meta("cluster_uuid")

        async def apply(p: idf.PendingRegistration) -> idf.ApplyAnswer:
            c, a = await self.apply_once(address, m.REGISTER, p.register_code, p.requested_id)
            if c is not None:
                try:
                    await c.send(m.BYE)
                except (ConnectionError, RuntimeError, aiohttp.ClientError):
                    pass
                await c.close()
            return a

        try:
            if self.life.uses_identity_files:
                ident = await idf.register(node.data_dir, apply, new_uuid=node.uuid, cluster_uuid=cluster_uuid,
                                           requested_id=None, now_s=time.time())
                return IdGranted(address, ident.replica_id)
            c, a = await self.apply_once(address, m.REGISTER, None, None)
            if c is None:
                raise RemoteProtocolError(str(a))
            await c.close()
            return IdGranted(address, a.replica_id)
        except (idf.RegistrationPending, PeerRefused, RemoteProtocolError) as e:
            if isinstance(e, PeerRefused) and e.code == "wrong_cluster":
                return AskFailed(address, e.message, WRONG_CLUSTER)
            log.warning("register via %s failed: %s", address, e)
            return AskFailed(address, str(e), REFUSED)

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
            if node.lease is not None:
                node.lease.serving()   # past its deadline the loss begins here: the status says so
            if node.status != "running":
                # The relay checked, but this waited for another registration meanwhile: a row
                # under our own id is written only while running (not after a lease was lost,
                # nor once a rejoin or a stop began).
                raise PeerRefused("not_ready", f"this node is {node.status}: {node.status_reason}")
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
                await node.journal.durable()    # answered as REGISTERED / JOIN's id: see register_member
            if codes.get(uuid) != [granted, code]:
                codes[uuid] = [granted, code]
                store.set_meta(registrations=codes)
            log.info("register: %s is id %d (code %s…)", uuid, granted, code[:8])
            return ApplyResult(True, granted)
