"""A node that lost its lease closes every inbound link, not only those already streaming
(node/identity/lease_node.py `_wind_down`), on a real lease node in this process (real LMDB,
WAL, sockets and a file:// lease store).

The wind-down used to close `node.relays`, the links that had subscribed. A link that had
greeted the node before the loss but had not yet asked for anything was in none of the lists
closed: it could subscribe (or ask to register) during the grace before the exit, and be
served by a node that no longer holds its identity. Every link accept took is closed now;
links opened after the loss are refused by the greeting's lease check.

Likewise a registration (a `_cluster` row under the node's own id) that waited its turn behind
another one while the lease was lost was written after the loss: it now looks at the node's
status again when its turn comes (node/join.py `apply_registration`).

And from the other side: a node that learns from the store that its upstream is a stale holder
of a slot closes its link to it at once (`_fence_open_links`) instead of taking its rows until
the link breaks by itself."""
from __future__ import annotations

import asyncio
from uuid import uuid4

import pytest

from node.applier.conn import client_auth, connect
from node.config import Config
from node.core import messages as m
from node.errors import PeerRefused, RemoteProtocolError
from node.identity.lease_manager import LeaseManager
from node.identity.lease_store import open_store
from node.server import Node
from tests.integration.fakepeer import FakePeer
from tests.unit.test_dashboard_http import collector_restored
from tests.waiting import until


async def running_lease_node(tmp_path, listen, size: int):
    """A lease node of a `size`-slot cluster on a file:// store, running, yielded, then stopped."""
    with collector_restored():
        node = Node(Config(identity="lease", lease_store=f"file://{tmp_path}/leases", cluster_size=size,
                           lease_duration_s=30.0, data_dir=str(tmp_path / "data"), listen=listen(), token=""))
        await node.start()
        node.lease._exit_at_once_on_loss = False          # a loss must not end pytest
        await until(lambda: node.status == "running", 20, "the lease node to bootstrap")
        yield node
        await node.stop()


@pytest.fixture
async def lease_node(tmp_path, listen):
    async for node in running_lease_node(tmp_path, listen, 1):
        yield node


async def greeted_link(peer: FakePeer, address: str):
    """A link that has authenticated and exchanged greetings, and asks for nothing yet."""
    conn = await connect(peer._session, address)
    await client_auth(conn, peer.secret, peer.uuid)
    await conn.send(m.GREETING, **peer.greeting())
    await conn.expect(m.GREETING, timeout=5)
    return conn


def greeting(uuid: str) -> dict:
    """What a joiner's greeting tells the donor's registration."""
    return {"uuid": uuid, "address": "127.0.0.1:7"}


async def test_a_link_greeted_before_the_loss_is_closed_before_the_exit(lease_node):
    node = lease_node
    address = node.cfg.listen
    peer = FakePeer(node.cfg.secret)
    await peer.start()
    try:
        ours = node.greeting()
        peer.greeting_extra = {"lease": {"slot": 1, "version": 1, "seen": {"0": 1}},
                               "options": ours["options"], "options_digest": ours["options_digest"]}
        await peer.introduce(address)
        idle = await greeted_link(peer, address)
        streaming = asyncio.create_task(peer.listen(address))
        await until(lambda: len(node.relays) == 1 and len(node.links) == 2, 10,
                    "one link streaming and one greeted, idle")

        node.lease.lose_now("a test took the slot over")
        assert node.status == "lease_lost"
        await asyncio.wait_for(node.stopped.wait(), 10)   # the grace ends in at most 1 s

        assert not node.links, f"links outlived the wind-down: {[c.peer for c in node.links]}"
        _, ended = await asyncio.wait_for(streaming, 10)
        assert isinstance(ended, (ConnectionError, RemoteProtocolError, PeerRefused)), repr(ended)
        # The idle link was closed too: what it asks for now finds no relay.
        with pytest.raises((ConnectionError, RemoteProtocolError, PeerRefused)):
            await idle.send(m.SUBSCRIBE, vclock={})
            await idle.recv(timeout=5)
        await idle.close()

        refused = await peer.request(address, m.SUBSCRIBE, vclock={})
        assert isinstance(refused, PeerRefused) and refused.code == "lease_lost", repr(refused)
    finally:
        await peer.close()


