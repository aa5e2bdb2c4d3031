"""Lease identity core: what a slot's lease object holds, and every decision about it.

After Zeebe's dynamic node id provider: `cluster_size` slots, each a lease object in a
compare-and-swap store; a node takes the first free or expired slot, bumps the slot's
version, renews every duration/3 and releases on orderly shutdown. Added here: a slot
keeps a persistent `member_uuid`, and peers fence off lease versions older than one they
have seen.

Rules this module keeps:
- Pure: no IO, no asyncio, no clock, no randomness. Time arrives as `now_ms` (wall-clock
  milliseconds, comparable across nodes); nonces arrive as arguments.
- A lease is held while `now_ms < expires_ms`; at `expires_ms` exactly it is expired.
- The version grows by one on every acquisition and never otherwise; `serial` grows on
  every write and `nonce` differs per write, so no two bodies have equal bytes (the S3
  ETag is the body's MD5, and a CAS token must never come back: no ABA).
- A holder stops serving at `renew_deadline` (expiry minus a safety margin), well before
  another node may take the slot.
- Bytes that are not a lease raise `LeaseCorrupt`; callers treat the slot as expired and
  report it. Calling a decision on a state it does not apply to is a bug (AssertionError).
- Fencing acts on versions read from the lease store only. A peer's greeting that claims a
  newer version is a hint to read the store again (`unverified_claims`); one that lies
  changes nothing, and nothing it says is written to the store.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping, Union

from node.core.validate import is_uuid
from node.errors import ReplogError
from node import limits

lease_format = 1                     # bumped when the body's meaning changes


class LeaseCorrupt(ReplogError):
    """A lease object's bytes are not a lease (truncated, hand-edited, foreign writer).

    The store's data is at fault, not the caller: treat the slot as expired and report it."""

    def __init__(self, slot: int, reason: str):
        super().__init__(f"lease slot {slot} is corrupt: {reason}")
        self.slot = slot
        self.reason = reason


class LeaseLost(ReplogError):
    """This node no longer holds its slot (taken over, or the renewal deadline passed).

    Not a bug and not retryable: the node must stop serving under this identity."""

    def __init__(self, slot: int | None, reason: str):
        super().__init__(f"lease slot {slot} lost: {reason}")
        self.slot = slot
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Corrupt:
    """A slot whose object could not be decoded, as a value for `choose_slot`."""

    slot: int
    reason: str


@dataclass(frozen=True, slots=True)
class Lease:
    slot: int
    task_id: str | None          # holder; None = free (never held, or released)
    version: int                 # +1 on every acquisition; fencing compares it
    expires_ms: int              # wall-clock ms; 0 when free
    member_uuid: str             # minted with the slot, never changes
    known_versions: Mapping[int, int] = field(default_factory=dict, hash=False)
    serial: int = 0              # +1 on every write of this slot
    nonce: str = ""              # differs per write; identifies our own writes on read-back
    # The last version whose holder served (and so may have written this member's rows): a
    # holder writes it before it claims an lsn. None: not recorded (a body written before it
    # was), taken as `version` (served_version).
    served: int | None = None

    def __post_init__(self) -> None:
        if not (0 <= self.slot < limits.lease_cluster_size_max):
            raise ValueError(f"slot {self.slot} out of range")
        if self.task_id is not None and not (0 < len(self.task_id) <= limits.lease_task_id_chars_max):
            raise ValueError(f"task_id must be 1..{limits.lease_task_id_chars_max} chars")
        if not all(0 <= n <= limits.lease_int_max for n in (self.version, self.expires_ms, self.serial)):
            raise ValueError(f"version, expires_ms and serial must be 0..{limits.lease_int_max}")
        if not is_uuid(self.member_uuid):
            raise ValueError(f"member_uuid {self.member_uuid[:80]!r} is not a canonical uuid")
        if self.served is not None and not 0 <= self.served <= self.version:
            raise ValueError(f"served must be 0..version ({self.version}), got {self.served}")
        if len(self.nonce) > limits.lease_nonce_chars_max:
            raise ValueError(f"nonce is longer than {limits.lease_nonce_chars_max} characters")
        if len(self.known_versions) > limits.lease_cluster_size_max:
            raise ValueError("known_versions has more entries than slots")
        kv = {int(k): int(v) for k, v in self.known_versions.items()}
        if any(k < 0 or not 0 <= v <= limits.lease_int_max for k, v in kv.items()):
            raise ValueError(f"known_versions holds a negative slot or a version outside 0..{limits.lease_int_max}")
        object.__setattr__(self, "known_versions", kv)  # own copy: the caller's dict may change


