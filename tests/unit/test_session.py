"""Session-bound authentication (node/core/session.py): the proofs bind the whole transcript and
the role, the session keys bind the direction, and every sealed message is accepted once, in
order, in its own session and direction only."""
import os

import pytest

from node.core import messages as m
from node.core import rowscan
from node.core import session as sess
from node.core.codec import pack
from node.core.rows import GROUP_DEFAULT, OP_PUT
from node.errors import RemoteProtocolError

SECRET = b"cluster secret"
S_UUID, C_UUID = "5e1f0000-0000-4000-8000-000000000001", "c11e0000-0000-4000-8000-000000000002"


def handshake(secret_c: bytes = SECRET, secret_s: bytes = SECRET):
    """Both sides of one handshake: (client session, server session)."""
    sn, cn = os.urandom(sess.NONCE_BYTES), os.urandom(sess.NONCE_BYTES)
    t = sess.transcript(m.PROTOCOL_VERSION, sn, S_UUID, cn, C_UUID)
    assert sess.proof_ok(secret_s, sess.CLIENT, t, sess.proof(secret_c, sess.CLIENT, t))
    assert sess.proof_ok(secret_c, sess.SERVER, t, sess.proof(secret_s, sess.SERVER, t))
    return sess.Session(secret_c, t, sess.CLIENT, S_UUID), sess.Session(secret_s, t, sess.SERVER, C_UUID)


def test_a_proof_is_valid_only_for_its_secret_role_and_every_field_of_its_transcript():
    sn, cn = os.urandom(32), os.urandom(32)
    t = sess.transcript(2, sn, S_UUID, cn, C_UUID)
    mac = sess.proof(SECRET, sess.CLIENT, t)
    assert sess.proof_ok(SECRET, sess.CLIENT, t, mac)
    assert not sess.proof_ok(b"other secret", sess.CLIENT, t, mac)
    assert not sess.proof_ok(SECRET, sess.SERVER, t, mac), "a client proof must not pass as the server's"
    for other in (sess.transcript(1, sn, S_UUID, cn, C_UUID), sess.transcript(2, os.urandom(32), S_UUID, cn, C_UUID),
                  sess.transcript(2, sn, "another-relay", cn, C_UUID), sess.transcript(2, sn, S_UUID, os.urandom(32), C_UUID),
                  sess.transcript(2, sn, S_UUID, cn, "another-applier")):
        assert not sess.proof_ok(SECRET, sess.CLIENT, other, mac)


def test_transcript_fields_are_framed_so_shifting_bytes_between_them_changes_it():
    a = sess.transcript(2, b"n" * 32, "ab", b"m" * 32, "c")
    b = sess.transcript(2, b"n" * 32, "a", b"m" * 32, "bc")
    assert a != b


def test_sealed_messages_arrive_in_order_in_both_directions():
    c, s = handshake()
    for i in range(5):
        assert s.unseal(c.seal(m.encode(m.ACK, vclock={1: i}))) == m.encode(m.ACK, vclock={1: i})
        assert c.unseal(s.seal(m.encode(m.HEARTBEAT, now_us=i))) == m.encode(m.HEARTBEAT, now_us=i)
    assert (c.sent, c.received, s.sent, s.received) == (5, 5, 5, 5)


def test_a_replayed_message_is_refused():
    c, s = handshake()
    first = c.seal(m.encode(m.BYE))
    s.unseal(first)
    with pytest.raises(RemoteProtocolError, match="fails its session tag"):
        s.unseal(first)


def test_reordered_or_dropped_messages_are_refused():
    c, s = handshake()
    one, two = c.seal(b"one"), c.seal(b"two")
    with pytest.raises(RemoteProtocolError):
        s.unseal(two)                     # the first never arrived
    assert s.unseal(one) == b"one"        # a failed check consumes nothing
    assert s.unseal(two) == b"two"


def test_a_message_reflected_back_to_its_sender_is_refused():
    c, s = handshake()
    to_server = c.seal(b"ACK")
    with pytest.raises(RemoteProtocolError):
        c.unseal(to_server)               # the client never accepts client->server bytes
    from_server = s.seal(b"ROWS")
    with pytest.raises(RemoteProtocolError):
        s.unseal(from_server)


def test_a_message_of_another_session_with_the_same_secret_is_refused():
    c1, s1 = handshake()
    c2, s2 = handshake()
    with pytest.raises(RemoteProtocolError):
        s2.unseal(c1.seal(b"GREETING"))


def test_forged_truncated_or_altered_messages_are_refused():
    c, s = handshake()
    sealed = c.seal(b"SUBSCRIBE {vclock}")
    for bad in (b"", b"short", sealed[:-1], sealed[:-sess.TAG_BYTES] + os.urandom(sess.TAG_BYTES),
                b"X" + sealed[1:], b"FETCH_SNAPSHOT" + sealed[-sess.TAG_BYTES:]):
        with pytest.raises(RemoteProtocolError):
            s.unseal(bad)
    assert s.unseal(sealed) == b"SUBSCRIBE {vclock}"


def test_a_session_derived_without_the_secret_cannot_talk_to_one_with_it():
    c, s = handshake(secret_c=SECRET, secret_s=SECRET)
    sn, cn = os.urandom(32), os.urandom(32)
    t = sess.transcript(m.PROTOCOL_VERSION, sn, S_UUID, cn, C_UUID)
    real = sess.Session(SECRET, t, sess.SERVER, C_UUID)
    guess = sess.Session(b"", t, sess.CLIENT, S_UUID)   # a relay in the middle knows the transcript, not the secret
    with pytest.raises(RemoteProtocolError):
        real.unseal(guess.seal(m.encode(m.FETCH_SNAPSHOT)))


def test_seal_parts_is_seal_of_the_joined_parts():
    c1, s1 = handshake()
    parts = [b"head", os.urandom(1000), b"", os.urandom(10)]
    sealed = c1.seal_parts(parts)
    assert s1.unseal(sealed) == b"".join(parts)


def test_a_sealed_rows_message_reaches_the_row_scanner_as_its_exact_bytes():
    if rowscan.native is None:
        pytest.skip("no native row scanner in this build")
    c, s = handshake()
    txns = [[1, 5, GROUP_DEFAULT, 1_700_000_000_000_000, [[OP_PUT, "kv", "k", 1]]]]
    frame = pack([1_700_000_000_000_000, txns])
    parts = m.rows_parts([frame])
    body = s.unseal(c.seal_parts(parts))
    assert body == b"".join(parts) and type(body) is bytes
    msg = m.decode(body, rowscan.scan_rows)
    assert msg.type == m.ROWS and "scan" in msg.body and msg.body["scan"].ntxn == 1


def test_hello_fields_are_checked_before_they_enter_a_transcript():
    assert sess.check_hello_fields(b"n" * 32, C_UUID, "AUTH") == C_UUID
    for nonce, uuid in ((b"short", C_UUID), (b"n" * 32, None), (b"n" * 32, ""), (b"n" * 32, "u" * 65), (b"n" * 32, 7)):
        with pytest.raises(RemoteProtocolError):
            sess.check_hello_fields(nonce, uuid, "AUTH")
