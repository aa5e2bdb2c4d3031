"""What a key, a value, a space name, a row, a transaction, a `_cluster` row, a member address,
a uuid and a vclock may be: every rule about the shape of data, in one place. Pure.

Callers: the HTTP API (client input; `Invalid` becomes a 4xx), the exact row decoder
node.core.rows (the wire, the WAL and recovery; `Invalid` becomes a RemoteProtocolError), the
message checks of node.core.messages (greetings, vclocks, snapshots), the core (what needs this
node's state: known spaces, capacity, clocks). The fast paths — msgspec's `_WireOp` in
node.core.rows and the C scanner node/core/_rowscan.c — accept subsets of these rules and are held
to them by differential tests (tests/unit/test_validate.py, tests/unit/test_rowscan.py).

The storable value domain is what JSON and msgpack both carry and read back identically: null,
booleans, integers within int64/uint64, finite floats, UTF-8 strings, arrays, and maps with string
keys; at most `value_depth_max` containers deep and `value_bytes_max` bytes as canonical msgpack.
Every walk over a value is iterative (an explicit stack), never recursive: a value is input.

Legacy values: a store or WAL written before this rule may hold msgpack timestamps, bin, non-finite
floats and maps with other scalar keys. Recovery and snapshots accept them (`legacy=True`: they were
acknowledged, and refusing them would lose them); clients and peers' rows may not add any; reads
render them in JSON by the documented fallback (node/http/render.py)."""
from __future__ import annotations

import math
import re
from typing import Any

import msgpack

from node import limits
from node.cluster_space.resolver import DATA_RESOLVERS
from node.cluster_space.table import STATES



