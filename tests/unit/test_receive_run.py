"""`NodeCore.receive_run` decides a run of one origin's plain txns exactly as the rules of
`receive` decide them one by one: the same txns accepted (translated), the same claims,
HLC, stats, and the same refusal at the same txn with what came before it claimed — refusals
for rows this node's state refuses (an unknown or local space, a clock too far ahead) included."""
from __future__ import annotations

import random

import pytest

from node import limits
from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.replicaset import NodeCore, Peer
from node.core.rows import GROUP_DEFAULT, OP_PUT, Op, Txn
from node.core.vclock import VClock
from node.errors import RemoteProtocolError

SELF, PEER, OTHER = "u-self", "u-peer", "u-other"
WALL = 1_700_000_000_000_000                     # this node's wall clock, µs
AHEAD = WALL + int(limits.hlc_offset_max_s * 1e6)   # the latest timestamp it accepts


def _core(expelled_lsn: int | None) -> NodeCore:
    other_state = STATE_MEMBER if expelled_lsn is None else STATE_EXPELLED
    table = ClusterTable([Member(SELF, 1, "", STATE_MEMBER), Member(PEER, 2, "", STATE_MEMBER),
                          Member(OTHER, 3, "", other_state, 0, expelled_lsn or 0)])
    core = NodeCore(SELF, table, VClock({2: 5, 3: 5}), spaces={"s": False, "loc": True})
    peer = core.peers[PEER] = Peer(PEER)
    peer.map.learn(7, 2)     # the peer's ids differ from ours: rows are translated
    peer.map.learn(3, 3)
    return core


def _reference(core: NodeCore, raw: Txn) -> list[Txn]:
    """The one-by-one rules for a plain txn (what `receive` did before runs existed)."""
    peer = core.peers[PEER]
    origin = peer.map.to_local.get(raw.replica_id)
    if origin is None:
        raise RemoteProtocolError("unknown id")
    member = core.table.by_id(origin)
    have = core.claimed.get(origin)
    if raw.last_lsn <= have:
        peer.stats.duplicates += 1
        return []
    if raw.lsn != have + 1:
        if raw.lsn <= have:
            raise RemoteProtocolError("overlap")
        peer.stats.gaps += 1
        return []
    if member.state == STATE_EXPELLED and raw.last_lsn > member.expelled_lsn:
        peer.stats.expelled += 1
        return []
    if raw.timestamp > AHEAD or any(op.space != "s" for op in raw.ops):
        raise RemoteProtocolError("refused")
    core.claimed.follow(origin, raw.last_lsn)
    core.hlc.observe(raw.timestamp)
    peer.stats.applied += 1
    return [raw.with_replica_id(origin)]


def _txns(rng: random.Random, n: int) -> list[Txn]:
    out, next_lsn = [], {7: 6, 3: 6}
    for _ in range(n):
        rid = rng.choice((7, 3)) if rng.random() < 0.3 else (out[-1].replica_id if out else 7)
        nops = rng.choice((1, 1, 2, 3))
        r = rng.random()
        if r < 0.1:
            lsn = max(1, next_lsn[rid] - rng.randint(1, 4))     # duplicate or overlap
        elif r < 0.15:
            lsn = next_lsn[rid] + rng.randint(1, 3)             # a gap
        else:
            lsn = next_lsn[rid]
        space = rng.choice(("s",) * 30 + ("nope", "loc"))     # now and then a space it must refuse
        ops = tuple(Op(OP_PUT, space if j == 0 else "s", f"k{lsn}.{j}", j) for j in range(nops))
        ts = rng.choice((rng.randint(0, 10**6), WALL, AHEAD) * 10 + (AHEAD + 1, 2**62))
        out.append(Txn(rid, lsn, GROUP_DEFAULT, ts, ops))
        next_lsn[rid] = max(next_lsn[rid], lsn + nops)
    return out


def _run_all(core: NodeCore, txns: list[Txn]) -> tuple[list[Txn], int, str]:
    out: list[Txn] = []
    i, rows = 0, 0
    try:
        while i < len(txns):
            i, r = core.receive_run(PEER, txns, i, out, WALL)
            rows += r
    except RemoteProtocolError:
        return out, sum(len(x.ops) for x in out), "refused"
    return out, rows, ""


def _ref_all(core: NodeCore, txns: list[Txn]) -> tuple[list[Txn], int, str]:
    out: list[Txn] = []
    for t in txns:
        try:
            got = _reference(core, t)
        except RemoteProtocolError:
            return out, sum(len(x.ops) for x in out), "refused"
        out += got
    return out, sum(len(x.ops) for x in out), ""


@pytest.mark.parametrize("seed", range(200))
def test_receive_run_decides_as_one_by_one(seed):
    rng = random.Random(seed)
    expelled = None if seed % 3 else rng.randint(5, 40)
    txns = _txns(rng, rng.randint(1, 40))
    a, b = _core(expelled), _core(expelled)
    assert _run_all(a, txns) == _ref_all(b, txns), f"seed {seed}"
    assert a.claimed == b.claimed
    assert a.hlc.last == b.hlc.last
    assert a.peers[PEER].stats == b.peers[PEER].stats


def test_receive_run_stops_at_another_origin():
    core = _core(None)
    txns = [Txn(7, 6, GROUP_DEFAULT, 1, (Op(OP_PUT, "s", "a", 1),)),
            Txn(3, 6, GROUP_DEFAULT, 1, (Op(OP_PUT, "s", "b", 1),))]
    out: list[Txn] = []
    assert core.receive_run(PEER, txns, 0, out, WALL) == (1, 1)
    assert out == [txns[0].with_replica_id(2)]


def test_receive_run_claims_what_came_before_a_refusal():
    core = _core(None)
    txns = [Txn(7, 6, GROUP_DEFAULT, 9, (Op(OP_PUT, "s", "a", 1),)),
            Txn(7, 6, GROUP_DEFAULT, 1, (Op(OP_PUT, "s", "a", 1), Op(OP_PUT, "s", "b", 1)))]
    out: list[Txn] = []
    with pytest.raises(RemoteProtocolError):
        core.receive_run(PEER, txns, 0, out, WALL)
    assert out == [txns[0].with_replica_id(2)]
    assert core.claimed.get(2) == 6 and core.hlc.last == 9


def test_commit_advances_each_component_to_its_highest_last_lsn():
    core = _core(None)
    core.commit([Txn(2, 6, GROUP_DEFAULT, 1, (Op(OP_PUT, "s", "a", 1),) * 3),
                 Txn(3, 6, GROUP_DEFAULT, 1, (Op(OP_PUT, "s", "a", 1),)),
                 Txn(2, 9, GROUP_DEFAULT, 1, (Op(OP_PUT, "s", "a", 1),)),
                 Txn(2, 4, GROUP_DEFAULT, 1, (Op(OP_PUT, "s", "a", 1),))])
    assert core.vclock == VClock({2: 9, 3: 6})
