"""What a subscriber's ACK leaves behind on a real node (in this process, real LMDB): its
acknowledged position is kept only when it can hold the WAL — a member's, or an anonymous
replica's, at most `anon_acks_max` of those — so ACKs from made-up uuids (anyone holding the
secret can subscribe under any uuid) cannot grow `Node.acks` and the `_meta` it is saved in
without bound (issue 15, defect 9)."""
from __future__ import annotations

import itertools
import time
import types
import uuid as uuidlib

from node import limits
from tests.unit.test_dashboard_http import open_node as node  # noqa: F401 (a fixture: a node without a token)


def _relay(uuid: str, *, anon: bool, lsn: int = 1):
    return types.SimpleNamespace(uuid=uuid, anon=anon, acked={1: lsn})


async def test_acks_of_uuids_that_are_no_members_are_not_kept(node):
    for _ in range(100):
        node.on_ack(_relay(str(uuidlib.uuid4()), anon=False))
    assert node.acks == {}


async def test_a_members_ack_is_kept_and_holds_its_position(node):
    member = str(uuidlib.uuid4())
    await node.register_member(member, "127.0.0.1:9")
    node.on_ack(_relay(member, anon=False, lsn=2))
    assert node.acks[member]["vclock"] == {1: 2} and not node.acks[member]["anon"]


async def test_anonymous_acks_are_bounded_and_the_one_heard_from_longest_ago_goes(node, monkeypatch):
    monkeypatch.setattr(limits, "anon_acks_max", 8)
    ticks = itertools.count(1_000_000)                   # one second between ACKs: no ties

    class Clock:
        def __getattr__(self, name):
            return getattr(time, name)

        def time(self):
            return float(next(ticks))
    monkeypatch.setattr("node.server.time", Clock())
    uuids = [str(uuidlib.uuid4()) for _ in range(50)]
    for u in uuids:
        node.on_ack(_relay(u, anon=True))
    assert set(node.acks) == set(uuids[-8:])
    node.on_ack(_relay(uuids[-8], anon=True, lsn=5))   # heard from again: the newest now, kept
    node.on_ack(_relay(uuids[0], anon=True))
    assert uuids[-8] in node.acks and uuids[-7] not in node.acks and len(node.acks) == 8
