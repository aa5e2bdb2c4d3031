"""Generated input on the replication endpoint of a real node: from a client that does not hold
the secret (whatever it sends before authenticating), and from a peer that does (mutated rows,
tests/integration/fakepeer.py). The oracle each time: the node lives, what the rules accept is
applied and what they refuse is refused with a reason, replication from an honest peer goes on,
and at the end a kill -9 restart recovers the WAL. Each mutated-rows round ends on what the node
shows (refused, the last row applied, or a row past a gap counted), never on a quiet period;
`REPLOG_FUZZ_SEED=N` replays the rounds of a failure's seed."""
from __future__ import annotations

import asyncio
import os
import random
import time

import aiohttp
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from bench.fuzz_rowscan import mutate
from node import limits
from node.core import messages as m
from node.core.rows import GROUP_CLUSTER, GROUP_LOCAL, OP_DELETE, OP_NOP, OP_PUT, OP_SPACE, Op
from tests.integration.fakepeer import FakePeer, rows_message, running
from tests.integration.harness import PortReservation, ReplogProcess, wait_for

SECRET = b"fuzz secret"
FUZZ_S = 20.0                              # the authenticated peer's rounds stop after this


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wirefuzz")
    secret = tmp / "secret"
    secret.write_bytes(SECRET)
    ra, rb = PortReservation(), PortReservation()     # held until the end: no other test's node takes them
    extra = ["--secret-file", str(secret)]
    a = ReplogProcess(tmp, "a", reservation=ra, peers=[f"127.0.0.1:{rb.port}"], extra=extra)
    b = ReplogProcess(tmp, "b", reservation=rb, peers=[f"127.0.0.1:{ra.port}"], extra=extra)
    try:
        for n in (a, b):
            n.start(wait=False)
        for n in (a, b):
            n.wait_healthy(60)
        a.create_space("kv")
        wait_for(lambda: b.get("/v1/spaces/kv/keys")[0] == 200, 20, "kv on B")
        yield a, b
    finally:
        for n in (a, b):
            n.kill9()
            n.release_port()


def _alive_and_replicating(a: ReplogProcess, b: ReplogProcess, tag: str) -> None:
    assert a.proc.poll() is None, a.log_tail()
    assert a.get("/v1/health")[0] == 200
    b.kv_put("kv", f"honest-{tag}", tag)
    wait_for(lambda: a.kv_get("kv", f"honest-{tag}")[0] == 200, 20, "B's row reaches A")


# --- before authentication -------------------------------------------------------------------------
_ANY = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.binary(max_size=40)
                    | st.text(max_size=20), lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c,
                                                                                            max_size=4), max_leaves=15)
_FIRST = st.one_of(st.binary(max_size=300),
                   st.tuples(st.sampled_from(sorted(m.SCHEMA)), st.dictionaries(st.sampled_from(
                       ["nonce", "mac", "version", "uuid", "vclock", "frames"]), _ANY, max_size=3)).map(
                       lambda p: msgpack.packb([p[0], p[1]])),
                   _ANY.map(lambda v: msgpack.packb(v)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=_FIRST, text=st.booleans())
def test_whatever_an_unauthenticated_client_sends_the_node_lives(cluster, first, text):
    a, _ = cluster

    async def talk() -> None:
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(a.url + "/v1/replication") as ws:
                await ws.receive(timeout=10)                         # HELLO
                if text:
                    await ws.send_str(first.decode("latin-1"))
                else:
                    await ws.send_bytes(first)
                msg = await ws.receive(timeout=10)
                while msg.type == aiohttp.WSMsgType.BINARY:          # an ERROR, then the close
                    msg = await ws.receive(timeout=10)
                assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)

    asyncio.run(talk())
    assert a.get("/v1/health")[0] == 200


