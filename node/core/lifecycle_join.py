"""Joining a cluster and founding one, as a sans-IO machine: whom to ask, whether to found the
cluster instead, when to try again or give up, and how a donor's snapshot is installed
(node/join.py drives it, and tests/sim/joins.py). The start-up rules of the own-rows fence
(a stored fence taken up at open, an expel asked for while fenced, the greeting's
`own_history_lsn`) are node/core/lifecycle_fence.py's.

A member with no store (`start`) polls its peers' greetings (`PollPeers` -> `Polled`), asks
the running ones in turn (`Ask` -> `IdGranted`, `SnapshotReceived` or `AskFailed`) and
installs the first snapshot that registers it (`Install` -> `Installed`). If none is running,
the Qpid exchange decides (node/identity/signature.py, through the context's `decide`): found
the cluster (`Bootstrap` -> `Bootstrapped`; only the lowest uuid among fresh nodes, and only
a node that never registered anywhere), wait (status "waiting"), or stop (`Abort`). A round
that joined nobody waits `retry_at` (a doubling backoff) before the next poll (`tick`). A
member with a store (`start_with_store`) polls too: a running member of another formation is a
wrong store; with `cluster_wait_for` it catches up with a running member (`CatchUp`), or the
Qpid decision says wait, stop, catch up or go active. One request alone (`ask`: an anonymous
replica's FETCH_SNAPSHOT or REGISTER, a simulated join) ends in DONE, or in IDLE for its
driver to try again.

Interface (as RejoinMachine's): `start` / `start_with_store` / `ask`, `step(event, now)`,
`tick(now)`, `ready()` -> Ready with `apply` (`Status` notes) and `effects` (in order), then
`advance(ready)`; events and effects: node/core/lifecycle_join_events.py.

Rules kept here:
- Only a node that never registered anywhere founds a cluster; among fresh nodes only the
  lowest uuid, once every peer answered fresh (or, with `cluster_wait_for` >= 1, once the Qpid
  exchange says ACTIVATE); the others join it.
- A donor of another cluster than this node's identity is a wrong store, for a JOIN and for an
  anonymous replica's FETCH_SNAPSHOT alike: stop before asking. A donor that
  says this node was expelled: stop. Any other failure tries the next running donor; a broken
  link first wipes what it left (`WipePartial`).
- A joined store is fenced (`join_fence`) if this uuid went active before (its identity file
  says so, or, with no identity files, the donor's `_cluster` lists it) or the snapshot holds
  rows of its own origin: its peers may hold rows it wrote before. (The rules that read no
  state of the machine: node/core/lifecycle_join_rules.py.)
- A snapshot that does not register the joiner is not installed. An anonymous replica takes
  the lowest id free in its snapshot (`anon_id`). The new WAL starts at the snapshot:
  `gc_vclock` is its vclock without 0, so a subscriber behind it is told to rejoin.
- States are an enum; a transition the driver should never ask for asserts."""
from __future__ import annotations

import enum
from typing import Any, Protocol

from node import limits
from node.cluster_space.table import ClusterTable, Member
from node.core import messages as m
from node.core.lifecycle_join_events import (BROKEN, EXPELLED, IDENTITY_REJECTED, REFUSED, WRONG_CLUSTER, Abort,
                                             Activated, Ask, AskFailed, BecomeMember, Bootstrap, Bootstrapped,
                                             CatchUp, CaughtUp, IdGranted, Install, Installed, PollPeers, Polled,
                                             SnapshotReceived, Status, WipePartial)
from node.core.lifecycle_join_rules import (anon_id, founders, is_fresh, join_fence, lost_store_notes, refusal_notes,
                                            requested_id)
from node.core.link.ready import Outbox, Ready
from node.core.membership import running_donors
from node.identity.signature import InitialSignature, Outcome, decide_join, initial_from_wire


