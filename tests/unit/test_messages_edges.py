"""node/core/messages.py at its edges: the message size bound (the largest accepted, one past it),
the checks some messages get past their fields' types (REGISTERED's id, SUBSCRIBE's and ACK's
vclocks and flags), the ROWS paths (a scanner's, the fast decoder's, the exact one's) and what
each keeps when a ROWS message goes wrong part-way: the txns before the first bad one, never a
txn too large to travel alone. The fuzz tests (test_messages_fuzz.py) draw at random; these are
the cases they may not draw."""
import msgpack
import pytest

from node import limits
from node.core import codec, messages as m
from node.core.rows import GROUP_DEFAULT, OP_PUT, Op, Txn
from node.errors import RemoteProtocolError

UUID = "0000000a-0000-4000-8000-00000000000b"


def _txn(rid: int, lsn: int, value="v", ops: int = 1) -> Txn:
    return Txn(rid, lsn, GROUP_DEFAULT, 5, tuple(Op(OP_PUT, "s", f"k{i}", value) for i in range(ops)))


def _txn_of(rid: int, size: int) -> Txn:
    """A txn of puts whose encoding is exactly `size` bytes (values of at most value_bytes_max)."""
    value = "v" * (limits.value_bytes_max - 16)
    n = size // len(codec.pack(value)) + 1
    t = _txn(rid, 1, value, n)
    short = len(codec.pack(t)) - size          # take it off the last value (its head stays str32)
    t = t._replace(ops=t.ops[:-1] + (t.ops[-1]._replace(value=value[:len(value) - short]),))
    assert len(codec.pack(t)) == size
    return t


def _frame(*txns) -> bytes:
    return codec.pack([7, list(txns)])


def _error_message_of(size: int) -> bytes:
    """An ERROR message of exactly `size` bytes."""
    base = len(m.encode(m.ERROR, code="c", message=""))
    pad = size - base - 4                   # a str32 head is 5 bytes, fixstr's 1
    data = m.encode(m.ERROR, code="c", message="x" * pad)
    assert len(data) == size
    return data


def test_a_message_of_exactly_the_size_bound_is_decoded_and_one_byte_more_is_refused_naming_both():
    at = _error_message_of(limits.message_bytes_max)
    assert m.decode(at).type == m.ERROR
    with pytest.raises(RemoteProtocolError, match=f"{limits.message_bytes_max + 1} bytes exceeds "
                                                  f"{limits.message_bytes_max}"):
        m.decode(_error_message_of(limits.message_bytes_max + 1))


def test_a_bytearray_is_a_binary_message_too():
    data = m.encode(m.ERROR, code="c", message="why")
    assert m.decode(bytearray(data)).body == {"code": "c", "message": "why"}


@pytest.mark.parametrize("rid, ok", [(1, True), (limits.replica_id_max, True), (0, False),
                                     (limits.replica_id_max + 1, False)])
def test_registered_names_an_id_within_the_id_range(rid, ok):
    data = m.encode(m.REGISTERED, id=rid)
    if ok:
        assert m.decode(data)["id"] == rid
    else:
        with pytest.raises(RemoteProtocolError, match="REGISTERED: id out of range"):
            m.decode(data)


@pytest.mark.parametrize("body, ok", [
    ({"vclock": {1: 2}}, True),
    ({"vclock": {1: 2}, "durable": {1: 1}}, True),
    ({"vclock": {1: 2}, "durable": {1: 1}, "own_rows": True}, True),
    ({"vclock": {1: 2}, "own_rows": False}, True),
    ({"vclock": {-1: 2}}, False),
    ({"vclock": {1: 2}, "durable": {1: -1}}, False),
    ({"vclock": {1: 2}, "durable": [1]}, False),
    ({"vclock": {1: 2}, "own_rows": 1}, False),
    ({"vclock": {1: 2}, "own_rows": None}, False),
])
def test_a_subscribe_carries_bounded_vclocks_and_a_boolean_own_rows(body, ok):
    data = m.encode(m.SUBSCRIBE, **body)
    if ok:
        assert m.decode(data).body == body
    else:
        with pytest.raises(RemoteProtocolError, match="SUBSCRIBE"):
            m.decode(data)


