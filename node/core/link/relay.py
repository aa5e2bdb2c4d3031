"""The relay's side of a link as a sans-IO machine: the subscriber's GREETING -> one request
(JOIN, FETCH_SNAPSHOT, REGISTER, SUBSCRIBE, SHUTDOWN or BYE) -> for SUBSCRIBE, the stream:
ACKs in, ROWS and HEARTBEATs out.

The driver (node/applier/relay.py) feeds messages to `step(message, now)`, the results of
what it did for an effect (`Registered`, `SnapshotSent`) likewise, and acts on `ready()` in
Ready's order (node/core/link/ready.py). While streaming it reads the WAL with the machine's
filter (`sub`, `own`: node/core/link/filter.py) and asks `tick` for heartbeats.

Rules kept here:
- An expelled member, a peer whose greeting fails a lasting check, and a request this node
  cannot serve now (no cluster yet, anonymous, not running, fenced) are refused with a code.
- A joiner's WAL hold (all that is here) is on disk before its snapshot is read; a
  subscriber's hold moves to its durable vclock before SUBSCRIBED goes (persist comes first).
- A subscriber behind what this node's WAL collected is told to rejoin, with what was
  collected by uuid (the rejoin answer: it asks whether another upstream has those rows),
  unless it says it goes without every such component (SUBSCRIBE `without`: its rejoin found
  no donor, and they are expelled members'): then no row of those members goes on the link,
  and the rest does (node/core/link/collected.py).
- An anonymous node sends none of its own rows (its private `_cluster` notes, signed with its
  private id): a member that replicates from it (to get back rows of its own it lost) neither
  registers it nor learns its id. Once the node registers, a link subscribed before ends with
  `greet_again` (`rows_may_go`): its own rows are a member's now, and the subscriber must hear
  a greeting that names its id before they go.
- A subscriber's own rows past what this node held of them when it subscribed are not echoed
  back, unless it asked for them (a fenced subscriber catching its own rows up: own_rows).
- An ACK moves the subscriber's hold to what it says is on disk (its `durable`; an older peer
  sends its vclock alone).
- A heartbeat says all we hold was sent: none goes while rows of the subscriber's own are
  claimed here and not applied (our greeting counted them: node/lifecycle.py greeting_fields).
- Rows go only under the greeting the subscriber heard: once our own `_cluster` rows are
  history up to a lower lsn than it said (a rebuilt store's fence lifted: it said all of them),
  the link ends with `greet_again` before the rows read go, and the subscriber greets again
  (`rows_may_go`): a row we write from then on states our ids, and it would take none of them."""
from __future__ import annotations

import enum
from typing import Callable, Protocol

import msgspec

from node import limits
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER
from node.core import messages as m
from node.core.link.collected import behind, expel_bounds_by_id, split_without
from node.core.link.greeting import check_greeting
from node.core.lifecycle_fence import own_history_lsn
from node.core.entry import TxnEntry
from node.core.link.ready import Hold, Outbox, Persist, Ready, Send, Stop
from node.core.membership import greeting_expels, news_for
from node.core.replicaset import NodeCore
from node.core.vclock import VClock
from node.errors import PeerRefused, RemoteProtocolError


class RelayState(enum.Enum):
    GREETING = "greeting"          # the subscriber's GREETING awaited
    REQUEST = "request"            # our GREETING sent, its request awaited
    REGISTERING = "registering"    # JOIN / REGISTER: the registration being applied (Register)
    SNAPSHOT = "snapshot"          # the snapshot being sent (SendSnapshot)
    SUBSCRIBE = "subscribe"        # after a snapshot or a registration: SUBSCRIBE or BYE awaited
    STREAMING = "streaming"        # subscribed: ACKs in, rows out
    CLOSED = "closed"              # the link is over (Stop handed out)

    # hashed by identity, as members compare (each is a singleton): enum's own __hash__ is a
    # Python call, and every transition looks a state up twice (_NEXT)
    __hash__ = object.__hash__


_NEXT = {
    RelayState.GREETING: {RelayState.REQUEST, RelayState.CLOSED},
    RelayState.REQUEST: {RelayState.REGISTERING, RelayState.SNAPSHOT, RelayState.STREAMING, RelayState.CLOSED},
    RelayState.REGISTERING: {RelayState.SNAPSHOT, RelayState.SUBSCRIBE, RelayState.CLOSED},
    RelayState.SNAPSHOT: {RelayState.SUBSCRIBE, RelayState.CLOSED},
    RelayState.SUBSCRIBE: {RelayState.STREAMING, RelayState.CLOSED},
    RelayState.STREAMING: {RelayState.CLOSED},
    RelayState.CLOSED: set(),
}
_REQUESTS = (m.JOIN, m.FETCH_SNAPSHOT, m.REGISTER, m.SUBSCRIBE, m.SHUTDOWN, m.BYE)
GREET_AGAIN = "greet_again"     # the ERROR code of a link whose greeting no longer holds (rows_may_go)


