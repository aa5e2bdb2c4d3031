"""A peer address that is not a replog node's HTTP address says so (node/applier/conn.py
connect): an HTTP server without /v1/replication (404), and a port that does not answer HTTP
at all, such as a node's binary client port. Real sockets on 127.0.0.1."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from node.applier.conn import connect


async def test_an_http_server_without_the_replication_endpoint_is_named_so():
    app = web.Application()
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as s:
            with pytest.raises(ConnectionError, match="answered HTTP 404 for /v1/replication: not a replog node"):
                await connect(s, f"127.0.0.1:{port}")
    finally:
        await runner.cleanup()


async def test_a_port_that_does_not_answer_http_is_named_so():
    async def answer(reader, writer):
        await reader.read(100)
        writer.write(b"\x00\x00\x00\x05\x92\xc0\x91\x93\xc0")     # a binary frame, as a client port answers
        await writer.drain()
        writer.close()
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as s:
            with pytest.raises(ConnectionError, match="does not answer HTTP .*binary client port"):
                await connect(s, f"127.0.0.1:{port}")
    finally:
        server.close()
        await server.wait_closed()
