"""Orderly cluster shutdown (Qpid's "automatic restart after orderly shutdown").

`POST /v1/admin/shutdown {"cluster": true}` makes this node the coordinator: it quiesces every
member (writes refused, replication goes on), waits until all hold one vclock by uuid, sends
that vclock + a shutdown id as the final signature, and everybody stops; each store whose
vclock equals the agreed one is marked clean as its node stops (`on_stop`). A quiesced member
that hears no final phase resumes serving after `quiesce_hold_s` (node/limits.py). See docs/operations.md.

The phases travel over replication links (SHUTDOWN after the greeting, node/applier/relay.py):
authenticated by the cluster secret and sealed by the session, answered only to a member, and
sent only to the member whose uuid the greeting names. The client bearer token never leaves
this node: members' addresses are learned from peers, and anyone holding the cluster secret can
register a member at an address it listens on."""
from __future__ import annotations

import asyncio
import logging
import uuid as uuidlib
from typing import TYPE_CHECKING

from node import limits
from node.applier.handshake import open_link
from node.cluster_space.table import STATE_MEMBER, Member
from node.core import messages as m
from node.errors import ClientError, RemoteProtocolError
from node.identity.signature import FinalSignature, StoreStatus, final_from_wire, final_to_wire
from node.process.ports import ENDING

if TYPE_CHECKING:
    from node.process.ports import ShutdownHost

log = logging.getLogger("replog.lifecycle")


