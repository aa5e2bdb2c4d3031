"""What a key, a value, a space name, a row, a transaction, a `_cluster` row, a member address,
a uuid and an lsn may be: every rule about the shape of data, in one place. Pure.

Callers: the HTTP API (client input; `Invalid` becomes a 4xx), the exact row decoder
node.core.rows (the wire, the WAL and recovery; `Invalid` becomes a RemoteProtocolError),
node.core.validate_msgs (what messages carry besides rows: `_cluster` tables, vclocks, greetings,
snapshots; built on the rules here), the core (what needs this node's state: known spaces,
capacity, clocks). The fast paths keep subsets of these rules for speed
— msgspec's `_WireTxn`/`_WireOp` and `check_fast` in node.core.rows, the C scanner
node/core/_rowscan.c, the client session's fast path (node/clientproto/session.py) — each check
commented with the rule here it implements, and differential tests hold every copy to these rules at
each bound (tests/unit/test_row_rule_copies.py, tests/unit/test_rowscan.py, tests/unit/test_messages_fuzz.py).
A fast path that is unsure passes the input to the exact path, whose answer is these rules'.

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
from node.core.kinds import (CLUSTER_SPACE, GROUP_CLUSTER, GROUPS, OP_CLUSTER, OP_DELETE, OP_PUT, OP_SPACE,
                             OPS)



class Invalid(ValueError):
    """Data outside the rules; `code` names the rule for a client's error body."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


SPACE_RE = re.compile(rf"^[A-Za-z_][A-Za-z0-9_]{{0,{limits.space_name_chars_max - 1}}}\Z")   # both ends: msgspec searches
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
_ADDRESS_RE = re.compile(r"(\[[0-9A-Za-z:.%]+\]|[0-9A-Za-z._:-]+):([0-9]{1,5})\Z")
_UUID_CHARS = limits.uuid_chars
INT_MIN, UINT_MAX = -(1 << 63), (1 << 64) - 1
_VALUE_BYTES_MAX = limits.value_bytes_max
_DEPTH_MAX = limits.value_depth_max
KEY_CHARS_SAFE = limits.key_bytes_max // 4     # a key of at most this many characters is within key_bytes_max
# ... a str value within value_bytes_max as msgpack (UTF-8: <= 4 bytes a character, after a header of <= 5)
STR_CHARS_SAFE = (limits.value_bytes_max - 5) // 4


# Strings already found to be a canonical uuid (is_uuid) or a well-formed address (address_error):
# every greeting, `_cluster` table and `_cluster` row names the same few members again, and a
# regular expression costs more than the rest of a row's checks. Only strings that passed go in,
# so a string found here has the answer its check gave; each set is emptied when it holds
# _PASSED_MAX (a peer sending ever new ones costs the checks, never memory).
_PASSED_MAX = limits.members_max
_uuids_passed: set[str] = set()
_addresses_passed: set[str] = set()


def _passed(seen: set[str], s: str) -> None:
    if len(seen) >= _PASSED_MAX:
        seen.clear()
    seen.add(s)


# --- scalars ---------------------------------------------------------------------------------
def is_uuid(s: Any) -> bool:
    """A canonical uuid: 8-4-4-4-12 lowercase hex, as str(uuid.uuid4()) writes it."""
    if type(s) is not str or len(s) != _UUID_CHARS:
        return False
    if s in _uuids_passed:
        return True
    if _UUID_RE.match(s) is None:
        return False
    _passed(_uuids_passed, s)
    return True


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
    if a in _addresses_passed:
        return None
    m = _ADDRESS_RE.match(a)
    if m is None or not 0 < int(m.group(2)) < 65536:
        return f"expected host:port, got {a[:80]!r}"
    _passed(_addresses_passed, a)
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
    if n > KEY_CHARS_SAFE or not key.isascii():
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


_CLUSTER_KEYS = frozenset(("id", "address", "state", "expelled_lsn"))


def cluster_value_error(v: Any) -> str | None:
    """The value of a `_cluster` row: {"id", "address", "state"[, "expelled_lsn"]} in its origin's ids."""
    if type(v) is not dict or "id" not in v or "state" not in v or not _CLUSTER_KEYS.issuperset(v):
        return '_cluster rows are {"id", "address", "state"[, "expelled_lsn"]}'
    return cluster_fields_error(v["id"], v.get("address"), v["state"], v.get("expelled_lsn"))


def cluster_fields_error(i: Any, a: Any, state: Any, e: Any) -> str | None:
    """A `_cluster` member's fields, as a row's value holds them (cluster_value_error) or a
    `_cluster` tuple (node.core.validate_msgs.cluster_row_error): id 1..replica_id_max, an
    address (or "" / null), a known state, an lsn or null as expelled_lsn."""
    if type(i) is not int or not 1 <= i <= _REPLICA_ID_MAX:
        return f"_cluster id {str(i)[:20]} is not 1..{limits.replica_id_max}"
    if a not in ("", None) and address_error(a) is not None:
        return f"_cluster address: {address_error(a)}"
    if state not in STATES:
        return f"_cluster state {str(state)[:40]!r} is not one of {', '.join(STATES)}"
    # (lsn_error's rule, inline: every row of a greeting's `_cluster` states a bound)
    if e is not None and (type(e) is not int or not 0 <= e <= _LSN_MAX):
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


