"""Secrets never travel to addresses learned from peers. Anyone holding the cluster secret can
register a member at an address it listens on; a node then calls that address during an orderly
cluster shutdown, and `replog status` follows it. The listener must never see the client bearer
token, and nothing it sees may be replayed to act on another node."""
from __future__ import annotations

import asyncio
import subprocess

import aiohttp

from node.core import messages as m
from node.status import status_table
from tests.adversary.attacker import Listener, plain_or_sealed, register_member
from tests.integration.harness import ReplogProcess, mesh, request, wait_for

TOKEN = "client-token-that-must-stay-home"
SECRET = b"learned-address-secret"
LISTENER_UUID = "1157e4e4-0000-4000-8000-000000000001"


def test_a_listener_registered_as_a_member_never_sees_the_client_token_nor_can_use_what_it_sees(tmp_path, procs):
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    (tmp_path / "token").write_text(TOKEN + "\n")
    opts = ["--secret-file", str(tmp_path / "secret"), "--token-file", str(tmp_path / "token")]
    a, b = mesh(tmp_path, 2, extra=opts, token=TOKEN)
    procs.extend([a, b])
    a.create_space("kv")
    a.kv_put("kv", "k", "v")
    replica = ReplogProcess(tmp_path, "replica", peers=[a], extra=opts + ["--anon"], token=TOKEN).start()
    procs.append(replica)                 # not a member: the cluster shutdown leaves it running
    wait_for(lambda: replica.kv_get("kv", "k")[0] == 200, 30, "the replica caught up")

    async def scenario() -> Listener:
        listener = await Listener().start()
        try:
            assert await register_member(a.address, SECRET, LISTENER_UUID, listener.address) >= 1
            await asyncio.to_thread(wait_for, lambda: LISTENER_UUID in b.cluster(), 30, "B learns the new member")
            # An operator looks at the cluster: the status table follows every member's address.
            table = await asyncio.to_thread(status_table, [a.url], TOKEN)
            assert a.uuid()[:8] in table
            # ... and shuts the cluster down: the coordinator calls every member, the listener too.
            s, d = await asyncio.to_thread(a.post, "/v1/admin/shutdown", {"cluster": True})
            assert s == 202, (s, d)
            for n in (a, b):
                assert await asyncio.to_thread(n.proc.wait, 60) == 0, n.log_tail()
            await asyncio.to_thread(wait_for, lambda: listener.requests, 10, "the listener was called")
            await replay_everything(listener, replica)
        finally:
            await listener.stop()
        return listener

    listener = asyncio.run(scenario())
    seen = listener.everything()
    assert TOKEN.encode() not in seen, "the client token reached an address learned from the cluster"
    assert not [r for r in listener.requests if "Authorization" in r["headers"]]
    # /readyz: `replog status` asks every learned member whether it is ready; it needs no token
    assert {r["path"] for r in listener.requests} <= {"/v1/replication", "/v1/info", "/v1/cluster", "/readyz"}
    assert "not reached (stay dirty)" in a.log_text() and listener.address in a.log_text()
    # Nothing the listener replayed moved the replica.
    assert replica.get("/v1/health")[0] == 200 and replica.info()["status"] == "running"
    assert replica.kv_get("kv", "k")[1]["value"] == "v"


async def replay_everything(listener: Listener, target: ReplogProcess) -> None:
    """Every request the listener got, sent again to `target` as it came; every link message it
    got, sent on a fresh link to `target`; and a plain shutdown with each header it saw."""
    async with aiohttp.ClientSession() as session:
        for r in list(listener.requests):
            if r["messages"]:
                for data in r["messages"]:
                    async with session.ws_connect(target.url + "/v1/replication") as ws:
                        await ws.receive(timeout=10)                      # the target's own HELLO
                        await ws.send_bytes(data)
                        answer = await ws.receive(timeout=10)
                        assert answer.type != aiohttp.WSMsgType.BINARY or plain_or_sealed(answer.data) == "ERROR"
                continue
            if r["headers"].get("Upgrade"):
                continue
            headers = {k: v for k, v in r["headers"].items() if k.lower() not in ("host", "content-length")}
            async with session.request(r["method"], target.url + r["path"], headers=headers, data=r["body"]) as resp:
                await resp.read()
            auth = r["headers"].get("Authorization")
            if auth:
                async with session.post(target.url + "/v1/admin/shutdown", json={"cluster": False},
                                        headers={"Authorization": auth}) as resp:
                    await resp.read()
