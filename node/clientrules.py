"""Client input, checked by one set of rules on every client endpoint: the HTTP API
(node/http/api.py) and the binary client protocol (node/clientproto/). Each check raises a
ClientError with the status and code both endpoints answer, so a client sees the same error
for the same mistake whichever way it came. The data rules themselves are node.core.validate's;
this module only maps them to client errors and adds what is a client's business alone (system
spaces, the shape of a transaction, read-your-writes vclocks and wait timeouts).

Rules kept here:
- nothing is written that these checks did not pass (the write paths call them first);
- a space whose name starts with `_` is a system space: clients may read, never write it;
- a transaction holds 1..txn_ops_max ops and encodes within txn_bytes_max;
- an `after_vclock` names canonical uuids with lsns within bounds, at most members_max of them,
  and a wait lasts at most wait_timeout_ms_max."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from node import limits
from node.core import validate, validate_msgs
from node.core.rows import OP_DELETE, OP_PUT, OP_SPACE, Op
from node.errors import ClientError

if TYPE_CHECKING:
    from node.process.ports import ClientHost

_TOO_LARGE = {"value_too_large", "txn_too_large"}
OP_NAMES = {"put": OP_PUT, "delete": OP_DELETE}


def invalid(e: validate.Invalid) -> ClientError:
    """A broken data rule (node.core.validate) as the client's error."""
    return ClientError(413 if e.code in _TOO_LARGE else 400, e.code, e.message)


def check_space(name: Any, *, write: bool) -> str:
    try:
        validate.check_space_name(name)
    except validate.Invalid as e:
        raise invalid(e) from None
    if write and name.startswith("_"):
        raise ClientError(403, "system_space", f"{name!r} is a system space; clients cannot write it")
    return name


def check_key(key: Any) -> str:
    try:
        return validate.check_key(key)
    except validate.Invalid as e:
        raise invalid(e) from None


def check_value(value: Any) -> int:
    """The value's size as stored (msgpack); refuses what cannot be stored or read back."""
    try:
        return validate.value_size(value)
    except validate.Invalid as e:
        raise invalid(e) from None


def check_txn_size(ops_bytes: int) -> None:
    try:
        validate.check_txn_bytes(ops_bytes)
    except validate.Invalid as e:
        raise invalid(e) from None


def row_bytes(space: str, key: str) -> int:
    """What a row adds to a transaction's encoding besides its value (<= 16 bytes of framing)."""
    return len(space) + len(key.encode()) + 16


def put_op(space: Any, key: Any, value: Any) -> Op:
    """One put, checked as `PUT /v1/spaces/{space}/keys/{key}` checks it."""
    space = check_space(space, write=True)
    key = check_key(key)
    check_txn_size(check_value(value) + row_bytes(space, key))
    return Op(OP_PUT, space, key, value)


def delete_op(space: Any, key: Any) -> Op:
    return Op(OP_DELETE, check_space(space, write=True), check_key(key), None)


def txn_ops(raw_ops: Any) -> list[Op]:
    """The ops of one transaction, as `POST /v1/txn` carries them:
    [{"op": "put"|"delete", "space", "key", "value"}, ...]."""
    if not isinstance(raw_ops, list) or not raw_ops:
        raise ClientError(400, "bad_txn", "body is {\"ops\": [{\"op\": \"put\"|\"delete\", \"space\", \"key\", \"value\"}]}")
    if len(raw_ops) > limits.txn_ops_max:
        raise ClientError(413, "txn_too_large", f"at most {limits.txn_ops_max} ops in one transaction")
    ops = []
    size = 0
    for i, o in enumerate(raw_ops):
        if not isinstance(o, dict) or o.get("op") not in OP_NAMES or not isinstance(o.get("space"), str):
            raise ClientError(400, "bad_op", f"op {i} is not {{\"op\": \"put\"|\"delete\", \"space\", \"key\", ...}}")
        space = check_space(o["space"], write=True)
        key = check_key(o.get("key"))
        size += row_bytes(space, key)
        if o["op"] == "put":
            if "value" not in o:
                raise ClientError(400, "bad_op", f"op {i}: put needs a value")
            size += check_value(o["value"])
            ops.append(Op(OP_PUT, space, key, o["value"]))
        else:
            ops.append(Op(OP_DELETE, space, key, None))
    check_txn_size(size)
    return ops


# --- read-your-writes -------------------------------------------------------------------
def check_vclock_uuid(v: Any) -> dict[str, int]:
    """An after_vclock as a map {uuid: lsn}."""
    err = validate_msgs.vclock_uuid_error(v)
    if err is not None:
        raise ClientError(400, "bad_vclock", err)
    return v


