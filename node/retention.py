"""WAL retention of one node: who holds its WAL, checkpoints, and collection.

A subscriber's hold is its durable position in this node's ids (node.core.membership): a
joiner holds all that is here from its JOIN until it subscribes; a SUBSCRIBE sets the hold to
what the subscriber says it has on disk (its `durable` vclock); both are written to the store and
synced at once, so neither side's restart loses them; every other registered member holds
everything still here from the first checkpoint after this node learned of it (a member that
never subscribed here may after a restart or a peer change); ACKs advance a hold by their
`durable` vclock (what the subscriber has on disk, never what it has only applied); released
when the member is expelled. An anonymous replica holds the WAL
only while it was seen within `anon_ttl_s`.

A checkpoint syncs the store (everything applied so far is on disk: the core's `synced`
vclock moves), writes the holds, then removes the segments below every hold
(node/wal/gc.py). The start of the oldest segment kept is the `gc_vclock`: a subscriber
behind it in any component is told to rejoin (node/rejoin.py decides whether it may)."""
from __future__ import annotations

import asyncio
import logging
import os
import time

from node import limits
from node.cluster_space.table import STATE_MEMBER
from node.core.membership import Hold, advance_hold, hold_positions
from node.core.vclock import VClock
from node.errors import NoSpaceError
from node.faults import fault
from node.ops.backup import wal_holds
from node.wal.gc import collectable, keep_vclock
from node.wal.reader import list_segments, read_header

log = logging.getLogger("replog.retention")


def _holds_to_meta(holds: dict[str, Hold]) -> dict:
    return {u: {"vclock": h.vclock, "seen_s": h.seen_s, "anon": h.anon} for u, h in holds.items()}


def _holds_from_meta(raw) -> dict[str, Hold]:
    out: dict[str, Hold] = {}
    for u, a in (raw or {}).items():
        if isinstance(a, dict) and isinstance(a.get("vclock"), dict):
            out[str(u)] = Hold({int(k): int(v) for k, v in a["vclock"].items()}, float(a.get("seen_s") or 0.0),
                               bool(a.get("anon")))
    return out


