"""Joining a cluster, founding one, and the donor's side of JOIN / REGISTER: the crash-safe
registration after RocketMQ (identity.temp durable before JOIN leaves, the donor applies
idempotently per uuid + register code) and the Qpid rule for who founds a formation.

The decisions come from node/identity/identity_file.py (register codes) and
node/identity/signature.py (decide_initialization); the status exchange they read (polled
greetings, peers seen, this node's proposal) is node/lifecycle.py's. The process calls:
  start-up task    join_or_bootstrap() (no store) | register_anon() (an anonymous replica
                   restarted without --anon)
  relay            apply_registration() for JOIN/REGISTER (through Lifecycle)
  rejoin           apply_once() (node/rejoin.py)

Rules kept here:
- The joiner's identity.temp is durable before JOIN leaves; the donor applies idempotently for
  one uuid + register code (codes kept in the donor's `_meta`); an unknown outcome retries with
  the same code; only an explicit rejection starts over. A node with an identity or an
  unfinished registration never bootstraps a new cluster.
- Among fresh nodes only the lowest uuid bootstraps, and only once `cluster_wait_for` members
  exchanged status; the others join it.
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
from node.applier.handshake import open_link
from node.cluster_space.table import ClusterTable, Member
from node.core import messages as m
from node.errors import PeerRefused, RemoteProtocolError, StorageError
from node.fence import remember_registration
from node.identity import identity_file as idf
from node.identity.signature import InitialSignature, Outcome

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
    def __init__(self, node: "JoinHost", life: "StatusExchange"):
        self.node = node
        self.life = life
        self._register_lock = asyncio.Lock()

    @property
    def cfg(self):
        return self.node.cfg

    # --- no store: join a cluster, or found one ------------------------------------------------------
    async def join_or_bootstrap(self) -> None:
        """Join through a running peer; if every peer is fresh too, the lowest uuid among all
        of us bootstraps (after `cluster_wait_for` members exchanged status) and the others join it."""
        node, cfg = self.node, self.cfg
        wait_for = cfg.cluster_wait_for
        node.status, node.status_reason = "joining", "looking for a booted peer"
        peers = [a for a in node.peers if a != cfg.address]
        if not peers and wait_for <= 1:
            if not self.life.may_bootstrap():
                raise Aborted(f"this node is a member of cluster {self.life.member_cluster_uuid()} (identity file in "
                              f"{node.data_dir}) but has an empty store and no peers to rejoin through",
                              "start it with --peers of its cluster, or remove the identity files to found a new cluster")
            await node.opening.bootstrap_new_cluster(InitialSignature(self.life.proposal[0], self.life.proposal[1], (node.uuid,)))
            return
        delay = limits.reconnect_backoff_min_s
        while True:
            polled = await self.life.poll_peers()
            self.life.check_wrong_store(polled)
            self.life.check_must_match(polled)
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
                    node.opening.wipe_partial_join()
            if failed:
                node.status, node.status_reason = "joining", "join failed, retrying: " + "; ".join(failed)
            notes = self.life.notes(polled)
            fresh = {a: g["uuid"] for a, g in polled.items() if isinstance(g, dict) and not g.get("cluster_uuid")}
            all_fresh_lowest = len(fresh) == len(peers) and all(node.uuid < u for u in fresh.values())
            if not running and not self.life.may_bootstrap():
                node.status_reason = f"waiting for a running member of cluster {self.life.member_cluster_uuid()}{notes}"
            elif not running and wait_for >= 1:
                d = self.life.decide()
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
                    await node.opening.bootstrap_new_cluster(d.initial)
                    return
                else:
                    node.status = "joining"
                    node.status_reason = (f"{len(d.active) or len(self.life.peers_seen) + 1} initial members exchanged "
                                          f"status; waiting for a running member to join{notes}")
            elif not running and all_fresh_lowest:
                log.info("join: every peer is fresh and this node has the lowest uuid: bootstrapping")
                founders = tuple(fresh.values()) + (node.uuid,)
                await node.opening.bootstrap_new_cluster(InitialSignature(self.life.proposal[0], self.life.proposal[1], founders))
                return
            elif not running:
                node.status_reason = f"waiting for a booted peer ({len(fresh)} of {len(peers)} peers fresh){notes}"
            await asyncio.sleep(delay)
            delay = min(delay * 2, limits.join_wait_backoff_s_max)

    async def join_via(self, address: str, theirs: dict) -> None:
        """Register through the donor (identity.temp first, idempotent apply, identity after),
        then take its snapshot over the same link."""
        node = self.node
        cluster_uuid = theirs["cluster_uuid"]
        mine = self.life.member_cluster_uuid()
        if mine is not None and mine != cluster_uuid:
            raise Aborted(f"wrong store: this node's identity belongs to cluster {mine}, {address} to {cluster_uuid}")
        held: dict[str, Any] = {}
        # A uuid that was a member before may have written rows its peers still hold: fenced.
        existed = node.uuid in {r[0] for r in theirs.get("cluster") or ()}
        if not self.life.uses_identity_files:
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
            await node.opening.install_snapshot(conn, theirs, join=True, existed=existed)
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
                    if self.life.uses_identity_files:
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
            await asyncio.sleep(limits.join_retry_s)

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
