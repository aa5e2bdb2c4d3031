"""The anonymous replicas a node remembers as its followers, beside its identity, with no
IO (node/fence.py keeps the file, node/retention.py the process's view; the simulation uses
these too).

Rules kept here:
- A node remembers every anonymous replica that fetches from or subscribes to it
  (`follower_seen`), at most limits.anon_followers_max: a new one past that is refused
  (`followers_full`). One may be the only holder of this node's last rows, so a fence taken up
  after a loss waits for it (node.core.lifecycle_fence take_up_fence).
- Each entry bounds the rows of this node the follower may hold (`Follower`): any while a link
  of it is open (written, synced, before the link is answered); when its last link ends, the own
  lsn claimed then, or while fenced the higher of that and the earlier bound, an unknown one
  staying unknown (`follower_unlinked`, `follower_link_end`); at a start, what a dead process
  left linked is bounded by the own lsn if the start lost nothing, else unknown
  (`followers_at_start`). A lost store's fence stops waiting for a follower once a word heard
  reaches its bound (OwnRowsFence.reach).
- While not fenced a node forgets one that the table knows, or one unseen past its TTL once
  every member holds the rows of ours it may hold (`FollowerReach`: quiet, it may still be
  their only holder; `followers_to_forget`). The operator may have it forget those unseen for a
  while and not linked (`followers_unseen`); a follower forgotten so is refused if it comes back
  (`with_forgotten`: a lost store would not have waited for it)."""
from __future__ import annotations

from typing import Iterable, NamedTuple

from node import limits
from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER
from node.errors import PeerRefused


class Follower(NamedTuple):
    """A remembered anonymous follower, as its latest line beside the identity says."""
    address: str
    seen: float                  # when it last fetched or subscribed (s)
    reach: int | None = None     # the most of our own rows its ended links here may have sent it (None: unknown)
    linked: bool = False         # a link of it was open when this was written: it may hold any of ours

    def bound(self) -> int | None:
        """The most of this node's own rows it may hold, as far as the entry says (None: any)."""
        return None if self.linked else self.reach


Followers = dict[str, Follower]


def follower_seen(followers: Followers, uuid: str, address: str, now_s: float,
                  anon_ttl_s: float) -> Follower | None:
    """An anonymous replica fetches from or subscribes to this node now: the entry to remember
    for it, on disk before it is answered, or None when there is nothing to write (it is
    remembered as linked, seen within half its TTL; or `limits.anon_followers_max` others are,
    and it is not). A node remembers, outside its store, every anonymous replica that follows
    it: one may be the only holder of this node's last rows, and a lost store would not know it.
    The entry says the link is open (the follower may hold any of our rows until it ends), and
    keeps what its ended links may have sent it (a new one: none)."""
    old = followers.get(uuid)
    if old is not None and old.linked and now_s - old.seen < anon_ttl_s / 2:
        return None
    if old is None and len(followers) >= limits.anon_followers_max:
        return None
    return Follower(address, now_s, old.reach if old is not None else 0, True)


def follower_unlinked(entry: Follower, own_claimed: int, fenced: bool) -> Follower:
    """The entry of a follower whose last link here ended with this node's own lsn claimed at
    `own_claimed` (a link sends nothing past it). Not fenced, no other node holds a row of ours
    past that (a start that lost rows is fenced, and a fence lifts only with every row of ours
    that was heard of back), so it bounds all the follower holds of ours. Fenced, rows of an
    earlier incarnation may be past it: the entry's earlier bound stays if higher, and an
    unknown one stays unknown. Written without a sync: if it is lost, the entry before it
    (linked) stands, which waits for more."""
    if fenced:
        reach = None if entry.reach is None else max(entry.reach, own_claimed)
    else:
        reach = own_claimed
    return entry._replace(reach=reach, linked=False)


def follower_link_end(entry: Follower | None, own_claimed: int, fenced: bool) -> tuple[Follower | None, int]:
    """A link of a follower ends with this node's own lsn claimed at `own_claimed`: its entry
    once no other link of it is open (`follower_unlinked`; None: it is not remembered), and how
    far of our rows it may hold for FollowerReach: what the entry bounds, any lsn where it knows
    no bound. (While fenced that is not `own_claimed`: what is in memory then outlives the lift,
    and a quiet follower is forgotten by it.)"""
    if entry is None:
        return None, own_claimed
    new = follower_unlinked(entry, own_claimed, fenced)
    return new, limits.lsn_max if new.reach is None else new.reach