LeaseState = Union[Lease, None, Corrupt]   # None: no object in the store for that slot


# --- encoding ------------------------------------------------------------------

def encode(lease: Lease) -> bytes:
    doc = {
        "format": lease_format,
        "slot": lease.slot,
        "task_id": lease.task_id,
        "version": lease.version,
        "expires_ms": lease.expires_ms,
        "member_uuid": lease.member_uuid,
        "known_versions": {str(k): v for k, v in sorted(lease.known_versions.items())},
        "serial": lease.serial,
        "nonce": lease.nonce,
    }
    if lease.served is not None:
        doc["served"] = lease.served
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    assert len(body) <= limits.lease_body_bytes_max, len(body)
    return body


def decode(body: bytes, slot: int) -> Lease:
    """Parse the object stored under `slot`; anything but a valid lease for it is LeaseCorrupt."""
    if len(body) > limits.lease_body_bytes_max:
        raise LeaseCorrupt(slot, f"{len(body)} bytes, more than {limits.lease_body_bytes_max}")
    try:
        doc = json.loads(body)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        if doc.get("format") != lease_format:
            raise ValueError(f"format {doc.get('format')!r}, expected {lease_format}")
        ints = ("slot", "version", "expires_ms", "serial")
        if any(type(doc[k]) is not int for k in ints):
            raise ValueError(f"{ints} must be integers")
        if doc["task_id"] is not None and not isinstance(doc["task_id"], str):
            raise ValueError("task_id must be a string or null")
        if not isinstance(doc["member_uuid"], str) or not isinstance(doc["nonce"], str):
            raise ValueError("member_uuid and nonce must be strings")
        served = doc.get("served")
        if served is not None and type(served) is not int:
            raise ValueError("served must be an integer")
        kv = doc["known_versions"]
        if not isinstance(kv, dict) or any(type(v) is not int for v in kv.values()):
            raise ValueError("known_versions must map slot to integer version")
        lease = Lease(slot=doc["slot"], task_id=doc["task_id"], version=doc["version"],
                      expires_ms=doc["expires_ms"], member_uuid=doc["member_uuid"],
                      known_versions={int(k): v for k, v in kv.items()},
                      serial=doc["serial"], nonce=doc["nonce"], served=served)
    except (ValueError, KeyError, TypeError, RecursionError) as e:  # JSON/Unicode errors are ValueErrors
        raise LeaseCorrupt(slot, str(e) or type(e).__name__) from None
    if lease.slot != slot:
        raise LeaseCorrupt(slot, f"body says slot {lease.slot}")
    return lease


def decode_state(body: bytes | None, slot: int) -> LeaseState:
    """A store read as a value: None (absent), Lease, or Corrupt."""
    if body is None:
        return None
    try:
        return decode(body, slot)
    except LeaseCorrupt as e:
        return Corrupt(slot, e.reason)


# --- decisions -------------------------------------------------------------------

def new_slot(slot: int, member_uuid: str, *, nonce: str) -> Lease:
    """The free lease a bootstrap creates: no holder, version 0, a fresh member_uuid."""
    return Lease(slot=slot, task_id=None, version=0, expires_ms=0, member_uuid=member_uuid,
                 nonce=nonce, served=0)


def is_free(lease: Lease, now_ms: int) -> bool:
    """Released (or never held), or expired: at `expires_ms` exactly the holder has lost it."""
    return lease.task_id is None or lease.expires_ms <= now_ms


def served_version(lease: Lease) -> int:
    """The last version whose holder may have written this member's rows (a body that does not
    record it: its own version, as if every holder had)."""
    return lease.version if lease.served is None else lease.served


def _takeable(state: LeaseState, now_ms: int) -> bool:
    # Absent: never bootstrapped, the caller creates it first. Corrupt: treated as expired.
    return state is None or isinstance(state, Corrupt) or is_free(state, now_ms)


