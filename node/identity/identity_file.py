"""Crash-safe persistent identity of a member: `identity.temp` while registering, `identity` after.

After RocketMQ's persistent broker id (references/rocketmq-persistent-unique-broker-id.md): a new
node writes `identity.temp` (its uuid, the id it asks for, a fresh register code), applies to the
cluster, and on success switches to `identity`. Rules kept here:

- Every write is atomic: a hidden `.NAME.writing` file is written and fsynced, renamed over NAME,
  then the directory is fsynced. A reader sees the old file or the new one, never a mix.
- Every file carries a crc32 of its canonical body. An empty, truncated, garbled or mismatched file
  raises IdentityFileError naming the file. "No identity" is said only when the file does not
  exist, so a damaged disk never makes a member come back as a stranger with a new uuid.
- `identity` wins over `identity.temp`: both exist only after a crash inside commit_identity, and
  loading removes the leftover temp.
- An unknown apply outcome keeps the temp file and retries with the same register code (the
  server's apply is idempotent for uuid + code); only an explicit rejection starts over with a
  fresh code, and the new temp atomically replaces the rejected one.
- FAULT_POINT, when set, is called with the name of each crash point (FAULT_POINTS), so tests can
  kill the process exactly there.

RegistrationDecision and apply_registration are pure. The rest touches only files in the data
directory: no network, no clock (time and randomness come in as arguments)."""
from __future__ import annotations

import json
import math
import os
import random
import secrets
import uuid as uuid_mod
import zlib
from dataclasses import MISSING, dataclass, fields, replace
from enum import Enum
from pathlib import Path
from typing import Awaitable, Callable, MutableMapping, Union

from node.errors import RemoteProtocolError, ReplogError, StorageError
from node import limits
from node.limits import replica_id_max

IDENTITY_FILE = "identity"
PENDING_FILE = "identity.temp"
FORMAT_VERSION = 1
register_code_bytes = 16   # 128 random bits: two registrations never share a code by chance

FAULT_POINTS = (
    "after_temp_written",      # identity.temp is durable, nothing sent yet
    "after_apply_sent",        # fired by the transport once the apply request is on the wire
    "after_apply_ok",          # the server said ok; identity not yet written
    "after_identity_written",  # identity is durable; identity.temp still there
    "after_temp_removed",      # registration complete
)
FAULT_POINT: Callable[[str], None] | None = None


def fault_point(name: str) -> None:
    """Hand a crash point to the test hook; a no-op in production."""
    assert name in FAULT_POINTS, f"unknown fault point {name!r}"
    hook = FAULT_POINT
    if hook is not None:
        hook(name)


class IdentityFileError(StorageError):
    """An identity file is unreadable or cannot be written: the node must stop, never re-register."""

    def __init__(self, path: os.PathLike | str, reason: str):
        super().__init__(f"identity file {path}: {reason}")
        self.path = str(path)
        self.reason = reason


class RegistrationPending(ReplogError):
    """No definite answer to the apply; identity.temp is kept and the next start retries it."""


# --- values ------------------------------------------------------------------------------------

def _check_uuid(field: str, value: object) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a uuid string, not {value!r}")
    try:
        canonical = str(uuid_mod.UUID(value))
    except ValueError:
        raise ValueError(f"{field} is not a uuid: {value!r}") from None
    if canonical != value:
        raise ValueError(f"{field} is not in canonical form: {value!r}")


def _check_id(field: str, value: object, optional: bool) -> None:
    if value is None and optional:
        return
    if type(value) is not int or not 1 <= value <= replica_id_max:
        raise ValueError(f"{field} must be an int in 1..{replica_id_max}, not {value!r}")


def _check_code(value: object) -> None:
    if (not isinstance(value, str) or len(value) != 2 * register_code_bytes
            or value.strip("0123456789abcdef")):
        raise ValueError(f"register_code must be {2 * register_code_bytes} lowercase hex digits, not {value!r}")


def _check_time(value: object) -> None:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"created_s must be a finite non-negative number, not {value!r}")


