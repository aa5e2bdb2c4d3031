"""What the rejoin machine (node/core/lifecycle_rejoin.py) and its drivers (node/rejoin.py, the
simulation's tests/sim/shell.py) tell each other: the events a driver steps in with what came
of an effect, the effects the machine hands out for the driver to perform, and the notes it
shows. Frozen dataclasses, no behaviour.

Rules kept here: an effect names everything its driver needs to perform it, so a driver
decides nothing; each effect is answered by exactly one event (ProbeDonor -> Probed, Rebuild
-> Rebuilt / RebuildFailed)."""
from __future__ import annotations

from dataclasses import dataclass


# --- what the driver tells the machine --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Probed:
    """A probe's answer: `vclock` the donor's by uuid, None if the probe failed (unreachable,
    refused); `serving`: it is a running member of a cluster (else it cannot be a donor);
    `receiving`: it subscribes to this node for every origin's rows (it gets ours; a fenced
    subscriber asks for its own only), going without the members in `receiving_without` (its
    SUBSCRIBE's `without`: their rows it never gets from us); `bounds`: the members its
    `_cluster` says are expelled, with their accepted bounds (its greeting's); `anon`: it is an
    anonymous replica (its greeting says so), which registers nobody; `uuid`: its own (its
    greeting's)."""
    address: str
    vclock: dict | None
    serving: bool = True
    receiving: bool = False
    bounds: dict | None = None
    anon: bool = False
    uuid: str = ""
    receiving_without: tuple = ()


@dataclass(frozen=True, slots=True)
class Rebuilt:
    address: str


@dataclass(frozen=True, slots=True)
class RebuildFailed:
    """The rebuild stopped with the store kept; `why` None: not the donor's doing (the node
    stops), nothing is shown."""
    address: str
    why: str | None


# --- what the machine hands the driver -------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ProbeDonor:
    address: str


@dataclass(frozen=True, slots=True)
class Rebuild:
    """Links down, journal drained, a snapshot from `address` into a side store that must cover
    `mine()` (snapshot_uncovered), then the swap; answer Rebuilt or RebuildFailed.
    `donor_anon`: the donor is an anonymous replica. It registers nobody, so a member asks it
    for its snapshot (FETCH_SNAPSHOT) instead of joining through it (JOIN); the snapshot must
    have this member already, and its anonymous entries (the donor's private ones) are not
    this member's to keep (`member_snapshot`)."""
    address: str
    reason: str
    donor_anon: bool = False
    discarding: tuple = ()         # ((uuid, this node's lsn, the donor's), ...): rows the operator let go


@dataclass(frozen=True, slots=True)
class Status:
    """The node's status and reason ("rejoining" pauses writes)."""
    status: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Blocked:
    """The attempt found no donor (`on_links`: `why` is shown on the refusing links; a state
    that stands until a peer can give a snapshot), or the rebuild failed (the donor's or the
    network's doing: the next attempt may go to another donor)."""
    why: str
    on_links: bool = True


@dataclass(frozen=True, slots=True)
class NoRebuild:
    """It caught up past what was collected while the attempt probed and waited: no rebuild."""