def preemptable(state: LeaseState, now_ms: int, stamp: int) -> bool:
    """May a node whose data dir of this slot last served it at version `stamp`
    (node/identity/slot_dir.py last_served) take the slot from its holder now, before the lease
    expires? Only from a holder that has not served (it
    wrote none of the member's rows: `served` is older than its version), and only for the dir
    that last served (`stamp == served`): the member's rows are there, possibly some no other
    node has, and the holder has nothing to lose. Waiting instead stalled that data for as long
    as the holder kept renewing, forever when it could not join because the member whose data
    it waited for was the one that could have let it (a cluster restarted at once).

    The swap is safe by the store's compare-and-swap: the holder records `served` with one
    before it claims an lsn, so either that lands first (the slot is no longer preemptable,
    and the taker's swap fails on the changed object), or the taker's does and the holder's
    next write finds the slot taken and it stops, having served nothing. Another dir the holder
    took the slot into (`stamp` > `served`) holds no rows of the member and never preempts. A dir
    that served at `served`, took the slot again later and stopped before it served then (a crash
    while it waited for its peers) wrote no row since, and preempts too."""
    return (isinstance(state, Lease) and not is_free(state, now_ms) and state.served is not None
            and state.served < state.version and stamp == state.served)


def choose_slot(leases: list[LeaseState], now_ms: int, mine: Mapping[int, int] | None = None,
                served: Mapping[int, int] | None = None) -> int | None:
    """The first slot (in slot order) that is absent, free, expired or corrupt; None if all held.

    `leases[i]` is the state of slot i. `mine` maps slots to the version this node's own data
    for it last served under (node/identity/slot_dir.py): a slot no holder has served since that
    version (still at it, or held since only by nodes that never served: they wrote none of
    the member's rows) is current, and this node's data is that member's. Such a slot is the only one taken,
    once takeable or `preemptable` (while a holder that served holds it, that holder was this
    node's previous process, and its lease runs out within a lease duration): taking another
    would leave that member's data behind, and a whole cluster restarted at once could come
    back empty, every slot taken by a node without its data. `served` maps slots to the version
    this node's data last served at (slot_dir.last_served; without an entry, `mine`'s), the
    stamp `preemptable` compares."""
    mine, served = mine or {}, served or {}
    current = sorted(s for s, v in mine.items()
                     if 0 <= s < len(leases) and isinstance(leases[s], Lease)
                     and served_version(leases[s]) <= v <= leases[s].version)
    if current:
        return next((s for s in current
                     if _takeable(leases[s], now_ms) or preemptable(leases[s], now_ms, served.get(s, mine[s]))),
                    None)
    for slot, state in enumerate(leases):
        if _takeable(state, now_ms):
            return slot
    return None


def recover_version(leases: list[LeaseState], slot: int) -> int:
    """The highest version of `slot` recorded anywhere: its own lease or a holder's known_versions.

    Used when a slot's own object is corrupt, so the next holder still out-versions every
    version peers may have seen (fencing would otherwise refuse it)."""
    best = 0
    for state in leases:
        if isinstance(state, Lease):
            if state.slot == slot:
                best = max(best, state.version)
            best = max(best, state.known_versions.get(slot, 0))
    return best


def acquire(lease: Lease, task_id: str, now_ms: int, duration_ms: int, *, nonce: str,
            known_versions: Mapping[int, int] | None = None, stamp: int | None = None) -> Lease:
    """Take a free or expired slot, or a held one `preemptable` for a dir at `stamp`: version
    + 1, a new expiry, the same member_uuid. The slot's `served` stays until this holder serves
    (mark_served)."""
    assert is_free(lease, now_ms) or (stamp is not None and preemptable(lease, now_ms, stamp)), \
        f"slot {lease.slot} is held by {lease.task_id} until {lease.expires_ms}"
    _check_duration(duration_ms)
    version = lease.version + 1
    kv = dict(known_versions or {})
    kv[lease.slot] = version
    return Lease(slot=lease.slot, task_id=task_id, version=version,
                 expires_ms=now_ms + duration_ms, member_uuid=lease.member_uuid,
                 known_versions=kv, serial=lease.serial + 1, nonce=nonce, served=served_version(lease))


