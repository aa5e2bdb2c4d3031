"""WAL on-disk format: segment headers and frames. Pure encoding; no files opened here.

A segment file is named `<signature:020d>.wal` after the vclock signature at its start and is:

    header:  SEGMENT_MAGIC(8) | length u32 | crc32c u32 | msgpack {version, uuid, vclock, cluster, created_s}
    frames:  FRAME_MAGIC(4)   | length u32 | crc32c u32 | msgpack [written_us, [txn, ...]]

All integers are little-endian. A frame holds one WAL write unit: a local transaction, or a
remote transaction together with the `_cluster` rows its applier wrote for it, so those are
atomic. `written_us` is this node's wall clock when it wrote the frame (the analysis
uses it for replication delay). `cluster` in the header is this node's `_cluster` at the segment's start, as
[[uuid, id, address, state], ...], so a segment can be read without any other file."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import crc32c as _crc
import msgpack

from node import limits
from node.core import codec

FORMAT_VERSION = 1
SEGMENT_MAGIC = b"RPLGWAL1"
FRAME_MAGIC = b"\xd5\x1a\x7e\x01"
_HDR = struct.Struct("<II")          # length, crc32c
FRAME_OVERHEAD = len(FRAME_MAGIC) + _HDR.size
SEGMENT_SUFFIX = ".wal"


def crc32c(data: bytes) -> int:
    return _crc.crc32c(data)


def segment_name(signature: int) -> str:
    return f"{signature:020d}{SEGMENT_SUFFIX}"


def segment_signature(name: str) -> int:
    return int(name[: -len(SEGMENT_SUFFIX)])


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    version: int
    uuid: str
    vclock: dict[int, int]
    cluster: list[list[Any]]         # [[uuid, id, address, state], ...]
    created_s: float

    def to_bytes(self) -> bytes:
        body = msgpack.packb(
            {"version": self.version, "uuid": self.uuid, "vclock": self.vclock,
             "cluster": self.cluster, "created_s": self.created_s},
            use_bin_type=True,
        )
        assert len(body) <= limits.segment_header_bytes_max
        return SEGMENT_MAGIC + _HDR.pack(len(body), crc32c(body)) + body


class FormatError(Exception):
    """Bytes that are not a valid header or frame; `offset` is where reading stopped."""

    def __init__(self, message: str, offset: int, torn: bool):
        super().__init__(message)
        self.offset = offset
        self.torn = torn              # True: the data ends early (a torn write), not corrupt


def decode_header(buf: bytes) -> tuple[SegmentHeader, int]:
    """Parse the segment header at the start of buf; returns it and the offset after it."""
    n = len(SEGMENT_MAGIC) + _HDR.size
    if len(buf) < n:
        raise FormatError("segment header is truncated", 0, torn=True)
    if buf[: len(SEGMENT_MAGIC)] != SEGMENT_MAGIC:
        raise FormatError("not a replog WAL segment (bad magic)", 0, torn=False)
    length, crc = _HDR.unpack_from(buf, len(SEGMENT_MAGIC))
    if length > limits.segment_header_bytes_max:
        raise FormatError(f"segment header length {length} is too large", 0, torn=False)
    if len(buf) < n + length:
        raise FormatError("segment header is truncated", 0, torn=True)
    body = bytes(buf[n : n + length])
    if crc32c(body) != crc:
        raise FormatError("segment header checksum mismatch", 0, torn=False)
    d = msgpack.unpackb(body, raw=False, strict_map_key=False)
    hdr = SegmentHeader(
        version=d["version"], uuid=d["uuid"],
        vclock={int(k): int(v) for k, v in d["vclock"].items()},
        cluster=[list(m) for m in d["cluster"]], created_s=float(d.get("created_s", 0.0)),
    )
    if hdr.version != FORMAT_VERSION:
        raise FormatError(f"unsupported WAL format version {hdr.version}", 0, torn=False)
    return hdr, n + length


def encode_frame(txns_wire: list, written_us: int) -> bytes:
    body = codec.pack([written_us, txns_wire])
    assert len(body) <= limits.frame_bytes_max, "frame too large"
    return FRAME_MAGIC + _HDR.pack(len(body), crc32c(body)) + body


def encode_frame_body(body: bytes) -> bytes:
    """Frame an already-packed msgpack list of txns."""
    assert len(body) <= limits.frame_bytes_max, "frame too large"
    return FRAME_MAGIC + _HDR.pack(len(body), crc32c(body)) + body


def decode_frame(buf: bytes | memoryview, offset: int) -> tuple[bytes, int]:
    """Read the frame at offset; returns (msgpack payload, offset after the frame).

    Raises FormatError(torn=True) if the buffer ends inside the frame, torn=False if the
    frame is damaged (bad magic, impossible length or checksum mismatch)."""
    end = len(buf)
    if end - offset < FRAME_OVERHEAD:
        raise FormatError(f"frame header truncated at byte {offset}", offset, torn=True)
    if bytes(buf[offset : offset + 4]) != FRAME_MAGIC:
        raise FormatError(f"bad frame magic at byte {offset}", offset, torn=False)
    length, crc = _HDR.unpack_from(buf, offset + 4)
    if length > limits.frame_bytes_max:
        raise FormatError(f"impossible frame length {length} at byte {offset}", offset, torn=False)
    start = offset + FRAME_OVERHEAD
    if end - start < length:
        raise FormatError(f"frame at byte {offset} truncated ({end - start} of {length} bytes)", offset, torn=True)
    body = bytes(buf[start : start + length])
    if crc32c(body) != crc:
        raise FormatError(f"frame checksum mismatch at byte {offset}", offset, torn=False)
    return body, start + length


def unpack_frame(body: bytes) -> tuple[int, list]:
    """(written_us, [txn wire, ...]) of a frame payload."""
    d = msgpack.unpackb(body, raw=False, strict_map_key=False, use_list=True)
    if not isinstance(d, list) or len(d) != 2 or not isinstance(d[0], int) or not isinstance(d[1], list):
        raise FormatError("frame payload is not [written_us, txns]", 0, torn=False)
    return d[0], d[1]