class JoinState(enum.Enum):
    IDLE = "idle"                      # nothing under way (before start; a lone request ended without luck)
    POLLING = "polling"                # PollPeers handed out, Polled awaited
    ASKING = "asking"                  # Ask handed out: IdGranted / SnapshotReceived / AskFailed awaited
    INSTALLING = "installing"          # Install handed out, Installed awaited
    BOOTSTRAPPING = "bootstrapping"    # Bootstrap handed out, Bootstrapped awaited
    CATCHING_UP = "catching_up"        # a store: CatchUp handed out, CaughtUp awaited
    WAITING = "waiting"                # a round joined nobody: tick() polls again from retry_at
    DONE = "done"                      # joined, fetched, registered or founded
    FAILED = "failed"                  # Abort handed out: start-up stops

    # hashed by identity, as members compare (each is a singleton): enum's own __hash__ is a
    # Python call, and every transition looks a state up twice (_NEXT)
    __hash__ = object.__hash__


_NEXT = {
    JoinState.IDLE: {JoinState.POLLING, JoinState.ASKING, JoinState.BOOTSTRAPPING, JoinState.FAILED, JoinState.DONE},
    JoinState.POLLING: {JoinState.ASKING, JoinState.BOOTSTRAPPING, JoinState.WAITING, JoinState.FAILED,
                        JoinState.CATCHING_UP, JoinState.DONE},
    JoinState.ASKING: {JoinState.ASKING, JoinState.INSTALLING, JoinState.DONE, JoinState.WAITING, JoinState.FAILED,
                       JoinState.IDLE},
    JoinState.INSTALLING: {JoinState.DONE},
    JoinState.BOOTSTRAPPING: {JoinState.DONE},
    JoinState.CATCHING_UP: {JoinState.DONE},
    JoinState.WAITING: {JoinState.POLLING},
    JoinState.DONE: set(),
    JoinState.FAILED: set(),
}


class JoinContext(Protocol):
    """What the join machine reads of the rest of the node (a process's Lifecycle, or a
    simulated node), synchronous and in memory."""
    uuid: str
    wait_for: int                          # cluster_wait_for
    proposal: tuple[str, float]            # (cluster uuid, creation time) should this node found one
    data_dir: str                          # named in messages

    def peers(self) -> list[str]: ...                  # the configured peers other than this node

    def member_cluster_uuid(self) -> str | None:
        """The cluster this node belongs to (its store's, else its identity files'), None if none."""

    def went_active(self) -> bool | None:
        """This uuid went active in a cluster before (its identity file says so); None: the node
        keeps no identity files (a lease slot), and the donor's `_cluster` tells."""

    def decide(self) -> Any: ...                       # the Qpid decision over the statuses seen (Decision)

    def members_seen(self) -> int: ...                 # members whose status was seen, this node included

    def my_status(self) -> Any: ...                    # this node's store status, signatures (MemberStatus)

    def seen(self, uuid: str) -> dict: ...             # the last greeting seen from member `uuid`