@pytest.mark.parametrize("body, ok", [
    ({"vclock": {1: 2}}, True), ({"vclock": {1: 2}, "durable": {1: 2}}, True),
    ({"vclock": {1: "2"}}, False), ({"vclock": {1: 2}, "durable": {"1": 2}}, False),
])
def test_an_ack_carries_bounded_vclocks(body, ok):
    data = m.encode(m.ACK, **body)
    if ok:
        assert m.decode(data).body == body
    else:
        with pytest.raises(RemoteProtocolError, match="ACK"):
            m.decode(data)


def test_subscribed_carries_a_bounded_vclock():
    assert m.decode(m.encode(m.SUBSCRIBED, vclock={2: 3})).body == {"vclock": {2: 3}}
    with pytest.raises(RemoteProtocolError, match="SUBSCRIBED"):
        m.decode(m.encode(m.SUBSCRIBED, vclock={2: limits.lsn_max + 1}))


def test_a_field_of_the_wrong_type_or_missing_is_refused_naming_the_message_and_field():
    with pytest.raises(RemoteProtocolError, match="HEARTBEAT: field 'now_us' missing"):
        m.decode(m.encode(m.HEARTBEAT))
    with pytest.raises(RemoteProtocolError, match="REGISTERED: field 'id'"):
        m.decode(m.encode(m.REGISTERED, id=True))
    assert m.decode(m.encode(m.HEARTBEAT, now_us=0))["now_us"] == 0


def test_an_unknown_message_type_is_refused_by_its_number():
    with pytest.raises(RemoteProtocolError, match="unknown message type 99"):
        m.decode(msgpack.packb([99, {}]))
    with pytest.raises(RemoteProtocolError, match=r"not \[type, \{body\}\]"):
        m.decode(msgpack.packb([m.HELLO, [1]]))
    with pytest.raises(AssertionError):
        m.encode(99)


def test_a_message_answers_its_name_and_its_fields():
    msg = m.decode(m.encode(m.HEARTBEAT, now_us=4, extra="x"))
    assert msg.name == "HEARTBEAT" and msg["now_us"] == 4 and msg.get("extra") == "x"
    assert msg.get("absent") is None and msg.get("absent", 3) == 3
    assert m.Message(77, {}).name == "77"


def test_a_vclock_from_the_wire_drops_zero_components_and_refuses_a_bad_one():
    assert m.vclock_from_wire({1: 0, 2: 5, 0: 3}) == {2: 5, 0: 3}
    with pytest.raises(RemoteProtocolError, match="malformed vclock"):
        m.vclock_from_wire({1: -1})


# --- ROWS ------------------------------------------------------------------------------------
def test_rows_spliced_from_frames_are_the_rows_message_encode_writes():
    frames = [_frame(_txn(1, 1)), _frame(_txn(1, 2), _txn(2, 1))]
    data = m.encode_rows(frames)
    assert data == m.encode(m.ROWS, frames=[msgpack.unpackb(f) for f in frames])
    assert b"".join(m.rows_parts(frames)) == data
    out = m.decode(data)
    assert out.type == m.ROWS and out["txns"] == [_txn(1, 1), _txn(1, 2), _txn(2, 1)] and out["error"] is None
    assert m.decode(m.encode_rows([]))["txns"] == []


def test_a_scanner_gets_a_rows_message_and_its_scan_is_the_body():
    data = m.encode_rows([_frame(_txn(1, 1))])
    seen = []
    out = m.decode(data, lambda d: seen.append(d) or "scanned")
    assert seen == [data] and out.type == m.ROWS and out.body == {"scan": "scanned", "data": data}


def test_a_rows_message_the_scanner_declines_is_decoded_into_txns():
    data = m.encode_rows([_frame(_txn(1, 1))])
    out = m.decode(data, lambda d: None)
    assert out["txns"] == [_txn(1, 1)] and "scan" not in out.body


def test_a_scanner_is_never_handed_a_message_that_is_not_rows():
    def scanner(d):
        raise AssertionError("scanned a message that is not ROWS")
    assert m.decode(m.encode(m.HEARTBEAT, now_us=1), scanner).type == m.HEARTBEAT


