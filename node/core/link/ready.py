"""What a link machine hands its driver: one `Ready`, acted on in its written order.

The order (after etcd raft's Ready): 1. `persist` — journal entries the machine claimed and
WAL holds, submitted synchronously, with no await before the last of them (WAL order is claim
order, and a hold is in place before anything it protects is sent); 2. `send` — messages to
the peer, in order; 3. `apply` — what the rest of the node learns (the rejoiner, the fence,
retention); 4. `effects` — what the driver does next for the link (stop it, send a snapshot,
start streaming). Then `advance(ready)`.

Rules kept here:
- A Ready is taken once: `ready()` hands out everything pending and clears it; `advance` takes
  back exactly a Ready that was handed out. A relay's two loops (reading ACKs, sending rows)
  may each hold one, but never while one of them holds claimed rows.
- A machine takes no new message while rows it claimed have not been handed over
  (`Outbox.assert_claims_taken`): check, claim and submit happen with no await between."""
from __future__ import annotations

import msgspec

from node.core.entry import Entry


class Persist(msgspec.Struct, frozen=True, gc=False):
    """One journal entry (one WAL frame; node.core.entry): `journal.submit_entry_nowait(entry)`."""
    entry: Entry

    @property
    def rows(self) -> int:
        return self.entry.rows


class Hold(msgspec.Struct, frozen=True, gc=False):
    """A WAL hold for a subscriber, on disk before the answer goes: `durable` None holds all
    that is here (a joiner about to read a snapshot), else the subscriber's durable vclock."""
    uuid: str
    anon: bool
    durable: dict | None = None


class Send(msgspec.Struct, frozen=True, gc=False):
    """One message to the peer."""
    mtype: int
    body: dict


class Stop(msgspec.Struct, frozen=True):
    """End the link: `error` None is a clean end (BYE, a finished request); else the driver
    raises it after acting on the rest of the Ready (its one place maps it to a next step)."""
    error: BaseException | None = None
    note: str = ""            # a quiet end worth a log line (the driver logs it)


class Ready(msgspec.Struct, frozen=True):
    persist: tuple = ()
    send: tuple = ()
    apply: tuple = ()
    effects: tuple = ()

    def __bool__(self) -> bool:
        return bool(self.persist or self.send or self.apply or self.effects)

    @property
    def stop(self) -> Stop | None:
        for e in self.effects:
            if type(e) is Stop:
                return e
        return None


EMPTY = Ready()


class Outbox:
    """A machine's pending Ready and the one handed out and not advanced yet."""

    __slots__ = ("persist", "send", "apply", "effects", "_out", "_claims_out")

    def __init__(self) -> None:
        self.persist: list = []
        self.send: list = []
        self.apply: list = []
        self.effects: list = []
        self._out: list[Ready] = []     # handed out, not advanced yet
        self._claims_out = 0            # how many of those carry claimed rows (persist)

    def take(self) -> Ready:
        assert not self._claims_out, "claimed rows are still being persisted: advance first"
        if not (self.persist or self.send or self.apply or self.effects):
            return EMPTY
        # an empty list stays here (and the Ready gets ()); a non-empty one is emptied
        persist, send, apply, effects = self.persist, self.send, self.apply, self.effects
        rd = Ready(tuple(persist) if persist else (), tuple(send) if send else (),
                   tuple(apply) if apply else (), tuple(effects) if effects else ())
        if persist:
            persist.clear()
            self._claims_out += 1
        if send:
            send.clear()
        if apply:
            apply.clear()
        if effects:
            effects.clear()
        self._out.append(rd)
        return rd

    def advance(self, rd: Ready) -> None:
        if rd is EMPTY:
            return
        for i, r in enumerate(self._out):
            if r is rd:
                del self._out[i]
                if rd.persist:
                    self._claims_out -= 1
                return
        raise AssertionError("advance() of a Ready this machine did not hand out, or twice")

    def assert_claims_taken(self) -> None:
        """Rows claimed for the last message are handed over before the next is taken."""
        assert not self.persist, "claimed rows not handed over: ready() and persist before the next step"
        assert not self._claims_out, "claimed rows not advanced before the next step"
