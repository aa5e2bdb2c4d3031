"""The rejoin's decisions as a sans-IO machine: whether a node told `need_rejoin` rebuilds its
store from a snapshot, from which donor, and when (node/rejoin.py and the simulation drive it).

An upstream that collected WAL a subscriber still needs answers `need_rejoin` (`note_need`).
That alone decides nothing: while another upstream streams what was collected (`fed`), or once
this node has caught up past it (`caught_up`), the links serve again. Otherwise, at most every
`retry_s`, an attempt probes donors (the refusing upstreams first, then every peer): a donor is
taken only if it has the collected rows this node lacks (`wanted`; it may lack those this node
goes without, if it has the rest: `_has_wanted`) and covers every replicated component this
node holds (`mine`), or a snapshot of it would discard rows only this node has. A donor that
lacks some of this node's rows but receives them from it gets `cover_wait_s` with this node's
writes paused (status "rejoining") to catch up, asked again every `cover_poll_s`. Just before a
rebuild, an attempt that meanwhile caught up rebuilds nothing. An attempt that finds no donor
says why (`blocked`) and keeps the store; the expelled members among what it lacks (expelled
here, or in the word of a donor it probed) are then gone without (`going_without`): its links
ask their upstreams for the rest. While any are, an attempt still starts every `retry_s` (a
donor that has them and covers this node may appear), but no writes pause for one: only a donor
that covers this node as it is is taken.

Interface (as the link machines', node/core/link/): `tick(now)` (the watch), `step(event,
now)` with the driver's answers (`Probed`, `Rebuilt`, `RebuildFailed`), `ready()` -> Ready
with `apply` (`Status`, `Blocked`, `NoRebuild`: what the node shows) and `effects`
(`ProbeDonor`, `Rebuild`: what the driver does), then `advance(ready)`; events and effects:
node/core/lifecycle_rejoin_events.py. The driver reads the rest of the node through
`RejoinContext`, synchronous and in memory.

Rules kept here: one attempt at a time; states are enums and a transition the driver should
never ask for asserts; the snapshot a rebuild received must cover `mine` taken after the
journal drained (`snapshot_uncovered`); an anonymous replica keeps its id if it can
(`anon_rejoin_id`). An anonymous replica may be a member's donor too (it may be the one that
kept rows of the member's own, its WAL collected without a hold for members that never
subscribe to it: node.core.holds): a member asks it for its snapshot instead of joining
through it (`Rebuild.donor_anon`), and keeps none of its anonymous entries (`member_snapshot`)."""
from __future__ import annotations

import enum
from typing import Protocol

from node import limits
from node.cluster_space.table import STATE_ANON, ClusterTable
from node.core.lifecycle_rejoin_events import (Blocked, NoRebuild, ProbeDonor, Probed, Rebuild, RebuildFailed, Rebuilt,
                                               Status)
from node.core.link.ready import Outbox, Ready
from node.core.membership import describe_uncovered, expel_bounds, uncovered
from node.core.replicaset import NodeCore


class RejoinState(enum.Enum):
    IDLE = "idle"                    # no attempt under way: the watch decides on each tick
    PROBING = "probing"              # an attempt asked a donor's greeting (ProbeDonor), awaits Probed
    COVER_WAIT = "cover_wait"        # writes paused: the donor receives this node's rows
    COVER_PROBING = "cover_probing"  # ... and its greeting was asked again
    REBUILDING = "rebuilding"        # Rebuild handed out, Rebuilt / RebuildFailed awaited

    # hashed by identity, as members compare (each is a singleton): enum's own __hash__ is a
    # Python call, and every transition looks a state up twice (_NEXT)
    __hash__ = object.__hash__


_NEXT = {
    RejoinState.IDLE: {RejoinState.PROBING},
    RejoinState.PROBING: {RejoinState.PROBING, RejoinState.COVER_WAIT, RejoinState.REBUILDING, RejoinState.IDLE},
    RejoinState.COVER_WAIT: {RejoinState.COVER_PROBING, RejoinState.PROBING, RejoinState.REBUILDING,
                             RejoinState.IDLE},
    RejoinState.COVER_PROBING: {RejoinState.COVER_WAIT},
    RejoinState.REBUILDING: {RejoinState.IDLE},
}


