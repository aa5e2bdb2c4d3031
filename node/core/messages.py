"""Replication wire messages: one msgpack `[type, body]` per WebSocket binary message.

Pure encoding and validation: `decode()` turns any bytes into a Message or raises
RemoteProtocolError — nothing else — so a peer sending garbage only drops its link.

Conversation (client = the subscribing node, server = the relay; node/core/session.py):
  S: HELLO {version, versions, nonce, uuid}         nothing else before auth succeeds, and
  C: AUTH {nonce, uuid, mac, version}               nothing longer than preauth_message_bytes_max
  S: AUTH_OK {mac}                                  mac = proofs over the transcript (both nonces,
                                                    both uuids); every message from here on is
                                                    sealed: its bytes + a tag under the session key
  C: GREETING {...}     S: GREETING {...} | ERROR   uuid (= the authenticated one), cluster,
                                                    options digest, whole _cluster
  C: JOIN {code, id} | FETCH_SNAPSHOT | REGISTER {code, id} | SHUTDOWN | BYE
     | SUBSCRIBE {vclock, durable, own_rows,       (durable: on disk, holds the WAL; own_rows: a
                  without}                          fenced subscriber wants its own rows back too;
                                                    without: members whose collected rows it goes
                                                    without, node/core/link/relay.py)
  S: REGISTERED {id} | ERROR register_rejected      (JOIN, REGISTER; node/lifecycle.py)
  S: SNAPSHOT {meta} SNAPSHOT_ROWS* SNAPSHOT_END   (JOIN, FETCH_SNAPSHOT)
  S: SUBSCRIBED {vclock}  then ROWS {frames} / HEARTBEAT   (SUBSCRIBE)
  C: ACK {vclock, durable}                          in the relay's ids: applied, and on disk
                                                    (durable holds the relay's WAL; an older
                                                    peer sends vclock alone)
  S: SHUTDOWN_OK {status, ...} | ERROR              (SHUTDOWN {phase, shutdown_id, final?}: one
                                                    step of an orderly cluster shutdown)
Vclocks on the wire are maps {id: lsn} in the *receiver's* id space.

ROWS carries WAL frame payloads inline: {"frames": [[written_us, [txn, ...]], ...]}. A payload
is already that msgpack, so the relay splices WAL bytes without re-encoding them
(`rows_parts`), and `decode` reads a whole ROWS message into validated Txns in one call:
its body is {"txns": [Txn, ...] up to the first bad one, "error": that RemoteProtocolError or None},
or, for an applier that passes a scanner, {"scan": ...} (node.core.rowscan: no Txn per row)."""
from __future__ import annotations

from typing import Any, Callable, Literal

import msgpack
import msgspec

from node import limits
from node.core import codec, validate, validate_msgs
from node.core.rows import FAST_ERRORS, WIRE_FRAME, Txn, check_fast, exact_frame, no_ext
from node.errors import RemoteProtocolError

# Protocol versions this node speaks, oldest first (docs/upgrade.md): a node of version N talks to
# one of N-1, so a cluster can be upgraded one node at a time.
#   2: session-bound auth (uuids in HELLO/AUTH, sealed messages)
#   3: version negotiation: HELLO carries `versions` [lowest, highest] beside `version` (its lowest,
#      which a version-2 applier compares exactly), AUTH the `version` the applier chose (absent: a
#      version-2 applier, which speaks HELLO's `version`). Nothing else changed.
PROTOCOL_VERSION = 3                 # the highest version this node speaks
PROTOCOL_VERSION_MIN = 2             # the lowest; a peer outside [MIN, VERSION] is refused, naming both

HELLO, AUTH, AUTH_OK, GREETING, ERROR = 1, 2, 3, 4, 5
JOIN, FETCH_SNAPSHOT, SUBSCRIBE, REGISTER, BYE, SHUTDOWN = 10, 11, 12, 13, 14, 15
SNAPSHOT, SNAPSHOT_ROWS, SNAPSHOT_END, SUBSCRIBED, REGISTERED, SHUTDOWN_OK = 20, 21, 22, 23, 24, 25
ROWS, ACK, HEARTBEAT = 30, 31, 32