async def test_a_registration_that_waited_for_another_writes_nothing_after_the_loss(lease_node, monkeypatch):
    """The relay checks that the node runs before it registers anyone, but registrations take
    turns (one lock): the one waiting must look again when its turn comes."""
    node = lease_node
    entered, release = asyncio.Event(), asyncio.Event()
    real_submit = node.journal.submit

    async def submit(txns):
        if not entered.is_set():               # the first registration's row: held until told
            entered.set()
            await release.wait()
        return await real_submit(txns)

    monkeypatch.setattr(node.journal, "submit", submit)
    first_uuid, second_uuid = str(uuid4()), str(uuid4())
    first = asyncio.create_task(node.join.apply_registration(greeting(first_uuid), {"code": "a" * 32}))
    await asyncio.wait_for(entered.wait(), 10)
    second = asyncio.create_task(node.join.apply_registration(greeting(second_uuid), {"code": "b" * 32}))
    await until(lambda: node.join._register_lock._waiters, 10, "the second registration waiting its turn")

    node.lease.lose_now("a test took the slot over")
    release.set()
    assert (await asyncio.wait_for(first, 10)).ok      # claimed before the loss: written
    with pytest.raises(PeerRefused) as e:
        await asyncio.wait_for(second, 10)
    assert e.value.code == "not_ready" and "lease_lost" in e.value.message, e.value
    assert node.core.table.get(second_uuid) is None, "a member was registered after the lease was lost"
    assert node.core.table.get(first_uuid) is not None


@pytest.fixture
async def lease_pair_node(tmp_path, listen):
    """A lease node of a 2-slot cluster (the other slot is the test's)."""
    async for node in running_lease_node(tmp_path, listen, 2):
        yield node


async def test_a_link_to_a_holder_found_stale_is_closed_at_once_and_not_taken_again(lease_pair_node, tmp_path):
    """A node learns from the store that the slot its upstream greeted it with has a newer
    version (another node took it over: the upstream is a stale holder, paused past its lease
    or with its clock behind). Before, the link went on until it broke by itself, taking every
    row the stale holder still sent; now it closes at once, and the next handshake is refused."""
    node = lease_pair_node
    url = f"file://{tmp_path}/leases"
    stale = LeaseManager(open_store(url), 2, "stale-task", 30.0)
    slot = stale.acquire().slot                                  # the other slot, at version 1
    peer = FakePeer(node.cfg.secret)
    await peer.start()
    try:
        ours = node.greeting()
        peer.greeting_extra = {"lease": {"slot": slot, "version": 1, "seen": {}},
                               "options": ours["options"], "options_digest": ours["options_digest"]}
        await peer.introduce(node.cfg.listen)
        node.set_peers([peer.address])
        await until(lambda: peer.subscribes == 1 and node.appliers[peer.address].status == "follow", 10,
                    "the node following the peer")
        stale.release()                                         # (as if it expired) and taken again:
        newer = LeaseManager(open_store(url), 2, "new-task", 30.0)
        assert (newer.acquire().slot, newer.lease.version) == (slot, 2)
        node.lease.check_peer({"uuid": "new-holder", "address": "127.0.0.1:7",
                               "lease": {"slot": slot, "version": 2, "seen": {}}})   # the hint
        applier = node.appliers[peer.address]
        await until(lambda: applier.status == "lease_fenced" and "lease_fenced" in applier.error, 10,
                    f"the link to the stale holder closed (it is {applier.status}: {applier.error})")
        assert node.lease.fenced >= 1
        assert peer.subscribes == 1, "the stale holder was subscribed to again"
    finally:
        await peer.close()