class JoinMachine:
    def __init__(self, host: JoinContext, backoff_min_s: float = limits.reconnect_backoff_min_s,
                 backoff_max_s: float = limits.join_wait_backoff_s_max):
        self.host = host
        self.backoff_min_s, self.backoff_max_s = backoff_min_s, backoff_max_s
        self.state = JoinState.IDLE
        self.rounds = False                  # started by start(): failures go on to the next donor
        self.with_store = False              # started by start_with_store(): the Qpid exchange of a store
        self._why = ""                       # the Activated note a catch-up ends with
        self.delay = backoff_min_s
        self.retry_at = 0.0
        self._polled: dict = {}
        self._running: list[tuple[str, dict]] = []   # this round's running peers, the one asked first
        self._failed: list[str] = []
        self._kind = m.JOIN
        self._theirs: dict = {}
        self._out = Outbox()

    # --- the machine's interface ---------------------------------------------------------
    def ready(self) -> Ready:
        return self._out.take()

    def advance(self, rd: Ready) -> None:
        self._out.advance(rd)

    @property
    def done(self) -> bool:
        return self.state in (JoinState.DONE, JoinState.FAILED)

    @property
    def asking(self) -> str | None:              # the donor asked, while a request is under way
        return self._running[0][0] if self.state is JoinState.ASKING else None

    def start(self, now: float) -> None:
        """A member with no store: join a running peer, or found the cluster."""
        assert self.state is JoinState.IDLE, f"start in state {self.state.name}"
        host = self.host
        self.rounds = True
        self._out.apply.append(Status("joining", "looking for a booted peer"))
        if not host.peers() and host.wait_for <= 1:
            cu = host.member_cluster_uuid()
            if cu is not None:
                return self._abort(f"this node is a member of cluster {cu} (identity file in {host.data_dir}) but "
                                   "has an empty store and no peers to rejoin through",
                                   "start it with --peers of its cluster, or remove the identity files to found a "
                                   "new cluster")
            return self._bootstrap(InitialSignature(host.proposal[0], host.proposal[1], (host.uuid,)))
        self._poll()

    def start_with_store(self, now: float) -> None:
        """A member with a store (not anonymous, no lease slot): with peers, check it belongs to
        the cluster they run (Qpid: wrong store), and with `cluster_wait_for` wait for the
        initial members' statuses, then go active, after taking the updates a clean store has."""
        assert self.state is JoinState.IDLE, f"start_with_store in state {self.state.name}"
        self.with_store = True
        if not self.host.peers() and self.host.wait_for == 0:
            return self._to(JoinState.DONE)
        self._out.apply.append(Status("waiting", "exchanging status with the peers"))
        self._poll()

    def ask(self, address: str, kind: int, theirs: dict) -> None:
        """One request to one donor whose greeting is `theirs`; it ends in DONE or back in IDLE."""
        assert self.state is JoinState.IDLE, f"ask in state {self.state.name}"
        assert kind in (m.JOIN, m.FETCH_SNAPSHOT, m.REGISTER), kind
        self._kind = kind
        self._ask([(address, theirs)])

    def tick(self, now: float) -> None:
        """The backoff between rounds: poll again once it is over."""
        if self.state is JoinState.WAITING and now >= self.retry_at:
            self._poll()

    def step(self, event, now: float) -> None:
        st, t = self.state, type(event)
        if t is Polled:
            assert st is JoinState.POLLING, f"Polled in state {st.name}"
            return self._polled_in(event.greetings, now)
        if t is Installed:
            assert st is JoinState.INSTALLING, f"Installed in state {st.name}"
            return self._to(JoinState.DONE)
        if t is Bootstrapped:
            assert st is JoinState.BOOTSTRAPPING, f"Bootstrapped in state {st.name}"
            return self._to(JoinState.DONE)
        if t is CaughtUp:
            assert st is JoinState.CATCHING_UP, f"CaughtUp in state {st.name}"
            return self._activate(self._why)
        assert st is JoinState.ASKING, f"{t.__name__} in state {st.name}"
        assert event.address == self._running[0][0], f"{t.__name__} from {event.address}, asked {self._running[0][0]}"
        if t is IdGranted:
            assert self._kind != m.FETCH_SNAPSHOT, "REGISTERED for FETCH_SNAPSHOT"
            if self._kind == m.REGISTER:
                self._to(JoinState.DONE)
                self._out.effects.append(BecomeMember(event.address))
            return None
        if t is SnapshotReceived:
            assert self._kind != m.REGISTER, "a snapshot for REGISTER"
            return self._received(event, now)
        assert t is AskFailed, f"unknown event {event!r}"
        self._ask_failed(event, now)

    # --- transitions -----------------------------------------------------------------------
    def _to(self, state: JoinState) -> None:
        assert state in _NEXT[self.state], f"join: {self.state.name} -> {state.name}"
        self.state = state

    def _poll(self) -> None:
        self._to(JoinState.POLLING)
        quick = self.with_store and not self.host.wait_for     # a missing peer is not waited for
        self._out.effects.append(PollPeers(limits.peer_poll_quick_timeout_s if quick else limits.peer_poll_timeout_s))

    def _wait(self, now: float) -> None:
        self._to(JoinState.WAITING)
        self.retry_at = now + self.delay
        self.delay = min(self.delay * 2, self.backoff_max_s)

    def _activate(self, why: str) -> None:
        self._to(JoinState.DONE)
        if why:
            self._out.effects.append(Activated(why))

    def _abort(self, message: str, hint: str = "") -> None:
        self._to(JoinState.FAILED)
        self._out.effects.append(Abort(message, hint))

    def _bootstrap(self, initial: InitialSignature, why: str = "") -> None:
        self._to(JoinState.BOOTSTRAPPING)
        self._out.effects.append(Bootstrap(initial, why))

    def _polled_in(self, polled: dict, now: float) -> None:
        if self.with_store:
            return self._store_polled(polled, now)
        self._polled, self._failed = polled, []
        running = running_donors(polled)
        if running:
            return self._ask(running)
        self._round_over(now, running=False)

    def _ask(self, donors: list[tuple[str, dict]]) -> None:
        """Ask the first of `donors` (JOIN, an anonymous replica's FETCH_SNAPSHOT or REGISTER):
        a donor of another cluster than ours stops this node before anything is asked. (A
        REGISTER's driver passes no greeting: it comes from a store, whose link's greeting
        check refuses another cluster.)"""
        self._running = donors
        address, theirs = donors[0]
        mine = self.host.member_cluster_uuid()
        if mine is not None and theirs.get("cluster_uuid") not in (mine, None):
            return self._abort(f"wrong store: this node's identity belongs to cluster {mine}, {address} to "
                               f"{theirs['cluster_uuid']}",
                               f"point --peers at cluster {mine}, or start it with an empty data dir (no identity "
                               "files) to join or replicate that one")
        self._to(JoinState.ASKING)
        self._theirs = theirs
        req = requested_id(theirs) if self._kind == m.JOIN else None
        self._out.effects.append(Ask(address, self._kind, theirs, req))

    def _received(self, ev: SnapshotReceived, now: float) -> None:
        host = self.host
        table = ClusterTable(Member.from_row(r) for r in ev.table_rows)
        if self._kind == m.JOIN:
            if table.get(host.uuid) is None:
                return self._ask_failed(AskFailed(ev.address, "the donor's snapshot does not register this node"), now)
            fence, aid = join_fence(host.uuid, host.went_active(), self._theirs.get("cluster") or (), table,
                                    ev.vclock), None
        else:
            fence, aid = None, anon_id(table)
        self._to(JoinState.INSTALLING)
        self._out.effects.append(Install(ev.address, fence, aid, {k: v for k, v in ev.vclock.items() if k}, ev.rows))

    def _ask_failed(self, ev: AskFailed, now: float) -> None:
        if ev.code == EXPELLED:
            return self._abort(f"this node ({self.host.uuid}) was expelled from cluster "
                               f"{self._theirs.get('cluster_uuid')}: {ev.why}")
        if ev.code == WRONG_CLUSTER:
            # a REGISTER (its driver has no greeting to check before asking): the link's check
            # refused another cluster, which no retry changes
            mine = self.host.member_cluster_uuid()
            return self._abort(f"wrong store: {ev.why}",
                               f"point --peers at cluster {mine}" if mine else "point --peers at this store's cluster")
        if ev.code == IDENTITY_REJECTED:
            return self._abort(f"identity: {ev.address} refuses this node's registration: {ev.why}",
                               "another node may be running with a copy of this data dir")
        if ev.code == BROKEN:
            self._out.effects.append(WipePartial())
        if not self.rounds:
            return self._to(JoinState.IDLE)
        self._failed.append(f"{ev.address} refused: {ev.why}" if ev.code == REFUSED else f"{ev.address}: {ev.why}")
        if len(self._running) > 1:
            return self._ask(self._running[1:])
        self._round_over(now, running=True)

    def _round_over(self, now: float, running: bool) -> None:
        """Nobody joined this round: found the cluster, wait, or stop (the Qpid decision)."""
        host, polled = self.host, self._polled
        if self._failed:
            self._out.apply.append(Status("joining", "join failed, retrying: " + "; ".join(self._failed)))
        notes = refusal_notes(polled) + lost_store_notes(polled)
        peers = host.peers()
        fresh = {a: g["uuid"] for a, g in polled.items() if is_fresh(g)}
        founding = founders(host.uuid, polled, peers)
        all_fresh_lowest = founding is not None
        cu = host.member_cluster_uuid()
        if running:
            pass                         # running members refused or failed: ask them again
        elif cu is not None:
            self._out.apply.append(Status(None, f"waiting for a running member of cluster {cu}{notes}"))
        elif host.wait_for >= 1:
            d = host.decide()
            if d.outcome is Outcome.ABORT and d.code in ("no_clean_store", "different_shutdowns"):
                # This store is empty: it can only join. Peers whose stores are dirty may be
                # members that founded or joined this very formation a moment ago and are not
                # running yet; if they really cannot recover, they abort themselves.
                self._out.apply.append(Status("waiting", f"{d.message} among the peers; waiting for a running "
                                                         f"member{notes}"))
            elif d.outcome is Outcome.ABORT:
                return self._abort(d.message, d.hint)
            elif d.outcome is Outcome.WAIT:
                self._out.apply.append(Status("waiting", d.message + notes))
            elif d.outcome is Outcome.ACTIVATE and all_fresh_lowest:
                return self._bootstrap(d.initial, f"{len(d.active)} initial members exchanged status; this node has "
                                                  "the lowest uuid: bootstrapping")
            else:
                self._out.apply.append(Status("joining", f"{len(d.active) or host.members_seen()} initial members "
                                                         f"exchanged status; waiting for a running member to "
                                                         f"join{notes}"))
        elif all_fresh_lowest:
            return self._bootstrap(InitialSignature(host.proposal[0], host.proposal[1], founding),
                                   "every peer is fresh and this node has the lowest uuid: bootstrapping")
        else:
            self._out.apply.append(Status(None, f"waiting for a booted peer ({len(fresh)} of {len(peers)} peers "
                                                f"fresh){notes}"))
        self._wait(now)

    def _store_polled(self, polled: dict, now: float) -> None:
        """A store's round of the exchange: a running member of the same cluster lets this node
        go active (after catching up with it, if it waits for its peers); else the Qpid decision
        over the statuses seen."""
        host = self.host
        active = [g for g in polled.values()
                  if isinstance(g, dict) and g.get("cluster_uuid") and g.get("status") == "running"]
        if active:
            theirs = active[0]
            their_initial = initial_from_wire((theirs.get("store") or {}).get("initial"))
            mine = host.my_status()
            if their_initial is not None and mine.initial is not None:
                jd = decide_join(their_initial, mine.status, mine.initial)
                if not jd.update:
                    return self._abort(jd.message)
            if host.wait_for:
                return self._catch_up(theirs, "")
        if not host.wait_for:
            return self._to(JoinState.DONE)
        d = host.decide()
        if d.outcome is Outcome.WAIT:
            self._out.apply.append(Status("waiting", d.message + refusal_notes(polled)))
            return self._wait(now)
        if d.outcome is Outcome.ABORT:
            return self._abort(d.message, d.hint)
        why = (f"initialization: {d.outcome.value}; {len(d.active) + len(d.catch_up)} initial members; this node "
               "goes active")
        if d.outcome is Outcome.CATCH_UP and host.uuid not in d.active:
            return self._catch_up(host.seen(d.source_for(host.uuid)), why)
        self._activate(why)

    def _catch_up(self, theirs: dict, why: str) -> None:
        self._to(JoinState.CATCHING_UP)
        self._why = why
        self._out.effects.append(CatchUp(theirs))
