"""What a subscriber's ACK leaves behind on a real node (in this process, real LMDB): a hold on
the WAL for a member always; for an anonymous replica or a subscriber this node does not know yet
(a member registered through another node, issue 16) at most `anon_acks_max` of those together —
so ACKs from made-up uuids (anyone holding the secret can subscribe under any uuid) cannot grow
the holds and the `_meta` they are saved in without bound (issue 15, defect 9; node/retention.py)."""
from __future__ import annotations

import itertools
import time
import uuid as uuidlib

from node import limits
from tests.unit.test_dashboard_http import open_node as node  # noqa: F401 (a fixture: a node without a token)


def _ack(node, uuid: str, *, anon: bool, lsn: int = 1) -> None:
    node.retention.on_ack(uuid, {1: lsn}, anon)


async def test_acks_of_uuids_that_are_no_members_leave_at_most_the_bounded_number_of_holds(node, monkeypatch):
    monkeypatch.setattr(limits, "anon_acks_max", 8)
    before = dict(node.retention.holds)
    made_up = [str(uuidlib.uuid4()) for _ in range(100)]
    for u in made_up:
        _ack(node, u, anon=False)
    added = set(node.retention.holds) - set(before)
    assert len(added) == 8 and added <= set(made_up)
    assert all(node.retention.holds[u] == h for u, h in before.items())


async def test_a_members_ack_holds_its_position(node):
    member = str(uuidlib.uuid4())
    await node.register_member(member, "127.0.0.1:9")
    _ack(node, member, anon=False, lsn=2)
    hold = node.retention.holds[member]
    assert hold.vclock[1] >= 2 and not hold.anon


async def test_anonymous_holds_are_bounded_and_the_one_heard_from_longest_ago_goes(node, monkeypatch):
    monkeypatch.setattr(limits, "anon_acks_max", 8)
    ticks = itertools.count(1_000_000)                   # one second between ACKs: no ties

    class Clock:
        def __getattr__(self, name):
            return getattr(time, name)

        def time(self):
            return float(next(ticks))
    monkeypatch.setattr("node.retention.time", Clock())
    uuids = [str(uuidlib.uuid4()) for _ in range(50)]
    for u in uuids:
        _ack(node, u, anon=True)
    anon = {u for u, h in node.retention.holds.items() if h.anon}
    assert anon == set(uuids[-8:])
    _ack(node, uuids[-8], anon=True, lsn=5)              # heard from again: the newest now, kept
    _ack(node, uuids[0], anon=True)
    anon = {u for u, h in node.retention.holds.items() if h.anon}
    assert uuids[-8] in anon and uuids[-7] not in anon and len(anon) == 8
