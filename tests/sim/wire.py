"""The simulated wire's decoding: node.core.messages.decode, which is pure, run once per
distinct message where the receivers only read what it gives (tests/sim/links.py decodes every
message it delivers through here; node/core/messages.py is the codec itself).

Rules kept here:
- A message whose decoding becomes the receiver's own (a snapshot's table and data, an ERROR
  turned into an exception) is decoded each time; so is a ROWS message the row scanner takes
  (its scan is the receiver's).
- The caches are bounded (DECODED_MAX, emptied when full): what they hold is only ever a copy
  of what decoding the same bytes again would give."""
from __future__ import annotations

from typing import Any, Callable

from node.core import messages as m

_DECODED: dict[bytes, m.Message] = {}
_DECLINED: set[bytes] = set()     # ROWS messages the row scanner declined (the plain decoding is theirs)
DECODED_MAX = 4096     # messages whose decoding is kept (the cache is emptied when full)
# the messages whose receivers only read them (a snapshot's table and data become the receiver's)
SHARED = frozenset((m.GREETING, m.SUBSCRIBE, m.SUBSCRIBED, m.ROWS, m.ACK, m.HEARTBEAT))


def decode(mtype: int, data: bytes, scan: Any) -> m.Message:
    """node.core.messages.decode, which is pure, run once per distinct message: the same ROWS
    message goes to every subscriber of a relay, the same greeting with every reconnect. (A
    message the row scanner takes is scanned each time: its scan is the receiver's. One it
    declined, a `_cluster` row in it, decodes as without a scanner: the scanner is pure too.)"""
    if mtype not in SHARED:
        return m.decode(data, scan)
    if scan is not None and data not in _DECLINED:
        msg = m.decode(data, scan)
        if "scan" in msg.body:
            return msg
        _keep(_DECLINED, data)
    else:
        msg = _DECODED.get(data)
        if msg is not None:
            return msg
        msg = m.decode(data)
    if data not in _DECODED:
        if len(_DECODED) >= DECODED_MAX:
            _DECODED.clear()
        _DECODED[data] = msg
    return msg


def encoded_once(cache: dict[int, tuple[Any, bytes]], obj: Any, encode: Callable[[Any], bytes], most: int) -> bytes:
    """`encode(obj)` for an object never changed once built (a greeting while it holds, a WAL
    entry), kept by the object's identity: `cache` holds at most `most`, emptied when full."""
    hit = cache.get(id(obj))
    if hit is None or hit[0] is not obj:
        if len(cache) >= most:
            cache.clear()
        hit = cache[id(obj)] = (obj, encode(obj))
    return hit[1]


def _keep(seen: set[bytes], data: bytes) -> None:
    if len(seen) >= DECODED_MAX:
        seen.clear()
    seen.add(data)