@dataclass(frozen=True, slots=True)
class PendingRegistration:
    """The content of identity.temp: a registration that may or may not have been applied."""
    uuid: str
    requested_id: int | None      # None: "the lowest free id"
    register_code: str
    cluster_uuid: str
    created_s: float

    def __post_init__(self) -> None:
        _check_uuid("uuid", self.uuid)
        _check_id("requested_id", self.requested_id, optional=True)
        _check_code(self.register_code)
        _check_uuid("cluster_uuid", self.cluster_uuid)
        _check_time(self.created_s)

    def granted(self, replica_id: int) -> "Identity":
        return Identity(self.uuid, replica_id, self.register_code, self.cluster_uuid, self.created_s, active=False)


@dataclass(frozen=True, slots=True)
class Identity:
    """The content of identity: who this member is, for good. No address: addresses change."""
    uuid: str
    replica_id: int               # the id the registration granted
    register_code: str
    cluster_uuid: str
    created_s: float
    # the member has gone active (it may have written rows under its id). False between the
    # registration and the first activation: a store lost before that cannot have written
    # anything, so it re-joins without the own-rows fence (node/fence.py). A file from before
    # this field has none: it counts as active.
    active: bool = True

    def __post_init__(self) -> None:
        _check_uuid("uuid", self.uuid)
        _check_id("replica_id", self.replica_id, optional=False)
        if type(self.active) is not bool:
            raise ValueError("active is not a boolean")
        _check_code(self.register_code)
        _check_uuid("cluster_uuid", self.cluster_uuid)
        _check_time(self.created_s)


def new_register_code(rng: random.Random | None = None) -> str:
    """A fresh register code; pass a seeded rng for reproducible tests."""
    if rng is None:
        return secrets.token_hex(register_code_bytes)
    return f"{rng.getrandbits(8 * register_code_bytes):0{2 * register_code_bytes}x}"


def new_pending(uuid: str, cluster_uuid: str, requested_id: int | None, now_s: float,
                rng: random.Random | None = None) -> PendingRegistration:
    return PendingRegistration(uuid, requested_id, new_register_code(rng), cluster_uuid, now_s)


# --- encoding ----------------------------------------------------------------------------------

_KIND = {Identity: "identity", PendingRegistration: "pending"}


