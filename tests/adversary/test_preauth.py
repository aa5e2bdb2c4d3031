"""The surface a node shows before a peer has proven the cluster secret: it reads nothing larger
than the AUTH message, inflates nothing, holds a bounded number of handshakes, and logs failed
ones at a bounded rate.

The damage bound of the first test, measured against a baseline taken in the same test: while
two streams of compression bombs (16 KB that inflate to a 16 MiB array of maps, ~1 GB of Python
objects) and 16 MiB uncompressed messages hit /v1/replication, the node's resident memory grows
by less than RSS_GROWTH_KIB_MAX and no /v1/health answer takes longer than the slowest of the
baseline times HEALTH_SLOWDOWN_MAX (and at least HEALTH_FLOOR_S, for a busy machine). Before
this bound existed, one bomb cost 1.3 GB and 0.7 s of event loop."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from node import limits
from node.applier.conn import client_auth, connect
from node.errors import PeerRefused
from tests.adversary.attacker import HealthSampler, RawLink, inflating_message, metric, rss_kib
from tests.integration.harness import ReplogProcess, wait_for

RSS_GROWTH_KIB_MAX = 64 * 1024       # what two attack streams may add to the node's resident set
HEALTH_SLOWDOWN_MAX = 10             # the slowest health answer under attack, against the baseline's
HEALTH_FLOOR_S = 0.5                 # ... but a bound under this is noise on a shared machine
ROUNDS = 6                           # bombs per stream


def node_with_secret(tmp_path, procs, name: str = "n") -> ReplogProcess:
    secret = tmp_path / "secret"
    secret.write_text("preauth-test-secret\n")
    n = ReplogProcess(tmp_path, name, extra=["--secret-file", str(secret)]).start()
    procs.append(n)
    return n


async def bomb_stream(port: int, rounds: int, raw: bytes, packed: bytes) -> list[int]:
    """Compressed bombs (RSV1 frames, offered deflate or not) and raw 16 MiB messages
    (`inflating_message`, built before the clock starts: building it takes the attacker ~0.2 s)."""
    statuses = []
    for i in range(rounds):
        link = await RawLink.open("127.0.0.1", port, deflate=True)
        statuses.append(link.status)
        try:
            link.send(packed if i % 2 == 0 else raw, compressed=i % 2 == 0)
            await link.drain()
        except ConnectionError:
            pass                                  # the node hung up before reading it all: the point
        await link.until_closed()
        link.close()
    return statuses


def test_pre_auth_bombs_and_oversized_messages_cost_the_node_a_bounded_amount(tmp_path, procs):
    n = node_with_secret(tmp_path, procs)
    pid = n.proc.pid

    async def attack(raw: bytes, packed: bytes) -> tuple[int, int, list[int]]:
        rss0 = peak = rss_kib(pid)
        attack = asyncio.gather(bomb_stream(n.port, ROUNDS, raw, packed), bomb_stream(n.port, ROUNDS, raw, packed))
        while not attack.done():
            peak = max(peak, rss_kib(pid))
            await asyncio.wait([attack], timeout=0.02)
        return rss0, max(peak, rss_kib(pid)), [s for part in attack.result() for s in part]

    raw, packed = inflating_message(limits.message_bytes_max)
    with HealthSampler(n.url) as base:
        time.sleep(1.0)                                     # the baseline's sampling period
    with HealthSampler(n.url) as under:
        rss0, peak, statuses = asyncio.run(attack(raw, packed))
    baseline, during = base.latencies, under.latencies
    assert statuses == [101] * (2 * ROUNDS), statuses
    assert peak - rss0 < RSS_GROWTH_KIB_MAX, f"RSS grew by {(peak - rss0) / 1024:.0f} MiB under pre-auth bombs"
    bound = max(HEALTH_FLOOR_S, HEALTH_SLOWDOWN_MAX * max(baseline))
    assert during and max(during) < bound, \
        f"/v1/health took {max(during):.3f} s under attack (baseline max {max(baseline):.3f} s, bound {bound:.3f} s)"
    assert n.get("/v1/health")[0] == 200
    log = n.log_text()
    assert "refused an unauthenticated link from 127.0.0.1" in log


def test_a_pre_auth_message_over_the_auth_size_is_refused_without_being_read(tmp_path, procs):
    n = node_with_secret(tmp_path, procs)

    async def run() -> list[tuple[int, bytes]]:
        link = await RawLink.open("127.0.0.1", n.port)
        link.send(b"\x92\x02\x83" + b"x" * limits.preauth_message_bytes_max)
        await link.drain()
        frames = await link.frames()
        link.close()
        return frames

    frames = asyncio.run(run())
    assert [op for op, _ in frames] == [2, 8], frames                  # HELLO, then a CLOSE
    assert int.from_bytes(frames[1][1][:2], "big") == aiohttp.WSCloseCode.MESSAGE_TOO_BIG, frames
    assert n.get("/v1/health")[0] == 200


def test_handshakes_in_flight_from_one_address_are_bounded_and_refused_before_the_upgrade(tmp_path, procs):
    n = node_with_secret(tmp_path, procs)

    async def run() -> tuple[list[int], int, int]:
        silent = [await RawLink.open("127.0.0.1", n.port) for _ in range(limits.handshakes_per_address_max)]
        over = await RawLink.open("127.0.0.1", n.port)
        over.close()
        health = await asyncio.to_thread(n.get, "/v1/health")
        silent.pop().close()                                            # one handshake gives up

        async def admitted() -> int:
            while True:
                link = await RawLink.open("127.0.0.1", n.port)
                link.close()
                if link.status == 101:
                    return link.status
                await asyncio.sleep(0.05)
        again = await asyncio.wait_for(admitted(), 10)
        statuses = [s.status for s in silent]
        for s in silent:
            s.close()
        return statuses, over.status, again if health[0] == 200 else health[0]

    statuses, over, again = asyncio.run(run())
    assert statuses == [101] * (limits.handshakes_per_address_max - 1)
    assert over == 503, "the handshake past the bound must be refused before the upgrade"
    assert metric(n.url, "replog_link_handshakes_refused_total") >= 1
    assert again == 101, "health must answer while handshakes are held, and a freed place be taken again"


def test_failed_authentications_log_one_line_per_address_per_interval(tmp_path, procs):
    n = node_with_secret(tmp_path, procs)

    async def fail(times: int) -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(times):
                conn = await connect(session, n.address)
                with pytest.raises(PeerRefused):
                    await client_auth(conn, b"not the secret", "0badc0de-0000-4000-8000-0000000000aa")
                await conn.close()

    asyncio.run(fail(40))
    wait_for(lambda: "wrong cluster secret" in n.log_text(), 10, "the first failure logged")
    lines = [ln for ln in n.log_text().splitlines() if "127.0.0.1" in ln and "wrong cluster secret" in ln]
    assert len(lines) == 1 and "WARNING" in lines[0], lines[:5]
    assert metric(n.url, "replog_link_auth_failures_total") == 40, "every failure is counted, if not logged"
    assert n.info()["status"] == "running"
