"""JSON answers, for every value a store may hold.

Values written under today's rules (node/core/validate.py) are JSON as they are. A store or WAL
from before those rules may hold values JSON cannot carry — "legacy values", accepted by
recovery and snapshots because they were acknowledged. A read must never fail on them, so
they are rendered by a fixed, documented fallback (docs/limits.md):
  - binary data              -> {"$base64": "<standard base64>"}
  - a msgpack timestamp      -> {"$timestamp": "<RFC 3339, UTC, nanoseconds>"} (outside years
                                1..9999: "<seconds>.<nanoseconds>" since the epoch)
  - NaN, Infinity, -Infinity -> the strings "NaN", "Infinity", "-Infinity"
  - a map key that is not a string: its JSON text (1 -> "1", true -> "true", null -> "null",
    binary -> its base64, a float -> its repr)
The msgpack encoding of answers carries all of them unchanged. The walk is iterative: a stored
value came from outside once."""
from __future__ import annotations

import base64
import datetime
import json
import math
from typing import Any

import msgpack

_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode


def dumps(data: Any) -> str:
    """`data` as JSON text; legacy values by the fallback above."""
    try:
        return _encode(data)
    except (TypeError, ValueError, RecursionError):
        return _encode(json_safe(data))


def _scalar(x: Any) -> Any:
    t = type(x)
    if t is bytes:
        return {"$base64": base64.b64encode(x).decode()}
    if t is msgpack.Timestamp:
        try:
            dt = datetime.datetime.fromtimestamp(x.seconds, datetime.timezone.utc)
            return {"$timestamp": dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{x.nanoseconds:09d}Z"}
        except (ValueError, OverflowError, OSError):        # past year 9999 or before year 1
            return {"$timestamp": f"{x.seconds}.{x.nanoseconds:09d}"}
    if t is float and not math.isfinite(x):
        return "NaN" if x != x else "Infinity" if x > 0 else "-Infinity"
    if t in (str, int, float, bool) or x is None:
        return x
    return repr(x)                    # nothing a decoder of ours makes; never fail a read on it


def _key(k: Any) -> str:
    if type(k) is str:
        return k
    if type(k) is bytes:
        return base64.b64encode(k).decode()
    v = _scalar(k)
    return v if type(v) is str else json.dumps(v)


def json_safe(v: Any) -> Any:
    """A copy of v that JSON carries (the fallback of the module comment), built without recursion."""
    root: list = [None]
    stack: list[tuple[Any, Any, Any]] = [(v, root, 0)]     # (value, where its copy goes, at which key)
    while stack:
        x, parent, at = stack.pop()
        t = type(x)
        if t is dict:
            out: Any = {}
            for k, y in x.items():
                out[_key(k)] = None
                stack.append((y, out, _key(k)))
        elif t is list or t is tuple:
            out = [None] * len(x)
            stack.extend((y, out, i) for i, y in enumerate(x))
        else:
            out = _scalar(x)
        parent[at] = out
    return root[0]
