"""The binary client protocol's wire format (node/clientproto/wire.py) and the SDK's mapping of
answers to exceptions (replog/errors.py), without a node."""
from __future__ import annotations

import struct

import msgpack
import pytest

import replog
from node import limits
from node.clientproto import wire
from replog.errors import from_answer


def test_frames_split_across_reads_and_several_per_read_come_out_whole_and_in_order():
    frames = [wire.encode_requests([[i, wire.PUT, "kv", f"k{i}", "v" * i]]) for i in range(50)]
    stream = b"".join(frames)
    r = wire.FrameReader(limits.client_frame_bytes_max)
    out = []
    for i in range(0, len(stream), 7):                  # 7-byte reads: lengths and bodies cut anywhere
        out += list(r.frames(stream[i:i + 7]))
    assert [wire.decode_requests(p, 10)[0][0] for p in out] == list(range(50)) and r.buffered == 0
    out = list(wire.FrameReader(1 << 20).frames(stream))
    assert len(out) == 50


def test_a_length_past_the_bound_is_refused_before_its_body_arrives():
    r = wire.FrameReader(100)
    with pytest.raises(wire.ProtocolError) as e:
        list(r.frames(struct.pack(">I", 101)))
    assert (e.value.status, e.value.code) == (413, "frame_too_large")
    ok = wire.FrameReader(100)
    assert list(ok.frames(struct.pack(">I", 100) + b"\x90" * 100))      # exactly the bound is accepted
    with pytest.raises(wire.ProtocolError):
        list(wire.FrameReader(100).frames(b"\x00\x00\x00\x00"))


@pytest.mark.parametrize("payload, code", [
    (b"\xc1", "bad_frame"), (msgpack.packb({}), "bad_frame"), (msgpack.packb([]), "bad_frame"),
    (msgpack.packb([[1, 2]] * 11), "frame_too_large"), (b"\x91" * 100_000 + b"\xc0", "bad_frame"),
    (msgpack.packb([msgpack.ExtType(3, b"")]), "bad_value"),
])
def test_frames_that_are_not_arrays_of_requests_are_protocol_errors(payload, code):
    with pytest.raises(wire.ProtocolError) as e:
        wire.decode_requests(payload, 10)
    assert e.value.code == code


def test_answers_round_trip_with_their_vclock():
    data = wire.encode_answers({"u": 3}, [(1, 200, 3), (2, 404, {"code": "no_such_key", "message": "m"})])
    payload = next(wire.FrameReader(1 << 20).frames(data))
    assert wire.decode_answers(payload) == ({"u": 3}, [[1, 200, 3], [2, 404, {"code": "no_such_key", "message": "m"}]])
    with pytest.raises(wire.ProtocolError):
        wire.decode_answers(msgpack.packb([1, 2, 3]))


@pytest.mark.parametrize("status, cls", [(400, replog.BadRequest), (413, replog.TooLarge), (403, replog.Forbidden),
                                         (401, replog.Unauthorized), (404, replog.NotFound), (409, replog.Conflict),
                                         (503, replog.Unavailable), (504, replog.Timeout), (500, replog.ServerError)])
def test_each_status_maps_to_its_exception_with_the_nodes_code(status, cls):
    e = from_answer(status, {"code": "some_code", "message": "why"}, "h:1")
    assert type(e) is cls and e.code == "some_code" and e.status == status and "why" in str(e) and e.address == "h:1"
    assert isinstance(e, replog.ReplogError)
    assert from_answer(status, {"error": {"code": "c", "message": "m"}}).code == "c"     # HTTP's body shape
