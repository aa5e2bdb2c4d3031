"""A relay in the middle: a box that a real member's applier connects to (a stale peer address,
a reused IP) forwards that member's authentication to a victim node, then tries to use it.
It must get nothing: not one message it sends after AUTH_OK is accepted, and the victim sends
it no snapshot or rows of its asking. Replaying the member's old AUTH on a fresh link is
refused too."""
from __future__ import annotations

import asyncio
import os

import aiohttp

from node.core import messages as m
from node.core import session as sess
from tests.adversary.attacker import RelayInTheMiddle, greeting, plain_or_sealed
from tests.integration.harness import ReplogProcess, wait_for

EVIL_UUID = "0badc0de-0000-4000-8000-000000000001"
GIVEN_AWAY = {"SNAPSHOT", "SNAPSHOT_ROWS", "SNAPSHOT_END", "SUBSCRIBED", "ROWS", "REGISTERED", "SHUTDOWN_OK"}


async def ask_in_its_own_name(member, victim, auth_ok: bytes) -> None:
    """Never answers the member; asks the victim for its snapshot as a peer of its own."""
    await victim.send_bytes(m.encode(m.GREETING, **greeting(EVIL_UUID, "127.0.0.1:9")))
    await victim.send_bytes(m.encode(m.FETCH_SNAPSHOT))


async def member_greets(member, victim, auth_ok: bytes) -> bytes:
    """Let the member finish its handshake with the victim: its (sealed) greeting goes through."""
    await member.send_bytes(auth_ok)
    mine = await member.receive(timeout=10)
    await victim.send_bytes(mine.data)
    return mine.data


async def swap_the_request_for_a_snapshot(member, victim, auth_ok: bytes) -> None:
    """After the member's own greeting, a FETCH_SNAPSHOT of the attacker's, under a made-up tag."""
    await member_greets(member, victim, auth_ok)
    await victim.send_bytes(m.encode(m.FETCH_SNAPSHOT) + os.urandom(sess.TAG_BYTES))


async def replay_the_members_greeting(member, victim, auth_ok: bytes) -> None:
    """The member's greeting, sent again in the place of its next message."""
    mine = await member_greets(member, victim, auth_ok)
    await victim.send_bytes(mine)


async def reflect_the_victims_greeting(member, victim, auth_ok: bytes) -> None:
    """The victim's own (sealed) greeting, sent back to it as if it came from the member."""
    await member_greets(member, victim, auth_ok)
    theirs = await victim.receive(timeout=10)
    await victim.send_bytes(theirs.data)


ATTACKS = [ask_in_its_own_name, swap_the_request_for_a_snapshot, replay_the_members_greeting,
           reflect_the_victims_greeting]


def test_a_relayed_handshake_gets_nothing_from_the_victim(tmp_path, procs):
    secret = tmp_path / "secret"
    secret.write_text("relay-test-secret\n")
    victim = ReplogProcess(tmp_path, "victim", extra=["--secret-file", str(secret)]).start()
    procs.append(victim)
    victim.create_space("kv")
    victim.kv_put("kv", "crown-jewels", {"secret": True})
    member = ReplogProcess(tmp_path, "member", peers=[victim], extra=["--secret-file", str(secret)]).start()
    procs.append(member)
    wait_for(lambda: member.kv_get("kv", "crown-jewels")[0] == 200, 30, "the member joined and replicated")

    async def attack() -> RelayInTheMiddle:
        relay = await RelayInTheMiddle(victim.address, ATTACKS).start()
        try:
            # The member's peer address now leads to the attacker's box.
            await asyncio.to_thread(member.set_peers, [f"127.0.0.1:{relay.port}"])
            await asyncio.wait_for(relay.done.wait(), 60)
            # An old AUTH replayed on a fresh link: the victim's new nonce makes it worthless.
            async with aiohttp.ClientSession() as s, s.ws_connect(victim.url + "/v1/replication") as ws:
                await ws.receive(timeout=10)                          # a fresh HELLO
                await ws.send_bytes(relay.auths[0])
                answer = await ws.receive(timeout=10)
                assert plain_or_sealed(answer.data) == "ERROR" and m.decode(answer.data)["code"] == "auth"
        finally:
            await relay.stop()
        return relay

    relay = asyncio.run(attack())
    for name, seen in zip([a.__name__ for a in ATTACKS], relay.after_auth):
        assert not GIVEN_AWAY & set(seen), f"{name}: the victim gave away {seen}"
        assert set(seen) <= {"GREETING", "ERROR"}, f"{name}: {seen}"
        # The only greeting is the victim's answer to the member's own: never one to the attacker.
        assert name != "ask_in_its_own_name" or "GREETING" not in seen, seen
    log = victim.log_text()
    assert log.count("fails its session tag") >= len(ATTACKS), log[-3000:]
    assert "refused an unauthenticated link from 127.0.0.1: " in log and "wrong cluster secret" in log
    assert EVIL_UUID not in str(victim.cluster()), "the attacker got itself registered"
    assert victim.get("/v1/health")[0] == 200