def test_rows_the_fast_decoder_refuses_are_decoded_exactly_up_to_the_first_bad_txn():
    good, bad = _txn(1, 1), [1, 2, GROUP_DEFAULT, 5, [[OP_PUT, "s", "", "v"]]]     # an empty key
    data = m.encode(m.ROWS, frames=[[7, [good.to_wire(), bad, _txn(1, 3).to_wire()]]])
    out = m.decode(data)
    assert out["txns"] == [good]
    assert isinstance(out["error"], RemoteProtocolError) and "malformed row" in str(out["error"])


def test_a_bad_txn_in_a_later_frame_keeps_every_txn_of_the_frames_before():
    bad = [1, 3, GROUP_DEFAULT, 5, [[OP_PUT, "s", "", "v"]]]
    data = m.encode(m.ROWS, frames=[[7, [_txn(1, 1).to_wire()]], [8, [_txn(1, 2).to_wire(), bad]],
                                    [9, [_txn(1, 4).to_wire()]]])
    out = m.decode(data)
    assert out["txns"] == [_txn(1, 1), _txn(1, 2)] and out["error"] is not None


def test_an_undecodable_frame_keeps_the_txns_before_it_and_names_the_damage():
    data = m.encode(m.ROWS, frames=[[7, [_txn(1, 1).to_wire()]], "junk", [9, [_txn(1, 2).to_wire()]]])
    out = m.decode(data)
    assert out["txns"] == [_txn(1, 1)]
    assert "undecodable ROWS frame" in str(out["error"])


def _oversized_rows(exact: bool) -> tuple[bytes, Txn, Txn]:
    """A ROWS message of a small txn, then one whose encoding passes txn_bytes_max (only a message
    larger than that bound can hold it), then a small one. `exact`: with a txn the fast decoder
    leaves to the exact path (a space row) in front, so the exact path sizes them."""
    big = _txn_of(2, limits.txn_bytes_max + 1)
    small = _txn(1, 1)
    first = [small.to_wire()] if not exact else [
        [1, 1, GROUP_DEFAULT, 5, [[3, "s", "", {"local": False, "conflict": "lww"}]]]]
    data = m.encode(m.ROWS, frames=[[7, first + [big.to_wire(), _txn(3, 1).to_wire()]]])
    assert limits.txn_bytes_max < len(data) <= limits.message_bytes_max
    return data, small, big


@pytest.mark.parametrize("exact", [False, True], ids=["fast", "exact"])
def test_a_txn_too_large_to_travel_alone_is_cut_off_with_what_follows_it(exact):
    data, small, big = _oversized_rows(exact)
    out = m.decode(data)
    assert len(out["txns"]) == 1 and out["txns"][0].replica_id == 1
    assert f"txn 2:1 encodes to {len(codec.pack(big))} bytes" in str(out["error"])


def test_a_rows_message_of_exactly_txn_bytes_max_keeps_its_txn_whole():
    """A message no larger than txn_bytes_max cannot hold a txn past it: nothing is cut."""
    big = _txn_of(2, limits.txn_bytes_max - 14)      # the ROWS framing around it is 14 bytes
    data = m.encode(m.ROWS, frames=[[7, [big.to_wire()]]])
    assert len(data) == limits.txn_bytes_max
    out = m.decode(data)
    assert out["txns"] == [big] and out["error"] is None


@pytest.mark.parametrize("scanner", [None, "reference", "native"])
def test_a_rows_message_holding_a_string_that_is_not_utf8_is_refused_as_a_protocol_error(scanner):
    """The fast decoder raises UnicodeDecodeError for such a str; it must end as the link's
    RemoteProtocolError (a retry), never escape decode (the applier would take it for a bug of
    ours and stop for good)."""
    from node.core import rowscan
    if scanner == "native" and rowscan.native is None:
        pytest.skip("the native row scanner is not built here")
    scan = {None: None, "reference": rowscan.scan_rows_py, "native": rowscan.scan_rows}[scanner]
    good = m.encode_rows([msgpack.packb([0, [[1, 1, 0, 5, [[1, "kv", "k", "x"]]]]])])
    assert m.decode(good, scan).type == m.ROWS
    bad = good.replace(b"\xa1x", b"\xa1\xc1")          # "x" -> a lone 0xc1, no UTF-8 at all
    with pytest.raises(RemoteProtocolError, match="UnicodeDecodeError"):
        m.decode(bad, scan)
