"""A lease node whose renewal deadline passed while it could not look (a pause: SIGSTOP, a frozen
VM, a stalled loop) stops acting as the slot's member at the first thing it does after, before
the renewal timer would tell it (node/identity/lease_node.py `serving`), on a real lease node in
this process (real LMDB, WAL, sockets and a file:// lease store).

The pause is played by the lease manager's clock jumping past the deadline, as the wall clock
does for a process that was stopped. Before, a request waiting in a socket when the process went
on was served first: the event loop runs the handler before the renewal's timer. A write was
claimed and acknowledged after the deadline, so after the slot could be another node's: lost
with this node's ephemeral disk, or, sent on a link a peer still had open, a second row for an
(origin, lsn) the new holder also writes. Now no row is claimed, acknowledged or sent after the
deadline, and no handshake is taken."""
from __future__ import annotations

import asyncio

import pytest

import replog
from node.applier.conn import client_auth, connect
from node.core import messages as m
from node.core.rows import GROUP_DEFAULT, OP_PUT, OP_SPACE, Op
from node.errors import ClientError, PeerRefused, RemoteProtocolError
from tests.integration.fakepeer import FakePeer
from tests.unit.test_lease_wind_down import lease_node  # noqa: F401 - the fixture
from tests.waiting import until


def pause_past_the_deadline(node) -> None:
    """From now on the node's clock reads as it would after a pause that outlived the lease."""
    mgr = node.lease.manager
    real, ahead = mgr._clock, mgr.renew_deadline_ms - mgr.now_ms() + 60_000
    mgr._clock = lambda: real() + ahead


def put(key: str) -> Op:
    return Op(OP_PUT, "kv", key, {"v": key})


@pytest.fixture
async def node(lease_node):   # noqa: F811 - the fixture above, with a replicated space
    await lease_node.write([Op(OP_SPACE, "kv", "", {"local": False, "conflict": "lww"})])
    return lease_node


async def test_a_write_after_the_deadline_is_refused_and_claims_nothing(node):
    await node.write([put("before")])
    own = node.core.claimed.get(node.core.self_id)
    pause_past_the_deadline(node)
    with pytest.raises(ClientError) as e:
        await node.write([put("after")])
    assert e.value.status == 503, e.value
    assert node.status == "lease_lost" and "deadline" in node.status_reason, node.status_reason
    assert node.core.claimed.get(node.core.self_id) == own, "a row was claimed after the deadline"


async def test_a_write_made_durable_across_the_deadline_is_not_acknowledged(node, monkeypatch):
    real_submit = node.journal.submit

    async def submit(txns):
        pause_past_the_deadline(node)          # the pause comes while the row is written
        return await real_submit(txns)

    monkeypatch.setattr(node.journal, "submit", submit)
    with pytest.raises(ClientError) as e:
        await node.write([put("straddles")])
    assert (e.value.status, e.value.code) == (503, "lease_lost"), e.value
    assert "may or may not" in e.value.message


async def test_the_binary_protocol_does_not_acknowledge_a_write_made_durable_across_the_deadline(
        node, monkeypatch):
    real_entry = node.journal.submit_entry_nowait

    def submit_entry_nowait(entry, want_future=True):
        pause_past_the_deadline(node)
        return real_entry(entry, want_future)

    async with replog.AsyncClient([node.cfg.address], timeout=10) as c:
        await c.put("kv", "before", {"v": 1})
        monkeypatch.setattr(node.journal, "submit_entry_nowait", submit_entry_nowait)
        with pytest.raises(replog.ReplogError) as e:
            await c.put("kv", "straddles", {"v": 2})
    assert getattr(e.value, "code", None) == "lease_lost", e.value


async def test_no_row_is_sent_on_an_open_link_after_the_deadline(node):
    address = node.cfg.listen
    peer = FakePeer(node.cfg.secret)
    await peer.start()
    got: list[str] = []
    try:
        ours = node.greeting()
        peer.greeting_extra = {"lease": {"slot": 1, "version": 1, "seen": {"0": 1}},
                               "options": ours["options"], "options_digest": ours["options_digest"]}
        await peer.introduce(address)
        conn = await connect(peer._session, address)
        await client_auth(conn, peer.secret, peer.uuid)
        await conn.send(m.GREETING, **peer.greeting())
        await conn.expect(m.GREETING, timeout=5)
        await conn.send(m.SUBSCRIBE, vclock={})

        async def read() -> BaseException:
            try:
                while True:
                    got.append((await conn.recv(timeout=10)).name)
            except (PeerRefused, RemoteProtocolError, ConnectionError) as e:
                return e
        reading = asyncio.create_task(read())
        await node.write([put("before")])
        await until(lambda: "ROWS" in got, 10, "the row written before the pause sent")
        sent = got.count("ROWS")

        # A row claimed before the pause, made durable after it (bypassing the client checks,
        # as a row already on its way to the journal would).
        txn = node.core.local_txn([put("claimed-before")], GROUP_DEFAULT, node.wall_us())
        pause_past_the_deadline(node)
        await node.journal.submit([txn])
        ended = await asyncio.wait_for(reading, 10)
        assert got.count("ROWS") == sent, f"a row was sent after the deadline: {got}"
        assert isinstance(ended, (PeerRefused, ConnectionError, RemoteProtocolError)), repr(ended)
        await conn.close()

        refused = await peer.request(address, m.SUBSCRIBE, vclock={})
        assert isinstance(refused, PeerRefused) and refused.code == "lease_lost", repr(refused)
    finally:
        await peer.close()
