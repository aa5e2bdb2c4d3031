"""Who holds a node's WAL, how far, and what the WAL may lose: node/retention.py's decisions
without its IO (the simulation, tests/sim/simnode.py, runs the same ones over its fake WAL).

Time comes in as `now` (seconds in the shell, ticks in the simulation); where the WAL still
here starts comes in as `start`, asked for only when a hold needs it.

Rules kept here:
- A hold is a subscriber's durable position in this node's ids (what it has on disk, never
  what it has only applied). Only what may hold the WAL leaves one (`Holds.may_hold`): a member
  of this node's `_cluster` always (an expelled one never); an anonymous replica, or a
  subscriber this node does not know yet (a member registered through another node), at most
  `limits.anon_acks_max` of those together, the one heard from longest ago going first, so
  subscriptions under made-up uuids cannot grow the holds without bound.
- A joiner holds all the WAL still here from its JOIN until it subscribes (`hold_all`); a
  SUBSCRIBE sets the hold to the subscriber's `durable`, forward or back (`on_subscribe`:
  back when it lost an unsynced tail or took its snapshot elsewhere). Both are written at once,
  synced unless anonymous (`Hold.sync_when_set`), before the answer goes.
- An ACK moves a hold forward only (`advance_hold`), in memory; it is written with the next
  checkpoint (a hold lost in a crash is an older one, which holds more).
- At a checkpoint every registered member without a hold holds all that is still here
  (`hold_for_new_members`: nothing was collected since this node learned of it), whether or
  not it ever subscribed here (it may after a restart or a peer change).
- The WAL kept (`positions`, `keep_vclock`): every member's hold that is not expelled (a
  member's hold never times out), every anonymous replica's seen within its TTL, and the
  store's synced vclock; a segment may go when the start of the next one is at or below
  that (`collectable_before`). Local rows (component 0) are held by the store alone.
- An anonymous node that has no row under its own id (`lapsing`: none of the private
  `_cluster` notes it writes when it learns of a member) gives members no hold they did not
  leave by subscribing, and every hold on it lasts only while seen within the TTL, a member's
  too: members do not replicate from it (one that does to take rows of its own back, and is
  told to rejoin, rebuilds from its snapshot: node.core.lifecycle_rejoin), so a hold for each
  would keep its WAL for ever. Once it has such a note, members hold as on any node: if it
  registers, its members ask for its rows from its first note."""
from __future__ import annotations

from typing import Callable

import msgspec

from node import limits
from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member


class Hold(msgspec.Struct, frozen=True):
    """One subscriber's hold on this node's WAL: its durable position in this node's ids."""
    vclock: dict[int, int]
    seen_s: float
    anon: bool

    @property
    def sync_when_set(self) -> bool:
        """A hold set by a JOIN or a SUBSCRIBE is synced at once unless anonymous (an anonymous
        replica whose hold a crash loses is only told to rejoin)."""
        return not self.anon


def lapsing(anon: bool, own_lsn: int) -> bool:
    """Whether every hold on this node lapses with the TTL and members get none unasked: an
    anonymous node (`anon`) that has written no row under its own id (`own_lsn`: its claimed)."""
    return anon and not own_lsn


def hold_positions(holds: dict[str, Hold], table: ClusterTable, now_s: float,
                   anon_ttl_s: float, lapse: bool = False) -> list[dict[int, int]]:
    """The positions that keep WAL segments: every member's (not expelled; a member's hold
    never times out), every anonymous replica's seen within its TTL; with `lapse` (`lapsing`)
    every hold only while seen within the TTL."""
    return [h.vclock for uuid, h in holds.items() if holding(h, table.get(uuid), now_s, anon_ttl_s, lapse)]


def holding(h: Hold, member: Member | None, now_s: float, anon_ttl_s: float, lapse: bool) -> bool:
    """Whether one hold keeps the WAL now (`member`: its holder's `_cluster` entry here; a
    member this node does not know yet, its registration row on its way, holds too; an
    expelled one never, nor anything subscribing under its uuid)."""
    if member is not None and member.state == STATE_EXPELLED:
        return False
    return now_s - h.seen_s <= anon_ttl_s if h.anon or lapse else True


def advance_hold(old: Hold | None, durable: dict[int, int], now_s: float, anon: bool) -> Hold:
    """A subscriber said it holds `durable` on disk: its hold moves there, never back (a
    restarted subscriber that lost an unsynced tail resubscribes below; what it needs again
    is still held from its older durable position, or it is told to rejoin)."""
    if old is None or old.anon != anon:
        return Hold(dict(durable), now_s, anon)
    merged = dict(old.vclock)
    have = merged.get
    for rid, lsn in durable.items():
        if lsn > have(rid, -1):
            merged[rid] = lsn
    return Hold(merged, now_s, anon)


