"""Lease manager: one node's lease identity, driven through a LeaseStore one blocking step at a time.

`bootstrap()` races to create every slot, `acquire()` takes the first free or expired one,
`renew()` extends it, `release()` gives it back. Decisions come from lease.py; this class
only reads, writes and reads back, and keeps the state between steps.

Rules it keeps:
- Every write is followed by a read of the object. The read-back gives the next CAS token
  and settles a write whose answer was lost (a retried PUT that gets 412 because its
  first attempt landed): the write is ours if the object carries our task_id and one of
  the nonces we wrote. A store's False is never taken as a loss on its own.
- A write that raised LeaseStoreUnavailable has an unknown outcome; its nonce is kept, so
  the next step's read-back recognises it if it landed.
- renew() refuses to write past the renewal deadline (LeaseLost): the node must already
  have stopped serving then.
- LeaseLost: the slot is not ours any more; stop serving. LeaseStoreUnavailable: the store
  did not answer; it propagates so the caller can retry until the deadline.
- Known versions (written with every renewal) come from reads of the store only, never from
  what a peer says.
- Steps block (boto3, flock) and are serialised by a lock; call them from one worker
  thread at a time (lease_runner does). Properties read without blocking.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
import uuid
from typing import Callable, Mapping

from node import limits
from node.errors import ConfigError
from node.identity import lease as core
from node.identity.lease import Corrupt, Lease, LeaseLost, LeaseState
from node.identity.lease_store import LeaseStore, LeaseStoreUnavailable

log = logging.getLogger("replog.identity.lease")



def wall_clock_ms() -> int:
    """Lease expiries are wall-clock times, compared across nodes."""
    return time.time_ns() // 1_000_000


def local_clock_ms() -> int:
    """This machine's clock that no one sets (it counts a suspend too): the holder's own deadline
    is kept by it as well, so a wall clock stepped back cannot stretch a lease."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1_000_000


