"""How the frames a subscriber gets become ROWS messages. Pure; the relay's WAL cursor
(node/applier/walcursor.py) reads the frames, and each entry says what a subscriber gets of
its frame (node.core.entry `relay_frame`, by `relay_wants`: the relay's ids, WAL order, whole
transactions, no local spaces, no own rows past the subscriber's cut; a frame sent as stored
when every txn goes, re-packed when some do).

Rules kept here:
- No ROWS message is over message_bytes_max: frames share a message up to
  relay_batch_bytes_max, a larger frame goes alone, split into whole txns when even alone it
  would not fit."""
from __future__ import annotations

import msgpack

from node import limits
from node.errors import PeerRefused
from node.wal import format as walfmt

_pack = msgpack.Packer(use_bin_type=True).pack



def rows_batches(frames: list) -> list[list]:
    """The frames (payloads) of ROWS messages carrying `frames` in order, none over
    message_bytes_max: frames share a message up to relay_batch_bytes_max; a larger one goes alone,
    split into several payloads of whole txns when even alone it would not fit (one txn always
    fits: txn_bytes_max, checked before the WAL). A txn larger than that can only be one an earlier
    version wrote: it cannot be sent, and the link stops saying so."""
    out: list[list] = []
    group: list = []
    size = 0
    for f in frames:
        for p in (f,) if len(f) <= limits.relay_frame_alone_bytes_max else _split(f):
            if group and size + len(p) > limits.relay_batch_bytes_max:
                out.append(group)
                group, size = [], 0
            group.append(p)
            size += len(p)
    if group:
        out.append(group)
    return out


def _split(payload) -> list[bytes]:
    written_us, txns = walfmt.unpack_frame(payload)
    pieces: list[bytes] = []
    chunk: list = []
    size = 0
    for t in txns:
        n = len(_pack(t))
        if n > limits.txn_bytes_max:
            raise PeerRefused("txn_too_large", f"txn {t[0]}:{t[1]} in this node's WAL encodes to {n} bytes, "
                              f"more than one message carries: written before txn_bytes_max was checked, "
                              "it cannot be replicated")
        if chunk and size + n > limits.relay_batch_bytes_max:
            pieces.append(_pack([written_us, chunk]))
            chunk, size = [], 0
        chunk.append(t)
        size += n
    if chunk:
        pieces.append(_pack([written_us, chunk]))
    return pieces