class Retention:
    def __init__(self, node):
        self.node = node
        self.holds: dict[str, Hold] = {}

    def load(self) -> None:
        """The holds as the store keeps them ("acks": the name an earlier version used)."""
        self.holds = _holds_from_meta(self.node.store.get_meta("acks"))

    def _persist(self, sync: bool) -> None:
        store = self.node.store
        store.set_meta(acks=_holds_to_meta(self.holds))
        if sync:
            store.sync()

    # --- holds -------------------------------------------------------------------------------
    def _may_hold(self, uuid: str, anon: bool) -> bool:
        """Only what can hold the WAL leaves a hold behind, so subscriptions under made-up uuids
        (anyone with the secret can) cannot grow the holds without bound: a member of this node's
        `_cluster` always; an anonymous replica, or a subscriber this node does not know yet (a
        member registered through another node), at most anon_acks_max of those together (the
        one heard from longest ago goes)."""
        mem = self.node.core.table.get(uuid)
        if not anon and mem is not None:
            return mem.state == STATE_MEMBER
        if uuid not in self.holds:
            table = self.node.core.table
            bounded = [u for u, h in self.holds.items() if h.anon or table.get(u) is None]
            if len(bounded) >= limits.anon_acks_max:
                del self.holds[min(bounded, key=lambda u: self.holds[u].seen_s)]
        return True

    def _oldest(self) -> dict[int, int]:
        """Where the WAL still here starts (all of it is what a new hold may need)."""
        node = self.node
        segs = list_segments(node.wal_dir)
        return read_header(os.path.join(node.wal_dir, segs[0])).vclock if segs else \
            {k: v for k, v in node.store.vclock.items() if k}

    def _set(self, uuid: str, vclock: dict[int, int], anon: bool, why: str) -> None:
        self.holds[uuid] = Hold(dict(vclock), time.time(), anon)
        self._persist(sync=not anon)
        log.info("retention: %s %s holds this node's WAL from %s (%s)", "anonymous replica" if anon else "member",
                 uuid, VClock(vclock), why)

    def hold_all(self, uuid: str, anon: bool) -> None:
        """A joiner is about to read this node's snapshot: it holds all that is here until it
        subscribes somewhere and says where it is; on disk before anything may be collected."""
        if self._may_hold(uuid, anon):
            self._set(uuid, self._oldest(), anon, "it joins")

    def on_subscribe(self, uuid: str, durable: dict[int, int], anon: bool) -> None:
        """A subscriber says what it has on disk: its hold is that from now on, forward or back
        (back: it lost an unsynced tail, or took its snapshot elsewhere; what it needs that is
        still here stays)."""
        old = self.holds.get(uuid)
        if old is not None and old.vclock == durable and old.anon == anon:
            return
        if self._may_hold(uuid, anon):
            self._set(uuid, durable, anon, "it subscribed")

    def on_ack(self, uuid: str, durable: dict[int, int], anon: bool) -> None:
        """A subscriber has `durable` on disk (persisted with the next checkpoint: a hold lost in
        a crash is an older one, which holds more)."""
        if uuid in self.holds or self._may_hold(uuid, anon):
            self.holds[uuid] = advance_hold(self.holds.get(uuid), durable, time.time(), anon)

    def _hold_for_new_members(self) -> None:
        """Every registered member holds this node's WAL, whether or not it ever subscribed here
        (it may, after a restart or a peer change): one this node learned of since the last
        checkpoint — nothing was collected meanwhile — holds all that is still here."""
        node = self.node
        now = time.time()
        start: dict[int, int] | None = None
        for mem in node.core.table.members():
            if mem.state == STATE_MEMBER and mem.uuid != node.uuid and mem.uuid not in self.holds:
                if start is None:
                    start = self._oldest()
                self.holds[mem.uuid] = Hold(dict(start), now, False)
                log.info("retention: member %s holds this node's WAL from %s until it acknowledges rows here",
                         mem.uuid, VClock(start))

    def view(self) -> dict[str, Hold]:
        return self.holds

    # --- checkpoint -----------------------------------------------------------------------------
    async def checkpoint(self) -> list[str]:
        """Sync the store, then remove WAL segments nobody needs any more."""
        node = self.node
        assert not fault("checkpoint_bug"), "fault point checkpoint_bug"
        store, core = node.store, node.core
        synced = store.vclock.to_dict()          # everything up to here is on disk after sync()
        await asyncio.get_running_loop().run_in_executor(None, store.sync)
        core.mark_synced(VClock(synced))
        self._hold_for_new_members()
        positions = hold_positions(self.holds, core.table, time.time(), node.cfg.anon_ttl_s)
        positions += wal_holds(node.data_dir)       # backups copying the WAL (node/ops/backup.py)
        keep = keep_vclock(synced, positions)
        removable, _ = collectable(node.wal_dir, keep)
        reading = {r.cursor.segment for r in node.relays if r.cursor.segment}
        kept_from = next((i for i, n in enumerate(removable) if n in reading), None)
        if kept_from is not None:
            removable = removable[:kept_from]
        gc_vclock = None
        try:
            self._persist(sync=bool(removable))      # the holds that allowed it are on disk first
            if removable:
                first = list_segments(node.wal_dir)[len(removable)]
                gc_vclock = read_header(os.path.join(node.wal_dir, first)).vclock
                # recorded before the files go: a subscriber behind it is told to rejoin, never given a gap
                store.set_meta(gc_vclock=gc_vclock)
        except NoSpaceError as e:
            log.warning("checkpoint: no room to record the WAL holds or the WAL's new start (%s); collection waits", e)
            return []
        for name in removable:
            os.unlink(os.path.join(node.wal_dir, name))
        if removable:
            log.info("checkpoint: removed %d WAL segments; oldest kept starts at %s", len(removable), gc_vclock)
        return removable