def keep_vclock(store_vclock: dict[int, int], positions: list[dict[int, int]]) -> dict[int, int]:
    """Component-wise minimum of the store's vclock and every position that holds the WAL."""
    keep = dict(store_vclock)
    rids = [rid for rid in keep if rid != 0]   # local rows are never sent: only recovery (the store) holds them
    for pos in positions:
        get = pos.get
        for rid in rids:
            lsn = get(rid, 0)
            if lsn < keep[rid]:
                keep[rid] = lsn
    return keep


def collectable_before(next_start: dict[int, int], keep: dict[int, int]) -> bool:
    """A segment (or the simulation's WAL entry) may go when everything in it is below `keep`:
    when the next one starts at or below it in every component."""
    get = keep.get
    for rid, lsn in next_start.items():
        if lsn > get(rid, 0):
            return False
    return True


class Holds:
    """The holds of one node's WAL by subscriber uuid, and the rules that set and move them.
    `table` is this node's `_cluster` as it is now (the core's: a rejoin replaces it)."""

    def __init__(self, holds: dict[str, Hold] | None = None):
        self.by_uuid: dict[str, Hold] = dict(holds or {})

    def may_hold(self, uuid: str, anon: bool, table: ClusterTable) -> bool:
        """Whether `uuid` may leave a hold; makes room among the bounded ones when it needs it."""
        mem = table.get(uuid)
        if not anon and mem is not None:
            return mem.state == STATE_MEMBER
        holds = self.by_uuid
        if uuid not in holds:
            bounded = [u for u, h in holds.items() if h.anon or table.get(u) is None]
            if len(bounded) >= limits.anon_acks_max:
                del holds[min(bounded, key=lambda u: holds[u].seen_s)]
        return True

    def _set(self, uuid: str, vclock: dict[int, int], anon: bool, now: float) -> Hold:
        self.by_uuid[uuid] = h = Hold(dict(vclock), now, anon)
        return h

    def hold_all(self, uuid: str, anon: bool, start: dict[int, int], table: ClusterTable, now: float) -> Hold | None:
        """A joiner is about to read this node's snapshot: it holds from `start` (where the WAL
        still here starts). Returns the hold to write at once, None if it may hold nothing."""
        if not self.may_hold(uuid, anon, table):
            return None
        return self._set(uuid, start, anon, now)

    def on_subscribe(self, uuid: str, durable: dict[int, int], anon: bool, table: ClusterTable,
                     now: float) -> Hold | None:
        """A subscriber says what it has on disk: its hold is that from now on. Returns the hold
        to write at once, None if nothing changed or it may hold nothing."""
        old = self.by_uuid.get(uuid)
        if old is not None and old.vclock == durable and old.anon == anon:
            return None
        if not self.may_hold(uuid, anon, table):
            return None
        return self._set(uuid, durable, anon, now)

    def on_ack(self, uuid: str, durable: dict[int, int], anon: bool, table: ClusterTable, now: float) -> None:
        """A subscriber has `durable` on disk: its hold moves forward (written with the next
        checkpoint)."""
        if uuid in self.by_uuid or self.may_hold(uuid, anon, table):
            self.by_uuid[uuid] = advance_hold(self.by_uuid.get(uuid), durable, now, anon)

    def hold_for_new_members(self, self_uuid: str, table: ClusterTable, start: Callable[[], dict[int, int]],
                             now: float, lapse: bool = False) -> tuple[list[str], dict[int, int]]:
        """Every registered member other than this node without a hold holds from `start()`
        (called once, only if one needs it), unless holds lapse here (`lapsing`). Returns those
        members and where they hold from."""
        added: list[str] = []
        at: dict[int, int] = {}
        if lapse:
            return added, at
        for mem in table.members():
            if mem.state == STATE_MEMBER and mem.uuid != self_uuid and mem.uuid not in self.by_uuid:
                if not added:
                    at = dict(start())
                self.by_uuid[mem.uuid] = Hold(dict(at), now, False)
                added.append(mem.uuid)
        return added, at

    def positions(self, table: ClusterTable, now: float, anon_ttl: float,
                  lapse: bool = False) -> list[dict[int, int]]:
        """The positions that keep the WAL now (`hold_positions`)."""
        return hold_positions(self.by_uuid, table, now, anon_ttl, lapse)
