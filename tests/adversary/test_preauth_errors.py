"""An ERROR before authentication is anyone's word. A box at a peer's address (a stale address,
a reused IP) that holds no secret can answer a node's applier with an ERROR before the
handshake. A relay says only a few things then (it is shutting down, the protocol version, the
secret, a malformed handshake: node/applier/accept.py and server_auth); an ERROR that states
what only a member may state (rejoin, you are expelled, wrong cluster, a duplicate link) must
change nothing: the link counts as broken, is retried with the backoff, and the node neither
notes a rejoin need nor takes a lasting refusal from it."""
from __future__ import annotations

import asyncio

from aiohttp import web

from node.core import messages as m
from tests.adversary.attacker import serve
from tests.integration.harness import ReplogProcess, wait_for
from tests.integration.oracles import upstream

SECRET = b"pre-auth errors secret"
# What only an authenticated peer may say, each with what it would do if taken at its word.
CLAIMS = ["need_rejoin", "expelled", "wrong_cluster", "duplicate", "self", "followers_full", "forgotten"]


class Liar:
    """Answers every replication link at once, before any HELLO, with ERROR `code`."""

    def __init__(self):
        self.code = ""
        self.links = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(compress=False)
        await ws.prepare(request)
        self.links += 1
        await ws.send_bytes(m.encode(m.ERROR, code=self.code, message=f"says the liar: {self.code}",
                                     needed={}))
        await ws.close()
        return ws


def test_an_error_before_authentication_that_claims_a_members_word_is_a_broken_link(tmp_path, procs):
    (tmp_path / "secret").write_bytes(SECRET)
    a = ReplogProcess(tmp_path, "a", extra=["--secret-file", str(tmp_path / "secret")]).start()
    procs.append(a)
    a.create_space("kv")
    a.kv_put("kv", "k", "v")
    liar = Liar()

    async def scenario() -> None:
        runner, liar.port = await serve(liar.handle, "/v1/replication")
        address = f"127.0.0.1:{liar.port}"
        try:
            for code in CLAIMS:
                liar.code, liar.links = code, 0
                await asyncio.to_thread(a.set_peers, [address])
                # A lasting refusal waits 5 to 15 s and need_rejoin 2.5 to 7.5 s between tries:
                # three tries within 2 s are the backoff of a broken link.
                await asyncio.to_thread(wait_for, lambda: liar.links >= 3, 2.0, f"three tries after {code}")
                up = await asyncio.to_thread(upstream, a, address)
                assert up.get("status") == "disconnected", (code, up)
                assert "before authentication" in up.get("error", ""), (code, up)
                info = await asyncio.to_thread(a.info)
                assert info["rejoin"] is None, (code, info["rejoin"])      # no need noted, nothing gone without
                await asyncio.to_thread(a.set_peers, [])
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
    assert a.kv_get("kv", "k")[0] == 200 and a.get("/v1/health")[0] == 200
    errors = [line for line in a.log_text().splitlines() if line.split()[1:2] == ["ERROR"]]
    assert not errors, "an unauthenticated word is no ERROR of this node's: " + "\n".join(errors)
