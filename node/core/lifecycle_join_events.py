"""What the join machine (node/core/lifecycle_join.py) and its drivers (node/join.py, the
simulation's tests/sim/links.py) tell each other: the events a driver steps in with what came
of an effect, the effects the machine hands out for the driver to perform, in order, and the
status notes it shows. Frozen dataclasses, no behaviour.

Rules kept here: an effect names everything its driver needs to perform it, so a driver
decides nothing; every effect but WipePartial, BecomeMember, Activated and Abort is answered
by exactly one event (PollPeers -> Polled, Ask -> IdGranted / SnapshotReceived / AskFailed,
Install -> Installed, Bootstrap -> Bootstrapped, CatchUp -> CaughtUp)."""
from __future__ import annotations

from dataclasses import dataclass

from node import limits
from node.identity.signature import InitialSignature

# why an ask failed (AskFailed.code)
BROKEN = "broken"                      # the link broke or the donor's answer was wrong: wipe, next donor
PENDING = "pending"                    # the registration's outcome is unknown (RegistrationPending): next donor
REFUSED = "refused"                    # the donor refused (its reason logged): next donor
EXPELLED = "expelled"                  # the donor says this uuid was expelled: stop
IDENTITY_REJECTED = "identity_rejected"  # the donor refuses this node's final registration: stop
WRONG_CLUSTER = "wrong_cluster"        # the donor belongs to another cluster than this node's store: stop


# --- what the driver tells the machine --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Polled:
    """Every peer's greeting by address, or the error polling it gave (a PeerRefused: its reason)."""
    greetings: dict


@dataclass(frozen=True, slots=True)
class IdGranted:
    """REGISTERED: the donor registered this node as `replica_id` (JOIN: its snapshot follows)."""
    address: str
    replica_id: int


@dataclass(frozen=True, slots=True)
class SnapshotReceived:
    """The donor's snapshot is in (records not installed yet): its `_cluster` rows and its
    vclock (the donor's ids), `rows` records."""
    address: str
    table_rows: list
    vclock: dict
    rows: int = 0


@dataclass(frozen=True, slots=True)
class AskFailed:
    address: str
    why: str
    code: str = BROKEN


@dataclass(frozen=True, slots=True)
class Installed:
    address: str


@dataclass(frozen=True, slots=True)
class Bootstrapped:
    pass


@dataclass(frozen=True, slots=True)
class CaughtUp:
    pass


# --- what the machine hands the driver --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PollPeers:
    """One handshake with every configured peer (greetings only), each within `timeout_s`;
    answer Polled."""
    timeout_s: float = limits.peer_poll_timeout_s


@dataclass(frozen=True, slots=True)
class Ask:
    """Open a link to `address` and ask: m.JOIN (register, then the snapshot), m.FETCH_SNAPSHOT
    or m.REGISTER. `requested_id`: the id a new registration asks for (the lowest free in the
    donor's `_cluster`, None if it could not tell)."""
    address: str
    kind: int
    theirs: dict
    requested_id: int | None = None


@dataclass(frozen=True, slots=True)
class WipePartial:
    """An interrupted join may have left records: an empty store again, keeping the uuid."""


@dataclass(frozen=True, slots=True)
class Install:
    """Make the snapshot received from `address` this node's store: `fence` the reason to fence
    it (persisted before the store is complete), `anon_id` this anonymous replica's id in it
    (None: a member, registered by the snapshot), `gc_vclock` where its WAL starts."""
    address: str
    fence: str | None
    anon_id: int | None
    gc_vclock: dict
    rows: int


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """Found the cluster with this initial signature; `why` is worth a log line."""
    initial: InitialSignature
    why: str = ""


@dataclass(frozen=True, slots=True)
class CatchUp:
    """Take the rows the member whose greeting is `theirs` has, then answer CaughtUp."""
    theirs: dict


@dataclass(frozen=True, slots=True)
class Activated:
    """A store's initialization is decided: this node goes active (`why` is worth a log line)."""
    why: str


@dataclass(frozen=True, slots=True)
class BecomeMember:
    """The REGISTER went through: this anonymous replica states itself as a member."""
    address: str


@dataclass(frozen=True, slots=True)
class Abort:
    """Start-up cannot go on without an operator: one line (and a hint), exit 1."""
    message: str
    hint: str = ""


@dataclass(frozen=True, slots=True)
class Status:
    """What the node shows while it joins; `status` None keeps the status, changes the reason."""
    status: str | None
    reason: str