def followers_at_start(followers: Followers, own_at_start: int, fenced: bool) -> Followers:
    """At a start (node/retention.py load): the entries to write again, for those left linked
    (the process died with a link open) or unknown (written by an earlier version). A start
    that is not fenced lost none of this node's rows, so no follower holds one past
    `own_at_start`: that bounds them now. A fenced start knows no bound for them: one left
    linked is unknown from now on, so that a link it opens and ends while the fence stands
    does not bound it by what this node has then (OwnRowsFence.reach: the word of peers heard
    before a restart is not kept)."""
    if fenced:
        return {u: f._replace(reach=None, linked=False) for u, f in followers.items() if f.linked}
    return {u: f._replace(reach=own_at_start, linked=False) for u, f in followers.items() if f.bound() is None}


def followers_full(remembered: int) -> PeerRefused:
    """The refusal of a new anonymous follower when `remembered` (anon_followers_max) are."""
    return PeerRefused("followers_full", f"this node remembers {remembered} anonymous followers (anon_followers_max) "
                       "and takes no more: one it did not remember could hold its last rows when it loses its "
                       "store; the operator can forget those gone for good (DELETE /v1/admin/followers)")


def followers_to_forget(followers: Followers, holds: dict, table, now_s: float, anon_ttl_s: float,
                        reach: "FollowerReach", self_id: int) -> tuple[list[str], dict[str, int]]:
    """Which remembered followers this node forgets (at a checkpoint, while not fenced): one
    the table knows (registered: the table covers it; or expelled), and one neither remembered
    nor held (node.core.holds: uuid -> Hold, moved by its ACKs) as seen within `anon_ttl_s`
    (the replica's time, as for the WAL kept for it) whose rows of this node every member
    holds: `reach.may_hold(uuid)` is the most of our own rows (`self_id`) it may hold, and
    every member's hold must be at least that. A replica gone quiet may still be the only
    holder of our last rows (every member cut off from us while it was not): forgotten, a lost
    store would not wait for it and would write other rows under those lsns. Returns those to
    forget, and those kept only for that (uuid -> the own lsn it may hold)."""
    out: list[str] = []
    kept: dict[str, int] = {}
    covered: int | None = None
    for uuid, entry in followers.items():
        mem = table.get(uuid)
        if mem is not None and mem.state in (STATE_EXPELLED, STATE_MEMBER):
            out.append(uuid)
            continue
        if now_s - follower_last_seen(entry, holds.get(uuid)) <= anon_ttl_s:
            continue
        if covered is None:
            covered = members_hold_own(holds, table, self_id)
        reaches = reach.may_hold(uuid)
        if reaches <= covered:
            out.append(uuid)
        else:
            kept[uuid] = reaches
    return out, kept


def members_hold_own(holds: dict, table, self_id: int) -> int:
    """The most of this node's own rows (id `self_id`) that every other member holds on disk by
    its hold here (a member without a hold: none; no other member: none)."""
    least: int | None = None
    for mem in table.members():
        if mem.state != STATE_MEMBER or mem.id == self_id:
            continue
        h = holds.get(mem.uuid)
        have = h.vclock.get(self_id, 0) if h is not None else 0
        least = have if least is None else min(least, have)
    return least or 0


Forgotten = dict[str, float]     # uuid -> when the operator had this node forget that follower (s)


def follower_last_seen(entry: Follower, hold) -> float:
    """When a remembered follower was last heard: its entry's FETCH or SUBSCRIBE, or an ACK that
    moved its hold (node.core.holds Hold; None: it has none)."""
    return max(entry.seen, hold.seen_s) if hold is not None else entry.seen