# --- from a peer holding the secret ------------------------------------------------------------------
def _mutant(rng: random.Random, peer: FakePeer, lsn: int, key: str):
    """A txn at `lsn` put under `key`, with one part replaced by an edge case, or its bytes
    mutated; returns what to send (a Txn or raw message bytes)."""
    good = peer.txn(lsn, (Op(OP_PUT, "kv", key, {"v": 1}),))
    how = rng.randrange(9)
    if how == 0:
        return peer.txn(lsn, (Op(OP_PUT, "kv", key, rng.choice([float("nan"), b"\x00", [[[[]]]] * 3, 2**64 - 1,
                                                                  {"k": msgpack.Timestamp(1, 0)}, "é" * 9])),))
    if how == 1:
        return peer.txn(lsn, (Op(OP_PUT, "kv", rng.choice(["", "k" * 512, "k" * 511 + key[:0], key]), 1),))
    if how == 2:
        return peer.txn(lsn, (Op(OP_PUT, rng.choice(["nope", "9bad", "_cluster", "kv", "x" * 65]), key, 1),))
    if how == 3:
        return peer.txn(lsn, (Op(OP_PUT, "kv", key, 1),), ts=rng.choice([0, 2**62, 2**63, 2**64 - 1,
                                                                        time.time_ns() // 1000 + 3600 * 10**6]))
    if how == 4:
        return peer.txn(lsn, (Op(OP_PUT, "kv", key, 1),), group=rng.choice([GROUP_LOCAL, GROUP_CLUSTER, 7]))
    if how == 5:
        return peer.txn(lsn, (Op(rng.choice([OP_DELETE, OP_NOP, OP_SPACE, 9]), "kv", key, rng.choice([None, 1])),))
    if how == 6:
        return peer.txn(lsn, (Op(OP_PUT, "kv", key, 1),), replica_id=rng.choice([0, 999, limits.replica_id_max + 1]))
    data = rows_message([good])
    return mutate(rng, data) if how == 7 else data


def _allowed(peer: FakePeer, item) -> set[str]:
    """The outcomes the rules allow for the mutant: {"refused"} by the exact decoder's verdict or
    what needs A's state (its only replicated space is kv, the peer's rows carry the peer's id,
    the clock bound), else {"accepted", "quiet"}. A txn that names another member of the peer's
    table (every earlier round's fake peer is one: after a few hundred rounds a mutated id byte
    lands on one) is a row the peer relays, decided by what A holds of that member: refused or
    not, and the peer's own rows then have a gap at lsn 2 unless the message also carries it,
    so the peer's last row is not accepted."""
    from node.core.rows import GROUP_DEFAULT
    try:
        msg = m.decode(item if isinstance(item, bytes) else rows_message([item]))
    except Exception:   # noqa: BLE001 - undecodable: refused
        return {"refused"}
    if msg.type != m.ROWS or msg["error"] is not None:
        return {"refused"}
    others = {int(r[1]) for r in peer.table} - {peer.id}
    if any(t.replica_id in others for t in msg["txns"]):
        own_2 = any(t.replica_id == peer.id and t.lsn == 2 for t in msg["txns"])
        return {"refused", "quiet", "accepted"} if own_2 else {"refused", "quiet"}
    ahead = time.time_ns() // 1000 + int(limits.hlc_offset_max_s * 1e6)
    for t in msg["txns"]:
        if t.group != GROUP_DEFAULT or t.replica_id != peer.id or (t.lsn == 2 and t.timestamp > ahead):
            return {"refused"}
        if t.lsn == 2 and any(o.kind in (OP_PUT, OP_DELETE) and o.space != "kv" for o in t.ops):
            return {"refused"}
    return {"accepted", "quiet"}


def test_mutated_rows_from_a_peer_holding_the_secret_never_harm_the_node(cluster):
    a, b = cluster
    seed = int(os.environ.get("REPLOG_FUZZ_SEED") or random.SystemRandom().randrange(1 << 32))
    rng = random.Random(seed)
    deadline = time.monotonic() + FUZZ_S
    rounds = accepted = refused = 0
    while time.monotonic() < deadline:
        rounds += 1
        with running(FakePeer(SECRET), a.address) as (peer, _):
            key = f"{peer.uuid[:8]}-fuzz"
            first, last = f"{peer.uuid[:8]}-first", f"{peer.uuid[:8]}-last"
            peer.script = [peer.txn(1, (Op(OP_PUT, "kv", first, 1),)), _mutant(rng, peer, 2, key),
                           peer.txn(3, (Op(OP_PUT, "kv", last, 1),))]
            a.set_peers([b, peer])
            try:
                def settled():
                    up = next((u for u in a.info()["upstreams"] if u["address"] == peer.address), {})
                    if up.get("error") and up.get("status") != "follow":
                        return "refused"
                    if a.kv_get("kv", last)[0] == 200:
                        return "accepted"
                    if up.get("gaps"):
                        # the mutant took another lsn: a row past a gap waits for a route that has
                        # the rows before it (node/core/receive.py), and so does every row after it
                        return "quiet"
                    return None
                wait_for(lambda: a.kv_get("kv", first)[0] == 200, 20, f"round {rounds} (seed {seed}) starts")
                outcome = wait_for(settled, 20, f"round {rounds} (seed {seed}) settles: {peer.script[1]!r:.300}")
            finally:
                a.set_peers([b])
        accepted += outcome != "refused"
        refused += outcome == "refused"
        assert a.proc.poll() is None, f"seed {seed}: A died:\n{a.log_tail()}"
        assert outcome in _allowed(peer, peer.script[1]), \
            f"seed {seed}, round {rounds}: {outcome} {peer.script[1]!r:.300}"
    _alive_and_replicating(a, b, f"after-{seed}")
    a.kill9()
    a.start()
    _alive_and_replicating(a, b, f"restarted-{seed}")
    assert rounds >= 5, rounds
