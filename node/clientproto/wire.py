"""The binary client protocol's wire format: frames, requests and answers. Pure: no IO, no
asyncio, no node state; the server (node/clientproto/session.py) and the SDK (replog/) both
speak through this module, so the format has one definition.

Framing: on TCP every frame is a 4-byte big-endian length, then that many bytes of msgpack.
A frame is at most `client_frame_bytes_max` bytes (the HTTP body bound), and the length is read
before anything is buffered, so a frame past it is refused without reading it.

Client -> node, one frame: an array of 1..client_frame_requests_max requests, each an array
`[id, op, args...]` (`id` an integer 0..2**63-1 the client chooses; answers carry it back):

    HELLO   [id, 0, {"token": str|nil, "version": 1}]      first, when the node has a token
    GET     [id, 1, space, key, after_vclock?, timeout_ms?]
    PUT     [id, 2, space, key, value]
    DELETE  [id, 3, space, key]
    RANGE   [id, 4, space, after|nil, limit, after_vclock?, timeout_ms?]
    TXN     [id, 5, [[2, space, key, value] | [3, space, key], ...]]
    INFO    [id, 6]
    WAIT    [id, 7, after_vclock, timeout_ms?]
    SPACE   [id, 8, space, {"local": bool, "conflict": str}]

Node -> client, one frame: `[vclock_uuid|nil, [[id, status, body], ...]]`. `status` is the HTTP
status the same request gets from the HTTP API (200, 201, 4xx, 503, 504), and for every
status >= 400 `body` is `{"code", "message"}` with the HTTP API's code. `vclock_uuid` is the
node's vclock by uuid when the frame was built, sent whenever the frame answers a write, a read
or a wait: a write's own vclock (read-your-writes) is at most that. Answers of one request frame
may come in several answer frames, in any order (reads answer at once, writes after the WAL,
waits when the vclock is reached): the id pairs them. Bodies of the frequent operations are
compact: PUT/DELETE -> lsn; GET -> [value, origin uuid, lsn]; RANGE -> [[[key, value, origin,
lsn], ...], next key|nil]; TXN -> lsn of its last row; SPACE, INFO, WAIT, HELLO -> maps.

A frame that is not msgpack, or not an array of requests, is a protocol error: the node answers
once with id nil, status 400, and closes the connection. A request it cannot read (not an
array, no integer id, unknown op, wrong arguments) is answered 400 `bad_request` under its id
(nil if it has none), and the connection goes on."""
from __future__ import annotations

import struct
from typing import Any

import msgpack
import msgspec

from node.core import codec

VERSION = 1

HELLO, GET, PUT, DELETE, RANGE, TXN, INFO, WAIT, SPACE = range(9)
OP_NAMES = {HELLO: "hello", GET: "get", PUT: "put", DELETE: "delete", RANGE: "range", TXN: "txn",
            INFO: "info", WAIT: "wait", SPACE: "space"}
TXN_PUT, TXN_DELETE = PUT, DELETE          # an op inside TXN: [2, space, key, value] or [3, space, key]
OK, CREATED = 200, 201
ID_MAX = (1 << 63) - 1

HEAD = struct.Struct(">I")                 # a frame's length
HEAD_BYTES = HEAD.size


class ProtocolError(ValueError):
    """Bytes that are not a frame of this protocol; the connection is closed after answering."""

    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


# --- encoding ---------------------------------------------------------------------------
_pack = codec.pack


def frame(payload: bytes) -> bytes:
    return HEAD.pack(len(payload)) + payload


def encode_requests(reqs: list) -> bytes:
    """A whole request frame (length and payload)."""
    payload = _pack(reqs)
    return HEAD.pack(len(payload)) + payload


def encode_answers(vclock_uuid: dict | None, answers: list) -> bytes:
    """A whole answer frame (length and payload)."""
    payload = _pack((vclock_uuid, answers))
    return HEAD.pack(len(payload)) + payload


