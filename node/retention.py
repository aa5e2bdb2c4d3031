"""WAL retention of one node, the IO side: the clock, where the WAL still here starts, the
holds written to the store ("acks" in its meta), and the checkpoint that removes segments.

Who holds the WAL and how far is decided in node/core/holds.py (`Holds`): a joiner holds all
that is here from its JOIN until it subscribes; a SUBSCRIBE sets the hold to the subscriber's
`durable` vclock; every other registered member holds everything still here from the first
checkpoint after this node learned of it; ACKs move a hold forward; an expelled member's hold
keeps nothing; an anonymous replica's only while it was seen within `anon_ttl_s`.

Rules kept here: a hold set by a JOIN or a SUBSCRIBE is written to the store, and synced
unless anonymous, before the answer goes (neither side's restart loses it); ACKs are written
with the next checkpoint. A checkpoint syncs the store (everything applied so far is on disk:
the core's `synced` vclock moves), writes the holds, then removes the segments below every
hold and every backup's (node/wal/gc.py), never one a relay is reading. The start of the
oldest segment kept is the `gc_vclock`, recorded before the files go: a subscriber behind it
in any component is told to rejoin (node/rejoin.py decides whether it may). An anonymous
replica that fetches or subscribes is remembered beside the identity first (node/fence.py: a
lost store waits to hear from it), and forgotten at a checkpoint once its hold timed out and
every member holds the rows of this node it may hold (node.core.anon_followers FollowerReach:
the relay says when each of its links ends). Its entry says whether a link of it is open, and
when the last ends, how many of this node's rows it may hold (a lost store does not wait for it
once a word heard reaches that: a replica whose disk was replaced never comes back under its
old uuid); the file is written anew when it holds many more lines than followers."""
from __future__ import annotations

import asyncio
import logging
import os
import time

from node import limits
from node.core.holds import Hold, Holds, keep_vclock, lapsing
from node.core.anon_followers import (Follower, FollowerReach, Followers, Forgotten, follower_link_end, follower_seen,
                                      followers_at_start, followers_full, followers_report, followers_to_forget,
                                      with_forgotten)
