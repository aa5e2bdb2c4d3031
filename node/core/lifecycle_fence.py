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
- A fence taken up after a loss waits for the anonymous replicas this node remembers as its
  followers (node/core/anon_followers.py) like members (`take_up_fence`), except one whose entry
  bounds the rows of ours it may hold, once a word heard reaches that bound (OwnRowsFence.reach).
- At open, a fence the store's meta holds stands again (`take_up_fence`); an expel asked for
  while fenced gives that member up (`give_up`) and is written at the lift, even for a member
  this node has no row for (`expels_after_lift`); a greeting says up to which lsn this node's own
  `_cluster` rows are an earlier incarnation's (`own_history_lsn`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from node import limits
from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER
from node.core.anon_followers import Followers
from node.core.membership import OwnRowsFence
from node.core.replicaset import NodeCore
from node.core.rows import Txn

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
