"""The client port's time bound on request bodies, on a real node in this process (real LMDB,
real sockets): a body that does not arrive within `http_body_timeout_s` is a 408 with the JSON
error body, and the connection does not hold the node (issue 15: HTTP header and body read
timeouts). The bound is lowered for the test; the header bound has its own test with real
processes (tests/integration/test_poison_client.py)."""
from __future__ import annotations

import asyncio
import json
import time

from node import limits
from tests.unit.test_dashboard_http import open_node as node  # noqa: F401 (a fixture: a node without a token)


async def test_a_body_that_does_not_arrive_in_time_is_a_408(node, monkeypatch):
    monkeypatch.setattr(limits, "http_body_timeout_s", 1.0)
    host, port = node.cfg.address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"PUT /v1/spaces/kv/keys/slow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n[1, 2, ")       # 7 of the 100 bytes it announced, then nothing
        await writer.drain()
        started = time.monotonic()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        took = time.monotonic() - started
        assert head.startswith(b"HTTP/1.1 408"), head
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        body = json.loads(await reader.readexactly(length))
        assert body["error"]["code"] == "body_timeout"
        assert limits.http_body_timeout_s <= took < limits.http_body_timeout_s + 3, took
    finally:
        writer.close()
    assert node.status == "running"
