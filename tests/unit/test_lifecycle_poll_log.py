"""How a start-up poll of the peers (node/lifecycle.py `poll_peers`) says a refusal: a lasting
one (the secret, a certificate, another cluster) as a WARNING, once per change; one that passes
(`not_ready`: the peer is stopping, swapping in a rebuilt store or not joined yet; `silent`: it
heard nothing from us for a moment) at INFO, as the links say them (node/applier/outcome.py).
Nemesis seed 54 met a peer swapping in a rebuilt store, said as a WARNING."""
from __future__ import annotations

import logging
import types

import pytest

from node import lifecycle
from node.errors import PeerRefused

PEER = "127.0.0.1:7302"


@pytest.mark.parametrize("code,level", [("not_ready", "INFO"), ("silent", "INFO"), ("auth", "WARNING"),
                                        ("wrong_cluster", "WARNING"), ("options", "WARNING")])
async def test_a_start_up_poll_says_a_passing_refusal_at_info_and_a_lasting_one_as_a_warning(
        monkeypatch, caplog, code, level):
    async def probe(node, session, address, timeout):
        raise PeerRefused(code, "no")
    monkeypatch.setattr(lifecycle, "probe", probe)
    node = types.SimpleNamespace(peers=[PEER], cfg=types.SimpleNamespace(address="127.0.0.1:7301"),
                                 http_session=None, lease=None)
    life = lifecycle.Lifecycle(node)
    caplog.set_level(logging.INFO, logger="replog.lifecycle")
    for _ in range(2):                                  # the same refusal again: not said again
        polled = await life.poll_peers()
        assert isinstance(polled[PEER], PeerRefused) and polled[PEER].code == code
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [(level, f"peer {PEER} refused: {code}: no")]