from node.core.vclock import VClock
from node.errors import NoSpaceError
from node.faults import fault
from node.fence import anonymous_followers, append_follower, forgotten_followers, write_followers, write_forgotten
from node.ops.backup import wal_holds
from node.wal.gc import collectable
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
    """The IO of the WAL holds: the clock, where the WAL starts, writing the holds to the store,
    and the checkpoint; every decision is node/core/holds.py's `Holds`."""

    def __init__(self, node):
        self.node = node
        self.book = Holds()
        self._followers: Followers | None = None      # node/fence.py's file, read once
        self._forgotten: Forgotten | None = None      # the followers the operator had it forget, read once
        self.reach = FollowerReach(0)                  # how far of our rows each follower may hold
        self._kept_said: set[str] = set()             # followers kept past their TTL, said so
        self._appended = 0                             # entries appended to the followers file since it was written

    @property
    def followers(self) -> Followers:
        """The anonymous replicas this node remembers as its followers (beside its identity: a
        store swapped or lost leaves them), read from their file the first time."""
        if self._followers is None:
            self._followers = anonymous_followers(self.node.data_dir)
        return self._followers

    @property
    def forgotten(self) -> Forgotten:
        """The anonymous replicas the operator had this node forget (refused if they come back)."""
        if self._forgotten is None:
            self._forgotten = forgotten_followers(self.node.data_dir)
        return self._forgotten

    def followers_report(self) -> list[dict]:
        """Every remembered follower as the operator sees it (anon_followers.followers_report)."""
        core = self.node.core
        return followers_report(self.followers, self.holds, core.table, self.reach, core.self_id, time.time(),
                                self.node.cfg.anon_ttl_s)

    def forget_by_operator(self, uuids: list[str]) -> None:
        """The operator says these remembered followers are gone for good: refused from now on if
        they come back (written first), then forgotten (a lost store will not wait for them)."""
        if not uuids:
            return
        reaches = {u: self.reach.may_hold(u) for u in uuids}
        self._forgotten = with_forgotten(self.forgotten, uuids, time.time())
        write_forgotten(self.node.data_dir, self._forgotten)
        for uuid in uuids:
            del self.followers[uuid]
            self.reach.forget(uuid)
            self._kept_said.discard(uuid)
        self._rewrite_followers()
        for uuid in uuids:
            log.warning("retention: the operator had this node forget anonymous follower %s, which may hold its rows "
                        "up to lsn %d: a lost store no longer waits for it, and it is refused if it comes back "
                        "(rebuild it with a new data directory)", uuid, reaches[uuid])

    @property
    def holds(self) -> dict[str, Hold]:
        return self.book.by_uuid

    def load(self) -> None:
        """The holds as the store keeps them ("acks": the name an earlier version used)."""
        self.book = Holds(_holds_from_meta(self.node.store.get_meta("acks")))
        own = self._own_claimed()
        bounded = followers_at_start(self.followers, own, self._fenced())
        if bounded:
            self.followers.update(bounded)
            self._rewrite_followers()
        self.reach = FollowerReach.load(self.followers, own, self._fenced())

    def _fenced(self) -> bool:
        core = self.node.core
        return core is not None and core.fence is not None

    def _own_claimed(self) -> int:
        core = self.node.core
        return core.claimed.get(core.self_id) if core is not None else 0

    def _persist(self, sync: bool) -> None:
        store = self.node.store
        store.set_meta(acks=_holds_to_meta(self.holds))
        if sync:
            store.sync()

    # --- holds -------------------------------------------------------------------------------
    def _oldest(self) -> dict[int, int]:
        """Where the WAL still here starts (all of it is what a new hold may need)."""
        node = self.node
        segs = list_segments(node.wal_dir)
        return read_header(os.path.join(node.wal_dir, segs[0])).vclock if segs else \
            {k: v for k, v in node.store.vclock.items() if k}

    def _written(self, uuid: str, hold: Hold | None, why: str) -> None:
        """A hold a JOIN or a SUBSCRIBE set is on disk before the answer goes."""
        if hold is None:
            return
        self._persist(sync=hold.sync_when_set)
        log.info("retention: %s %s holds this node's WAL from %s (%s)", "anonymous replica" if hold.anon else "member",
                 uuid, VClock(hold.vclock), why)

    def hold_all(self, uuid: str, anon: bool) -> None:
        """A joiner is about to read this node's snapshot: it holds all that is here until it
        subscribes somewhere and says where it is."""
        self._written(uuid, self.book.hold_all(uuid, anon, self._oldest(), self.node.core.table, time.time()),
                      "it joins")

    def on_subscribe(self, uuid: str, durable: dict[int, int], anon: bool) -> None:
        """A subscriber says what it has on disk: its hold is that from now on, forward or back."""
        self._written(uuid, self.book.on_subscribe(uuid, durable, anon, self.node.core.table, time.time()),
                      "it subscribed")

    def follower(self, uuid: str, address: str) -> None:
        """An anonymous replica fetches from or subscribes to this node: remembered, on disk
        before it is answered (node/fence.py), unless it was within half its TTL (node.core.
        anon_followers follower_seen); its link is then open in `reach` until
        `follower_link_ended`. A new one past anon_followers_max is refused (PeerRefused
        `followers_full`): served and not remembered, it could be the only holder of this node's
        last rows, and a lost store would not wait for it."""
        followers = self.followers
        entry = follower_seen(followers, uuid, address, time.time(), self.node.cfg.anon_ttl_s)
        if entry is None:
            if uuid not in followers:
                raise followers_full(len(followers))      # (the relay logs the refusal: relay_end)
        else:
            new = uuid not in followers
            self._append(uuid, entry, sync=True)
            if new:
                log.info("retention: anonymous replica %s (%s) follows this node: a lost store waits to hear from it",
                         uuid, address)
        self.reach.opened(uuid)

    def follower_link_ended(self, uuid: str) -> None:
        """A link of a remembered follower (`follower` said so) ends: it holds at most the own
        rows this node claimed now; the last one's end goes in its entry (not synced). If that
        write fails (a full disk), the entry stays linked, which waits for more, not less."""
        entry, bound = follower_link_end(self.followers.get(uuid), self._own_claimed(), self._fenced())
        if self.reach.closed(uuid, bound, entry is not None) and entry is not None:
            try:
                self._append(uuid, entry, sync=False)
            except OSError as e:
                log.warning("retention: could not note that anonymous follower %s's link ended (%s): a lost store "
                            "waits to hear from it", uuid, e)

    def _append(self, uuid: str, entry: Follower, sync: bool) -> None:
        """A follower's new entry, on disk first (a failed write changes nothing); the file is
        written anew instead once it holds many more lines than followers."""
        if self._appended > 2 * len(self.followers) + 64:
            write_followers(self.node.data_dir, {**self.followers, uuid: entry})
            self._appended = 0
        else:
            append_follower(self.node.data_dir, uuid, entry, sync)
            self._appended += 1
        self.followers[uuid] = entry

    def _rewrite_followers(self) -> None:
        write_followers(self.node.data_dir, self.followers)
        self._appended = 0

    def _forget_followers(self, uuids: list[str]) -> None:
        if not uuids:
            return
        for uuid in uuids:
            del self.followers[uuid]
            self.reach.forget(uuid)
        self._rewrite_followers()
        log.info("retention: forgets anonymous follower(s) %s (unseen past anon_ttl_s and every member holds the "
                 "rows of this node it may hold, or now in _cluster)",
                 ", ".join(uuids))

    def _keep_followers(self, kept: dict[str, int]) -> None:
        """Followers unseen past anon_ttl_s that are remembered still: said once per follower."""
        for uuid, lsn in kept.items():
            if uuid not in self._kept_said:
                log.info("retention: anonymous follower %s is unseen past anon_ttl_s but may hold rows of this node up "
                         "to lsn %s that not every member holds: it is remembered (a lost store waits for it) until "
                         "they do", uuid, "any" if lsn >= limits.lsn_max else lsn)
        self._kept_said = set(kept)

    def on_ack(self, uuid: str, durable: dict[int, int], anon: bool) -> None:
        """A subscriber has `durable` on disk (written with the next checkpoint)."""
        self.book.on_ack(uuid, durable, anon, self.node.core.table, time.time())

    def _hold_for_new_members(self) -> None:
        node = self.node
        added, start = self.book.hold_for_new_members(node.uuid, node.core.table, self._oldest, time.time(),
                                                      self.lapse)
        for uuid in added:
            log.info("retention: member %s holds this node's WAL from %s until it acknowledges rows here",
                     uuid, VClock(start))

    @property
    def lapse(self) -> bool:
        """Every hold here lapses with the TTL (node.core.holds.lapsing: an anonymous node with no
        row under its own id)."""
        core = self.node.core
        return core is not None and lapsing(core.anon, core.claimed.get(core.self_id))

    def view(self) -> dict[str, Hold]:
        return self.holds

    # --- checkpoint -----------------------------------------------------------------------------
    async def checkpoint(self) -> list[str]:
        """Sync the store, then remove WAL segments nobody needs any more."""
        node = self.node
        assert not fault("checkpoint_bug"), "fault point checkpoint_bug"
        store, core = node.store, node.core
        # everything up to here is on disk after sync(): the core's vclock, which moves once a batch
        # is committed (the store's moves inside the write transaction, which a batch applied on an
        # executor thread may hold open now)
        synced = core.vclock.to_dict()
        await asyncio.get_running_loop().run_in_executor(None, store.sync)
        core.mark_synced(VClock(synced))
        self._hold_for_new_members()
        positions = self.book.positions(core.table, time.time(), node.cfg.anon_ttl_s, self.lapse)
        if core.fence is None:      # a fence waits for them: a restart while it stands must too
            forget, kept = followers_to_forget(self.followers, self.book.by_uuid, core.table, time.time(),
                                               node.cfg.anon_ttl_s, self.reach, core.self_id)
            self._forget_followers(forget)
            self._keep_followers(kept)
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