class LeaseManager:
    def __init__(self, store: LeaseStore, cluster_size: int, task_id: str, duration_s: float,
                 clock: Callable[[], int] | None = None, rng: random.Random | None = None,
                 local_clock: Callable[[], int] | None = None):
        """`clock` returns wall-clock ms; `rng` makes member uuids and nonces (seed it
        differently per node, or leave it None for system randomness); `local_clock` returns
        ms of a clock nobody sets (local_clock_ms)."""
        if not 1 <= cluster_size <= limits.lease_cluster_size_max:
            raise ConfigError("cluster_size", f"{cluster_size} is not in 1..{limits.lease_cluster_size_max}")
        duration_ms = round(duration_s * 1000)
        if not limits.lease_duration_ms_min <= duration_ms <= limits.lease_duration_ms_max:
            raise ConfigError("lease_duration_s", f"{duration_s} is not in "
                              f"{limits.lease_duration_ms_min / 1000}..{limits.lease_duration_ms_max / 1000}")
        if not 0 < len(task_id) <= limits.lease_task_id_chars_max:
            raise ConfigError("task_id", f"must be 1..{limits.lease_task_id_chars_max} characters")
        self.store = store
        self.cluster_size = cluster_size
        self.task_id = task_id
        self.duration_ms = duration_ms
        self._clock = clock or wall_clock_ms
        self._local = local_clock or local_clock_ms
        # The renewal deadline by the local clock: taken before the store write that set it,
        # so it never comes later than the wall-clock one would for a clock nobody stepped.
        self._local_deadline_ms: int | None = None
        self._rng = rng or random.SystemRandom()
        self._lock = threading.Lock()            # one store step at a time
        self._kv_lock = threading.Lock()         # note_version may come from another thread
        self._lease: Lease | None = None
        self._token: str | None = None
        self._own_nonces: collections.deque[str] = collections.deque(maxlen=limits.lease_own_nonces_max)
        self._known_versions: dict[int, int] = {}
        self.renewals = 0
        self.renew_failures = 0
        self.corrupt_seen = 0
        self.last_corrupt: Corrupt | None = None
        self.wait_for_peers = False              # see lease.needs_wait_for_peers
        self.peer_wait_until_ms: int | None = None
        self.lost_reason: str | None = None

    # --- read-only view ----------------------------------------------------------
    @property
    def lease(self) -> Lease | None:
        return self._lease

    @property
    def slot(self) -> int | None:
        return self._lease.slot if self._lease else None

    @property
    def version(self) -> int | None:
        return self._lease.version if self._lease else None

    @property
    def expires_ms(self) -> int | None:
        return self._lease.expires_ms if self._lease else None

    @property
    def member_uuid(self) -> str | None:
        return self._lease.member_uuid if self._lease else None

    @property
    def renew_deadline_ms(self) -> int | None:
        return core.renew_deadline(self._lease, self.duration_ms) if self._lease else None

    @property
    def known_versions(self) -> dict[int, int]:
        return dict(self._known_versions)

    def now_ms(self) -> int:
        return self._clock()

    def holds_valid_lease(self) -> bool:
        """May the node serve under this identity right now? Both clocks must say its renewal
        deadline has not passed: the wall clock the store's expiry is written in, and the local
        one (a wall clock stepped back would otherwise let it serve past its expiry)."""
        lease = self._lease
        return lease is not None and self._clock() < core.renew_deadline(lease, self.duration_ms) \
            and (self._local_deadline_ms is None or self._local() < self._local_deadline_ms)

    def late_ms(self) -> int:
        """How far past its renewal deadline the held lease is, by the clock that says it is
        later (0 or less: not past)."""
        if self._lease is None:
            return 0
        late = self._clock() - core.renew_deadline(self._lease, self.duration_ms)
        if self._local_deadline_ms is not None:
            late = max(late, self._local() - self._local_deadline_ms)
        return late

    def _set_local_deadline(self, lease: Lease, wall_at_write: int, local_at_write: int) -> None:
        self._local_deadline_ms = local_at_write + core.renew_deadline(lease, self.duration_ms) - wall_at_write

    def next_renew_ms(self, *, failed_at_ms: int | None = None) -> int:
        assert self._lease is not None, "not holding a lease"
        return core.next_renew_ms(self._lease, self.duration_ms, failed_at_ms=failed_at_ms)

    def refresh(self) -> tuple[dict[int, int], str | None]:
        """Read every slot again (a peer claimed a version newer than any read so far): the
        versions now known, all read from the store; and why our lease is gone, or None.
        Does not change the held lease: the caller stops serving if it is gone, and the next
        renewal confirms it."""
        with self._lock:
            lost = None
            for slot in range(self.cluster_size):
                state, _ = self._read(slot)
                if isinstance(state, Lease):
                    self._learn(state)
                if self._lease is not None and slot == self._lease.slot and not self._ours(state):
                    lost = _describe(state)
            return self.known_versions, lost

    # --- steps -------------------------------------------------------------------
    def bootstrap(self) -> int:
        """Create every missing slot as a free lease with a fresh member_uuid; returns how many
        this call created. Concurrent bootstraps are safe: the first create of a slot wins."""
        created = 0
        with self._lock:
            for slot in range(self.cluster_size):
                body = core.encode(core.new_slot(slot, self._new_uuid(), nonce=self._new_nonce()))
                created += self.store.create_if_absent(slot, body)
        return created

    def acquire(self, mine: Mapping[int, int] | None = None, served: Mapping[int, int] | None = None) -> Lease | None:
        """Take the first free or expired slot; None when every slot is held. `mine`: the slots
        this node holds data of, and the version each last took the slot at; `served`: the
        version each last served at (lease.choose_slot: such a slot, if no holder served it
        since, is the one taken)."""
        with self._lock:
            assert self._lease is None, f"already holding slot {self._lease.slot}"
            self.lost_reason = None
            states, tokens = [], []
            for slot in range(self.cluster_size):
                state, token = self._read(slot)
                states.append(state)
                tokens.append(token)
            for state in states:
                if isinstance(state, Lease):
                    self._learn(state)
            now = self._clock()
            for state, token in zip(states, tokens):
                # An earlier acquire() that raised may have landed: the slot is ours already.
                if self._ours(state) and now < core.renew_deadline(state, self.duration_ms):
                    # written before this call began: counted from now by the local clock, the
                    # deadline could only come later than the write's; the wall clock's bounds it
                    self._local_deadline_ms = None
                    return self._hold(state, token, wait_for_peers=True, now_ms=now)
            for _ in range(2 * self.cluster_size + 2):   # each failed try means another node won a slot
                now, local = self._clock(), self._local()
                slot = core.choose_slot(states, now, mine, served)
                if slot is None:
                    return None
                prev = states[slot]
                if prev is None:   # never bootstrapped: create it free, then compete for it
                    body = core.encode(core.new_slot(slot, self._new_uuid(), nonce=self._new_nonce()))
                    self.store.create_if_absent(slot, body)
                    states[slot], tokens[slot] = self._read(slot)
                    continue
                if isinstance(prev, Corrupt):
                    # Its member_uuid is gone; keep fencing sound with the highest version on record.
                    base = Lease(slot=slot, task_id=None, version=core.recover_version(states, slot),
                                 expires_ms=0, member_uuid=self._new_uuid())
                    log.warning("lease slot %d is corrupt (%s); taking it over as a new member %s",
                                slot, prev.reason, base.member_uuid)
                else:
                    base = prev
                    if not core.is_free(prev, now):
                        log.warning("lease slot %d is held by %s at version %d, which has not served it; this "
                                    "node's data is the member's as last served (version %d): taking the slot "
                                    "over (node/identity/lease.py preemptable)", slot, prev.task_id, prev.version,
                                    prev.served)
                new = core.acquire(base, self.task_id, now, self.duration_ms, nonce=self._new_nonce(),
                                   known_versions=self._known_versions,
                                   stamp=(served or {}).get(slot, (mine or {}).get(slot)))
                self._own_nonces.append(new.nonce)
                self.store.compare_and_swap(slot, core.encode(new), tokens[slot])
                states[slot], tokens[slot] = self._read(slot)   # settles a lost answer
                if self._ours(states[slot]):
                    self._set_local_deadline(states[slot], now, local)
                    return self._hold(states[slot], tokens[slot],
                                      wait_for_peers=core.needs_wait_for_peers(prev), now_ms=now)
            return None

    def renew(self, serving: bool = False) -> Lease:
        """Extend the held lease. LeaseLost if the slot is not ours or the deadline passed.
        `serving`: record that this holder serves from now on (lease.renew)."""
        with self._lock:
            if self._lease is None and self.lost_reason is not None:
                raise LeaseLost(None, self.lost_reason)   # lost by another step meanwhile
            assert self._lease is not None, "renew() without a lease"
            for _ in range(limits.lease_renew_writes_max):
                lease = self._lease
                now, local = self._clock(), self._local()
                deadline = core.renew_deadline(lease, self.duration_ms)
                if now >= deadline or (self._local_deadline_ms is not None and local >= self._local_deadline_ms):
                    self.renew_failures += 1
                    by = "the wall clock" if now >= deadline else "the local clock (the wall clock was stepped back)"
                    self._lose(f"renewal deadline passed {self.late_ms()} ms ago by {by} without a successful renewal")
                new = core.renew(lease, now, self.duration_ms, self._known_versions,
                                 nonce=self._new_nonce(), serving=serving)
                self._own_nonces.append(new.nonce)
                try:
                    self.store.compare_and_swap(lease.slot, core.encode(new), self._token)
                    state, token = self._read(lease.slot)
                except LeaseStoreUnavailable:
                    self.renew_failures += 1
                    raise
                if not self._ours(state):
                    self.renew_failures += 1
                    self._lose(_describe(state))
                self._lease, self._token = state, token
                if state.nonce == new.nonce:
                    self.renewals += 1
                    self._set_local_deadline(state, now, local)
                    return state
                # The object holds an earlier write of ours (one whose answer we never got,
                # or our lease unchanged after a 409): retry from it with the fresh token.
            self.renew_failures += 1
            raise LeaseStoreUnavailable(f"lease store {self.store.url}: renewal of slot {lease.slot} "
                                        f"did not land in {limits.lease_renew_writes_max} writes")

    def release(self) -> bool:
        """Give the slot back (orderly shutdown). False if it was not ours any more."""
        with self._lock:
            if self._lease is None:
                return False
            for _ in range(limits.lease_renew_writes_max):
                lease = self._lease
                new = core.release(lease, nonce=self._new_nonce())
                self._own_nonces.append(new.nonce)
                self.store.compare_and_swap(lease.slot, core.encode(new), self._token)
                state, token = self._read(lease.slot)
                if (isinstance(state, Lease) and state.task_id is None
                        and state.nonce in self._own_nonces):   # this write, or an earlier one that landed
                    log.info("lease slot %d released at version %d", lease.slot, lease.version)
                    self._lease = self._token = None
                    return True
                if not self._ours(state):
                    log.warning("lease slot %d was no longer ours at release: %s", lease.slot, _describe(state))
                    self._lease = self._token = None
                    return False
                self._lease, self._token = state, token
            raise LeaseStoreUnavailable(f"lease store {self.store.url}: release of slot {lease.slot} "
                                        f"did not land in {limits.lease_renew_writes_max} writes")

    # --- helpers -------------------------------------------------------------------
    def _read(self, slot: int) -> tuple[LeaseState, str | None]:
        body, token = self.store.read(slot)
        state = core.decode_state(body, slot)
        if isinstance(state, Corrupt):
            # The store's data is at fault: report it, treat the slot as expired, keep going.
            self.corrupt_seen += 1
            self.last_corrupt = state
            log.warning("lease store %s: slot %d is corrupt (%s); treating it as expired",
                        self.store.url, slot, state.reason)
        return state, token

    def _ours(self, state: LeaseState) -> bool:
        # task_id alone is not enough: a restarted task may reuse it; nonces are per write.
        return (isinstance(state, Lease) and state.task_id == self.task_id
                and state.nonce in self._own_nonces)

    def _learn(self, lease: Lease) -> None:
        with self._kv_lock:
            kv = self._known_versions
            for slot, version in [(lease.slot, lease.version), *lease.known_versions.items()]:
                kv = core.note_version(kv, slot, version)
            self._known_versions = kv

    def _hold(self, lease: Lease, token: str | None, *, wait_for_peers: bool, now_ms: int) -> Lease:
        self._lease, self._token = lease, token
        self._learn(lease)
        self.wait_for_peers = wait_for_peers
        self.peer_wait_until_ms = core.peer_wait_until_ms(now_ms, self.duration_ms) if wait_for_peers else None
        log.info("lease slot %d acquired by %s at version %d (member %s)%s", lease.slot, self.task_id,
                 lease.version, lease.member_uuid, "; previous holder did not release" if wait_for_peers else "")
        return lease

    def _lose(self, reason: str) -> None:
        slot = self._lease.slot if self._lease else None
        self._lease = self._token = None
        self.lost_reason = reason
        log.error("lease slot %s lost: %s", slot, reason)
        raise LeaseLost(slot, reason)

    def _new_nonce(self) -> str:
        return f"{self._rng.getrandbits(128):032x}"

    def _new_uuid(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))


def _describe(state: LeaseState) -> str:
    if state is None:
        return "the lease object is gone"
    if isinstance(state, Corrupt):
        return f"the lease object is corrupt ({state.reason})"
    if state.task_id is None:
        return f"the slot was released by another writer (version {state.version})"
    return f"the slot is held by {state.task_id} at version {state.version}"