class ClusterShutdown:
    def __init__(self, node: "ShutdownHost"):
        self.node = node
        self.shutdown_id: str | None = None                   # quiesced for this cluster shutdown
        self.final: FinalSignature | None = None              # agreed: mark the store clean on stop
        self._resume: asyncio.TimerHandle | None = None

    @property
    def cfg(self):
        return self.node.cfg

    async def request(self, cluster: bool, fields: dict) -> dict:
        """POST /v1/admin/shutdown. Plain: this node stops (its store stays dirty). cluster=true:
        this node coordinates an orderly cluster shutdown."""
        node = self.node
        if fields.get("phase") is not None:
            raise ClientError(400, "bad_body", "shutdown phases travel between members over replication links, "
                                               "not through the client API")
        if not cluster:
            asyncio.get_running_loop().call_later(0.05, node.stopped.set)
            return {"status": "stopping", "cluster": False}
        if node.core is None or node.core.anon or node.status != "running":
            raise ClientError(409, "not_ready", f"node is {node.status}"
                              + (" (an anonymous replica)" if node.core and node.core.anon else "")
                              + ": only a running member can shut the cluster down")
        sid = str(uuidlib.uuid4())
        self._quiesce(sid)
        node.spawn(self._coordinate_shutdown(sid), "cluster-shutdown")
        return {"status": "stopping", "cluster": True, "shutdown_id": sid}

    async def phase(self, fields: dict) -> dict:
        """One step a coordinator sends over a replication link (SHUTDOWN): `phase` is quiesce,
        final (with the agreed signature, or none: stop dirty) or resume. ClientError refuses."""
        node = self.node
        loop = asyncio.get_running_loop()
        phase, sid = fields.get("phase"), fields.get("shutdown_id")
        if not isinstance(sid, str) or not sid:
            raise ClientError(400, "bad_body", "a shutdown phase needs a shutdown_id")
        if phase == "quiesce":
            if node.core is None or node.status in ENDING:      # (a stopping node stays stopping)
                raise ClientError(409, "not_ready", f"node is {node.status}")
            if self.shutdown_id not in (None, sid):
                raise ClientError(409, "shutdown_conflict", f"already quiesced for shutdown {self.shutdown_id}")
            self._quiesce(sid)
            return {"status": "quiesced", "shutdown_id": sid, "vclock_uuid": node.core.vclock_by_uuid()}
        if self.shutdown_id != sid:
            raise ClientError(409, "shutdown_conflict", f"not quiesced for shutdown {sid}")
        if phase == "final":
            if fields.get("final") is None:             # no agreement: stop, the store stays dirty
                loop.call_later(0.05, node.stopped.set)
                return {"status": "stopping", "clean": False}
            final = final_from_wire(fields.get("final"))
            if final is None or final.shutdown_id != sid:
                raise ClientError(400, "bad_body", "final is {\"vclock_by_uuid\": {...}, \"shutdown_id\": ...}")
            self.final = final
            if self._resume:
                self._resume.cancel()
            loop.call_later(0.05, node.stopped.set)
            return {"status": "stopping", "clean": final.vclock_by_uuid == self._vclock_now()}
        if phase == "resume":
            self._do_resume(sid)
            return {"status": node.status, "shutdown_id": sid}
        raise ClientError(400, "bad_body", f"unknown shutdown phase {phase!r:.40}")

    def _vclock_now(self) -> dict[str, int]:
        core = self.node.core
        return {u: n for u, n in core.vclock_by_uuid().items() if n} if core else {}

    def _quiesce(self, sid: str) -> None:
        node = self.node
        if self.shutdown_id == sid:
            return
        self.shutdown_id = sid
        node.status, node.status_reason = "quiesced", f"orderly cluster shutdown {sid} in progress"
        log.info("shutdown: quiesced for cluster shutdown %s; client writes refused", sid)
        self._resume = asyncio.get_running_loop().call_later(limits.quiesce_hold_s, self._do_resume, sid)

    def _do_resume(self, sid: str) -> None:
        node = self.node
        if self.shutdown_id != sid or self.final is not None or node.status != "quiesced":
            return
        log.warning("shutdown: cluster shutdown %s did not complete; serving again", sid)
        self.shutdown_id = None
        node.status, node.status_reason = "running", ""

    async def _call(self, member: Member, body: dict) -> dict:
        """One phase to one member, over an authenticated replication link to its address;
        the greeting must name that member (an address may have changed hands)."""
        node = self.node
        conn, theirs = await asyncio.wait_for(open_link(node, node.http_session, member.address),
                                              limits.shutdown_call_timeout_s)
        try:
            if theirs["uuid"] != member.uuid:
                raise RemoteProtocolError(f"{member.address} is {theirs['uuid']}, not member {member.uuid}")
            await conn.send(m.SHUTDOWN, **body)
            return (await conn.expect(m.SHUTDOWN_OK, timeout=limits.shutdown_call_timeout_s)).body
        finally:
            await conn.close()

    async def _coordinate_shutdown(self, sid: str) -> None:
        """Quiesce every member, wait until all hold one vclock, agree that vclock + sid as the
        final signature, and stop everybody; each store is marked clean as it stops."""
        node = self.node
        loop = asyncio.get_running_loop()
        members = [mem for mem in node.core.table.members()
                   if mem.state == STATE_MEMBER and mem.uuid != node.uuid and mem.address]
        reached: dict[str, dict] = {}                        # member uuid -> its quiesce answer
        deadline = loop.time() + limits.shutdown_converge_s
        agreed: dict[str, int] | None = None
        try:
            while True:
                calls = await asyncio.gather(*(self._call(a, {"phase": "quiesce", "shutdown_id": sid})
                                               for a in members), return_exceptions=True)
                for a, r in zip(members, calls):
                    if isinstance(r, dict):
                        reached[a.uuid] = r
                    elif a.uuid not in reached:
                        log.warning("shutdown: member %s not reached: %s", a.address, r)
                mine = self._vclock_now()
                clocks = [{u: n for u, n in (reached[a].get("vclock_uuid") or {}).items() if n} for a in reached]
                if all(c == mine for c in clocks):
                    agreed = mine
                    break
                if loop.time() > deadline:
                    log.error("shutdown: members did not reach one vclock within %.0f s; stores stay dirty",
                              limits.shutdown_converge_s)
                    break
                await asyncio.sleep(limits.shutdown_converge_poll_s)
            if agreed is not None:
                self.final = FinalSignature(agreed, sid)
                body = {"phase": "final", "shutdown_id": sid, "final": final_to_wire(self.final)}
            else:
                body = {"phase": "final", "shutdown_id": sid}      # stop, stores stay dirty
            stopping = [a for a in members if a.uuid in reached]
            results = await asyncio.gather(*(self._call(a, body) for a in stopping), return_exceptions=True)
            for a, r in zip(stopping, results):
                if not isinstance(r, dict):
                    log.error("shutdown: member %s did not take the final phase: %s", a.address, r)
            missing = sorted(a.address for a in members if a.uuid not in reached)
            log.info("shutdown: cluster shutdown %s: %d members stop %s%s", sid, len(reached) + 1,
                     "clean" if agreed is not None else "dirty",
                     f"; not reached (stay dirty): {', '.join(missing)}" if missing else "")
        finally:
            node.stopped.set()

    def on_stop(self) -> None:
        """Called by Node.stop once the journal has stopped: nothing changes the store after."""
        node = self.node
        if self.final is None or node.store is None or node.core is None:
            return
        now = self._vclock_now()
        if now != self.final.vclock_by_uuid:
            log.error("shutdown: this store's vclock %s is not the agreed %s; it stays dirty",
                      now, self.final.vclock_by_uuid)
            return
        node.store.set_meta(store_status=StoreStatus.CLEAN.value, final_signature=final_to_wire(self.final))
        log.info("shutdown: store marked clean (shutdown %s)", self.final.shutdown_id)
