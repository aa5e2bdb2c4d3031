"""The relay filter: what a subscriber gets of each WAL frame, and how frames become ROWS
messages. Pure; the relay's WAL cursor (node/applier/walcursor.py) reads the frames.

Rules kept here:
- Rows go out in the relay's ids, in WAL order, whole transactions, never rows of local
  spaces, never a subscriber's own rows past the cut it subscribed with (`relay_wants`).
- A frame every txn of which goes is sent as stored (the bytes the WAL holds); one some of
  whose txns go is re-packed; one none of whose txns go is not sent.
- No ROWS message is over message_bytes_max: frames share a message up to
  relay_batch_bytes_max, a larger frame goes alone, split into whole txns when even alone it
  would not fit."""
from __future__ import annotations

import msgpack

from node import limits
from node.core.replicaset import relay_wants
from node.core.rowscan import PackedEntry
from node.errors import PeerRefused
from node.wal import format as walfmt

_pack = msgpack.Packer(use_bin_type=True).pack

FRAME_ALONE_BYTES_MAX = limits.message_bytes_max - limits.message_margin_bytes   # a frame this size fits a message


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
        for p in (f,) if len(f) <= FRAME_ALONE_BYTES_MAX else _split(f):
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
        if n > FRAME_ALONE_BYTES_MAX - 32:
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


def frame_for(body: bytes, written_us: int, entry, sub: dict[int, int],
              own: tuple[int, int] | None) -> tuple[bytes | None, int]:
    """What a subscriber at `sub` (and `own`: relay_wants) gets of one WAL frame (payload
    `body`, its txns `entry`: a list, or a journal PackedEntry): the payload itself if it
    wants every txn, re-packed if some, None if none; and the rows that go."""
    if type(entry) is PackedEntry:
        every = entry.wanted(sub, own)
        if every is not None:
            return (body, entry.rows) if every else (None, 0)
        entry = entry.txns
    keep = [t for t in entry if relay_wants(t, sub, own)]
    if not keep:
        return None, 0
    rows = sum([len(t[4]) for t in keep])
    return (body if len(keep) == len(entry) else _pack([written_us, keep])), rows