class Invalid(ValueError):
    """Data outside the rules; `code` names the rule for a client's error body."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


SPACE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}\Z")     # anchored both ends: msgspec searches
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
_ADDRESS_RE = re.compile(r"(\[[0-9A-Za-z:.%]+\]|[0-9A-Za-z._:-]+):([0-9]{1,5})\Z")
INT_MIN, UINT_MAX = -(1 << 63), (1 << 64) - 1
_VALUE_BYTES_MAX = limits.value_bytes_max
_DEPTH_MAX = limits.value_depth_max


# --- scalars ---------------------------------------------------------------------------------
def is_uuid(s: Any) -> bool:
    """A canonical uuid: 8-4-4-4-12 lowercase hex, as str(uuid.uuid4()) writes it."""
    return type(s) is str and len(s) == limits.uuid_chars and _UUID_RE.match(s) is not None


def check_uuid(s: Any, what: str = "uuid") -> str:
    if not is_uuid(s):
        raise Invalid("bad_uuid", f"{what} is not a canonical uuid: {str(s)[:80]!r}")
    return s


def address_error(a: Any) -> str | None:
    """host:port, at most address_bytes_max bytes of printable ASCII, port 1..65535."""
    if type(a) is not str:
        return "an address is a string"
    if len(a) > limits.address_bytes_max:
        return f"an address is at most {limits.address_bytes_max} bytes"
    m = _ADDRESS_RE.match(a)
    if m is None or not 0 < int(m.group(2)) < 65536:
        return f"expected host:port, got {a[:80]!r}"
    return None


def check_address(a: Any) -> str:
    err = address_error(a)
    if err is not None:
        raise Invalid("bad_address", err)
    return a


def key_error(key: Any) -> str | None:
    """A key is a UTF-8 string of 1..key_bytes_max bytes."""
    if type(key) is not str:
        return "keys are strings"
    n = len(key)
    if n == 0:
        return f"keys are 1..{limits.key_bytes_max} bytes of UTF-8"
    if n > limits.key_bytes_max // 4 or not key.isascii():
        try:
            n = len(key.encode("utf-8"))
        except UnicodeEncodeError:
            return "keys are valid UTF-8"
        if n > limits.key_bytes_max:
            return f"keys are 1..{limits.key_bytes_max} bytes of UTF-8 (this one is {n})"
    return None


def check_key(key: Any) -> str:
    err = key_error(key)
    if err is not None:
        raise Invalid("bad_key", err)
    return key


def space_name_error(name: Any) -> str | None:
    if type(name) is not str or SPACE_RE.match(name) is None:
        return "space names match [A-Za-z_][A-Za-z0-9_]{0,63}"
    return None


def check_space_name(name: Any) -> str:
    err = space_name_error(name)
    if err is not None:
        raise Invalid("bad_space_name", err)
    return name


def space_def_error(d: Any) -> str | None:
    """A space definition, as OP_SPACE carries it: {"local": bool, "conflict": a resolver's name}."""
    if type(d) is not dict or not set(d) <= {"local", "conflict"}:
        return 'a space definition is {"local": bool, "conflict": str}'
    if type(d.get("local", False)) is not bool:
        return "'local' is true or false"
    c = d.get("conflict", "lww")
    if type(c) is not str or c not in DATA_RESOLVERS:
        return f"'conflict' is one of {', '.join(sorted(DATA_RESOLVERS))}"
    return None


def lsn_error(lsn: Any, what: str = "lsn") -> str | None:
    if type(lsn) is not int or not 0 <= lsn <= limits.lsn_max:
        return f"{what} is an integer 0..{limits.lsn_max}"
    return None


def cluster_value_error(v: Any) -> str | None:
    """The value of a `_cluster` row: {"id", "address", "state"[, "expelled_lsn"]} in its origin's ids."""
    if type(v) is not dict or not {"id", "state"} <= set(v) or \
            not set(v) <= {"id", "address", "state", "expelled_lsn"}:
        return '_cluster rows are {"id", "address", "state"[, "expelled_lsn"]}'
    i = v["id"]
    if type(i) is not int or not 1 <= i <= limits.replica_id_max:
        return f"_cluster id {str(i)[:20]} is not 1..{limits.replica_id_max}"
    a = v.get("address")
    if a not in ("", None) and address_error(a) is not None:
        return f"_cluster address: {address_error(a)}"
    if v["state"] not in STATES:
        return f"_cluster state {str(v['state'])[:40]!r} is not one of {', '.join(STATES)}"
    e = v.get("expelled_lsn")
    if e is not None and lsn_error(e) is not None:
        return "_cluster expelled_lsn: " + lsn_error(e)
    return None


# --- values ----------------------------------------------------------------------------------
def _int_size(v: int) -> int:
    if v >= 0:
        return 1 if v < 0x80 else 2 if v <= 0xff else 3 if v <= 0xffff else 5 if v <= 0xffffffff \
            else 9 if v <= UINT_MAX else 0
    return 1 if v >= -32 else 2 if v >= -0x80 else 3 if v >= -0x8000 else 5 if v >= -0x80000000 \
        else 9 if v >= INT_MIN else 0


def _str_size(s: str) -> int:
    n = len(s) if s.isascii() else len(s.encode("utf-8"))    # UnicodeEncodeError: a lone surrogate
    return n + (1 if n < 32 else 2 if n < 0x100 else 3 if n < 0x10000 else 5)


def _head_size(n: int) -> int:
    return 1 if n < 16 else 3 if n < 0x10000 else 5


def _legacy_scalar_size(x: Any) -> int:
    """A scalar only stores written before the value rule hold (0: not even that)."""
    t = type(x)
    if t is bytes:
        n = len(x)
        return n + (2 if n < 0x100 else 3 if n < 0x10000 else 5)
    if t is float:
        return 9
    if t is msgpack.Timestamp:
        n = len(x.to_bytes())
        return n + (2 if n in (4, 8) else 3)
    return 0


def value_size(v: Any, *, legacy: bool = False) -> int:
    """The size of v as canonical msgpack, after checking it is storable (module comment); raises
    Invalid: `bad_value` (outside the domain), `value_too_deep`, `value_too_large`."""
    size = 0
    stack = [iter((v,))]              # one iterator per open container; the root is not one
    while stack:
        for x in stack[-1]:
            t = type(x)
            if t is str:
                try:
                    size += _str_size(x)
                except UnicodeEncodeError:
                    raise Invalid("bad_value", "strings are valid UTF-8") from None
            elif t is int:
                n = _int_size(x)
                if not n:
                    raise Invalid("bad_value", "integers are within int64/uint64")
                size += n
            elif t is bool or x is None:
                size += 1
            elif t is float:
                if not legacy and not math.isfinite(x):
                    raise Invalid("bad_value", "numbers are finite (no NaN or Infinity)")
                size += 9
            elif t is list or t is dict:
                if len(stack) > _DEPTH_MAX:
                    raise Invalid("value_too_deep", f"values nest at most {_DEPTH_MAX} arrays and maps deep")
                size += _head_size(len(x))
                if t is dict:
                    for k in x:
                        if type(k) is str:
                            try:
                                size += _str_size(k)
                            except UnicodeEncodeError:
                                raise Invalid("bad_value", "strings are valid UTF-8") from None
                        elif legacy and (type(k) in (int, bool) or k is None):
                            size += _int_size(k) if type(k) is int else 1
                        elif legacy and _legacy_scalar_size(k):
                            size += _legacy_scalar_size(k)
                        else:
                            raise Invalid("bad_value", "map keys are strings")
                    stack.append(iter(x.values()))
                else:
                    stack.append(iter(x))
                break                 # walk the new container first
            elif legacy and _legacy_scalar_size(x):
                size += _legacy_scalar_size(x)
            else:
                what = "binary data" if t is bytes else "msgpack extension types" \
                    if t in (msgpack.Timestamp, msgpack.ExtType) else f"{t.__name__} values"
                raise Invalid("bad_value", f"{what} cannot be stored (JSON could not read it back)")
            if size > _VALUE_BYTES_MAX:
                break
        else:
            stack.pop()
            continue
        if size > _VALUE_BYTES_MAX:
            raise Invalid("value_too_large", f"values are at most {_VALUE_BYTES_MAX} bytes as msgpack")
    return size


def check_value(v: Any, *, legacy: bool = False) -> Any:
    value_size(v, legacy=legacy)
    return v


def value_error(v: Any, *, legacy: bool = False) -> str | None:
    try:
        value_size(v, legacy=legacy)
    except Invalid as e:
        return e.message
    return None


# --- transactions ------------------------------------------------------------------------------
# What each kind of row may hold is node.core.rows's op_error, built from the rules above.
TXN_HEAD_BYTES_MAX = 1 + 5 + 9 + 1 + 9 + 5    # [replica_id, lsn, group, timestamp, ops-array head]


def check_txn_bytes(ops_bytes: int) -> None:
    """A transaction whose ops encode to `ops_bytes` fits in one ROWS message (limits.py)."""
    if ops_bytes + TXN_HEAD_BYTES_MAX > limits.txn_bytes_max:
        raise Invalid("txn_too_large", f"a transaction encodes to at most {limits.txn_bytes_max} bytes "
                      f"(this one to about {ops_bytes + TXN_HEAD_BYTES_MAX})")


# --- clocks ----------------------------------------------------------------------------------------
def timestamp_ahead_error(ts: int, wall_us: int) -> str | None:
    """A remote timestamp may lead this node's wall clock by at most hlc_offset_max_s."""
    ahead = ts - wall_us
    if ahead > limits.hlc_offset_max_s * 1e6:
        return (f"its timestamp is {ahead / 1e6:.3f} s ahead of this node's clock (more than "
                f"hlc_offset_max_s = {limits.hlc_offset_max_s:g} s): check the clocks")
    return None


# --- _cluster tables, vclocks ----------------------------------------------------------------------
def cluster_row_error(row: Any) -> str | None:
    """A `_cluster` tuple as greetings, snapshots and segment headers carry it:
    [uuid, id, address, state(, lsn(, expelled_lsn))]."""
    if type(row) is not list or not 4 <= len(row) <= 6:
        return "a _cluster row is [uuid, id, address, state, lsn, expelled_lsn]"
    if not is_uuid(row[0]):
        return f"_cluster uuid {str(row[0])[:80]!r} is not a canonical uuid"
    v = {"id": row[1], "address": row[2], "state": row[3]}
    if len(row) > 5:
        v["expelled_lsn"] = row[5]
    err = cluster_value_error(v)
    if err is None and len(row) > 4 and lsn_error(row[4]) is not None:
        err = "_cluster lsn: " + lsn_error(row[4])
    return err


def cluster_rows_error(rows: Any) -> str | None:
    """A whole `_cluster`: at most members_max rows, one per uuid and one per id."""
    if type(rows) is not list or len(rows) > limits.members_max:
        return f"a _cluster table is a list of at most {limits.members_max} rows"
    uuids, ids = set(), set()
    for r in rows:
        err = cluster_row_error(r)
        if err is not None:
            return err
        if r[0] in uuids or r[1] in ids:
            return f"_cluster names {r[0]} or id {r[1]} twice"
        uuids.add(r[0])
        ids.add(r[1])
    return None


def vclock_error(d: Any) -> str | None:
    """A vclock on the wire: {id: lsn}, ids 0..replica_id_max, lsns 0..lsn_max."""
    if type(d) is not dict or len(d) > limits.members_max + 1:
        return f"a vclock is a map of at most {limits.members_max + 1} components"
    for k, v in d.items():
        if type(k) is not int or not 0 <= k <= limits.replica_id_max or lsn_error(v) is not None:
            return f"vclock component {str(k)[:20]}: {str(v)[:30]} is not id: lsn within bounds"
    return None


def vclock_uuid_error(d: Any) -> str | None:
    if type(d) is not dict or len(d) > limits.members_max:
        return f"a vclock by uuid is a map of at most {limits.members_max} components"
    for k, v in d.items():
        if not is_uuid(k) or lsn_error(v) is not None:
            return f"vclock component {str(k)[:40]}: {str(v)[:30]} is not uuid: lsn within bounds"
    return None


def _finite_number(x: Any) -> bool:
    return (type(x) is float and math.isfinite(x)) or type(x) is int


def store_field_error(st: Any) -> str | None:
    """A greeting's `store` (the join protocol's status exchange, node/lifecycle.py): null, or
    {"status", "initial": null | {cluster_uuid, created_s, founders}, "final": null |
    {vclock_by_uuid, shutdown_id}, "proposal": null | [cluster uuid, created_s]}."""
    if st is None:
        return None
    if type(st) is not dict:
        return "store is an object"
    if st.get("status") is not None and (type(st["status"]) is not str or len(st["status"]) > 64):
        return "store.status is a short string"
    ini = st.get("initial")
    if ini is not None and (type(ini) is not dict or not is_uuid(ini.get("cluster_uuid"))
                            or not _finite_number(ini.get("created_s")) or type(ini.get("founders")) is not list
                            or len(ini["founders"]) > limits.members_max or not all(map(is_uuid, ini["founders"]))):
        return "store.initial is {cluster_uuid, created_s, founders: [uuid, ...]}"
    fin = st.get("final")
    if fin is not None and (type(fin) is not dict or not is_uuid(fin.get("shutdown_id"))
                            or vclock_uuid_error(fin.get("vclock_by_uuid")) is not None):
        return "store.final is {vclock_by_uuid, shutdown_id}"
    prop = st.get("proposal")
    if prop is not None and (type(prop) is not list or len(prop) != 2 or not is_uuid(prop[0])
                             or not _finite_number(prop[1])):
        return "store.proposal is [cluster uuid, created_s]"
    return None


def greeting_error(g: dict) -> str | None:
    """The fields of a GREETING that this node acts on, past their types (node.core.messages);
    the optional ones are null or of the shape this node reads."""
    if not is_uuid(g["uuid"]):
        return f"uuid {g['uuid'][:80]!r} is not a canonical uuid"
    if g["cluster_uuid"] is not None and not is_uuid(g["cluster_uuid"]):
        return "cluster_uuid is not a canonical uuid"
    if not 0 < len(g["cluster_name"]) <= 64 or len(g["options_digest"]) > 64 or len(g["status"]) > 64:
        return "cluster_name, options_digest or status too long"
    err = address_error(g["address"]) or cluster_rows_error(g["cluster"])
    if err is None and g.get("vclock_uuid") is not None:
        err = vclock_uuid_error(g["vclock_uuid"])
    for name, types in (("options", (dict,)), ("lease", (dict,)), ("wait_for", (int,))):
        if err is None and g.get(name) is not None and type(g[name]) not in types:
            err = f"{name} is {' or '.join(t.__name__ for t in types)} or null"
    return err or store_field_error(g.get("store"))


def shutdown_error(body: dict) -> str | None:
    """SHUTDOWN {phase, shutdown_id, final?}: one step of an orderly cluster shutdown
    (node/cluster_shutdown.py), whose id and vclock end up in status and in the store."""
    if body["phase"] not in ("quiesce", "final", "resume") or not is_uuid(body["shutdown_id"]):
        return "phase is quiesce, final or resume, and shutdown_id a canonical uuid"
    final = body.get("final")
    if final is not None and (type(final) is not dict or final.get("shutdown_id") != body["shutdown_id"]
                              or vclock_uuid_error(final.get("vclock_by_uuid")) is not None):
        return "final is null or {vclock_by_uuid, shutdown_id} of this shutdown"
    return None


def snapshot_error(body: dict) -> str | None:
    """SNAPSHOT {vclock, cluster, spaces}: what install_snapshot will write."""
    spaces = body["spaces"]
    err = vclock_error(body["vclock"]) or cluster_rows_error(body["cluster"])
    if err is None and len(spaces) > limits.store_spaces_max:
        err = f"a snapshot holds at most {limits.store_spaces_max} spaces"
    for name, d in spaces.items() if err is None else ():
        err = space_name_error(name) or space_def_error(d)
        if err:
            break
    return err


def snapshot_rows_error(body: dict) -> str | None:
    """SNAPSHOT_ROWS {space, rows}: [[key, [value, origin id, lsn, hlc, deleted]], ...]. Values
    may be legacy ones (module comment): the donor holds them acknowledged."""
    err = space_name_error(body["space"])
    if err is None and len(body["rows"]) > limits.snapshot_chunk_rows_max:
        err = f"a snapshot chunk holds at most {limits.snapshot_chunk_rows_max} rows"
    for item in body["rows"] if err is None else ():
        if type(item) is not list or len(item) != 2 or type(item[1]) is not list or len(item[1]) != 5:
            return "a snapshot row is [key, [value, origin id, lsn, hlc, deleted]]"
        key, (value, origin, lsn, hlc, deleted) = item
        err = key_error(key) or value_error(value, legacy=True) or lsn_error(lsn)
        if err is None and (type(origin) is not int or not 0 <= origin <= limits.replica_id_max
                            or type(hlc) is not int or not 0 <= hlc <= limits.timestamp_us_max
                            or type(deleted) is not bool):
            err = "a snapshot record's origin id, hlc or deleted flag is out of bounds"
        if err:
            break
    return err