def followers_report(followers: Followers, holds: dict, table, reach: "FollowerReach", self_id: int,
                     now_s: float, anon_ttl_s: float) -> list[dict]:
    """What the operator sees of every remembered follower (GET /v1/admin/followers), in uuid
    order: its address, when it was last heard, whether a link of it is open here, the most
    of our own rows it may hold (None: any, a link is open), and whether it is kept only
    because not every member holds those (`followers_to_forget`'s `kept`)."""
    covered = members_hold_own(holds, table, self_id)
    out = []
    for uuid in sorted(followers):
        address = followers[uuid].address
        last = follower_last_seen(followers[uuid], holds.get(uuid))
        reaches = reach.may_hold(uuid)
        linked = uuid in reach.open
        quiet = now_s - last > anon_ttl_s
        out.append({"uuid": uuid, "address": address, "last_seen_s": round(last, 3),
                    "unseen_s": round(max(0.0, now_s - last), 3), "linked": linked,
                    "may_hold_own_lsn": None if linked else reaches,
                    "kept_for_rows": quiet and not linked and reaches > covered})
    return out


def followers_unseen(followers: Followers, holds: dict, reach: "FollowerReach", now_s: float,
                     unseen_s: float) -> tuple[list[str], list[str]]:
    """The remembered followers the operator may have this node forget by `unseen_s`: those not
    heard for at least that long with no link open here (one that is linked holds whatever the
    link sends it), and the others. Both in uuid order."""
    gone, kept = [], []
    for uuid in sorted(followers):
        last = follower_last_seen(followers[uuid], holds.get(uuid))
        (gone if uuid not in reach.open and now_s - last >= unseen_s else kept).append(uuid)
    return gone, kept


def with_forgotten(forgotten: Forgotten, uuids: Iterable[str], now_s: float) -> Forgotten:
    """The list of forgotten followers with `uuids` added (a follower the operator says is gone
    is refused if it comes back: its rows of ours may differ from ours by then), at most
    `limits.forgotten_followers_max`, the one forgotten longest ago dropped first."""
    out = dict(forgotten)
    for uuid in uuids:
        out[uuid] = now_s
    while len(out) > limits.forgotten_followers_max:
        del out[min(out, key=out.__getitem__)]
    return out


class FollowerReach:
    """How far of this node's own rows each remembered anonymous follower may hold, in memory:
    the own lsn this node had claimed when the follower's last link here ended (a link sends
    nothing past it), any lsn while a link is open (`limits.lsn_max`), and for a follower with
    no link since this process started, what its entry bounds (`ended`, from the file) or else
    the own lsn at the start (what an earlier process sent is at most that: a start that lost
    rows is fenced, and a fenced node forgets nobody)."""
    __slots__ = ("at_start", "open", "ended")

    def __init__(self, own_at_start: int, ended: dict[str, int] | None = None):
        self.at_start = own_at_start
        self.open: dict[str, int] = {}      # uuid -> its links open now
        self.ended: dict[str, int] = dict(ended or {})   # uuid -> own lsn claimed when its last link ended

    @classmethod
    def load(cls, followers: Followers, own_at_start: int, fenced: bool) -> "FollowerReach":
        """At a start (after `followers_at_start`): what each entry bounds, and for a follower
        whose entry bounds nothing, the own lsn at the start, or any lsn if the start lost rows
        (rows of the earlier incarnation may lie past it)."""
        return cls(limits.lsn_max if fenced else own_at_start,
                   {u: f.reach for u, f in followers.items() if f.bound() is not None})

    def opened(self, uuid: str) -> None:
        """A remembered follower fetches or subscribes (node.core.link.ready Hold, anon)."""
        self.open[uuid] = self.open.get(uuid, 0) + 1

    def closed(self, uuid: str, own_claimed: int, remembered: bool = True) -> bool:
        """A link that `opened` ends (links that never did sent no row); `remembered`: the
        follower still is (the table may have come to know it meanwhile: nothing to keep).
        Whether that was its last link open and it is remembered: its entry says so now
        (`follower_unlinked`)."""
        n = self.open.get(uuid, 0)
        if n == 0:
            return False
        if n == 1:
            del self.open[uuid]
        else:
            self.open[uuid] = n - 1
        if remembered:
            self.ended[uuid] = own_claimed
        else:
            self.forget(uuid)
        return n == 1 and remembered

    def may_hold(self, uuid: str) -> int:
        if uuid in self.open:
            return limits.lsn_max
        return self.ended.get(uuid, self.at_start)

    def forget(self, uuid: str) -> None:
        self.ended.pop(uuid, None)