# What a fast path may take without walking it: a value a msgpack decoder made (its strings valid
# UTF-8, its ints within int64/uint64) that is small and flat is sure to pass value_size. False only
# means "not sure": the caller then asks value_error, or passes the input to its exact path.
DECODED_SCALARS = frozenset((str, int, bool, type(None)))


_SURE_ITEMS, _SURE_KEY, _SURE_STR = (limits.value_sure_items_max, limits.value_sure_key_chars_max,
                                    limits.value_sure_str_chars_max)


def decoded_flat_ok(v: Any) -> bool:
    """A decoded map or array of at most value_sure_items_max scalars, its strings and string map
    keys short enough (limits.py) that it is sure to be within value_bytes_max."""
    if len(v) > _SURE_ITEMS:
        return False
    if type(v) is dict:
        for k in v:
            if type(k) is not str or len(k) > _SURE_KEY:
                return False
        v = v.values()
    for x in v:
        t = type(x)
        if t is str:
            if len(x) > _SURE_STR:
                return False
        elif t is float:
            if not math.isfinite(x):
                return False
        elif t not in DECODED_SCALARS:
            return False
    return True


def decoded_value_ok(v: Any) -> bool:
    """A decoded value sure to pass value_size: a scalar (a str of at most STR_CHARS_SAFE
    characters, a finite float) or decoded_flat_ok."""
    t = type(v)
    if t is str:
        return len(v) <= STR_CHARS_SAFE
    if t is int or t is bool or v is None:
        return True
    if t is float:
        return math.isfinite(v)
    if t is dict or t is list:
        return decoded_flat_ok(v)
    return False


# --- rows and transactions -----------------------------------------------------------------------
_OPS_SET = frozenset(OPS)
_GROUPS_SET = frozenset(GROUPS)
_REPLICA_ID_MAX, _TXN_OPS_MAX, _LSN_MAX, _TS_MAX = (limits.replica_id_max, limits.txn_ops_max, limits.lsn_max,
                                                    limits.timestamp_us_max)


def op_error(kind: Any, space: Any, key: Any, value: Any, *, legacy: bool = False) -> str | None:
    """What is wrong with one row, by its kind, or None. `legacy`: values written before the value
    rule (recovery of this node's own WAL)."""
    if type(kind) is not int or kind not in _OPS_SET:
        return f"unknown op kind {str(kind)[:20]}"
    if kind == OP_PUT or kind == OP_DELETE:
        err = space_name_error(space) or key_error(key)
        if err is None:
            if kind == OP_PUT:
                err = value_error(value, legacy=legacy)
            elif value is not None:
                err = "a delete carries no value"
        return err
    if kind == OP_CLUSTER:
        if space != CLUSTER_SPACE or not is_uuid(key):
            return f"a _cluster row goes to space _cluster under a canonical uuid, not {str(key)[:80]!r}"
        return cluster_value_error(value)
    if kind == OP_SPACE:
        return space_name_error(space) or (None if key == "" else "a space row has an empty key") \
            or space_def_error(value)
    return space_name_error(space) or (key_error(key) if key != "" else None) \
        or (None if value is None else "a nop carries no value")                       # OP_NOP


def txn_envelope_error(replica_id: Any, lsn: Any, group: Any, ts: Any, ops: Any) -> str | None:
    """A transaction's envelope: replica id 0..replica_id_max, 1..txn_ops_max rows whose lsns
    lsn..lsn+n-1 are 1..lsn_max, a timestamp 0..timestamp_us_max µs, a known group."""
    if type(replica_id) is not int or type(lsn) is not int or type(ts) is not int:
        return "replica_id, lsn and timestamp are integers"
    t = type(ops)
    if (t is not list and t is not tuple) or not ops or len(ops) > _TXN_OPS_MAX:
        return f"a transaction has 1..{_TXN_OPS_MAX} rows"
    if not 0 <= replica_id <= _REPLICA_ID_MAX:
        return f"replica ids are 0..{_REPLICA_ID_MAX}, not {replica_id}"
    if lsn < 1 or lsn + len(ops) - 1 > _LSN_MAX:
        return f"row {replica_id}:{lsn}: lsns are 1..{_LSN_MAX}"
    if not 0 <= ts <= _TS_MAX:
        return f"row {replica_id}:{lsn}: timestamps are 0..{_TS_MAX} µs, not {ts}"
    if type(group) is not int or group not in _GROUPS_SET:
        return f"row {replica_id}:{lsn}: group {str(group)[:20]}"
    return None


def txn_group_error(group: int, kinds: list[int]) -> str | None:
    """`_cluster` rows travel alone, in group cluster (and group cluster holds nothing else)."""
    if (group == GROUP_CLUSTER) != all(k == OP_CLUSTER for k in kinds) or \
            (group != GROUP_CLUSTER and OP_CLUSTER in kinds):
        return "_cluster rows travel alone, in group cluster"
    return None


TXN_HEAD_BYTES_MAX = 1 + 5 + 9 + 1 + 9 + 5    # [replica_id, lsn, group, timestamp, ops-array head]


def txn_bytes_error(n: int) -> str | None:
    """A transaction that encodes to `n` bytes fits, alone, in one ROWS message (limits.py)."""
    if n > limits.txn_bytes_max:
        return f"encodes to {n} bytes, more than txn_bytes_max = {limits.txn_bytes_max}"
    return None


def check_txn_bytes(ops_bytes: int) -> None:
    """txn_bytes_error before encoding: a transaction whose ops encode to `ops_bytes` (a client's)."""
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