class RejoinContext(Protocol):
    """What the rejoin machine reads of the rest of the node."""

    def core(self) -> NodeCore | None: ...

    def may_rejoin(self) -> bool:
        """The node runs (not starting, stopping or rebuilding) with a core."""

    def upstreams(self) -> dict[str, tuple[bool, dict[str, int]]]:
        """Every applier in effect: address -> (it follows, its upstream's vclock by uuid)."""

    def peers(self) -> list[str]: ...

    def journal_pending(self) -> int: ...


def link_takes(relay) -> tuple[bool, tuple]:
    """What a donor's link from this node takes of our rows (`relay`: that link's RelayMachine,
    None if it has none): (`Probed.receiving`, `Probed.receiving_without`). A fenced subscriber
    asks for its own rows only; one going without members never takes theirs."""
    if relay is None:
        return False, ()
    return not relay.own_rows_only, tuple(relay.without)


def anon_rejoin_id(table: ClusterTable, uuid: str, prev_id: int) -> int:
    """An anonymous replica's id in a donor's snapshot: a REGISTER that went through (its answer
    lost), else its id from before if free there, else the lowest free one."""
    known = table.get(uuid)
    if known is not None:
        return known.id
    return prev_id if table.by_id(prev_id) is None else table.lowest_free_id()


def member_snapshot(cluster: list[list], vclock: dict[int, int]) -> tuple[list[list], dict[int, int]]:
    """An anonymous donor's snapshot as a member keeps it: without the anonymous entries of its
    `_cluster` (the donor's own private one; a member stores none: node.cluster_space.resolver)
    nor their components of the vclock (the donor's private `_cluster` notes, which no relay
    sends)."""
    anon = {r[1] for r in cluster if r[3] == STATE_ANON}
    return [r for r in cluster if r[3] != STATE_ANON], {k: v for k, v in vclock.items() if k not in anon}


