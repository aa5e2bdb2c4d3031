"""TLS connects that the peer resets during the handshake, on uvloop and on asyncio's loop, side by
side: why `event_loop = auto` runs a node with TLS on asyncio (node/config.py loop_module).

A TLS WebSocket echo server (aiohttp, as a node's) and a port that accepts and resets at once
(SO_LINGER 0, as a node killed while a peer dials it). The client, aiohttp as an applier dials,
keeps 8 echo links busy and dials the resetting port from 16 tasks for the seconds given. It counts the
dials refused with "File descriptor N is used by transport" (`fd`: a transport left registered on
a closed descriptor), other RuntimeErrors, and echoes that came back wrong.

    python -m bench.uvloop_tls uvloop 10
    python -m bench.uvloop_tls asyncio 10

Measured on this project's machine (uvloop 0.23.0, aiohttp 3.14.5): uvloop, 20 s: 17,819 of
18,809 dials refused that way (10 s: 10,984 of 11,573), and none when the dials are plain TCP;
asyncio: none."""
from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import sys
import tempfile
import time

import aiohttp

from bench.throwaway_ca import ThrowawayCA

async def main_counts(seconds: float, ca_dir: str) -> dict[str, int]:
    """One run on the running loop: the counts."""
    from aiohttp import web
    tls = ThrowawayCA(ca_dir).issue("node")
    sctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    sctx.load_cert_chain(tls.cert_file, tls.key_file)
    cctx = ssl.create_default_context(cafile=tls.ca_file)
    async def ws(request):
        w = web.WebSocketResponse(); await w.prepare(request)
        async for msg in w:
            await w.send_bytes(msg.data)
        return w
    app = web.Application(); app.router.add_get("/ws", ws)
    runner = web.AppRunner(app); await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=sctx); await site.start()
    good_port = site._server.sockets[0].getsockname()[1]

    # a port that accepts and resets at once
    rs = socket.socket(); rs.bind(("127.0.0.1", 0)); rs.listen(512); rs.setblocking(False)
    bad_port = rs.getsockname()[1]
    loop = asyncio.get_running_loop()
    async def resetter():
        while True:
            c, _ = await loop.sock_accept(rs)
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()
    rt = asyncio.ensure_future(resetter())

    errors = {"fd": 0, "wrong": 0, "other": 0, "echo": 0, "dials": 0, "echo_links_failed": 0}
    async with aiohttp.ClientSession() as s:
        async def echo(k):
            try:
                async with s.ws_connect(f"https://127.0.0.1:{good_port}/ws", ssl=cctx) as w:
                    i = 0
                    end = time.monotonic() + seconds
                    while time.monotonic() < end:
                        body = f"{k}:{i}".encode() * 50
                        await w.send_bytes(body)
                        m = await w.receive()
                        if m.data != body:
                            errors["wrong"] += 1
                        errors["echo"] += 1
                        i += 1
            except (aiohttp.ClientError, OSError, RuntimeError):
                errors["echo_links_failed"] += 1
        async def dial():
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                try:
                    async with s.ws_connect(f"https://127.0.0.1:{bad_port}/ws", ssl=cctx,
                                            timeout=aiohttp.ClientWSTimeout(ws_close=1)):
                        pass
                except RuntimeError as e:
                    if "is used by transport" in str(e):
                        errors["fd"] += 1
                    else:
                        errors["other"] += 1
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                    pass
                errors["dials"] += 1
        await asyncio.gather(*(echo(k) for k in range(8)), *(dial() for _ in range(16)), return_exceptions=False)
    rt.cancel()
    rs.close()
    await runner.cleanup()
    return errors


def main(argv: list[str]) -> int:
    loop = argv[0] if argv else "uvloop"
    seconds = float(argv[1]) if len(argv) > 1 else 10.0
    with tempfile.TemporaryDirectory(prefix="replog-uvloop-tls-") as d:
        if loop == "uvloop":
            import uvloop
            counts = uvloop.run(main_counts(seconds, d))
        else:
            counts = asyncio.run(main_counts(seconds, d))
    print(loop, counts, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
