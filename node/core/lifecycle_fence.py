"""The own-rows fence's decisions and the claims peers make on this node's own rows, with no IO
(node/fence.py, node/process/peering.py and the simulation use them; the fence itself is
node.core.membership's OwnRowsFence, fed and cleared through NodeCore).

Rules kept here:
- A loss this start must fence against (`loss_at_open`): the WAL directory gone while the store
  holds data (unless it last ran with wal_mode none, which keeps none), or the machine restarted
  (a new boot id) while this node ran with wal_mode = write and did not stop in order. A store
  already fenced keeps its fence as it is.
- A member's greeting (`hear_greeting`) tells a standing fence how many of our rows it holds
  and which members it knows; a peer that says it holds more of our own rows than we do has a
  claim: writes wait until an upstream's claim is met (`own_rows_awaited`: only an upstream
  can send them back, so only its claim is believed, and only while it is one). Anonymous
  replicas are not members, but one that followed this node directly may be the only holder of
  our last rows: the fence waits for those this node remembers as followers, and the word of
  any it hears counts like a member's.
- A claim the stream belied (`disprove_claim`: the upstream caught us up without the rows it
  claimed) is dropped, the peer is not believed again while this node runs, and the fence
  counts it as holding only what came.
- The fence lifts (`may_lift`, then `lift`) once every member was heard and our own rows are
  back, and not while a rebuild is under way (the store is about to be replaced); a rebuilt
  store's fence then states its table again (NodeCore.clear_fence).
- How many peers a node remembers claims of is bounded (limits.members_max).
- A node remembers the anonymous replicas that follow it beside its identity (`follower_seen`,
  at most limits.anon_followers_max: a new one past that is refused, `followers_full`), and a
  fence taken up after a loss waits for them like members (`take_up_fence`), except one whose
  entry bounds the rows of ours it may hold (`Follower`: the own lsn claimed when its last link
  here ended, kept on disk; unknown while a link is open) once a word heard reaches that bound
  (OwnRowsFence.reach); while not fenced
  it forgets one that the table knows, or one unseen past its TTL once every member holds the
  rows of ours it may hold (`FollowerReach`: quiet, it may still be their only holder;
  `followers_to_forget`). The operator may have it forget those unseen for a while and not
  linked (`followers_unseen`); a follower forgotten so is refused if it comes back
  (`with_forgotten`: a lost store would not have waited for it).
- At open, a fence the store's meta holds stands again (`take_up_fence`); an expel asked for
  while fenced gives that member up (`give_up`) and is written at the lift, even for a member
  this node has no row for (`expels_after_lift`); a greeting says up to which lsn this node's own
  `_cluster` rows are an earlier incarnation's (`own_history_lsn`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple

from node import limits
from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER
from node.core.membership import OwnRowsFence
from node.core.replicaset import NodeCore
from node.core.rows import Txn
from node.errors import PeerRefused

Claims = dict[str, tuple[int, str]]     # peer uuid -> (the most of our rows it says it holds, its address)

LOSS_NO_WAL = "the WAL directory is gone while the store holds data"
LOSS_POWER = ("the machine restarted while this node ran with wal_mode = write: rows written but not on "
              "disk may be lost here and held by peers")


def loss_at_open(*, fenced: bool, wal_mode: str, wal_present: bool, was_running: bool,
                 boot_before: str, boot_now: str, wal_mode_before: str = "") -> str | None:
    """Before recovery, on a store with data: a loss this start must fence against (None: none).
    `fenced`: the store holds a fence already; `was_running`: it did not stop in order; the boot
    ids: the machine's when it last ran, and now ("" unknown); `wal_mode_before`: the mode it
    last ran with ("" unknown: a store of an earlier version). A store that last ran with
    wal_mode none has no WAL to lose, and none of its rows since left it (such a node relays
    nothing): starting it with a WAL again is no loss."""
    if fenced:
        return None                       # the fence it holds is taken up as it is
    if wal_mode != "none" and not wal_present and wal_mode_before != "none":
        return LOSS_NO_WAL
    if wal_mode == "write" and was_running and boot_before and boot_now and boot_before != boot_now:
        return LOSS_POWER
    return None


def fence_from_meta(meta: dict | None, registered: set[str]) -> OwnRowsFence | None:
    """The fence a store's `_meta` "own_fence" holds, with the members this node registered
    itself (they may hold its rows though the donor never heard of them) and those the operator
    gave up on."""
    if not meta:
        return None
    fence = OwnRowsFence(str(meta.get("reason") or "an earlier loss"), rebuilt=bool(meta.get("rebuilt")))
    fence.known |= registered
    fence.given_up |= set(meta.get("given_up") or ())
    return fence


def hear_greeting(core: NodeCore | None, claims: Claims, disproved: set[str], theirs: dict, self_uuid: str) -> None:
    """A peer's greeting, either direction: a standing fence hears a member, and a claim on our
    own rows is noted (not from a peer whose claim a stream belied)."""
    uuid = theirs["uuid"]
    if uuid in disproved:
        return
    vu = theirs.get("vclock_uuid")
    vu = vu if isinstance(vu, dict) else {}
    if core is not None and core.fence is not None:
        # an anonymous replica is heard too: one that subscribed to us directly may hold our
        # rows that no member does (waited for only as a remembered follower)
        core.observe_peer(uuid, vu, theirs.get("cluster") or [],
                          anonymous=str(theirs.get("address") or "") if theirs.get("anon") else None,
                          expels_heard=theirs.get("expels_heard") or ())
    own = vu.get(self_uuid)
    if isinstance(own, int) and own > claims.get(uuid, (0, ""))[0] \
            and (uuid in claims or len(claims) < limits.members_max):
        # A peer says it holds more of this node's own rows than this node does (a replacement
        # container, a rejoin, or a lost unsynced tail): they come back by SUBSCRIBE, and
        # writes wait for them so no lsn of ours is ever used twice.
        claims[uuid] = (own, str(theirs.get("address") or ""))


def claim_of(claims: Claims, fence: OwnRowsFence | None, uuid: str) -> int:
    """How far `uuid` said it holds our own rows: its claim, or what a fence heard from it."""
    return max(claims.get(uuid, (0, ""))[0], fence.heard.get(uuid, 0) if fence is not None else 0)


def disprove_claim(claims: Claims, disproved: set[str], fence: OwnRowsFence | None, uuid: str, have: int) -> int:
    """An upstream caught us up to `have` without the rows of ours it said it holds: it lied (or
    its store lost them since), so its word neither holds writes nor raises a fence's target.
    Returns what it had claimed."""
    claim = claim_of(claims, fence, uuid)
    claims.pop(uuid, None)
    if len(disproved) < limits.members_max:
        disproved.add(uuid)
    if fence is not None:
        fence.heard[uuid] = min(fence.heard.get(uuid, have), have)
    return claim


def own_rows_awaited(claims: Claims, have: int, upstreams: set[str]) -> tuple[int, str] | None:
    """(lsn, who) of our own rows that one of our upstreams (by uuid or address) says it holds
    past `have` (what we claimed); claims met are dropped (the rows came back)."""
    best: tuple[int, str] | None = None
    for uuid, (lsn, address) in list(claims.items()):
        if lsn <= have:
            del claims[uuid]
        elif (uuid in upstreams or address in upstreams) and (best is None or lsn > best[0]):
            best = (lsn, f"{address} ({uuid[:8]})")
    return best


def claims_unheeded(claims: Claims, have: int, upstreams: set[str]) -> list[tuple[str, int, str]]:
    """(uuid, lsn, address) of the claims on our own rows past `have` made by peers that are not
    our upstreams (by uuid or address): not believed, since they cannot send the rows back, and
    our next rows take those lsns, so they are shown (node/http/health.py) with the way out."""
    return sorted((uuid, lsn, address) for uuid, (lsn, address) in claims.items()
                  if lsn > have and uuid not in upstreams and address not in upstreams)


def may_lift(core: NodeCore, rebuilding: bool = False) -> bool:
    """Every member was heard and our own rows are back (OwnRowsFence.can_clear), and no
    rebuild is under way (`rebuilding`: node.core.lifecycle_rejoin REBUILDING). A rebuild
    replaces the store with a donor's snapshot checked against what this node held when it
    began; the rows a lift writes under our own id (the restated table, the expels asked for
    while fenced) would be dropped at the swap, after a relay still serving may have sent
    them, and the next rows would take their lsns (the simulation's full mix, seed 23372).
    The rebuilt store keeps the fence, and it lifts there."""
    return not rebuilding and core.fence_state()[0]


@dataclass(frozen=True, slots=True)
class Lifted:
    """A lifted fence: what to persist (the fence gone, `own_history_lsn`), the restating txn to
    submit at once (a rebuilt store's), and the expels that waited for it."""
    target: int
    restate: Txn | None
    own_history_lsn: int
    given_up: list[str]


def lift(core: NodeCore, wall_us: int, given_up) -> Lifted:
    """Clear the fence (the caller asked may_lift): claimed, with no await before its persist."""
    target = core.fence.target()
    restate = core.clear_fence(wall_us)
    return Lifted(target, restate, core.own_history_lsn, sorted(set(given_up or ())))


# --- at start-up and on an expel (node/fence.py, node/process/peering.py) -----------------------
def own_history_lsn(core: NodeCore | None) -> int:
    """What a greeting says of this node's own `_cluster` rows: up to here they are an earlier
    incarnation's (all of them while a rebuilt store is fenced: its ids are the donor's), and
    peers take no ids from them."""
    if core is None:
        return 0
    return limits.lsn_max if core.fence is not None and core.fence.rebuilt else core.own_history_lsn


def take_up_fence(core: NodeCore, meta: dict | None, registered: set[str],
                  followers: "Followers | None" = None) -> bool:
    """At open, with the core just built: the fence the store's meta holds stands again, with
    the members this node registered itself, the anonymous replicas that followed it (waited
    for like members: `follower_seen`; one whose entry bounds what it may hold, only until a
    word heard reaches that: OwnRowsFence.reach) and those the operator gave up
    on (an anonymous replica has none). Whether every own row is history while it stands (a
    rebuilt store's)."""
    if core.anon:
        return False
    fence = fence_from_meta(meta, registered)
    if fence is None:
        return False
    for uuid, f in (followers or {}).items():
        if uuid != core.uuid:
            fence.known.add(uuid)
            fence.anonymous[uuid] = f.address
            bound = f.bound()
            if bound is not None:
                fence.reach[uuid] = bound
    core.fence = fence
    return fence.rebuilt


def expels_after_lift(core: NodeCore, given_up: Iterable[str]) -> list[tuple[str, str]]:
    """(uuid, address) of each member the operator expelled while the fence stood whose expel
    row is still to write: every one not expelled here yet, including one this node has no row
    for (a fenced node registers nobody, so a member it heard of only in greetings has none):
    its expel goes in as a new entry with bound 0, raised by every node holding its rows."""
    out = []
    for uuid in given_up:
        mem = core.table.get(uuid)
        if mem is None or mem.state != STATE_EXPELLED:
            out.append((uuid, mem.address if mem is not None else ""))
    return out


def give_up(fence: OwnRowsFence, given_up: Iterable[str] | None, uuid: str) -> list[str]:
    """The operator expels `uuid` while this node is fenced: the fence stops waiting for it now
    (the expel row waits for the fence). The members given up on, to persist with the fence."""
    fence.given_up.add(uuid)
    return sorted(set(given_up or ()) | {uuid})


# --- the anonymous replicas a node remembers beside its identity (node/fence.py) ---------------
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
