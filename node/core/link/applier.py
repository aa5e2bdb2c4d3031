"""The applier's side of a link as a sans-IO machine: GREETING -> SUBSCRIBE -> SUBSCRIBED (or
the rejoin answer) -> ROWS / HEARTBEAT, with ACKs in the upstream's ids.

The driver (node/applier/applier.py) connects and authenticates, then feeds every message
(and a refusal, the peer's ERROR, as a PeerRefused) to `step(message, now)`, calls `tick(now)`
while it waits, and acts on `ready()` in Ready's order (node/core/link/ready.py).

Rules kept here:
- The upstream's id map is built from its greeting, and the members it knows that we do not
  are registered (persisted) before SUBSCRIBE goes (NodeCore.greeting); while fenced we ask for
  our own rows only (NodeCore.subscribe_vclock) and subscribe again once the fence clears.
- Check, claim and submit with no await between: every row the core claims for a message is
  in the persist of the Ready that message produced, even when a later row of it is refused,
  and the machine takes no message while claimed rows are not handed over.
- A refused row ends the link (Stop with the RemoteProtocolError) after what was claimed
  before it; an expelled member's accepted bound growing asks for a fresh SUBSCRIBE
  (Stop with Resubscribe), since rows refused under the smaller bound must come again.
- An upstream that heartbeats (it has sent all it held) without our own rows that its
  greeting claimed to hold is not believed (DisproveClaim).
- ACKs go at most every ack_interval_s, and at least every heartbeat_interval_s: with a message,
  and between messages once the rows this link brought are applied (the driver's ACK writer
  asks ack_wait), so the last rows of a burst are not acknowledged a heartbeat late.
- A SUBSCRIBE names the expelled members whose collected rows this node goes without
  (`without`, once its rejoin found no donor for them): an upstream that collected only those
  serves the rest instead of telling it to rejoin."""
from __future__ import annotations

import enum
from typing import Callable, Protocol

import msgspec

from node import limits
from node.core import messages as m
from node.core.link.greeting import check_greeting
from node.core.link.ready import Outbox, Persist, Ready, Send, Stop
from node.core.membership import describe_uncovered, greeting_expels, greeting_vclock, news_for, uncovered
from node.core.replicaset import NodeCore, Peer
from node.core.rows import GROUP_DEFAULT
from node.core.entry import PackedEntry, TxnEntry
from node.errors import PeerNotReady, PeerRefused, RemoteProtocolError


class Resubscribe(Exception):
    """Our own state asks for a fresh SUBSCRIBE (an expelled member's accepted bound grew,
    so rows refused under the smaller bound must be sent again; or our fence cleared).
    Nobody's fault."""


class ApplierState(enum.Enum):
    NEW = "new"                    # nothing sent yet
    GREETING = "greeting"          # our GREETING sent, the upstream's awaited
    SUBSCRIBING = "subscribing"    # SUBSCRIBE sent, SUBSCRIBED (or a refusal) awaited
    FOLLOW = "follow"              # ROWS and HEARTBEATs in, ACKs out
    STOPPED = "stopped"            # the link is over (Stop handed out)

    # hashed by identity, as members compare (each is a singleton): enum's own __hash__ is a
    # Python call, and every transition looks a state up twice (_NEXT)
    __hash__ = object.__hash__


_NEXT = {
    ApplierState.NEW: {ApplierState.GREETING, ApplierState.STOPPED},
    ApplierState.GREETING: {ApplierState.SUBSCRIBING, ApplierState.STOPPED},
    ApplierState.SUBSCRIBING: {ApplierState.FOLLOW, ApplierState.STOPPED},
    ApplierState.FOLLOW: {ApplierState.STOPPED},
    ApplierState.STOPPED: set(),
}


class ApplierContext(Protocol):
    """What the applier machine asks of the rest of the node: synchronous, in-memory."""

    def check_peer_greeting(self, theirs: dict) -> None:
        """Checks beyond check_greeting (lease fencing, the own-rows fence hears the peer);
        raises PeerRefused."""

    def claim_link(self, peer_uuid: str) -> None:
        """One link per member: raises PeerRefused (another link follows it) or ConnectionError
        (a removed link to it is still closing)."""

    def journal_pending(self) -> int:
        """Entries submitted to the journal and not durable yet."""

    def own_claim(self, peer_uuid: str) -> int:
        """How far the peer said it holds this node's own rows: its greeting's claim, or what a
        fence heard from it (node.core.lifecycle_fence.claim_of; 0: no claim)."""

    def going_without(self) -> list[str]:
        """The expelled members whose collected rows this node goes without (its rejoin found no
        donor: node.core.lifecycle_rejoin RejoinMachine.going_without); SUBSCRIBE says so."""


