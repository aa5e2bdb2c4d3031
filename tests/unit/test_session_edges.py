"""Edges of node/core/session.py that mutation testing found unpinned (issue 18): a message too
short to carry a tag says so, a session remembers the version its handshake settled on, and a
role that is neither side is a caller's bug."""
from __future__ import annotations

import hashlib
import hmac
import os

import pytest

from node.core import messages as m
from node.core import session as sess
from node.errors import RemoteProtocolError
from tests.unit.test_session import C_UUID, S_UUID, SECRET, handshake


def test_a_message_shorter_than_a_tag_is_refused_as_carrying_no_tag():
    _, s = handshake()
    for short in (b"", b"x" * (sess.TAG_BYTES - 1)):
        with pytest.raises(RemoteProtocolError, match="carries no session tag"):
            s.unseal(short)
    assert s.received == 0


def test_a_session_keeps_the_protocol_version_its_handshake_chose_and_its_peer():
    t = sess.transcript(m.PROTOCOL_VERSION, os.urandom(sess.NONCE_BYTES), S_UUID, os.urandom(sess.NONCE_BYTES), C_UUID)
    s = sess.Session(SECRET, t, sess.SERVER, C_UUID, version=3)
    assert (s.version, s.peer_uuid) == (3, C_UUID)
    assert sess.Session(SECRET, t, sess.CLIENT, S_UUID).version == 0


def test_a_session_for_a_role_that_is_neither_side_is_a_callers_bug():
    with pytest.raises(AssertionError):
        sess.Session(SECRET, b"t", "observer", C_UUID)


def test_a_message_of_exactly_a_tags_length_is_an_empty_body_whose_tag_is_checked():
    c, s = handshake()
    sealed = c.seal(b"")
    assert len(sealed) == 16 and s.unseal(sealed) == b""
    with pytest.raises(RemoteProtocolError, match="fails its session tag"):
        s.unseal(b"x" * sess.TAG_BYTES)


def test_the_handshake_is_the_documented_construction_so_other_builds_interoperate():
    """The transcript frames each field by a 4-byte big-endian length after a 4-byte version;
    a proof is HMAC-SHA256(secret, label NUL transcript), 32 bytes; a message's tag is the first
    16 bytes of HMAC-SHA256 under a key derived the same way, over its 8-byte number and bytes.
    Computed here with hmac directly, not with the module's own helpers."""
    t = sess.transcript(3, b"sn", "s", b"cn", "c")
    assert t == bytes([0, 0, 0, 3, 0, 0, 0, 2]) + b"sn" + bytes([0, 0, 0, 1]) + b"s" + \
        bytes([0, 0, 0, 2]) + b"cn" + bytes([0, 0, 0, 1]) + b"c"
    want = hmac.new(SECRET, b"replog auth client proof\0" + t, hashlib.sha256).digest()
    assert sess.proof(SECRET, sess.CLIENT, t) == want and len(want) == 32
    key = hmac.new(SECRET, b"replog session client->server\0" + t, hashlib.sha256).digest()
    sealed = sess.Session(SECRET, t, sess.CLIENT, "s").seal(b"data")
    tag = hmac.new(key, (0).to_bytes(8, "big") + b"data", hashlib.sha256).digest()[:16]
    assert sealed == b"data" + tag


def test_a_hello_uuid_may_have_1_to_64_characters():
    for uuid in ("u", "u" * 64):
        assert sess.check_hello_fields(b"n" * sess.NONCE_BYTES, uuid, "HELLO") == uuid
    for uuid in ("", "u" * 65):
        with pytest.raises(RemoteProtocolError, match="64 characters"):
            sess.check_hello_fields(b"n" * sess.NONCE_BYTES, uuid, "HELLO")


@pytest.mark.parametrize("versions", [(2, 3), [2], [2, 3, 4], [0, 3], [2, 1 << 31], [True, 3], [3, 2], "23"])
def test_a_hello_version_range_that_is_not_two_ordered_versions_in_1_to_2_31_is_refused(versions):
    assert "no valid version range" in sess.negotiate((2, 3), 3, versions)


def test_a_hello_version_range_of_one_version_or_reaching_the_largest_is_taken():
    assert sess.negotiate((2, 3), 3, [3, 3]) == 3
    assert sess.negotiate((1, 3), 1, [1, (1 << 31) - 1]) == 3