def error_answer(req_id: Any, status: int, code: str, message: str) -> tuple:
    return (req_id, status, {"code": code, "message": message})


# --- decoding ---------------------------------------------------------------------------
_fast = msgspec.msgpack.Decoder(ext_hook=codec.refuse_ext).decode
_FAST_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError, TypeError, ValueError)


def decode_payload(payload: bytes | memoryview) -> Any:
    """A frame's msgpack, decoded (values as they will be stored: str, int, float, bool, nil,
    list, dict; bin and extension types are refused later by the value rule or here)."""
    try:
        return _fast(payload)
    except codec.ExtTypeRefused:
        pass                       # the exact decoder below refuses it too, or the value rule does
    except _FAST_ERRORS:
        pass
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=codec.refuse_ext)
    except codec.ExtTypeRefused as e:
        raise ProtocolError("bad_value", f"{e} (JSON could not read it back)") from None
    except Exception:  # msgpack raises many types for junk
        raise ProtocolError("bad_frame", "the frame is not valid msgpack") from None


def decode_requests(payload: bytes | memoryview, requests_max: int) -> list:
    """The requests of one client frame; raises ProtocolError for a frame that is not an
    array of 1..requests_max items (the items themselves are checked one by one)."""
    reqs = decode_payload(payload)
    if type(reqs) is not list or not reqs:
        raise ProtocolError("bad_frame", "a frame is an array of requests [id, op, args...]")
    if len(reqs) > requests_max:
        raise ProtocolError("frame_too_large", f"a frame holds at most {requests_max} requests", 413)
    return reqs


_answers = msgspec.msgpack.Decoder().decode   # a stored legacy timestamp reads back as a datetime


def decode_answers(payload: bytes | memoryview) -> tuple[dict | None, list]:
    """(vclock_uuid, [[id, status, body], ...]) of one node frame (the SDK's side)."""
    try:
        d = _answers(payload)
    except (msgspec.DecodeError, RecursionError):
        raise ProtocolError("bad_frame", "the frame is not valid msgpack") from None
    if type(d) is not list or len(d) != 2 or type(d[1]) is not list or (d[0] is not None and type(d[0]) is not dict):
        raise ProtocolError("bad_frame", "an answer frame is [vclock_uuid, [[id, status, body], ...]]")
    return d[0], d[1]


class FrameReader:
    """Splits a byte stream into frame payloads; refuses a frame whose length passes `max_bytes`
    (read at each frame, so a connection's bound may grow once it is authenticated) before
    buffering it."""
    __slots__ = ("buf", "max_bytes")

    def __init__(self, max_bytes: int):
        self.buf = bytearray()
        self.max_bytes = max_bytes

    def frames(self, data: bytes):
        """Yield the payloads that `data` completes, in order (lazily: raise ProtocolError at
        the first bad length, after yielding the frames before it)."""
        buf = self.buf
        if not buf and len(data) >= HEAD_BYTES:
            n = HEAD.unpack_from(data)[0]
            if n + HEAD_BYTES == len(data):        # the usual case: one whole frame in one read
                self._check(n)
                yield data[HEAD_BYTES:]
                return
        buf += data
        while len(buf) >= HEAD_BYTES:
            n = HEAD.unpack_from(buf)[0]
            self._check(n)
            if len(buf) - HEAD_BYTES < n:
                return
            payload = bytes(buf[HEAD_BYTES:HEAD_BYTES + n])
            del buf[:HEAD_BYTES + n]
            yield payload

    def _check(self, n: int) -> None:
        if n > self.max_bytes:
            raise ProtocolError("frame_too_large", f"a frame is at most {self.max_bytes} bytes (this one "
                                f"says {n})", 413)
        if n == 0:
            raise ProtocolError("bad_frame", "an empty frame")

    @property
    def buffered(self) -> int:
        return len(self.buf)