class RelayContext(Protocol):
    """What the relay machine asks of the rest of the node: synchronous, in-memory."""
    core: NodeCore | None

    def greeting(self) -> dict:
        """This node's greeting."""

    def check_peer_greeting(self, theirs: dict) -> None:
        """Checks beyond check_greeting (lease fencing); raises PeerRefused."""

    def status(self) -> tuple[str, str]:
        """This node's status ("running", ...) and why."""

    def serves_wal(self) -> bool:
        """False with wal_mode = none: no WAL to stream."""

    def gc_vclock(self) -> dict[int, int]:
        """Up to where this node's WAL was collected."""


class Registered(msgspec.Struct, frozen=True):
    """Input: what applying the registration of a JOIN / REGISTER gave (node/lifecycle.py)."""
    ok: bool
    id: int = 0
    reason: str = ""
    next_id: int | None = None


class SnapshotSent(msgspec.Struct, frozen=True):
    """Input: the driver sent the whole snapshot (SNAPSHOT, SNAPSHOT_ROWS*, SNAPSHOT_END)."""


class Register(msgspec.Struct, frozen=True):
    """Effect: apply the registration the joiner asked for, then step `Registered`."""
    greeting: dict
    body: dict


class SendSnapshot(msgspec.Struct, frozen=True):
    """Effect: send this node's snapshot, then step `SnapshotSent`."""


class Shutdown(msgspec.Struct, frozen=True):
    """Effect: run one phase of an orderly cluster shutdown and answer it (node/cluster_shutdown.py)."""
    body: dict


class Stream(msgspec.Struct, frozen=True):
    """Effect: SUBSCRIBED went; replace an older link of this subscriber and stream rows."""


class AckHold(msgspec.Struct, frozen=True):
    """Apply: the subscriber has `durable` on disk (retention moves its hold)."""
    uuid: str
    durable: dict
    anon: bool


