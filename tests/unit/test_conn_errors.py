"""What an ERROR or a close from a peer becomes in `Conn.recv` (node/applier/conn.py): before
authentication only what a relay says then (PREAUTH_ERRORS) is a refusal; any other code is a
broken link, since no secret stands behind it. After authentication every code is the peer's
refusal, cut to its bounds. A close as going away (1001: the peer stops) is PeerNotReady, said
quietly; any other close is a link that broke."""
from __future__ import annotations

import os

import aiohttp
import pytest

from node import limits
from node.applier.conn import PREAUTH_ERRORS, Conn
from node.core import messages as m
from node.core import session as sess
from node.errors import PeerNotReady, PeerRefused, RemoteProtocolError
from tests.unit.helpers import UUID_A, UUID_B

SECRET = b"s" * 32


class WS:
    """The WebSocket under a Conn: hands out the messages given, one per receive()."""

    def __init__(self, *data: bytes, closes: tuple | None = None):
        self.data = list(data)
        self.closes = closes                # (message type, its data, close_code) once data runs out
        self.close_code = closes[2] if closes else None

    async def receive(self):
        if not self.data:
            return aiohttp.WSMessage(self.closes[0], self.closes[1], None)
        return aiohttp.WSMessage(aiohttp.WSMsgType.BINARY, self.data.pop(0), None)


def sessions() -> tuple[sess.Session, sess.Session]:
    """The relay's and the applier's ends of one authenticated link."""
    t = sess.transcript(m.PROTOCOL_VERSION, os.urandom(sess.NONCE_BYTES), UUID_A, os.urandom(sess.NONCE_BYTES),
                        UUID_B)
    return (sess.Session(SECRET, t, sess.SERVER, UUID_B, m.PROTOCOL_VERSION),
            sess.Session(SECRET, t, sess.CLIENT, UUID_A, m.PROTOCOL_VERSION))


def test_the_codes_a_relay_sends_before_authentication_are_exactly_those_it_may():
    assert PREAUTH_ERRORS == {"not_ready", "version", "auth", "protocol", "silent"}


@pytest.mark.parametrize("code", sorted(PREAUTH_ERRORS))
async def test_before_authentication_what_a_relay_says_then_is_a_refusal(code):
    conn = Conn(WS(m.encode(m.ERROR, code=code, message="no")), "peer")
    with pytest.raises(PeerRefused) as e:
        await conn.recv(5)
    assert (e.value.code, e.value.message) == (code, "no")


@pytest.mark.parametrize("code", ["need_rejoin", "expelled", "wrong_cluster", "duplicate", "self", "options",
                                  "greet_again", "register_rejected", "", "x" * 200])
async def test_before_authentication_any_other_code_is_a_broken_link(code):
    conn = Conn(WS(m.encode(m.ERROR, code=code, message="trust me", needed={UUID_A: 9})), "peer")
    with pytest.raises(RemoteProtocolError, match="before authentication") as e:
        await conn.recv(5)
    assert len(str(e.value)) < 300, "the peer's code is cut before it reaches logs and status"


@pytest.mark.parametrize("code", ["need_rejoin", "expelled", "not_ready"])
async def test_after_authentication_every_code_is_the_peers_refusal_cut_to_its_bounds(code):
    relay, applier = sessions()
    message = "m" * (2 * limits.peer_error_chars_max)
    conn = Conn(WS(relay.seal(m.encode(m.ERROR, code=code, message=message))), "peer")
    conn.session = applier
    with pytest.raises(PeerRefused) as e:
        await conn.recv(5)
    assert e.value.code == code and len(e.value.message) == limits.peer_error_chars_max + 1   # + the ellipsis


@pytest.mark.parametrize("closes", [(aiohttp.WSMsgType.CLOSE, 1001, 1001), (aiohttp.WSMsgType.CLOSED, None, 1001)])
async def test_a_close_as_going_away_is_a_peer_not_ready(closes):
    conn = Conn(WS(closes=closes), "peer")
    with pytest.raises(PeerNotReady, match="as it stops"):
        await conn.recv(5)


@pytest.mark.parametrize("closes", [(aiohttp.WSMsgType.CLOSE, 1000, 1000), (aiohttp.WSMsgType.CLOSE, 1006, 1006),
                                    (aiohttp.WSMsgType.CLOSED, None, None), (aiohttp.WSMsgType.CLOSING, None, None)])
async def test_any_other_close_is_a_link_that_broke(closes):
    conn = Conn(WS(closes=closes), "peer")
    with pytest.raises(RemoteProtocolError, match="connection closed") as e:
        await conn.recv(5)
    assert type(e.value) is RemoteProtocolError