NAMES = {
    HELLO: "HELLO", AUTH: "AUTH", AUTH_OK: "AUTH_OK", GREETING: "GREETING", ERROR: "ERROR",
    JOIN: "JOIN", FETCH_SNAPSHOT: "FETCH_SNAPSHOT", SUBSCRIBE: "SUBSCRIBE", REGISTER: "REGISTER",
    BYE: "BYE", SHUTDOWN: "SHUTDOWN", SHUTDOWN_OK: "SHUTDOWN_OK", SNAPSHOT: "SNAPSHOT", SNAPSHOT_ROWS: "SNAPSHOT_ROWS", SNAPSHOT_END: "SNAPSHOT_END",
    SUBSCRIBED: "SUBSCRIBED", REGISTERED: "REGISTERED", ROWS: "ROWS", ACK: "ACK", HEARTBEAT: "HEARTBEAT",
}

# Body schema: field -> accepted python types. Extra fields are ignored (forward compatible).
# HELLO's uuid is read after its version is compared (a peer of another version is told so).
_STR, _INT, _BYTES, _BOOL = (str,), (int,), (bytes,), (bool,)
_OPT_STR = (str, type(None))
SCHEMA: dict[int, dict[str, tuple]] = {
    HELLO: {"version": _INT, "nonce": _BYTES},
    AUTH: {"nonce": _BYTES, "uuid": _STR, "mac": _BYTES},
    AUTH_OK: {"mac": _BYTES},
    GREETING: {"uuid": _STR, "cluster_uuid": _OPT_STR, "cluster_name": _STR, "options_digest": _STR,
               "anon": _BOOL, "address": _STR, "cluster": (list,), "status": _STR},
    ERROR: {"code": _STR, "message": _STR},
    JOIN: {},
    FETCH_SNAPSHOT: {},
    SUBSCRIBE: {"vclock": (dict,)},
    REGISTER: {},
    BYE: {},
    SHUTDOWN: {"phase": _STR, "shutdown_id": _STR},
    SNAPSHOT: {"vclock": (dict,), "cluster": (list,), "spaces": (dict,)},
    SNAPSHOT_ROWS: {"space": _STR, "rows": (list,)},
    SNAPSHOT_END: {},
    SUBSCRIBED: {"vclock": (dict,)},
    REGISTERED: {"id": _INT},
    SHUTDOWN_OK: {"status": _STR},
    ROWS: {"frames": (list,)},
    ACK: {"vclock": (dict,)},
    HEARTBEAT: {"now_us": _INT},
}


class Message(msgspec.Struct, frozen=True):
    type: int
    body: dict[str, Any]

    @property
    def name(self) -> str:
        return NAMES.get(self.type, str(self.type))

    def __getitem__(self, k: str) -> Any:
        return self.body[k]

    def get(self, k: str, default: Any = None) -> Any:
        return self.body.get(k, default)


_packer = msgpack.Packer(use_bin_type=True)


def encode(mtype: int, **body: Any) -> bytes:
    return encode_body(mtype, body)


def encode_body(mtype: int, body: dict[str, Any]) -> bytes:
    """encode() of a body already built as a dict (no copy of it as keyword arguments)."""
    assert mtype in SCHEMA, mtype
    return _packer.pack([mtype, body])


def rows_parts(frames: list[bytes]) -> list[bytes]:
    """A ROWS message of these frame payloads (node.wal.format) as the pieces that, joined,
    make it: the frames are spliced in as they are."""
    return [_ROWS_HEAD + codec.array_head(len(frames)), *frames]


def encode_rows(frames: list[bytes]) -> bytes:
    return b"".join(rows_parts(frames))


class _RowsBody(msgspec.Struct):
    frames: list[WIRE_FRAME]


_ROWS_HEAD = b"\x92" + _packer.pack(ROWS) + b"\x81" + _packer.pack("frames")
_ROWS_TYPE = _ROWS_HEAD[:2]      # [ROWS, ...: the fast path's first guess
_fast_rows = msgspec.msgpack.Decoder(tuple[Literal[ROWS], _RowsBody], ext_hook=no_ext).decode