def _crc(body: dict) -> int:
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def _encode(value: Identity | PendingRegistration) -> bytes:
    body = {"format": FORMAT_VERSION, "kind": _KIND[type(value)]}
    body.update({f.name: getattr(value, f.name) for f in fields(value)})
    body["crc32"] = _crc(body)
    return (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()


def _decode(path: Path, cls: type) -> Identity | PendingRegistration | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise IdentityFileError(path, f"cannot read: {e.strerror or e}") from e
    if not raw.strip():
        raise IdentityFileError(path, "file is empty (a write cut short?); refusing to treat it as no identity")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IdentityFileError(path, f"not valid JSON, truncated or garbled ({e})") from None
    if not isinstance(doc, dict):
        raise IdentityFileError(path, "not a JSON object")
    crc = doc.pop("crc32", None)
    if type(crc) is not int:
        raise IdentityFileError(path, "checksum field crc32 is missing")
    if crc != _crc(doc):
        raise IdentityFileError(path, "checksum mismatch: the file is damaged")
    if doc.pop("format", None) != FORMAT_VERSION:
        raise IdentityFileError(path, f"not format {FORMAT_VERSION}, which this replog reads")
    kind = doc.pop("kind", None)
    if kind != _KIND[cls]:
        raise IdentityFileError(path, f"holds a {kind!r} record where a {_KIND[cls]!r} one belongs")
    expected = {f.name for f in fields(cls)}
    optional = {f.name for f in fields(cls) if f.default is not MISSING}
    if not expected - optional <= set(doc) <= expected:
        raise IdentityFileError(path, f"fields {sorted(doc)} are not {sorted(expected)}")
    try:
        return cls(**doc)
    except ValueError as e:
        raise IdentityFileError(path, f"invalid content: {e}") from None


# --- files -------------------------------------------------------------------------------------

def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(d: Path, name: str, data: bytes) -> None:
    final, tmp = d / name, d / f".{name}.writing"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        _fsync_dir(d)
    except OSError as e:
        raise IdentityFileError(final, f"cannot write: {e.strerror or e}") from e


def _unlink_durable(d: Path, name: str) -> None:
    try:
        os.unlink(d / name)
        _fsync_dir(d)
    except FileNotFoundError:
        return
    except OSError as e:
        raise IdentityFileError(d / name, f"cannot remove: {e.strerror or e}") from e


def load_identity(data_dir: os.PathLike | str) -> Identity | None:
    """The committed identity, or None when there is no identity file. A leftover identity.temp
    (crash inside commit_identity) is removed: the identity file wins."""
    d = Path(data_dir)
    identity = _decode(d / IDENTITY_FILE, Identity)
    if identity is not None and os.path.lexists(d / PENDING_FILE):
        _unlink_durable(d, PENDING_FILE)
    return identity


def load_pending(data_dir: os.PathLike | str) -> PendingRegistration | None:
    """The registration to resume, or None. None too when an identity exists (it wins)."""
    d = Path(data_dir)
    if load_identity(d) is not None:
        return None
    return _decode(d / PENDING_FILE, PendingRegistration)


def write_pending(data_dir: os.PathLike | str, pending: PendingRegistration) -> None:
    d = Path(data_dir)
    assert not os.path.lexists(d / IDENTITY_FILE), f"{d / IDENTITY_FILE} exists: a member never registers twice"
    _write_atomic(d, PENDING_FILE, _encode(pending))
    fault_point("after_temp_written")


def commit_identity(data_dir: os.PathLike | str, identity: Identity) -> None:
    """The atomic switch: identity becomes durable first, then identity.temp goes."""
    d = Path(data_dir)
    _write_atomic(d, IDENTITY_FILE, _encode(identity))
    fault_point("after_identity_written")
    _unlink_durable(d, PENDING_FILE)
    fault_point("after_temp_removed")


def mark_active(data_dir: os.PathLike | str) -> None:
    """The member goes active for the first time: from now on it may have written rows."""
    d = Path(data_dir)
    ident = load_identity(d)
    if ident is not None and not ident.active:
        _write_atomic(d, IDENTITY_FILE, _encode(replace(ident, active=True)))


def write_note(data_dir: os.PathLike | str, name: str, text: str) -> None:
    """A small file beside the identity, durable (file and directory) when this returns."""
    _write_atomic(Path(data_dir), name, text.encode())


def discard_pending(data_dir: os.PathLike | str) -> None:
    _unlink_durable(Path(data_dir), PENDING_FILE)


# --- the exchange (pure) -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ApplyOk:
    replica_id: int


@dataclass(frozen=True, slots=True)
class ApplyRejected:
    reason: str
    next_id: int | None = None    # the server's lowest free id, to ask for next time


@dataclass(frozen=True, slots=True)
class ApplyUnknown:
    reason: str                   # timeout, broken link: the apply may or may not have happened


ApplyAnswer = Union[ApplyOk, ApplyRejected, ApplyUnknown]


class RegistrationAction(Enum):
    COMMIT = "commit"              # write identity, remove identity.temp
    START_OVER = "start_over"      # write the new pending (fresh code) over identity.temp, apply it
    RETRY = "retry"                # apply the same pending again, same code


@dataclass(frozen=True, slots=True)
class RegistrationDecision:
    action: RegistrationAction
    pending: PendingRegistration   # what identity.temp holds for the next apply
    identity: Identity | None      # COMMIT only
    reason: str

    @classmethod
    def decide(cls, pending: PendingRegistration, answer: ApplyAnswer, fresh_code: str) -> "RegistrationDecision":
        """fresh_code is used only after an explicit rejection."""
        if isinstance(answer, ApplyOk):
            if pending.requested_id is not None and answer.replica_id != pending.requested_id:
                raise RemoteProtocolError(
                    f"apply for id {pending.requested_id} was answered ok with id {answer.replica_id}")
            return cls(RegistrationAction.COMMIT, pending, pending.granted(answer.replica_id),
                       f"granted id {answer.replica_id}")
        if isinstance(answer, ApplyRejected):
            assert fresh_code != pending.register_code, "a rejected register code must not be reused"
            nxt = PendingRegistration(pending.uuid, answer.next_id, fresh_code,
                                      pending.cluster_uuid, pending.created_s)
            return cls(RegistrationAction.START_OVER, nxt, None, f"rejected: {answer.reason}")
        if isinstance(answer, ApplyUnknown):
            return cls(RegistrationAction.RETRY, pending, None,
                       f"outcome unknown ({answer.reason}); retrying with the same register code")
        raise TypeError(f"not an apply answer: {answer!r}")


def apply_registration(registry: MutableMapping[str, tuple[int, str]], uuid: str,
                       requested_id: int | None, code: str,
                       lowest_free_id: int) -> tuple[str, int] | tuple[str, str]:
    """Server side of the apply, after RocketMQ's CASApplyBrokerId. registry maps uuid to
    (id, register code), expelled members included (their ids are never reused); it is updated
    in place on a new grant, and the caller persists it before answering.

    Same uuid and code again: the same ("ok", id), however often. Same uuid, other code:
    rejected. An id held by another uuid: rejected. One id never goes to two uuids."""
    known = registry.get(uuid)
    if known is not None:
        known_id, known_code = known
        if known_code != code:
            return ("rejected", f"uuid {uuid} is already registered as id {known_id} with another register code")
        if requested_id is not None and requested_id != known_id:
            return ("rejected", f"uuid {uuid} holds id {known_id}, not the requested {requested_id}")
        return ("ok", known_id)
    owners = {rid: owner for owner, (rid, _) in registry.items()}
    assert lowest_free_id >= 1 and lowest_free_id not in owners, \
        f"lowest_free_id {lowest_free_id} is taken by {owners.get(lowest_free_id)}"
    if requested_id is None:
        granted = lowest_free_id
    elif requested_id in owners:
        return ("rejected", f"id {requested_id} is taken by {owners[requested_id]}")
    else:
        granted = requested_id
    registry[uuid] = (granted, code)
    return ("ok", granted)


def apply_answer(result: tuple[str, int] | tuple[str, str], lowest_free_id: int) -> ApplyAnswer:
    """What the server sends back for an apply_registration result (a rejection names the next id)."""
    kind, value = result
    if kind == "ok":
        return ApplyOk(int(value))
    assert kind == "rejected", result
    return ApplyRejected(str(value), lowest_free_id)


# --- the online process ------------------------------------------------------------------------

async def register(data_dir: os.PathLike | str, apply: Callable[[PendingRegistration], Awaitable[ApplyAnswer]],
                   *, new_uuid: str, cluster_uuid: str, requested_id: int | None, now_s: float,
                   rng: random.Random | None = None) -> Identity:
    """Register this node, resuming whatever a crash left behind, in one written order:
    identity.temp durable → apply → identity durable → identity.temp removed.

    new_uuid is used only when there is nothing to resume. `apply` sends the request (calling
    fault_point("after_apply_sent") once it is on the wire) and maps a timeout or a broken link
    to ApplyUnknown; a peer that breaks the protocol raises RemoteProtocolError."""
    d = Path(data_dir)
    identity = load_identity(d)
    if identity is not None:
        return identity
    pending = load_pending(d)
    if pending is None:
        pending = new_pending(new_uuid, cluster_uuid, requested_id, now_s, rng)
        write_pending(d, pending)
    elif pending.cluster_uuid != cluster_uuid:
        raise IdentityFileError(d / PENDING_FILE, f"an unfinished registration with cluster {pending.cluster_uuid}, "
                                f"but the peers are cluster {cluster_uuid}; remove it only if the node really moved")
    reason = "no apply was made"
    for _ in range(limits.register_apply_attempts_max):
        answer = await apply(pending)
        decision = RegistrationDecision.decide(pending, answer, new_register_code(rng))
        reason = decision.reason
        if decision.action is RegistrationAction.COMMIT:
            assert decision.identity is not None
            fault_point("after_apply_ok")
            commit_identity(d, decision.identity)
            return decision.identity
        if decision.action is RegistrationAction.START_OVER:
            write_pending(d, decision.pending)
        pending = decision.pending
    raise RegistrationPending(f"registration of {pending.uuid} unfinished after "
                              f"{limits.register_apply_attempts_max} applies "
                              f"(last: {reason}); {d / PENDING_FILE} is kept for the next start")
