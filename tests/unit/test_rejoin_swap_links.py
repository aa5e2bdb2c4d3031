"""No inbound link outlives the swap of a rebuilt store (node/process/opening.py
`reopen_after_rejoin`), on a real node in this process (real LMDB, WAL and sockets) and
subscribers played by tests/integration/fakepeer.py.

Found by the nemesis (seed 51): a master rebuilt its store from a donor's snapshot, and while
the swap closed its inbound links one by one (each close awaits), a member subscribed. That
link was not among those being closed; its relay went on over the swapped store and failed
reading a WAL segment that was gone (`relay ... failed (a bug ...): FileNotFoundError`). It
could as well have read on into the new WAL, whose ids are the donor's, under a greeting that
stated the old table's. Links are now refused (`not_ready`) until the new store is open."""
from __future__ import annotations

import asyncio

import pytest

from node.applier.conn import Conn
from node.core import messages as m
from node.errors import PeerRefused
from tests.integration.fakepeer import FakePeer
from tests.unit.test_dashboard_http import open_node  # noqa: F401 - the fixture `node` takes
from tests.waiting import until


@pytest.fixture
def node(open_node):
    return open_node


async def test_a_member_subscribing_while_the_swap_closes_links_is_refused_and_none_outlives_it(
        node, monkeypatch):
    address = node.cfg.listen
    first, late = FakePeer(node.cfg.secret), FakePeer(node.cfg.secret)
    for p in (first, late):
        await p.start()
        await p.introduce(address)
    late_link: list[asyncio.Task] = []
    real_close = Conn.close

    async def close(self, going_away: bool = False):
        if not late_link:        # the swap's first close: the late member subscribes meanwhile
            links = len(node.links)
            late_link.append(asyncio.create_task(late.listen(address)))
            await until(lambda: late_link[0].done() or len(node.links) > links, 10,
                        "the late subscription taken or refused")
        await real_close(self, going_away)
    try:
        streaming = asyncio.create_task(first.listen(address))
        await until(lambda: len(node.relays) == 1, 10, "the first member's relay streaming")
        monkeypatch.setattr(Conn, "close", close)
        await node.reopen_after_rejoin(lambda data_dir: None)      # the same store, swapped for itself
        monkeypatch.undo()
        assert node.status == "running" and node.links_refused is None
        _, ended = await asyncio.wait_for(streaming, 10)
        assert not isinstance(ended, PeerRefused), f"the first link was closed, not refused: {ended!r}"
        await until(lambda: late_link[0].done(), 10, "the late link to end: it must not outlive the swap")
        _, refused = late_link[0].result()
        assert isinstance(refused, PeerRefused) and refused.code == "not_ready", repr(refused)
        assert "swapping in a store" in refused.message
        answer = await asyncio.wait_for(late.request(address, m.SUBSCRIBE, vclock={}), 10)
        assert getattr(answer, "type", None) == m.SUBSCRIBED, f"links are taken again after the swap: {answer!r}"
    finally:
        for t in [*late_link]:
            t.cancel()
        for p in (first, late):
            await p.close()