def _rows(body: dict, size: int) -> dict:
    """The exact path of a ROWS body decoded by msgpack: txns as if checked one by one."""
    valid: list[Txn] = []
    for frame in body["frames"]:
        try:
            _, txns, bad = exact_frame(frame)
        except ValueError as e:
            return {"txns": valid, "error": RemoteProtocolError(f"undecodable ROWS frame: {e}")}
        valid += txns
        if bad is not None:
            return _sized(valid, size, bad)
    return _sized(valid, size, None)


def _sized(txns: list[Txn], size: int, error: RemoteProtocolError | None) -> dict:
    """A ROWS body, cut before the first txn whose encoding exceeds txn_bytes_max: what could not
    travel on alone from here (only a message larger than that bound can hold one)."""
    if size > limits.txn_bytes_max:
        for i, t in enumerate(txns):
            err = validate.txn_bytes_error(len(codec.pack(t)))
            if err is not None:
                return {"txns": txns[:i],
                        "error": RemoteProtocolError(f"malformed row: txn {t.replica_id}:{t.lsn} {err}")}
    return {"txns": txns, "error": error}


def decode(data: bytes, scan_rows: Callable[[bytes], Any] | None = None) -> Message:
    """`scan_rows` (an applier's: node.core.rowscan.scan_rows): a ROWS message it takes comes
    back as {"scan": its scan} instead of decoded txns."""
    if not isinstance(data, (bytes, bytearray)):
        raise RemoteProtocolError("replication messages are binary")
    if len(data) > limits.message_bytes_max:
        raise RemoteProtocolError(f"message of {len(data)} bytes exceeds {limits.message_bytes_max}")
    if scan_rows is not None and data.startswith(_ROWS_HEAD):
        scan = scan_rows(data)
        if scan is not None:
            return Message(ROWS, {"scan": scan, "data": data})
    if data.startswith(_ROWS_TYPE):
        try:
            _, body = _fast_rows(data)
            txns = [t for _, frame in body.frames for t in frame]
            check_fast(txns)
            return Message(ROWS, _sized(txns, len(data), None))
        except FAST_ERRORS:
            pass                                            # the exact path below
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=codec.refuse_ext)
    except Exception as e:  # msgpack raises several unrelated types for junk
        raise RemoteProtocolError(f"undecodable message: {type(e).__name__}") from None
    if not isinstance(raw, list) or len(raw) != 2 or not isinstance(raw[0], int) or not isinstance(raw[1], dict):
        raise RemoteProtocolError("message is not [type, {body}]")
    mtype, body = raw
    schema = SCHEMA.get(mtype)
    if schema is None:
        raise RemoteProtocolError(f"unknown message type {mtype}")
    for k, types in schema.items():
        v = body.get(k)
        if not isinstance(v, types) or (types is _INT and isinstance(v, bool)):
            raise RemoteProtocolError(f"{NAMES[mtype]}: field {k!r} missing or of the wrong type")
    if mtype == ROWS:
        return Message(mtype, _rows(body, len(data)))
    check = _CHECKS.get(mtype)
    err = check(body) if check is not None else None
    if err is not None:
        raise RemoteProtocolError(f"{NAMES[mtype]}: {err}")
    return Message(mtype, body)


# what a message's fields may hold past their types (node.core.validate), by type
_CHECKS: dict[int, Callable[[dict], str | None]] = {
    GREETING: validate_msgs.greeting_error,
    SUBSCRIBE: validate_msgs.subscribe_error,
    SUBSCRIBED: lambda b: validate_msgs.vclock_error(b["vclock"]),
    ACK: lambda b: validate_msgs.vclock_error(b["vclock"]) or (
        validate_msgs.vclock_error(b["durable"]) if "durable" in b else None),
    SHUTDOWN: validate_msgs.shutdown_error,
    SNAPSHOT: validate_msgs.snapshot_error,
    SNAPSHOT_ROWS: validate_msgs.snapshot_rows_error,
    REGISTERED: lambda b: None if 1 <= b["id"] <= limits.replica_id_max else "id out of range",
}


def vclock_from_wire(d: dict) -> dict[int, int]:
    err = validate_msgs.vclock_error(d)
    if err is not None:
        raise RemoteProtocolError(f"malformed vclock: {err}")
    return vclock_of(d)


def vclock_of(d: dict) -> dict[int, int]:
    """A vclock field of a message `decode` returned (it checked the field by vclock_error),
    without its zero components."""
    return {k: v for k, v in d.items() if v}