class RejoinMachine:
    def __init__(self, host: RejoinContext, retry_s: float = limits.rejoin_retry_s,
                 cover_wait_s: float = limits.rejoin_cover_wait_s, cover_poll_s: float = limits.rejoin_cover_poll_s):
        self.host = host
        self.retry_s, self.cover_wait_s, self.cover_poll_s = retry_s, cover_wait_s, cover_poll_s
        self.state = RejoinState.IDLE
        self.need: dict[str, str] = {}                 # upstream address -> why it told us to rejoin
        self.needed: dict[str, dict[str, int]] = {}    # upstream address -> what it collected, by uuid
        self.blocked = ""                              # why the last attempt could not rebuild
        self.without: dict[str, int] = {}              # expelled members' rows gone without: uuid -> lsn (going_without)
        self.discard: frozenset[str] = frozenset()     # expelled members whose rows a rebuild may lose (allow_discard)
        self.attempts = 0
        self.last_try = 0.0
        # the attempt under way
        self._order: list[str] = []
        self._at = 0                                   # the donor probed is _order[_at - 1]
        self._mine: dict[str, int] = {}
        self._wanted: dict[str, int] = {}
        self._best: dict | None = None                 # the fewest rows a probed donor lacked
        self._donor = ""
        self._donor_anon = False                       # the donor probed last is an anonymous replica
        self._theirs: dict[str, int] = {}
        self._bounds: dict | None = None               # the donor's expelled members (Probed.bounds)
        self._missing: dict = {}                       # what the donor lacked at the last look
        self._heard_expelled: set[str] = set()         # members a probed donor said are expelled (for good)
        self._covering_only = False                    # only a donor that covers this node now (going_without)
        self._deadline = self._next_probe = 0.0
        self._check_due = False
        self._out = Outbox()

    # --- the machine's interface ---------------------------------------------------------
    def ready(self) -> Ready:
        return self._out.take()

    def advance(self, rd: Ready) -> None:
        self._out.advance(rd)

    @property
    def closest_lacked(self) -> dict[str, tuple[int, int]]:
        """What the closest donor of the last attempt that found none lacked of this node's rows
        (uuid -> (this node's lsn, the donor's)); empty if no probed donor had the collected rows."""
        return dict(self._best or {}) if self.state is RejoinState.IDLE and self.blocked else {}

    @property
    def running(self) -> bool:
        """An attempt is under way (probing, waiting for cover or rebuilding)."""
        return self.state is not RejoinState.IDLE

    def note_need(self, address: str, reason: str, collected: dict[str, int] | None) -> None:
        self.need[address] = reason
        self.needed[address] = dict(collected or {})

    def note_follow(self, address: str) -> None:
        self.need.pop(address, None)
        self.needed.pop(address, None)

    def allow_discard(self, uuids) -> None:
        """The operator lets a rebuild lose rows of these expelled members that no donor has
        (POST /v1/admin/rejoin): a node that holds such rows and lacks members' rows that every
        upstream collected is told to rejoin by all of them, and no snapshot covers it, for good
        (the full+replace mix, seed 204848). The next attempt starts at once; the permission
        stands until a rebuild is done."""
        self.discard = frozenset(uuids)
        self.last_try = float("-inf")

    def note_duplicate(self, address: str) -> None:
        """The link at `address` was refused as a second address of a member another link
        follows: that link speaks for the member now, so a need this one noted is over (kept, it
        made every attempt pause writes for the member's cover, and never ended: the full+replace
        mix, seed 203435)."""
        self.note_follow(address)

    def status_of(self, address: str) -> str:
        why = self.need.get(address, "")
        return f"{why}; {self.blocked}" if self.blocked and why else why

    def tick(self, now: float) -> None:
        """The watch: start an attempt if one is due; in a cover wait, look again."""
        if self.state is RejoinState.COVER_WAIT:
            return self._cover_tick(now)
        if self.state is not RejoinState.IDLE or not (self.need or self.without):
            return
        upstreams = self.host.upstreams()
        self.need = {a: r for a, r in self.need.items() if a in upstreams}
        self.needed = {a: n for a, n in self.needed.items() if a in self.need}
        if not (self.need or self.going_without()) or not self.host.may_rejoin():
            return
        if self.caught_up():
            return                         # caught up past what they collected: the links serve again
        if self.fed(self.wanted()):
            return                         # the rows come from a streaming upstream
        if self.attempts and now - self.last_try < self.retry_s:
            return
        self.last_try = now
        self.attempts += 1
        self._mine, self._wanted = self.mine(), self.wanted()
        # only rows gone without: the links serve, so no writes pause for a donor to receive ours
        self._covering_only = not self.need
        self._order = list(self.need) + [a for a in self.host.peers() if a not in self.need]
        self._at, self._best = 0, None
        self._to(RejoinState.PROBING)
        self._probe_next()

    def step(self, event, now: float) -> None:
        st = self.state
        if type(event) is Probed:
            assert st in (RejoinState.PROBING, RejoinState.COVER_PROBING), f"Probed in state {st.name}"
            if st is RejoinState.COVER_PROBING:
                return self._cover_probed(event, now)
            return self._probed(event, now)
        assert st is RejoinState.REBUILDING, f"{type(event).__name__} in state {st.name}"
        self._to(RejoinState.IDLE)
        if type(event) is Rebuilt:
            self.need.clear()
            self.without.clear()
            self.blocked = ""
            self.discard = frozenset()
            return
        assert type(event) is RebuildFailed, f"unknown event {event!r}"
        self._out.apply.append(Status("running"))
        if event.why is not None:
            self.blocked = f"rebuilding from {event.address} failed: {event.why}"
            self._out.apply.append(Blocked(self.blocked, on_links=False))

    def abort(self) -> None:
        """The driver failed unexpectedly mid-attempt (a bug, or the node stops): the attempt is
        over, writes paused for a cover wait resume, and the watch may try again later."""
        paused = self.state in (RejoinState.COVER_WAIT, RejoinState.COVER_PROBING)
        self._out = Outbox()                    # what was handed out will not be acted on
        if paused:
            self._out.apply.append(Status("running"))
        self.state = RejoinState.IDLE           # from any state: the driver's answer will not come

    # --- the rules -----------------------------------------------------------------------
    def mine(self) -> dict[str, int]:
        """What a snapshot must cover: this node's replicated components by uuid, expelled
        members' only up to their bound, and not an anonymous replica's own (its private
        component: `_cluster` rows nobody else has or needs)."""
        core = self.host.core()
        mine = core.vclock_by_uuid()
        if core.anon:
            mine.pop(core.uuid, None)
        return {u: n for u, (n, _) in uncovered(mine, {}, expel_bounds(core.table)).items()}

    def wanted(self) -> dict[str, int]:
        """The collected rows this node still lacks: uuid -> the lsn it needs to reach. Those
        it goes without too: its links follow again, but a donor that has them and covers this
        node may appear (every peer may since have taken the rows that kept them from it)."""
        have = self.host.core().vclock_by_uuid()
        out: dict[str, int] = self.going_without()
        for collected in self.needed.values():
            for u, lsn in collected.items():
                if lsn > have.get(u, 0):
                    out[u] = max(out.get(u, 0), lsn)
        return out

    def going_without(self) -> dict[str, int]:
        """The expelled members whose collected rows this node lacks and goes without (uuid ->
        the lsn it lacks them to): the last attempt found no donor that has them and covers
        this node (they live in a snapshot only, on a node that lacks rows this one has:
        docs/replication.md "A rejoin discards nothing"). Its links say so (SUBSCRIBE
        `without`), and an upstream that collected only those serves the rest: the other
        members' rows still flow. A member's rows are never gone without: a member writes on,
        and its next row needs the ones before it."""
        core = self.host.core()
        if not self.without or core is None:           # (no core: the store is being swapped; /v1/info may ask)
            return {}
        have = core.vclock_by_uuid()                   # (only expelled members are noted: an expel is for good)
        return {u: lsn for u, lsn in sorted(self.without.items()) if have.get(u, 0) < lsn}

    def caught_up(self) -> bool:
        """Every upstream that told this node to rejoin said what it collected, and this node
        has all of it now (from another upstream): the links serve it again."""
        return not self.wanted() and all(self.needed.get(a) for a in self.need)

    def fed(self, wanted: dict[str, int]) -> bool:
        """A streaming upstream has what this node lacks (or some need was not said): wait for it.
        Not rows gone without: an upstream that has them only in its snapshot follows too."""
        following = [vclock for ok, vclock in self.host.upstreams().values() if ok]
        if not following or not self.without.keys().isdisjoint(wanted):
            return False
        if not wanted:
            return True          # an older relay said nothing of what it collected: give the stream time
        return any(all(v.get(u, 0) >= lsn for u, lsn in wanted.items()) for v in following)

    def uncovered(self, have: dict[str, int], theirs: dict[str, int],
                  bounds: dict[str, int] | None = None) -> dict[str, tuple[int, int]]:
        """What of `have` a snapshot of `theirs` would discard (node.core.membership.uncovered).
        `bounds`: the donor's expelled members and their bounds. Rows of one past its bound are
        refused everywhere the expel is known, so a snapshot without them loses nothing, even
        when this node never heard of that expel (it may be stuck where no row can reach it:
        every peer telling it to rejoin). A bound this node knows itself is `mine()`'s."""
        if bounds:
            expelled = expel_bounds(self.host.core().table)
            bounds = {u: b for u, b in bounds.items() if u not in expelled}
        if self.discard:                 # the operator let those go: none of their rows counts
            bounds = {**(bounds or {}), **dict.fromkeys(self.discard, 0)}
        return uncovered(have, theirs, bounds)

    def _expelled(self, uuid: str) -> bool:
        """A peer expelled here is no donor, though it may not know it yet and serve: a fence
        waits for no expelled member, so a member's row that reached it alone may since have
        been written again, differently, by that member. Members' rows come from members (as
        NodeCore.subscribe_vclock asks of an expelled upstream)."""
        return self.host.core().table.expelled(uuid)

    def snapshot_uncovered(self, mine: dict[str, int], by_uuid: dict[str, int],
                           bounds: dict[str, int] | None = None) -> str | None:
        """The rebuild's check of the snapshot it received (`by_uuid`: its vclock by member uuid;
        `bounds`: its expelled members') against `mine()` taken with the journal drained: why it
        may not replace the store."""
        missing = self.uncovered(mine, by_uuid, bounds)
        return f"does not cover this node ({describe_uncovered(missing)})" if missing else None

    # --- transitions ---------------------------------------------------------------------
    def _to(self, state: RejoinState) -> None:
        assert state in _NEXT[self.state], f"rejoin: {self.state.name} -> {state.name}"
        self.state = state

    def _probe_next(self) -> None:
        if self._at < len(self._order):
            self._at += 1
            self._out.effects.append(ProbeDonor(self._order[self._at - 1]))
            return
        self._to(RejoinState.IDLE)
        if self._best is not None:
            self.blocked = (f"a snapshot would discard rows no reachable peer has ({describe_uncovered(self._best)}): "
                            f"this node keeps its store and asks again every {self.retry_s:.0f} s")
        else:
            self.blocked = "no reachable peer has the collected rows this node lacks, to give a snapshot of"
        table = self.host.core().table
        for u, lsn in self._wanted.items():
            if table.expelled(u) or u in self._heard_expelled:
                self.without[u] = max(lsn, self.without.get(u, 0))
        self._out.apply.append(Blocked(self.blocked))

    def _probed(self, ev: Probed, now: float) -> None:
        assert ev.address == self._order[self._at - 1], f"Probed {ev.address}, asked {self._order[self._at - 1]}"
        if ev.bounds and ev.serving and not self._expelled(ev.uuid):
            self._heard_expelled.update(ev.bounds)
        if ev.vclock is None or not ev.serving or self._expelled(ev.uuid) or not self._has_wanted(ev.vclock):
            return self._probe_next()    # it cannot be a donor, or lacks the collected rows too
        self._donor_anon = ev.anon
        missing = self.uncovered(self._mine, ev.vclock, ev.bounds)
        if not missing:
            return self._rebuild(ev.address, ev.vclock)
        if ev.receiving and not self._covering_only and not any(u in missing for u in ev.receiving_without):
            # It is receiving our rows: pause writes so that it can have all of them. (Not for
            # one that goes without some it lacks: it never takes them from us, and the pause
            # came back every retry interval: the full+replace mix, seed 204848.)
            self._to(RejoinState.COVER_WAIT)
            self._out.apply.append(Status("rejoining", f"waiting for {ev.address} to receive this node's rows"))
            self._donor, self._theirs, self._bounds = ev.address, ev.vclock, ev.bounds
            self._deadline, self._check_due = now + self.cover_wait_s, True
            return self._cover_tick(now)
        self._not_this_donor(missing)

    def _has_wanted(self, theirs: dict[str, int]) -> bool:
        """Whether a snapshot of `theirs` gives this node the collected rows it lacks. It may lack
        rows this node goes without (an expelled member's, which may live in one store alone) if
        it has some wanted row and every other: refused by upstreams for a member's rows and
        going without an expelled one's, the node would otherwise wait for a donor that has
        both, which may be none (the simulation's full+replace mix, seed 200350: every member
        told to rejoin for ever)."""
        lacks = self.uncovered(self._wanted, theirs)
        return not lacks or (len(lacks) < len(self._wanted) and all(u in self.without for u in lacks))

    def _not_this_donor(self, missing: dict) -> None:
        if self._best is None or len(missing) < len(self._best):
            self._best = missing
        if self.state is not RejoinState.PROBING:
            self._to(RejoinState.PROBING)
        self._probe_next()

    def _cover_tick(self, now: float) -> None:
        """Writes are paused: once the journal is drained, does the donor have every row this
        node has? If not, ask it again every cover_poll_s until cover_wait_s is over."""
        if not self._check_due:
            if now >= self._next_probe:
                self._to(RejoinState.COVER_PROBING)
                self._out.effects.append(ProbeDonor(self._donor))
            return
        if self.host.journal_pending():
            return
        self._check_due = False
        missing = self._missing = self.uncovered(self.mine(), self._theirs, self._bounds)
        if not missing:
            return self._rebuild(self._donor, self._theirs)
        if now > self._deadline:
            return self._give_up_cover(missing)
        self._next_probe = now + self.cover_poll_s

    def _cover_probed(self, ev: Probed, now: float) -> None:
        assert ev.address == self._donor, f"Probed {ev.address}, asked {self._donor}"
        self._to(RejoinState.COVER_WAIT)
        if ev.vclock is None:
            return self._give_up_cover(self._missing)
        self._theirs, self._bounds, self._check_due = ev.vclock, ev.bounds, True
        self._cover_tick(now)

    def _give_up_cover(self, missing: dict) -> None:
        self._out.apply.append(Status("running"))
        self._not_this_donor(missing)

    def rebuild_gains(self) -> bool:
        """The last look before a rebuild: an attempt probes and waits for cover a while, and
        meanwhile another upstream may have streamed what was collected; then a snapshot would
        gain nothing (and empty the WAL, and take the donor's ids)."""
        return not self.caught_up()

    def _rebuild(self, address: str, theirs: dict[str, int]) -> None:
        if not self.rebuild_gains():
            self._to(RejoinState.IDLE)
            self._out.apply.append(Status("running"))
            self._out.apply.append(NoRebuild())
            return
        reason = self.need.get(address) or "an upstream collected rows this node needs"
        lost = uncovered(self.mine(), theirs) if self.discard else {}
        discarding = tuple((u, have, got) for u, (have, got) in sorted(lost.items()) if u in self.discard)
        self._to(RejoinState.REBUILDING)
        self._out.apply.append(Status("rejoining", reason))
        self._out.effects.append(Rebuild(address, reason, self._donor_anon, discarding))
