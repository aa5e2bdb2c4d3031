"""The applier and relay machines wired to each other in one process, with no IO and no
asyncio: every message goes through the real wire encoding, the relay streams a WAL through
the relay filter, the subscriber's journal writes what it was handed to persist when a seeded
coin says so, and the link breaks at seeded points and is opened again with fresh machines.
What the deterministic simulation needs of the machines (tests/sim drives them next)."""
from __future__ import annotations

import random

import pytest

from node.cluster_space.table import STATE_MEMBER, ClusterTable, Member
from node.core import codec, rowscan
from node.core import messages as m
from node.core.link.applier import ApplierMachine, ApplierState
from node.core.entry import TxnEntry, txns_relay_frame
from node.core.link.filter import rows_batches
from node.core.link.relay import AckHold, RelayMachine, RelayState, Stream
from node.core.replicaset import NodeCore
from node.core.rows import GROUP_DEFAULT, OP_PUT, Op
from node.core.vclock import VClock

UA = "00000000-0000-4000-8000-00000000000a"
UB = "00000000-0000-4000-8000-00000000000b"
WALL_US = 1_700_000_000_000_000
TICK_S = 0.05


class Side:
    """One node: its core, its WAL (durable frames), its journal queue, and its data."""

    def __init__(self, uuid: str, ids: dict[str, int]):
        self.uuid = uuid
        table = ClusterTable([Member(u, i, f"127.0.0.{i}:1", STATE_MEMBER) for u, i in ids.items()])
        self.core = NodeCore(uuid, table, VClock({}), spaces={"kv": False})
        self.wal: list[tuple[int, list]] = []          # (written_us, [txn wire]) frames, durable
        self.queue: list = []                           # entries handed over to persist, not written yet
        self.data: dict[str, object] = {}

    # the machines' contexts
    def greeting(self) -> dict:
        return {"uuid": self.uuid, "cluster_uuid": "00000000-0000-4000-8000-0000000000cc", "cluster_name": "t",
                "options_digest": "d", "options": {}, "anon": False, "address": "127.0.0.1:1", "status": "running",
                "cluster": self.core.table.rows(), "own_history_lsn": 0, "vclock_uuid": self.core.vclock_by_uuid()}

    def check_peer_greeting(self, theirs: dict) -> None:
        pass

    def claim_link(self, peer_uuid: str) -> None:
        pass

    def journal_pending(self) -> int:
        return len(self.queue)

    def own_claim(self, peer_uuid: str) -> int:
        return 0

    def going_without(self) -> list[str]:
        return []

    def status(self) -> tuple[str, str]:
        return "running", ""

    def serves_wal(self) -> bool:
        return True

    def gc_vclock(self) -> dict[int, int]:
        return {}

    def write(self, key: str, value: object) -> None:
        txn = self.core.local_txn([Op(OP_PUT, "kv", key, value)], GROUP_DEFAULT, WALL_US)
        self.queue.append(TxnEntry([txn]))

    def sync(self) -> None:
        """The journal writes and syncs what it was handed, in order, then the core commits."""
        for entry in self.queue:
            wire = [[t[0], t[1], t[2], t[3], [list(o) for o in t[4]]] for t in entry.txns]
            self.wal.append((WALL_US, wire))
            for t in wire:
                for op in t[4]:
                    self.data[op[2]] = op[3]
            self.core.commit(wire)
        self.queue.clear()


class Link:
    """B follows A: B's applier machine and A's relay machine, two FIFO directions."""

    def __init__(self, a: Side, b: Side, rng: random.Random):
        self.a, self.b, self.rng = a, b, rng
        self.applier = ApplierMachine(b.core, b, "127.0.0.1:1", authenticated=a.uuid)
        self.relay = RelayMachine(a, authenticated=b.uuid)
        self.to_relay: list[bytes] = []
        self.to_applier: list[bytes] = []
        self.cursor = 0                              # the relay's next WAL frame, once streaming
        self.applier.start(b.greeting())
        self._act_applier(0.0)

    def _act_applier(self, now: float) -> None:
        rd = self.applier.ready()
        self.b.queue.extend(p.entry for p in rd.persist)          # persist first, then send
        self.to_relay += [m.encode(s.mtype, **s.body) for s in rd.send]
        self.applier.advance(rd)

    def _act_relay(self) -> None:
        rd = self.relay.ready()
        self.to_applier += [m.encode(s.mtype, **s.body) for s in rd.send]
        for a in rd.apply:
            assert type(a) is AckHold and a.uuid == self.b.uuid
        if any(type(e) is Stream for e in rd.effects):
            self.cursor = 0
        self.relay.advance(rd)

    def step(self, now: float) -> None:
        if self.to_relay:
            self.relay.step(m.decode(self.to_relay.pop(0)), now)
            self._act_relay()
        if self.relay.state is RelayState.STREAMING and self.cursor < len(self.a.wal):
            end = min(len(self.a.wal), self.cursor + self.rng.randint(1, 3))
            frames = []
            for written_us, txns in self.a.wal[self.cursor:end]:
                send, _ = txns_relay_frame(txns, codec.pack([written_us, txns]), written_us, self.relay.sub, self.relay.own)
                if send is not None:
                    frames.append(send)
            self.cursor = end
            self.to_applier += [m.encode_rows(batch) for batch in rows_batches(frames)]
            self.relay.sent_rows(now)
        self.relay.tick(now, int(now * 1e6))
        self._act_relay()
        if self.to_applier and self.applier.state is not ApplierState.STOPPED:
            scanner = rowscan.scan_rows_py if self.rng.random() < 0.5 else None
            self.applier.step(m.decode(self.to_applier.pop(0), scanner), now)
            self._act_applier(now)
        elif self.applier.state is ApplierState.FOLLOW:
            self.applier.tick(now)
            self._act_applier(now)

    def close(self) -> None:
        self.applier.stop()
        self.relay.close()
        self.b.core.drop_peer(self.a.uuid, self.applier.core_peer)


@pytest.mark.parametrize("seed", range(40))
def test_a_follower_converges_through_the_machines_over_a_link_that_breaks(seed):
    rng = random.Random(seed)
    a = Side(UA, {UA: 1, UB: 2})
    b = Side(UB, {UB: 1, UA: 2})                 # ids differ: every row is translated
    link = Link(a, b, rng)
    links = 1
    for tick in range(400):
        now = WALL_US / 1e6 + tick * TICK_S
        if tick < 300 and rng.random() < 0.5:
            a.write(f"k{rng.randint(0, 30)}", tick)
        if rng.random() < 0.7:
            a.sync()
        if rng.random() < 0.5:
            b.sync()
        link.step(now)
        assert b.core.vclock.get(2) <= a.core.vclock.get(1)      # nothing B has that A never wrote
        if tick < 300 and rng.random() < 0.02 or link.applier.state is ApplierState.STOPPED:
            link.close()                               # the connection broke: both ends start again
            link = Link(a, b, rng)
            links += 1
    for _ in range(200):                               # heal: no more breaks, run to quiet
        a.sync()
        b.sync()
        link.step(now)
        now += TICK_S
    assert b.core.vclock_by_uuid()[UA] == a.core.vclock_by_uuid()[UA]
    assert b.data == a.data and links >= 1
    assert link.relay.acked.get(1, 0) == a.core.vclock.get(1)    # the relay heard B's ACK of all of it