class RelayMachine:
    def __init__(self, host: RelayContext, authenticated: str | None = None, peer: str = "?"):
        self.host = host
        self.authenticated = authenticated   # the uuid the handshake proof covered
        self.peer = peer                     # how logs name the subscriber
        self.state = RelayState.GREETING
        self.greeting: dict = {}
        self.mine: dict = {}                 # our greeting, as sent
        self.history_said = 0                # the own_history_lsn our greeting said (rows_may_go)
        self.anon_cut = False                # subscribed while this node was anonymous: none of its own rows go
        self.uuid = ""
        self.address = ""
        self.anon = False
        self.request = 0                     # the request's message type
        self.sub: dict[int, int] = {}        # the SUBSCRIBE vclock, in our ids
        self.own: tuple[int, int] | None = None   # the subscriber's own-rows cut (relay_wants)
        self.without: list[str] = []         # members whose collected rows it goes without (none sent)
        self.own_rows_only = False           # a fenced subscriber: it asked for its own rows only
        self.durable: dict[int, int] = {}    # what the subscriber has on disk
        self.acked: dict[int, int] = {}
        self.acked_at = 0.0
        self.lag_s = 0.0
        self.last_sent_at = 0.0
        self._out = Outbox()
        self.ready: Callable[[], Ready] = self._out.take
        self.advance: Callable[[Ready], None] = self._out.advance

    # --- the machine's interface ---------------------------------------------------------
    # ready() -> Ready and advance(ready) are the outbox's own, set in __init__ (taken after every
    # step, with no frame of the machine's between): node/core/link/ready.py Outbox.take, advance

    def step(self, msg: "m.Message | PeerRefused | Registered | SnapshotSent", now: float) -> None:
        st = self.state
        assert st is not RelayState.CLOSED, "step() of a closed relay link"
        if isinstance(msg, PeerRefused):
            return self._stop(msg)
        if st is RelayState.REGISTERING:
            assert type(msg) is Registered, f"expected the registration's result, got {msg!r:.60}"
            return self._registered(msg)
        if st is RelayState.SNAPSHOT:
            assert type(msg) is SnapshotSent, f"expected the snapshot sent, got {msg!r:.60}"
            return self._to(RelayState.SUBSCRIBE)
        assert isinstance(msg, m.Message), f"{st.name}: {msg!r:.60} is not a message"
        if st is RelayState.GREETING:
            if msg.type != m.GREETING:
                return self._stop(RemoteProtocolError(f"{self.peer}: expected GREETING, got {msg.name}"))
            return self._on_greeting(msg.body, now)
        if st is RelayState.REQUEST:
            if msg.type not in _REQUESTS:
                return self._stop(RemoteProtocolError(f"{self.peer}: expected a request, got {msg.name}"))
            return self._on_request(msg)
        if st is RelayState.SUBSCRIBE:
            if msg.type not in (m.SUBSCRIBE, m.BYE):
                return self._stop(RemoteProtocolError(f"{self.peer}: expected SUBSCRIBE/BYE, got {msg.name}"))
            return self._stop(None) if msg.type == m.BYE else self._on_subscribe(msg)
        if msg.type == m.ACK:                  # (its vclocks were checked by decode)
            acked = m.vclock_of(msg["vclock"])
            durable = msg.get("durable")
            durable = m.vclock_of(durable) if durable is not None else acked
            self.acked, self.durable, self.acked_at = acked, durable, now
            lag_us = msg.get("lag_us")
            self.lag_s = lag_us / 1e6 if isinstance(lag_us, int) and lag_us >= 0 else 0.0
            self._out.apply.append(AckHold(self.uuid, durable, self.anon))
        elif msg.type == m.BYE:
            self._stop(None)
        elif msg.type != m.HEARTBEAT:
            self._stop(RemoteProtocolError(f"unexpected {msg.name} from subscriber"))

    def tick(self, now: float, wall_us: int) -> None:
        """Streaming, nothing sent for heartbeat_interval_s (`now`, monotonic): a HEARTBEAT
        with this node's wall clock (the subscriber's lag when idle)."""
        if self.state is RelayState.STREAMING and now - self.last_sent_at >= limits.heartbeat_interval_s \
                and not self._own_rows_in_flight():
            self._out.send.append(Send(m.HEARTBEAT, {"now_us": wall_us}))
            self.last_sent_at = now

    def _own_rows_in_flight(self) -> bool:
        """This node claimed rows of the subscriber's own and has not applied them yet: our
        greeting counted them (it says what we hold or are writing), and a heartbeat says all
        we hold was sent, so none goes until they are (the subscriber would take our word for
        its rows as false, and a fenced one could write those lsns again)."""
        core = self.host.core
        member = core.table.get(self.uuid) if core is not None else None
        return member is not None and core.claimed.get(member.id) > core.vclock.get(member.id)

    def sent_rows(self, now: float) -> None:
        """The driver sent rows at `now` (monotonic): no heartbeat is due before the next interval."""
        assert self.state is RelayState.STREAMING
        self.last_sent_at = now

    def rows_may_go(self) -> bool:
        """The driver read this node's WAL (rows to send or not): whether the link goes on. Not
        once this node's own `_cluster` rows are history up to a lower lsn than our greeting
        said (a rebuilt store's fence lifted since: it said all of them): the subscriber takes
        no ids from our rows up to what it heard, so the restated table and every registration
        after it would teach it nothing, and its map would keep what our earlier incarnation's
        rows said. Nor once this node, anonymous when the subscriber subscribed, is a member:
        the link sends none of our own rows (`anon_cut`), and the subscriber's map has no id for
        us (our greeting named us anonymous), so our rows from now on would never reach it on
        this link. The link ends with ERROR greet_again (the rows read are not sent) and the
        subscriber greets again."""
        core = self.host.core
        if core is None:
            return True
        if self.anon_cut and not core.anon:
            self._refuse(GREET_AGAIN, "this node registered as a member since its greeting said it was anonymous: "
                         "greet again", note=f"{self.peer} greets again: this node is a member now")
            return False
        fence = core.fence
        if fence is not None:
            lacks = news_for(fence, core.table, core.uuid, self.uuid, self.mine)
            if lacks:
                self._refuse(GREET_AGAIN, f"this node's fence relies on the expel of {', '.join(lacks)}, which this "
                             "link's greeting did not state: greet again",
                             note=f"{self.peer} greets again: it spoke before it knew of an expel this node's fence "
                             "relies on")
                return False
        if own_history_lsn(core) >= self.history_said:
            return True
        self._refuse(GREET_AGAIN, "this node's own rows are confirmed and its table restated since its greeting "
                     "said every own `_cluster` row was an earlier incarnation's: greet again",
                     note=f"{self.peer} greets again: this node's fence lifted since its greeting")
        return False

    def recv_timeout_s(self) -> float:
        """How long the driver waits for the subscriber's next message: its request comes at
        once; a subscribed one ACKs at least every heartbeat_interval_s."""
        return limits.peer_timeout_s if self.state is RelayState.STREAMING else limits.handshake_timeout_s

    def next_heartbeat_at(self) -> float:
        return self.last_sent_at + limits.heartbeat_interval_s

    def close(self) -> None:
        """The driver ends the link (the connection broke, a newer link replaced it)."""
        if self.state is not RelayState.CLOSED:
            self._to(RelayState.CLOSED)

    # --- transitions ---------------------------------------------------------------------
    def _to(self, state: RelayState) -> None:
        assert state in _NEXT[self.state], f"relay link: {self.state.name} -> {state.name}"
        self.state = state

    def _stop(self, error: BaseException | None, note: str = "") -> None:
        self._to(RelayState.CLOSED)
        self._out.effects.append(Stop(error, note))

    def _refuse(self, code: str, message: str, raise_: bool = False, note: str = "", **fields) -> None:
        """Answer ERROR {code, message}; with `raise_` the driver logs it as a refusal."""
        self._out.send.append(Send(m.ERROR, {"code": code, "message": message, **fields}))
        self._stop(PeerRefused(code, message) if raise_ else None, note)

    def _on_greeting(self, theirs: dict, now: float) -> None:
        host = self.host
        self.greeting = theirs
        self.uuid, self.address, self.anon = theirs["uuid"], theirs["address"], theirs["anon"]
        self.peer = f"{theirs['address']} ({theirs['uuid'][:8]})"
        mine = host.greeting()
        try:
            check_greeting(mine, theirs, self.peer, self.authenticated)
            host.check_peer_greeting(theirs)
        except PeerRefused as e:
            self._out.send.append(Send(m.ERROR, {"code": e.code, "message": e.message,
                                                 **(getattr(e, "body", None) or {})}))
            return self._stop(e)
        except RemoteProtocolError as e:
            return self._stop(e)
        core = host.core
        me = core.table.get(self.uuid) if core is not None else None
        if me is not None and me.state == STATE_EXPELLED:
            return self._refuse("expelled", f"{self.uuid} was expelled from this cluster", raise_=True)
        if core is not None:
            # expels its greeting states that we did not know: ours too, on disk before our
            # greeting (which states them) goes (NodeCore.adopt_expels, OwnRowsFence.unaware);
            # only while running (not while a rebuild may swap the store under the row)
            heard = theirs.get("expels_heard")
            txn = core.adopt_expels(self.uuid, heard, int(now * 1e6)) \
                if heard and host.status()[0] == "running" else None
            if txn is not None:
                self._out.persist.append(Persist(TxnEntry([txn])))
            if txn is not None or core.fence is not None:
                mine = host.greeting()      # with what it told us (a fence heard its expels)
        self.mine = mine
        self._to(RelayState.REQUEST)
        history = mine.get("own_history_lsn")
        self.history_said = history if type(history) is int else 0
        self._out.send.append(Send(m.GREETING, mine))

    def _on_request(self, req: m.Message) -> None:
        self.request = req.type
        core = self.host.core
        if req.type == m.BYE:
            return self._stop(None)
        if req.type == m.SHUTDOWN:
            # Asked by its coordinator: a member of this cluster, authenticated by the session.
            member = core.table.get(self.uuid) if core is not None else None
            if member is None or member.state != STATE_MEMBER:
                return self._refuse("not_member", f"{self.uuid} is not a member here: it cannot coordinate a shutdown")
            self._out.effects.append(Shutdown(req.body))
            return self._stop(None)
        if core is None:
            return self._refuse("not_ready", "this node has not joined a cluster yet")
        if req.type in (m.JOIN, m.REGISTER):
            # Crash-safe registration (node/lifecycle.py): the apply is idempotent for one uuid +
            # register code; REGISTERED {id} answers it, an ERROR register_rejected refuses it.
            if core.anon:
                return self._refuse("anon", "an anonymous replica cannot register members")
            status, reason = self.host.status()
            if status != "running":
                return self._refuse("not_ready", f"this node is {status}: {reason}")
            out = core.expelled_reason()
            if out is not None:
                return self._refuse("donor_expelled", f"this node registers nobody: {out}; a member registered "
                                    "here would not be taken by the others")
            known = core.table.get(self.uuid)
            if core.fence is not None and (known is None or known.state != STATE_MEMBER):
                # registering writes a row under our own id; a member we have needs none
                return self._refuse("not_ready", "this node's own rows are not confirmed yet: it registers nobody new")
            self._to(RelayState.REGISTERING)
            self._out.effects.append(Register(self.greeting, req.body))
            return
        if req.type == m.FETCH_SNAPSHOT:
            return self._snapshot()
        self._on_subscribe(req)

    def _greet_again_for_fence(self, core: NodeCore) -> bool:
        """Our fence heard the subscriber before it knew of an expel the fence relies on, and
        our greeting told it (it expelled that member too before it subscribed: its greeting
        says so now): it greets again, once per news told (not a loop if it did not take it)."""
        fence = core.fence
        assert fence is not None
        lacks = fence.unaware(core.table, core.uuid).get(self.uuid)
        if not lacks:
            return False
        told = frozenset(greeting_expels(self.mine))
        if not told.issuperset(lacks) or fence.told.get(self.uuid) == told:
            return False
        fence.told[self.uuid] = told
        self._refuse(GREET_AGAIN, f"this node's fence heard {self.uuid} before it knew that {', '.join(lacks)} "
                     "is expelled: greet again")
        return True

    def _registered(self, applied: Registered) -> None:
        if not applied.ok:
            self._out.send.append(Send(m.ERROR, {"code": "register_rejected", "message": applied.reason,
                                                 "next_id": applied.next_id}))
            return self._stop(None)
        self._out.send.append(Send(m.REGISTERED, {"id": applied.id}))
        if self.request == m.JOIN:
            return self._snapshot()
        self._to(RelayState.SUBSCRIBE)

    def _snapshot(self) -> None:
        # The joiner's hold exists before its snapshot is read and holds all that is here
        # until it subscribes and says where it is (it may take its snapshot elsewhere in the
        # end), whoever restarts meanwhile (node/retention.py).
        self._to(RelayState.SNAPSHOT)
        self._out.persist.append(Hold(self.uuid, self.request == m.FETCH_SNAPSHOT))
        self._out.effects.append(SendSnapshot())

    def _on_subscribe(self, req: m.Message) -> None:
        host, core = self.host, self.host.core
        assert core is not None
        self.sub = m.vclock_of(req["vclock"])            # (checked by decode)
        self.own_rows_only = req.get("own_rows") is True
        durable = req.get("durable")
        # what the subscriber has on disk (its hold; an older peer says nothing: its vclock)
        self.durable = m.vclock_of(durable) if durable is not None else dict(self.sub)
        self.acked = dict(self.sub)
        if core.anon:
            # an anonymous replica's own rows are its private `_cluster` notes: never sent (nor
            # needed: their collection tells nobody to rejoin)
            self.sub[core.self_id] = limits.lsn_max
            self.anon_cut = True
        if not host.serves_wal():
            return self._refuse("wal_mode", "wal_mode = none: this node keeps no WAL and cannot serve replicas")
        if core.fence is not None and self._greet_again_for_fence(core):
            return None
        gc_vclock = host.gc_vclock()
        missing, gone = split_without(behind(self.sub, gc_vclock, expel_bounds_by_id(core.table, self.greeting)),
                                      req.get("without"), core.table)
        for rid in gone:         # never sent on this link: as past every lsn (as an anonymous node's own rows)
            self.sub[rid] = limits.lsn_max
        self.without = sorted(core.table.uuid_of(rid) for rid in gone)
        if missing:
            # the collected rows by uuid: the subscriber asks whether another upstream can give them
            return self._refuse("need_rejoin", f"rows of components {missing} below {gc_vclock} were "
                                "collected from this node's WAL; rejoin from a snapshot",
                                note=f"{self.uuid} is behind collected WAL {gc_vclock}: told to rejoin",
                                gc_vclock_uuid=core.vclock_by_uuid(VClock(gc_vclock)))
        member = core.table.get(self.uuid)
        if member is not None and member.state != STATE_ANON and req.get("own_rows") is not True:
            # its own rows past what this node holds of them now come from it: not echoed back
            self.own = (member.id, core.vclock.get(member.id))
        self._to(RelayState.STREAMING)
        self._out.persist.append(Hold(self.uuid, self.anon, self.durable))
        self._out.send.append(Send(m.SUBSCRIBED, {"vclock": {k: v for k, v in core.vclock.items() if k}}))
        self._out.effects.append(Stream())
