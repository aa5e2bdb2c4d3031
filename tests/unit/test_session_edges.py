"""Edges of node/core/session.py that mutation testing found unpinned (issue 18): a message too
short to carry a tag says so, a session remembers the version its handshake settled on, and a
role that is neither side is a caller's bug."""
from __future__ import annotations

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
