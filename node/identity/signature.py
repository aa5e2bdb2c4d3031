"""Qpid's cluster join rules, pure: store signatures, option consistency, initialization, joining,
and the comparison behind `replog admin compare` (references/qpid-cluster-join-protocol.txt).

Rules kept here:
- The initial signature is set when a store is created and never changes: stores with equal
  initial signatures belong to one cluster. The final signature is written to every store by an
  orderly cluster shutdown, which also marks the store clean; clean stores with equal final
  signatures hold the same data.
- Initialization looks at every initial member's status and decides the same thing on every
  member (each decides alone from the same statuses): all empty or transient → all go active, a
  new initial signature is set; otherwise every store must share one initial signature, every
  clean store one final signature, and at least one store must be clean; members without a clean
  store catch up from one that has it.
- Must-match options are compared by digest; first_mismatch names the option when both sides are
  at hand.
- Stores are ordered by their vclock keyed by member uuid (local ids mean nothing across nodes).
  Concurrent stores are reported as such and never ordered.
No IO, no clock: time and identities come in as arguments."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from enum import Enum
from itertools import combinations
from typing import Any, Iterable, Mapping, NamedTuple

from node.core.vclock import Order, VClock

MUST_MATCH_OPTIONS = (
    "cluster_name",        # one cluster, one name: a node pointed at another cluster must fail
    "identity",            # local and lease identities cannot share one _cluster sanely
    "cluster_size",        # lease slots: two sizes would hand one slot to two nodes
    "lease_store",         # fencing works only when every node leases from the same store
    "lease_duration_s",    # expiry is judged by every node; they must agree on it
)
NO_CLEAN_STORE = "Cannot recover, no clean store"
NO_CLEAN_STORE_HINT = ("run `replog admin compare DIR...` over every member's data dir, then "
                       "`replog admin mark-clean DIR` on the latest store, and restart the cluster")


class StoreStatus(Enum):
    EMPTY = "empty"           # a store with no data and no signature yet
    CLEAN = "clean"           # closed by an orderly cluster shutdown: safe to restart from
    DIRTY = "dirty"           # anything else: a crash, or a shutdown of this node alone
    TRANSIENT = "transient"   # no store at all


@dataclass(frozen=True, slots=True)
class InitialSignature:
    cluster_uuid: str
    created_s: float
    founders: tuple[str, ...]     # uuids of the initial members, sorted

    def __post_init__(self) -> None:
        founders = tuple(sorted(self.founders))
        if not founders or len(set(founders)) != len(founders):
            raise ValueError(f"founders must be distinct uuids, at least one: {founders!r}")
        object.__setattr__(self, "founders", founders)

    def __str__(self) -> str:
        return f"cluster {self.cluster_uuid} (created_s {self.created_s}, {len(self.founders)} founders)"


@dataclass(frozen=True, slots=True)
class FinalSignature:
    vclock_by_uuid: dict[str, int]
    shutdown_id: str

    def __post_init__(self) -> None:
        clock = dict(sorted(self.vclock_by_uuid.items()))
        if any(type(lsn) is not int or lsn < 0 for lsn in clock.values()):
            raise ValueError(f"vclock_by_uuid holds a non-lsn: {clock!r}")
        object.__setattr__(self, "vclock_by_uuid", clock)

    def key(self) -> tuple:
        return (self.shutdown_id, tuple(self.vclock_by_uuid.items()))

    def __hash__(self) -> int:
        return hash(self.key())


@dataclass(frozen=True, slots=True)
class MemberStatus:
    uuid: str
    status: StoreStatus
    initial: InitialSignature | None
    final: FinalSignature | None
    options_digest: str
    # (cluster_uuid, created_s) this member would found a new cluster with; the proposal of the
    # smallest uuid wins, so every member sets the same initial signature.
    proposal: tuple[str, float] | None = None

    def __post_init__(self) -> None:
        if self.status in (StoreStatus.EMPTY, StoreStatus.TRANSIENT):
            if self.initial is not None or self.final is not None:
                raise ValueError(f"{self.uuid}: a {self.status.value} store carries no signature")
        elif self.initial is None:
            raise ValueError(f"{self.uuid}: a {self.status.value} store has an initial signature")
        if self.status is StoreStatus.CLEAN and self.final is None:
            raise ValueError(f"{self.uuid}: a clean store has a final signature")


def _canonical(value: object) -> object:
    # 15 and 15.0 are one option value; json would spell them apart
    return int(value) if isinstance(value, float) and value.is_integer() else value


def must_match_options(options: Mapping[str, object]) -> dict[str, object]:
    return {name: _canonical(options.get(name)) for name in MUST_MATCH_OPTIONS}


def options_digest(options: Mapping[str, object]) -> str:
    """A stable hash of the must-match options (other keys are ignored; absent ones are None)."""
    text = json.dumps(must_match_options(options), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def first_mismatch(a: Mapping[str, object], b: Mapping[str, object]) -> str | None:
    ma, mb = must_match_options(a), must_match_options(b)
    return next((name for name in MUST_MATCH_OPTIONS if ma[name] != mb[name]), None)


# --- initialization ----------------------------------------------------------------------------

class Outcome(Enum):
    WAIT = "wait"              # fewer than wait_for initial members so far
    ACTIVATE = "activate"      # every member goes active now
    CATCH_UP = "catch_up"      # clean-store members go active; the rest take an update first
    ABORT = "abort"            # nobody goes active; the message says why


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    code: str = ""                              # options_mismatch, different_clusters, ...
    message: str = ""
    hint: str = ""
    initial: InitialSignature | None = None     # the cluster's initial signature
    active: tuple[str, ...] = ()                # go active now
    set_initial: tuple[str, ...] = ()           # write `initial` into their (empty) store
    sources: tuple[str, ...] = ()               # clean-store members that send updates
    catch_up: tuple[tuple[str, str], ...] = ()  # (member, source it takes its update from)

    def source_for(self, uuid: str) -> str | None:
        return next((src for member, src in self.catch_up if member == uuid), None)


def _abort(code: str, message: str, hint: str = "") -> Decision:
    return Decision(Outcome.ABORT, code, message, hint)


def _group(items: Iterable, key, name=lambda m: m.uuid) -> dict:
    """{key: [names]} in first-seen order."""
    groups: dict = {}
    for item in items:
        groups.setdefault(key(item), []).append(name(item))
    return groups


def decide_initialization(members: list[MemberStatus], wait_for: int = 1) -> Decision:
    uuids = sorted(m.uuid for m in members)
    if len(set(uuids)) != len(uuids):
        raise ValueError(f"a member is listed twice: {uuids}")
    if len(members) < wait_for:
        return Decision(Outcome.WAIT, message=f"waiting for {wait_for} initial members, {len(members)} so far")
    digests = _group(members, lambda m: m.options_digest)
    if len(digests) > 1:
        parts = "; ".join(f"{', '.join(sorted(u))} have {d}" for d, u in sorted(digests.items()))
        return _abort("options_mismatch", f"must-match options differ: {parts}",
                      f"make {', '.join(MUST_MATCH_OPTIONS)} equal on every member")
    by_status = {s: sorted(m.uuid for m in members if m.status is s) for s in StoreStatus}
    clean, dirty, empty = by_status[StoreStatus.CLEAN], by_status[StoreStatus.DIRTY], by_status[StoreStatus.EMPTY]
    stored = [m for m in members if m.status in (StoreStatus.CLEAN, StoreStatus.DIRTY)]

    if not stored:  # T + E = I: a new cluster
        proposals = sorted((m.uuid, m.proposal) for m in members if m.proposal is not None)
        if not proposals:
            raise ValueError("no member proposed an initial signature for the new cluster")
        cluster_uuid, created_s = proposals[0][1]
        initial = InitialSignature(cluster_uuid, created_s, tuple(uuids))
        return Decision(Outcome.ACTIVATE, initial=initial, active=tuple(uuids), set_initial=tuple(empty))

    initials = _group(stored, lambda m: m.initial)
    if len(initials) > 1:
        parts = "; ".join(f"{sig}: {', '.join(sorted(u))}" for sig, u in initials.items())
        return _abort("different_clusters", f"stores belong to different clusters: {parts}",
                      "start each member with a store of this cluster, or an empty data dir")
    (initial,) = initials
    finals = _group((m for m in stored if m.status is StoreStatus.CLEAN), lambda m: m.final)
    if len(finals) > 1:
        parts = "; ".join(f"shutdown {f.shutdown_id}: {', '.join(sorted(u))}" for f, u in finals.items())
        return _abort("different_shutdowns", f"clean stores from different shutdowns: {parts}", NO_CLEAN_STORE_HINT)
    if not clean:
        return _abort("no_clean_store", NO_CLEAN_STORE, NO_CLEAN_STORE_HINT)
    behind = sorted(dirty + empty + by_status[StoreStatus.TRANSIENT])
    # spread the updates over the sources, the same way on every member
    pairs = tuple((member, clean[i % len(clean)]) for i, member in enumerate(behind))
    return Decision(Outcome.CATCH_UP, initial=initial, active=tuple(clean), set_initial=tuple(empty),
                    sources=tuple(clean), catch_up=pairs)


# --- joining an active cluster -----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class JoinDecision:
    update: bool               # True: take an update from an active member; False: abort
    set_initial: bool = False  # write the cluster's initial signature into the (empty) store
    code: str = ""
    message: str = ""


def decide_join(active_initial: InitialSignature, joiner_status: StoreStatus,
                joiner_initial: InitialSignature | None) -> JoinDecision:
    if joiner_status in (StoreStatus.EMPTY, StoreStatus.TRANSIENT):
        if joiner_initial is not None:
            raise ValueError(f"a {joiner_status.value} store carries no initial signature")
        return JoinDecision(True, set_initial=joiner_status is StoreStatus.EMPTY)
    if joiner_initial is None:
        raise ValueError(f"a {joiner_status.value} store has an initial signature")
    if joiner_initial == active_initial:
        return JoinDecision(True)
    return JoinDecision(False, code="wrong_store",
                        message=f"wrong store: it belongs to {joiner_initial}, the active cluster is "
                                f"{active_initial}; start with an empty data dir or the right store")


# --- manual recovery ---------------------------------------------------------------------------

class StoreInfo(NamedTuple):
    name: str
    initial: InitialSignature | None
    final: FinalSignature | None
    vclock_by_uuid: Mapping[str, int]


def compare_vclocks_by_uuid(a: Mapping[str, int], b: Mapping[str, int]) -> Order:
    index = {u: i for i, u in enumerate(sorted(set(a) | set(b)), start=1)}
    return VClock({index[u]: n for u, n in a.items()}).compare(VClock({index[u]: n for u, n in b.items()}))


@dataclass(frozen=True, slots=True)
class StoreComparison:
    same_cluster: bool
    clusters: tuple[tuple[InitialSignature | None, tuple[str, ...]], ...]
    relations: tuple[tuple[str, str, Order], ...]   # each pair of stores of one cluster
    latest: tuple[str, ...]      # equal stores at or after every other; () when there is none
    maximal: tuple[str, ...]     # stores no other store is after
    concurrent: tuple[tuple[str, str], ...]
    summary: str


def compare_stores(stores: Iterable[StoreInfo | tuple]) -> StoreComparison:
    infos = [StoreInfo(*s) for s in stores]
    names = [s.name for s in infos]
    if not infos or len(set(names)) != len(names):
        raise ValueError(f"compare needs distinct store names, at least one: {names}")
    groups = _group(infos, lambda s: s.initial, lambda s: s.name)
    clusters = tuple((sig, tuple(n)) for sig, n in groups.items())
    same = len(groups) == 1 and infos[0].initial is not None
    relations = []
    for _, group in clusters:
        members = [s for s in infos if s.name in group]
        for a, b in combinations(members, 2):
            relations.append((a.name, b.name, compare_vclocks_by_uuid(a.vclock_by_uuid, b.vclock_by_uuid)))
    concurrent = tuple((a, b) for a, b, o in relations if o is Order.CONCURRENT)
    if not same:
        parts = "; ".join(f"{sig or 'no store'}: {', '.join(n)}" for sig, n in clusters)
        return StoreComparison(False, clusters, tuple(relations), (), (), concurrent,
                               f"stores belong to different clusters: {parts}")

    def order(a: str, b: str) -> Order:
        if a == b:
            return Order.EQUAL
        for x, y, o in relations:
            if (x, y) == (a, b):
                return o
            if (x, y) == (b, a):
                return {Order.BEFORE: Order.AFTER, Order.AFTER: Order.BEFORE}.get(o, o)
        raise AssertionError(f"no relation between {a} and {b}")

    latest = tuple(a for a in names if all(order(a, b) in (Order.AFTER, Order.EQUAL) for b in names))
    maximal = tuple(a for a in names if not any(order(b, a) is Order.AFTER for b in names))
    if latest:
        summary = (f"same {infos[0].initial}; latest: {', '.join(latest)}; to recover, "
                   f"`replog admin mark-clean` {latest[0]} and restart the cluster")
    else:
        pairs = ", ".join(f"{a} and {b}" for a, b in concurrent if a in maximal and b in maximal)
        summary = (f"same {infos[0].initial}; no single latest store: {pairs} are concurrent (each holds "
                   f"rows the other lacks); marking one clean loses the other's rows")
    return StoreComparison(True, clusters, tuple(relations), latest, maximal, concurrent, summary)


# --- signatures in a store's `_meta` and in greetings (msgpack/JSON-able dicts) ------------------

def initial_to_wire(s: InitialSignature | None) -> dict | None:
    return None if s is None else {"cluster_uuid": s.cluster_uuid, "created_s": s.created_s,
                                   "founders": list(s.founders)}


def initial_from_wire(d: Any) -> InitialSignature | None:
    if not isinstance(d, dict):
        return None
    try:
        return InitialSignature(str(d["cluster_uuid"]), float(d["created_s"]),
                                tuple(str(f) for f in d["founders"]))
    except (KeyError, TypeError, ValueError):
        return None


def final_to_wire(f: FinalSignature | None) -> dict | None:
    return None if f is None else {"vclock_by_uuid": dict(f.vclock_by_uuid), "shutdown_id": f.shutdown_id}


def final_from_wire(d: Any) -> FinalSignature | None:
    if not isinstance(d, dict) or not isinstance(d.get("shutdown_id"), str) \
            or not isinstance(d.get("vclock_by_uuid"), dict):
        return None
    try:
        return FinalSignature({str(u): n for u, n in d["vclock_by_uuid"].items() if n}, d["shutdown_id"])
    except (TypeError, ValueError):
        return None


def stored_status(meta_get, *, transient: bool = False) -> tuple[StoreStatus, InitialSignature | None,
                                                                  FinalSignature | None]:
    """(status, initial, final) of a store from its `_meta` (meta_get: key -> value)."""
    if meta_get("uuid") is None or meta_get("cluster_uuid") is None:
        return (StoreStatus.TRANSIENT if transient else StoreStatus.EMPTY), None, None
    initial = initial_from_wire(meta_get("initial_signature"))
    if initial is None:   # a store created before signatures were kept: derive one from its facts
        founders = tuple(meta_get("founders") or ()) or (str(meta_get("cluster_uuid")),)
        initial = InitialSignature(str(meta_get("cluster_uuid")), float(meta_get("created_s") or 0.0), founders)
    final = final_from_wire(meta_get("final_signature"))
    if meta_get("store_status") == StoreStatus.CLEAN.value and final is not None:
        return StoreStatus.CLEAN, initial, final
    return StoreStatus.DIRTY, initial, final


def member_status_from_greeting(g: dict) -> MemberStatus | None:
    st = g.get("store")
    if not isinstance(st, dict):
        return None
    try:
        status = StoreStatus(st.get("status"))
        proposal = st.get("proposal")
        if proposal is not None:
            proposal = (str(proposal[0]), float(proposal[1]))
        return MemberStatus(g["uuid"], status, initial_from_wire(st.get("initial")),
                            final_from_wire(st.get("final")) if status is StoreStatus.CLEAN else None,
                            str(g.get("options_digest")), proposal)
    except (ValueError, TypeError, IndexError, KeyError):
        return None