def renew(lease: Lease, now_ms: int, duration_ms: int, known_versions: Mapping[int, int],
          *, nonce: str, serving: bool = False) -> Lease:
    """Extend a held lease to now + duration; known_versions merge by max (versions only grow).
    `serving`: the holder is about to serve (claim lsns of the member): `served` becomes this
    version, so a data dir last served under an older one is stale from now on."""
    assert lease.task_id is not None, f"slot {lease.slot} is not held; nothing to renew"
    assert now_ms < renew_deadline(lease, duration_ms), "renewing past the deadline: the node should have stopped"
    _check_duration(duration_ms)
    kv = dict(lease.known_versions)
    for slot, version in known_versions.items():
        kv[slot] = max(kv.get(slot, 0), version)
    return Lease(slot=lease.slot, task_id=lease.task_id, version=lease.version,
                 expires_ms=now_ms + duration_ms, member_uuid=lease.member_uuid,
                 known_versions=kv, serial=lease.serial + 1, nonce=nonce,
                 served=lease.version if serving else lease.served)


def release(lease: Lease, *, nonce: str) -> Lease:
    """Give the slot back: no holder, expiry 0, version and member_uuid kept."""
    assert lease.task_id is not None, f"slot {lease.slot} is not held; nothing to release"
    return Lease(slot=lease.slot, task_id=None, version=lease.version, expires_ms=0,
                 member_uuid=lease.member_uuid, known_versions=lease.known_versions,
                 serial=lease.serial + 1, nonce=nonce, served=lease.served)


def needs_wait_for_peers(prev: LeaseState) -> bool:
    """True when the slot's previous holder did not release it (expired, preempted or corrupt).

    That holder may still be running with the old version (a zombie, or a holder that never
    served and has not yet read that it lost the slot); the new holder waits until peers have
    seen its new version (or `peer_wait_until_ms`: by then the old holder's deadline, at most a
    duration after its last renewal, has passed) before serving."""
    if prev is None:
        return False
    if isinstance(prev, Corrupt):
        return True
    return prev.task_id is not None


def peer_wait_until_ms(acquired_ms: int, duration_ms: int) -> int:
    """The longest a new holder waits for peers: by then any zombie's own deadline has passed."""
    return acquired_ms + duration_ms


def renew_interval_ms(duration_ms: int) -> int:
    return duration_ms // limits.lease_renew_divisor


def safety_margin_ms(duration_ms: int) -> int:
    return duration_ms // limits.lease_safety_margin_divisor


def retry_interval_ms(duration_ms: int) -> int:
    return max(1, duration_ms // limits.lease_retry_divisor)


def renew_deadline(lease: Lease, duration_ms: int) -> int:
    """The node stops serving if no renewal has succeeded by this time (ms)."""
    return lease.expires_ms - safety_margin_ms(duration_ms)


def next_renew_ms(lease: Lease, duration_ms: int, *, failed_at_ms: int | None = None) -> int:
    """When to try the next renewal: duration/3 after the last successful write, or a short
    retry after a failure; never later than the deadline."""
    deadline = renew_deadline(lease, duration_ms)
    if failed_at_ms is not None:
        return min(failed_at_ms + retry_interval_ms(duration_ms), deadline)
    written_ms = lease.expires_ms - duration_ms
    return min(written_ms + renew_interval_ms(duration_ms), deadline)


def check_fencing(seen_versions: Mapping[int, int], slot: int, version: int) -> bool:
    """May a peer claiming `slot` at `version` handshake? Not if we saw a newer version of the slot.
    `seen_versions` holds versions read from the lease store only: a peer's word fences nobody."""
    return version >= seen_versions.get(slot, 0)


def unverified_claims(seen_versions: Mapping[int, int], claims: Mapping[int, int]) -> dict[int, int]:
    """The slots a peer claims at versions newer than any read from the lease store: a reason to
    read the store again, never a fact to act on or to persist."""
    return {s: v for s, v in claims.items() if v > seen_versions.get(s, 0)}


def note_version(seen_versions: Mapping[int, int], slot: int, version: int) -> dict[int, int]:
    """`seen_versions` with `slot` raised to `version` (never lowered)."""
    out = dict(seen_versions)
    out[slot] = max(out.get(slot, 0), version)
    return out


def _check_duration(duration_ms: int) -> None:
    assert limits.lease_duration_ms_min <= duration_ms <= limits.lease_duration_ms_max, duration_ms
