"""node/wal/format.py on its own: what a segment header and a frame look like on disk, and how
damage is told apart from a torn write. Recovery trusts the `torn` flag: torn (the bytes end
early) is an unacknowledged write it may cut off at the end of the WAL; not torn (wrong bytes)
is damage it must refuse or skip loudly. So every way of failing is pinned with its flag."""
from __future__ import annotations

import struct

import msgpack
import pytest

from node import limits
from node.core import codec
from node.wal import format as fmt

HEADER = fmt.SegmentHeader(version=fmt.FORMAT_VERSION, uuid="u-1", vclock={1: 5, 2: 7},
                           cluster=[["u-1", 1, "127.0.0.1:1", "member"]], created_s=12.5)
PREFIX = len(fmt.SEGMENT_MAGIC) + 8


def _header_with(body: dict) -> bytes:
    raw = msgpack.packb(body, use_bin_type=True)
    return fmt.SEGMENT_MAGIC + struct.pack("<II", len(raw), fmt.crc32c(raw)) + raw


def _fails(fn, *args) -> fmt.FormatError:
    with pytest.raises(fmt.FormatError) as e:
        fn(*args)
    return e.value


# --- names ------------------------------------------------------------------------------
def test_a_segment_is_named_by_its_zero_padded_signature_and_the_name_reads_back():
    assert fmt.segment_name(42) == "00000000000000000042.wal"
    assert fmt.segment_signature(fmt.segment_name(0)) == 0
    assert fmt.segment_signature(fmt.segment_name(10**19 + 7)) == 10**19 + 7
    # names sort as their signatures do
    names = [fmt.segment_name(s) for s in (9, 10, 100, 99)]
    assert sorted(names) == [fmt.segment_name(s) for s in (9, 10, 99, 100)]


# --- the header ---------------------------------------------------------------------------
def test_a_header_round_trips_and_says_where_the_frames_begin():
    raw = HEADER.to_bytes()
    hdr, end = fmt.decode_header(raw + b"frames follow")
    assert hdr == HEADER and end == len(raw)
    assert raw[:8] == fmt.SEGMENT_MAGIC
    length, crc = struct.unpack_from("<II", raw, 8)
    assert length == len(raw) - PREFIX and crc == fmt.crc32c(raw[PREFIX:])


def test_a_header_without_created_s_reads_as_zero():
    body = {"version": fmt.FORMAT_VERSION, "uuid": "u", "vclock": {}, "cluster": []}
    hdr, _ = fmt.decode_header(_header_with(body))
    assert hdr.created_s == 0.0 and hdr.vclock == {} and hdr.cluster == []


def test_a_header_of_another_format_version_is_refused_as_damage_not_a_torn_write():
    for version in (fmt.FORMAT_VERSION + 1, fmt.FORMAT_VERSION - 1):
        body = {"version": version, "uuid": "u", "vclock": {}, "cluster": [], "created_s": 1.0}
        e = _fails(fmt.decode_header, _header_with(body))
        assert "version" in str(e) and str(version) in str(e) and e.torn is False and e.offset == 0


def test_a_header_cut_anywhere_is_torn():
    raw = HEADER.to_bytes()
    for cut in range(len(raw)):
        e = _fails(fmt.decode_header, raw[:cut])
        assert e.torn is True and e.offset == 0, cut


def test_a_header_with_wrong_bytes_is_damage():
    raw = bytearray(HEADER.to_bytes())
    bad_magic = b"X" + bytes(raw[1:])
    e = _fails(fmt.decode_header, bad_magic)
    assert e.torn is False and "magic" in str(e)
    flipped = bytes(raw[:-1]) + bytes([raw[-1] ^ 1])
    e = _fails(fmt.decode_header, flipped)
    assert e.torn is False and "checksum" in str(e)


def test_a_header_length_past_the_bound_is_damage_even_when_the_bytes_end_early():
    over = fmt.SEGMENT_MAGIC + struct.pack("<II", limits.segment_header_bytes_max + 1, 0)
    e = _fails(fmt.decode_header, over)
    assert e.torn is False and "too large" in str(e)
    # the largest length accepted is only torn while its bytes are missing
    at = fmt.SEGMENT_MAGIC + struct.pack("<II", limits.segment_header_bytes_max, 0)
    assert _fails(fmt.decode_header, at).torn is True


# --- frames --------------------------------------------------------------------------------
def _frame(payload: list) -> bytes:
    return fmt.encode_frame(payload, 1234)


def test_a_frame_round_trips_and_reports_the_offset_after_it():
    txns = [[1, 1, 0, 5, [[1, "s", "k", "v"]]]]
    a, b = _frame(txns), fmt.encode_frame_body(codec.pack([99, []]))
    buf = b"head" + a + b
    body, end = fmt.decode_frame(buf, 4)
    assert end == 4 + len(a) and fmt.unpack_frame(body) == (1234, txns)
    body2, end2 = fmt.decode_frame(memoryview(buf), end)
    assert end2 == len(buf) and fmt.unpack_frame(body2) == (99, [])
    assert len(a) == fmt.FRAME_OVERHEAD + len(body)


def test_a_frame_cut_anywhere_is_torn_at_its_start():
    f = _frame([[1, 1, 0, 5, [[1, "s", "k", "v" * 40]]]])
    for cut in range(len(f)):
        e = _fails(fmt.decode_frame, b"xx" + f[:cut], 2)
        assert e.torn is True and e.offset == 2, cut


