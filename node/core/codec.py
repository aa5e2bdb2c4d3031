"""msgpack encoding for the hot paths (WAL frames, store records).

msgspec's encoder writes, byte for byte, what `msgpack.Packer(use_bin_type=True)` writes for
every value replog stores — None, bools, ints, floats, str, bytes, lists, tuples, dicts and
msgpack Timestamps (through the hook) — and packs NamedTuple rows ~5x faster. Stored values
are never other msgpack extension types: every decoder of outside input refuses them with
`refuse_ext` (msgpack's ExtType is a namedtuple, which msgspec would write as an array).
Decoding stays with msgpack (and node.core.rows' checked fast path for frames): `unpack` reads
stored records and meta values."""
from __future__ import annotations

from typing import Any

import msgpack
import msgspec

_Ext = msgspec.msgpack.Ext


class ExtTypeRefused(ValueError):
    pass


def refuse_ext(code: int, data: bytes) -> Any:
    """msgpack `ext_hook` for outside input (timestamps, type -1, never reach it)."""
    raise ExtTypeRefused(f"msgpack extension type {code} is not a storable value")


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, msgpack.Timestamp):
        return _Ext(-1, obj.to_bytes())
    raise TypeError(f"can not serialize {type(obj).__name__!r} object")


pack = msgspec.msgpack.Encoder(enc_hook=_enc_hook).encode


def array_head(n: int) -> bytes:
    """The header of an array of n items as `pack` writes it (for splicing packed items after it)."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def unpack(b: bytes) -> Any:
    """A stored record or meta value (written by `pack`)."""
    return msgpack.unpackb(b, raw=False, strict_map_key=False)