def parse_vclock_text(text: str, name: str) -> dict[str, int]:
    """`uuid:lsn[,uuid:lsn...]`, the query-string form of a vclock (the parameter `name`)."""
    out: dict[str, int] = {}
    if len(text) > limits.members_max * (limits.uuid_chars + 22):
        raise ClientError(400, "bad_vclock", f"a vclock names at most {limits.members_max} members")
    for part in text.split(","):
        uuid, sep, lsn = part.strip().partition(":")
        if not sep or not lsn.isdigit() or len(lsn) > 19:
            raise ClientError(400, "bad_vclock", f"{name} is uuid:lsn[,uuid:lsn...], not {part[:80]!r}")
        if uuid in out:
            raise ClientError(400, "bad_vclock", f"{name} names {uuid[:40]} twice")
        out[uuid] = int(lsn)
    return check_vclock_uuid(out)


def check_timeout_ms(t: Any) -> int:
    if type(t) is not int or not 0 <= t <= limits.wait_timeout_ms_max:
        raise ClientError(400, "bad_timeout", f"timeout_ms is an integer 0..{limits.wait_timeout_ms_max}")
    return t


def parse_timeout_text(text: str | None) -> int:
    if text is None:
        return limits.wait_timeout_ms_default
    if not text.isdigit() or len(text) > 12:
        raise ClientError(400, "bad_timeout", f"timeout_ms is an integer 0..{limits.wait_timeout_ms_max}")
    return check_timeout_ms(int(text))


# --- operations both endpoints run (node: its ClientHost port) ------------------------------
def space_for_read(node: "ClientHost", name: Any) -> str:
    check_space(name, write=False)
    if node.store is None or name not in node.store.spaces:
        raise ClientError(404, "no_such_space", f"space {name!r} does not exist")
    return name


def get_record(node: "ClientHost", space: Any, key: Any) -> tuple[str, Any, str, int]:
    """(key, value, origin uuid, lsn) of a live key, or 404."""
    space_for_read(node, space)
    key = check_key(key)
    rec = node.store.get(space, key)
    if rec is None or rec.deleted:
        raise ClientError(404, "no_such_key", f"key {key!r} is not in {space!r}")
    origin = node.uuid if rec.origin_id == 0 else node.store.table.uuid_of(rec.origin_id)
    return key, rec.value, origin, rec.lsn


def check_limit(limit: Any) -> int:
    if type(limit) is not int or not 1 <= limit <= limits.range_limit_max:
        raise ClientError(400, "bad_limit", f"limit is 1..{limits.range_limit_max}")
    return limit


def range_records(node: "ClientHost", space: Any, after: Any, limit: int) -> tuple[list[tuple[str, Any, str, int]], str | None]:
    """Up to `limit` live keys after `after` (None: from the first), in key order, as
    (key, value, origin uuid, lsn), and the key to continue after (None at the end)."""
    space_for_read(node, space)
    if after is not None:
        check_key(after)
    recs, nxt = node.store.range(space, after, check_limit(limit))
    uuid_of, me = node.store.table.uuid_of, node.uuid
    return [(r.key, r.value, me if r.origin_id == 0 else uuid_of(r.origin_id), r.lsn) for r in recs], nxt


async def create_space(node: "ClientHost", name: Any, body: Any) -> tuple[int, dict]:
    """Create a space (idempotent): (201, answer) when created, (200, answer) when it exists
    with these options; 409 when it exists with others."""
    name = check_space(name, write=True)
    if not isinstance(body, dict):
        raise ClientError(400, "bad_body", "body is an object like {\"local\": false}")
    local = body.get("local", False)
    conflict = body.get("conflict", "lww")
    err = validate.space_def_error({"local": local, "conflict": conflict})
    if err is not None:
        raise ClientError(400, "bad_option", err)
    existing = node.store.spaces.get(name) if node.store else None
    if existing is not None:
        if existing.local != local or existing.conflict != conflict:
            raise ClientError(409, "space_exists", f"space {name!r} exists with other options {existing.to_dict()}")
        return 200, {"space": name, **existing.to_dict(), "created": False}
    if node.core is not None and len(node.core.spaces) >= limits.spaces_max:   # with creates in flight
        raise ClientError(409, "too_many_spaces", f"at most {limits.spaces_max} spaces")
    res = await node.write([Op(OP_SPACE, name, "", {"local": local, "conflict": conflict})])
    return 201, {"space": name, "local": local, "conflict": conflict, "created": True, **res}