def test_a_frame_with_wrong_bytes_is_damage_at_its_start():
    f = bytearray(_frame([[1, 1, 0, 5, [[1, "s", "k", "v"]]]]))
    bad_magic = bytes([f[0] ^ 0xFF]) + bytes(f[1:])
    e = _fails(fmt.decode_frame, b"x" + bad_magic, 1)
    assert (e.torn, e.offset) == (False, 1) and "magic" in str(e)
    flipped = bytes(f[:-1]) + bytes([f[-1] ^ 1])
    e = _fails(fmt.decode_frame, flipped, 0)
    assert (e.torn, e.offset) == (False, 0) and "checksum" in str(e)
    huge = fmt.FRAME_MAGIC + struct.pack("<II", limits.frame_bytes_max + 1, 0)
    e = _fails(fmt.decode_frame, huge, 0)
    assert e.torn is False and "impossible" in str(e)
    at_bound = fmt.FRAME_MAGIC + struct.pack("<II", limits.frame_bytes_max, 0)
    assert _fails(fmt.decode_frame, at_bound, 0).torn is True


def test_frames_past_the_bound_are_never_written():
    assert len(fmt.encode_frame_body(b"\x90" * limits.frame_bytes_max)) == limits.frame_bytes_max + fmt.FRAME_OVERHEAD
    with pytest.raises(AssertionError):
        fmt.encode_frame_body(b"\x90" * (limits.frame_bytes_max + 1))
    with pytest.raises(AssertionError):
        fmt.encode_frame(["x" * limits.frame_bytes_max], 1)


@pytest.mark.parametrize("payload", [[1], [1, [], 3], {"a": 1}, ["1", []], [1, "txns"], 7])
def test_a_frame_payload_that_is_not_written_us_and_a_txn_list_is_refused(payload):
    e = _fails(fmt.unpack_frame, msgpack.packb(payload))
    assert e.torn is False


# --- what mutation testing found unpinned (issue 18) -----------------------------------------
def test_segments_are_written_and_read_as_format_version_1_so_existing_wals_stay_readable():
    """The version number is on disk: a change of it is a format change (docs/upgrade.md), never a
    side effect. A header of version 1, packed by hand, reads; what this code writes says 1."""
    body = {"version": 1, "uuid": "u", "vclock": {3: 9}, "cluster": [["u", 1, "", "member"]], "created_s": 2.0}
    hdr, _ = fmt.decode_header(_header_with(body))
    assert hdr.version == 1 and hdr.vclock == {3: 9}
    written = HEADER.to_bytes()
    assert msgpack.unpackb(written[PREFIX:], strict_map_key=False)["version"] == 1


def test_every_damaged_header_is_reported_at_offset_zero_with_its_message():
    raw = HEADER.to_bytes()
    cases = {
        "bad magic": b"X" + raw[1:],
        "too large": fmt.SEGMENT_MAGIC + struct.pack("<II", limits.segment_header_bytes_max + 1, 0),
        "checksum mismatch": raw[:-1] + bytes([raw[-1] ^ 1]),
    }
    for words, buf in cases.items():
        e = _fails(fmt.decode_header, buf)
        assert (e.offset, e.torn) == (0, False) and words in str(e) and e.args == (str(e),), words


def test_a_header_of_exactly_the_bound_is_written_and_one_byte_more_is_not():
    def header_of(size: int) -> fmt.SegmentHeader:
        pad = 0
        while True:
            h = fmt.SegmentHeader(1, "u", {}, [["u", 1, "x" * pad, "member"]], 0.0)
            n = len(msgpack.packb({"version": 1, "uuid": "u", "vclock": {}, "cluster": h.cluster,
                                   "created_s": 0.0}, use_bin_type=True))
            if n >= size:
                assert n == size, "the padding steps by one byte here"
                return h
            pad += max(1, (size - n) // 2)
    at = header_of(limits.segment_header_bytes_max)
    raw = at.to_bytes()
    assert len(raw) == PREFIX + limits.segment_header_bytes_max and fmt.decode_header(raw)[0] == at
    with pytest.raises(AssertionError):
        header_of(limits.segment_header_bytes_max + 1).to_bytes()


def test_a_frame_body_of_exactly_the_bound_is_framed_by_either_encoder():
    body = codec.pack([1, ["x" * (limits.frame_bytes_max - 16)]])
    body = codec.pack([1, ["x" * (limits.frame_bytes_max - 16 + limits.frame_bytes_max - len(body))]])
    assert len(body) == limits.frame_bytes_max
    framed = fmt.encode_frame_body(body)
    assert fmt.decode_frame(framed, 0) == (body, len(framed))
    assert fmt.encode_frame(msgpack.unpackb(body)[1], 1) == framed


def test_a_frame_holding_a_value_with_integer_map_keys_reads_back():
    """Clients may store maps keyed by integers (msgpack allows it, the client protocol accepts
    it): such a row must read back from the WAL, not make its frame unreadable."""
    txns = [[1, 1, 0, 5, [[1, "s", "k", {1: "one", 2: [3]}]]]]
    body, _ = fmt.decode_frame(_frame(txns), 0)
    assert fmt.unpack_frame(body) == (1234, txns)


def test_a_frame_payload_of_the_wrong_shape_says_so_at_offset_zero():
    e = _fails(fmt.unpack_frame, msgpack.packb([1]))
    assert e.offset == 0 and "written_us" in str(e)