class Followed(msgspec.Struct, frozen=True):
    """SUBSCRIBED came: the link follows the upstream from `vclock` (in its ids)."""
    peer_uuid: str
    vclock: dict
    fenced: bool


class DisproveClaim(msgspec.Struct, frozen=True):
    """The upstream caught us up without our own rows it claimed: its claim is not believed."""
    peer_uuid: str
    have: int


class ApplierMachine:
    def __init__(self, core: NodeCore, host: ApplierContext, address: str, authenticated: str | None = None):
        self.core = core
        self.host = host
        self.address = address
        self.authenticated = authenticated   # the uuid the handshake proof covered
        self.state = ApplierState.NEW
        self.mine: dict = {}
        self.greeting: dict | None = None    # the upstream's
        self.peer_uuid: str | None = None
        self.peer_vclock: dict[str, int] = {}   # the upstream's vclock by uuid, from its greeting
        self.core_peer: Peer | None = None   # the core's Peer this link built (NodeCore.greeting)
        self.fenced = False                  # subscribed for our own rows only
        self.outside = False                 # the upstream was expelled here: subscribed for expelled members' rows
        self.subscribed_from: dict[int, int] = {}   # the SUBSCRIBE vclock, in the upstream's ids
        self.without: list[str] = []         # the SUBSCRIBE's `without` (going_without)
        self.expel_epoch = 0
        self.lag_s = 0.0
        self.last_row_at = 0.0
        self.rows = 0
        self.messages_scanned = 0            # ROWS messages taken by the row scanner
        self.messages_decoded = 0            # ... and decoded txn by txn (the exact path)
        self._last_ack = 0.0
        self._acked_sig: tuple[int, int] = (-1, -1)
        self._owed_sig = 0                   # the core's claimed vclock's signature after this link's last
                                             # rows, until an ACK goes with them applied; 0: none owed
        self._claim_checked = False
        self._out = Outbox()
        self.ready: Callable[[], Ready] = self._out.take
        self.advance: Callable[[Ready], None] = self._out.advance

    # --- the machine's interface ---------------------------------------------------------
    # ready() -> Ready and advance(ready) are the outbox's own, set in __init__ (taken after every
    # step, with no frame of the machine's between): node/core/link/ready.py Outbox.take, advance

    def start(self, mine: dict) -> None:
        """The link is authenticated: greet the upstream with `mine` (this node's greeting)."""
        self._to(ApplierState.GREETING)
        self.mine = mine
        # the bounds our greeting states are what the relay serves by (RelayMachine: it wants
        # no row of an expelled member past them): a bound grown since asks for a fresh link
        self.expel_epoch = self.core.expel_epoch
        self._out.send.append(Send(m.GREETING, mine))

    def step(self, msg: m.Message | PeerRefused, now: float) -> None:
        """One message from the upstream (a PeerRefused: its ERROR), received at `now` (s)."""
        self._out.assert_claims_taken()
        st = self.state
        assert st not in (ApplierState.NEW, ApplierState.STOPPED), f"step() in state {st.name}"
        if isinstance(msg, PeerRefused):
            if st is ApplierState.SUBSCRIBING and msg.code == "need_rejoin":
                self._rejoin_answer(msg)
            elif msg.code == "expelled":
                self.core.told_expelled(self.address, msg.message)
            return self._stop(msg)
        if st is ApplierState.GREETING:
            if msg.type != m.GREETING:
                return self._stop(RemoteProtocolError(f"{self.address}: expected GREETING, got {msg.name}"))
            return self._on_greeting(msg.body, now)
        if st is ApplierState.SUBSCRIBING:
            if msg.type != m.SUBSCRIBED:
                return self._stop(RemoteProtocolError(f"{self.address}: expected SUBSCRIBED, got {msg.name}"))
            self._to(ApplierState.FOLLOW)
            self._out.apply.append(Followed(self.peer_uuid, self.subscribed_from, self.fenced))  # type: ignore[arg-type]
            return
        if msg.type == m.ROWS:
            self._on_rows(msg, now)
        elif msg.type == m.HEARTBEAT:
            self._on_heartbeat(msg, now)
        else:
            return self._stop(RemoteProtocolError(f"unexpected {msg.name} while streaming"))
        if self.state is ApplierState.FOLLOW:
            self._ack(now)

    def tick(self, now: float) -> None:
        """Time passes with no message (the driver waits, e.g. on back-pressure): ACK what is
        due, and notice a fence or an expel bound that asks for a fresh SUBSCRIBE."""
        if self.state is ApplierState.FOLLOW and self._resubscribe_check():
            self._ack(now)

    @property
    def owes_ack(self) -> bool:
        """Rows came on this link since the last ACK that said they were applied."""
        return bool(self._owed_sig) and self.state is ApplierState.FOLLOW

    def ack_wait(self, now: float) -> float | None:
        """Between messages (the driver's ACK writer, once rows came on this link): how long (s)
        until an ACK may go (ack_interval_s after the last) that tells the upstream the rows it
        sent are applied here; None while none is owed (no rows came since the last ACK that
        covered them, or they are not all applied yet). Without it the last rows of a burst were
        acknowledged only with the next message, up to a heartbeat later. Rows of other links
        wait for this link's next message, as before: ACKs for them would be traffic the
        upstream needs no sooner."""
        if not self.owes_ack or self.core.vclock.signature < self._owed_sig:
            return None
        since = now - self._last_ack
        return 0.0 if since >= limits.ack_interval_s else limits.ack_interval_s - since

    def ack(self, now: float) -> bool:
        """The ACK ack_wait said is owed, into the outbox; whether one went in. Nothing else: no
        check that could stop the link runs here, so the writer's Ready is sends only."""
        if self.state is not ApplierState.FOLLOW:
            return False
        last = self._last_ack
        self._ack(now)
        return self._last_ack != last

    def recv_timeout_s(self) -> float:
        """How long the driver waits for the next message: a handshake answer comes at once;
        a following link hears at least a heartbeat every heartbeat_interval_s."""
        return limits.peer_timeout_s if self.state is ApplierState.FOLLOW else limits.handshake_timeout_s

    def holds_reading(self, pending_rows: int, no_space: bool) -> bool:
        """Back-pressure: while following, read no further message while the journal holds more
        than applier_pending_rows_max rows not durable yet, or the disk has no room (NOSPACE).
        The link stays: the driver ticks meanwhile, so what becomes durable is acknowledged
        and the relay does not time the link out."""
        return self.state is ApplierState.FOLLOW and (pending_rows > limits.applier_pending_rows_max or no_space)

    def stop(self) -> None:
        """The driver ends the link (stop(), the connection broke): nothing more is taken."""
        if self.state is not ApplierState.STOPPED:
            self._to(ApplierState.STOPPED)

    # --- transitions ---------------------------------------------------------------------
    def _to(self, state: ApplierState) -> None:
        assert state in _NEXT[self.state], f"applier link: {self.state.name} -> {state.name}"
        self.state = state

    def _stop(self, error: BaseException | None) -> None:
        self._to(ApplierState.STOPPED)
        self._out.effects.append(Stop(error))

    def _on_greeting(self, theirs: dict, now: float) -> None:
        core = self.core
        try:
            check_greeting(self.mine, theirs, self.address, self.authenticated)
            self.host.check_peer_greeting(theirs)
            self.greeting = theirs
            # Who is at this address, known even if it cannot serve us yet: a peer that moves
            # before it ever did is followed by its uuid (Lifecycle.follow_addresses).
            self.peer_uuid = theirs["uuid"]
            self.peer_vclock = greeting_vclock(theirs)
            self.host.claim_link(self.peer_uuid)
            if not theirs["cluster_uuid"]:
                raise PeerNotReady(f"{self.address} has not joined a cluster yet")
            history = theirs.get("own_history_lsn")
            history = history if type(history) is int and 0 <= history <= limits.lsn_max else 0
            regs = core.greeting(self.peer_uuid, theirs["cluster"], int(now * 1e6), history,
                                 theirs.get("expels_heard") or ())
        except (PeerRefused, RemoteProtocolError, ConnectionError) as e:
            return self._stop(e)
        self.core_peer = core.peers[self.peer_uuid]
        for txn in regs:
            self._out.persist.append(Persist(TxnEntry([txn])))
        told = [u for u in theirs.get("expels_heard") or () if core.table.expelled(u)]
        if not greeting_expels(self.mine).issuperset(told):
            # A fenced upstream told us of expels our greeting (sent before) did not state: its
            # fence may wait for a word of ours that knows them, and its relay asks once per
            # news, so a greeting that took them only now would never be heard (the
            # full+replace mix, seed 208588: after a crash lost what we took the first time)
            return self._stop(Resubscribe(f"took the expel of {', '.join(sorted(told))} from {self.peer_uuid}'s "
                                          "greeting: greeting it again"))
        self.fenced = core.fence is not None      # then only our own rows (NodeCore.subscribe_vclock)
        self.outside = core.table.expelled(self.peer_uuid)   # then only expelled members' rows (likewise)
        vclock = core.subscribe_vclock(self.peer_uuid, self.peer_vclock, theirs["cluster"])
        self.subscribed_from = vclock.to_dict()
        self._to(ApplierState.SUBSCRIBING)
        req = {"vclock": self.subscribed_from, "durable": core.ack_durable(self.peer_uuid).to_dict(),
               "own_rows": self.fenced}
        self.without = [] if self.fenced else self.host.going_without()
        if self.without:
            req["without"] = self.without
        self._out.send.append(Send(m.SUBSCRIBE, req))

    def _rejoin_answer(self, e: PeerRefused) -> None:
        """The upstream collected rows we still need: say what a snapshot from it would discard,
        and what we need (node/rejoin.py decides where from)."""
        missing = uncovered(self.core.vclock_by_uuid(), self.peer_vclock)
        if missing:
            e.message += f"; this node holds rows it lacks ({describe_uncovered(missing)})"
        e.needed = greeting_vclock({"vclock_uuid": (getattr(e, "body", None) or {}).get("gc_vclock_uuid")})

    def _resubscribe_check(self) -> bool:
        """False (and the link stops) if our own state asks for a fresh SUBSCRIBE."""
        core = self.core
        if core.expel_epoch != self.expel_epoch:
            self._stop(Resubscribe("an expelled member's accepted rows grew: subscribing again"))
            return False
        if self.fenced and core.fence is None:
            self._stop(Resubscribe("this node's own rows are confirmed: subscribing for every origin"))
            return False
        if not self.outside and core.table.expelled(self.peer_uuid):    # type: ignore[arg-type]
            self._stop(Resubscribe("this upstream is expelled now: subscribing for expelled members' rows only"))
            return False
        fence = core.fence
        if fence is not None:
            lacks = news_for(fence, core.table, core.uuid, self.peer_uuid, self.mine)  # type: ignore[arg-type]
            if lacks:
                self._stop(Resubscribe(f"this node's fence relies on the expel of {', '.join(lacks)}, which the "
                                       "upstream did not know when it spoke: greeting it again"))
                return False
        return True

    def _on_rows(self, msg: m.Message, now: float) -> None:
        scan = msg.body.get("scan")
        last_ts = None
        if scan is not None:
            last_ts = self._receive_scan(scan, now)
            if self.state is ApplierState.STOPPED:
                return
            if last_ts is None:                  # a row the core must refuse exactly
                try:
                    msg = m.decode(msg["data"])
                except RemoteProtocolError as e:
                    return self._stop(e)
            else:
                self.messages_scanned += 1
        if last_ts is None:
            self.messages_decoded += 1
            last_ts = self._receive_txns(msg, now)
            if self.state is ApplierState.STOPPED:
                return
        if last_ts:
            self.lag_s = max(0.0, now - last_ts / 1e6)
            self.last_row_at = now
        self._owed_sig = self.core.claimed.signature    # an ACK is owed once all claimed so far is applied
        self._resubscribe_check()

    def _on_heartbeat(self, msg: m.Message, now: float) -> None:
        idle = self.host.journal_pending() == 0
        if idle:
            self.lag_s = max(0.0, now - msg["now_us"] / 1e6)
        if idle and not self._claim_checked:
            # The relay heartbeats once it has sent all it held: by now every row of ours its
            # greeting claimed to hold has come (its own-rows cut is at that claim). If some did
            # not, the claim was false: it must not hold our writes or our fence for ever.
            self._claim_checked = True
            core = self.core
            have = core.claimed.get(core.self_id)
            claimed = self.host.own_claim(self.peer_uuid)  # type: ignore[arg-type]
            if claimed > have:
                self._out.apply.append(DisproveClaim(self.peer_uuid, have))  # type: ignore[arg-type]
        self._resubscribe_check()

    def _ack(self, now: float) -> None:
        if now - self._last_ack < limits.ack_interval_s:
            return
        core, peer = self.core, self.peer_uuid
        v, d = core.ack_vclock(peer), core.ack_durable(peer)   # type: ignore[arg-type]
        sig = (v.signature, d.signature)
        if sig != self._acked_sig or now - self._last_ack >= limits.heartbeat_interval_s:
            self._out.send.append(Send(m.ACK, {"vclock": v.to_dict(), "durable": d.to_dict(),
                                               "lag_us": int(self.lag_s * 1e6)}))
            self._acked_sig, self._last_ack = sig, now
        if core.vclock.signature >= self._owed_sig:
            self._owed_sig = 0                   # said now, or by the last ACK already

    # --- rows: check + claim, handed over as persist --------------------------------------
    def _receive_scan(self, scan, now: float) -> int | None:
        """A message the row scanner took (plain txns only): the core claims whole runs of
        each origin, and what it took becomes one WAL frame built from the received bytes.
        Returns the last txn's timestamp, or None if the core wants the message decided by
        the exact path (nothing claimed)."""
        ranges: list[tuple[int, int, int]] = []
        try:
            decided = self.core.receive_scan(self.peer_uuid, scan, ranges, int(now * 1e6))
        except RemoteProtocolError as e:
            self._stop(e)
            return None
        finally:
            self._persist_ranges(scan, ranges)    # claimed rows reach the WAL, refused or not
        if decided is None:
            return None
        return scan.ts_max(scan.ntxn - 1, scan.ntxn) if scan.ntxn else 0

    def _persist_ranges(self, scan, ranges: list) -> None:
        if ranges:
            entry = PackedEntry(scan, ranges)
            self.rows += entry.rows
            self._out.persist.append(Persist(entry))

    def _receive_txns(self, msg: m.Message, now: float) -> int:
        """A decoded message: each txn by the core's rules (runs of one origin's plain txns
        at once), consecutive plain ones sharing one WAL frame. Returns the last txn's
        timestamp."""
        core, peer, persist = self.core, self.peer_uuid, self._out.persist
        wall_us = int(now * 1e6)
        entry: list = []          # consecutive plain txns share one WAL frame
        entry_rows = 0
        valid, bad = msg["txns"], msg["error"]
        try:
            i, n = 0, len(valid)
            while i < n:
                txn = valid[i]
                if txn.group == GROUP_DEFAULT:   # a run of one origin's plain txns
                    k = len(entry)
                    try:
                        i, rows = core.receive_run(peer, valid, i, entry, wall_us)
                    except RemoteProtocolError:
                        claimed = sum(len(t.ops) for t in entry[k:])   # claimed before it
                        self.rows += claimed
                        entry_rows += claimed
                        raise
                    self.rows += rows
                    entry_rows += rows
                    continue
                i += 1
                out = core.receive(peer, txn, wall_us)   # a _cluster txn (a local one raised)
                if out:
                    self.rows += len(txn.ops)
                    if entry:                             # it and our own answer: a frame of their own
                        persist.append(Persist(TxnEntry(entry, entry_rows)))
                        entry, entry_rows = [], 0
                    persist.append(Persist(TxnEntry(out)))
            if bad is not None:
                raise bad
        except RemoteProtocolError as e:
            self._stop(e)
        finally:
            # Claimed rows must reach the WAL even if a later row of the message is
            # refused: a claim without a write would make the node skip them for ever.
            if entry:
                persist.append(Persist(TxnEntry(entry, entry_rows)))
        return valid[-1].timestamp if valid else 0
