"""The dashboard's server side on a real node (in this process, real LMDB, real sockets):
the static page, the events stream and its bounds, the token, and what a browser may do
(CORS only for members' pages, no cross-origin writes, no DNS rebinding of a token-less node)."""
from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import gc
import json
import os
import socket
import time
import tomllib

import aiohttp
import pytest

from node import limits
from node.config import Config
from node.http import events
from node.http.ui import UI_DIR
from node.server import Node
from tests.waiting import until

TOKEN = "t0ken"
EVIL = "http://evil.example"


@contextlib.contextmanager
def collector_restored():
    """The collector's settings as they were, after a node in this process tuned it for a
    server (node/process/node.py tune_gc): pytest is not one."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


async def start_node(tmp_path, listen, token: str = TOKEN) -> Node:
    node = Node(Config(data_dir=str(tmp_path / "n"), listen=listen(), token=token))
    await node.start()
    await until(lambda: node.status == "running", 20, "the node to bootstrap")
    return node


@pytest.fixture
async def node(tmp_path, listen):
    with collector_restored():
        n = await start_node(tmp_path, listen)
        yield n
        await n.stop()


@pytest.fixture
async def open_node(tmp_path, listen):
    with collector_restored():
        n = await start_node(tmp_path, listen, token="")
        yield n
        await n.stop()


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as s:
        yield s


def url(node: Node, path: str) -> str:
    return f"http://{node.cfg.address}{path}"


def auth(token: str = TOKEN, **more) -> dict:
    return {"Authorization": f"Bearer {token}", **more}


async def next_snapshot(resp: aiohttp.ClientResponse) -> dict:
    """The next SSE frame of `resp` (any size: readuntil stops at 64 KiB)."""
    buf = resp.__dict__.setdefault("_sse_buf", bytearray())
    while (end := buf.find(b"\n\n")) < 0:
        chunk = await asyncio.wait_for(resp.content.readany(), 10)
        if not chunk:
            raise EOFError("the stream ended")
        buf += chunk
    frame = bytes(buf[:end])
    del buf[:end + 2]
    lines = frame.decode().split("\n")
    assert lines[0] == "event: snapshot", lines
    return json.loads(lines[1].removeprefix("data: "))


# --- the page ---------------------------------------------------------------------------------
async def test_the_page_loads_without_a_token_and_forbids_framing_and_foreign_scripts(node, http):
    for path, ctype in (("/ui", "text/html"), ("/ui/", "text/html"), ("/ui/app.js", "text/javascript"),
                        ("/ui/style.css", "text/css")):
        async with http.get(url(node, path)) as r:
            assert r.status == 200, path
            assert r.content_type == ctype, path
            csp = r.headers["Content-Security-Policy"]
            assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
            assert r.headers["X-Content-Type-Options"] == "nosniff"
    async with http.get(url(node, "/ui")) as r:
        assert '<script type="module" src="/ui/app.js">' in await r.text()


async def test_the_page_serves_only_its_own_files_by_name(node, http):
    for path in ("/ui/nope.js", "/ui/..%2fapi.py", "/ui/%2e%2e%2f%2e%2e%2fserver.py", "/ui/ui.py"):
        async with http.get(url(node, path)) as r:
            assert r.status == 404, path
            assert (await r.json())["error"]["code"] == "not_found"


def test_every_dashboard_file_is_package_data():
    """A non-editable install must carry the page: pyproject's globs cover every file in node/http/ui."""
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml"), "rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"]["node"]
    files = [f"http/ui/{n}" for n in os.listdir(UI_DIR)]
    assert "http/ui/index.html" in files
    for name in files:
        assert any(fnmatch.fnmatch(name, g) for g in globs), f"{name} is not package data"


# --- the events stream ----------------------------------------------------------------------------
async def test_events_need_the_token(node, http):
    async with http.get(url(node, "/v1/events")) as r:
        assert r.status == 401
        assert (await r.json())["error"]["code"] == "unauthorized"
    async with http.get(url(node, "/v1/events"), headers=auth("wrong")) as r:
        assert r.status == 401


async def test_a_snapshot_carries_info_cluster_counters_and_wal(node, http):
    async with http.get(url(node, "/v1/events"), headers=auth()) as r:
        assert r.status == 200 and r.content_type == "text/event-stream"
        first = await next_snapshot(r)
        assert first["info"]["uuid"] == node.uuid and first["info"]["id"] == 1
        assert [m["uuid"] for m in first["cluster"]["members"]] == [node.uuid]
        assert first["wal"]["segments"] >= 1 and first["wal"]["bytes"] > 0
        assert first["counters"]["rows_applied"] == 0
        before = first["counters"]["rows_written"]
        async with http.put(url(node, "/v1/spaces/kv"), json={}, headers=auth()) as w:
            assert w.status == 201
        for i in range(3):
            async with http.put(url(node, f"/v1/spaces/kv/keys/k{i}"), json=i, headers=auth()) as w:
                assert w.status == 200
        while (snap := await next_snapshot(r))["counters"]["rows_written"] < before + 4:
            pass
        assert snap["counters"]["rows_written"] == before + 4    # the space and three rows, all this node's
        assert snap["counters"]["rows_applied"] == 0
        assert snap["t"] > first["t"]


async def test_listeners_share_one_snapshot_built_once_per_interval(node, http, monkeypatch):
    monkeypatch.setattr(limits, "events_interval_s", 0.05)
    hub = node._runner.app[events.HUB]
    resps = [await http.get(url(node, "/v1/events"), headers=auth()) for _ in range(6)]
    try:
        started, built = time.monotonic(), hub.frames
        seen = [[(await next_snapshot(r))["t"] for _ in range(4)] for r in resps]
        intervals = (time.monotonic() - started) / limits.events_interval_s
        assert hub.frames - built <= intervals + 2, "one snapshot per interval, not one per listener"
        assert len(hub.listeners) == 6
        assert all(s[-1] == seen[0][-1] or abs(s[-1] - seen[0][-1]) < 1 for s in seen)
        common = set.intersection(*(set(s) for s in seen))
        assert common, "every listener got the same snapshots"
    finally:
        for r in resps:
            r.close()
    await until(lambda: not hub.listeners, 10, "closed streams to leave the hub")


async def test_a_listener_past_the_cap_is_refused_with_503(node, http, monkeypatch):
    monkeypatch.setattr(limits, "events_listeners_max", 2)
    resps = [await http.get(url(node, "/v1/events"), headers=auth()) for _ in range(2)]
    try:
        assert all(r.status == 200 for r in resps)
        async with http.get(url(node, "/v1/events"), headers=auth()) as r:
            assert r.status == 503
            assert (await r.json())["error"]["code"] == "too_many_listeners"
    finally:
        for r in resps:
            r.close()
    hub = node._runner.app[events.HUB]
    await until(lambda: not hub.listeners, 10, "the slots to free")
    async with http.get(url(node, "/v1/events"), headers=auth()) as r:
        assert r.status == 200


async def test_a_listener_that_stops_reading_is_dropped_and_its_connection_cut(node, http, monkeypatch):
    """Big snapshots: a client that never reads fills its socket, then its queue; it is dropped
    (its slot freed at once) and its handler ends after the write timeout, while a listener that
    reads goes on getting fresh snapshots all along."""
    monkeypatch.setattr(limits, "events_interval_s", 0.05)
    monkeypatch.setattr(limits, "events_queue_frames_max", 16)      # the reader's slack: 0.8 s
    monkeypatch.setattr(limits, "events_write_timeout_s", 2.0)      # longer: the queue overflows first
    # A loaded machine builds a snapshot slowly, and the beat stretches to keep the dashboard's
    # share of the loop (events_cpu_share_max): not what this test is about, and it starved the
    # stuck listener's queue for over 30 s at a load average of 12.
    monkeypatch.setattr(limits, "events_cpu_share_max", 1.0)
    real = events.snapshot
    monkeypatch.setattr(events, "snapshot", lambda n: {**real(n), "pad": "x" * 512 * 1024})
    hub = node._runner.app[events.HUB]
    got: list[float] = []

    async def read(resp):
        while True:
            got.append((await next_snapshot(resp))["t"])
    async with http.get(url(node, "/v1/events"), headers=auth()) as reader:
        task = asyncio.create_task(read(reader))
        host, port = node.cfg.host, node.cfg.port
        stuck = socket.socket()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # fills sooner: the node's send buffer is left
        stuck.connect((host, port))
        try:
            stuck.sendall(f"GET /v1/events HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
            await until(lambda: len(hub.listeners) == 2, 10, "both listeners in")
            await until(lambda: hub.dropped >= 1, 30, "the stuck listener to be dropped")
            assert len(hub.listeners) == 1 and hub.dropped == 1, "only the stuck one"
            await until(lambda: hub.streams == 1, 10, "the stuck stream's handler to end (write timeout)")
            seen = len(got)
            await until(lambda: len(got) >= seen + 3, 10, "the reader to go on")
            assert got == sorted(got) and len(set(got)) == len(got)
        finally:
            stuck.close()
            task.cancel()


async def test_open_streams_end_at_shutdown_without_holding_the_http_drain(tmp_path, http, listen):
    with collector_restored():
        node = await start_node(tmp_path, listen)
        r = await http.get(url(node, "/v1/events"), headers=auth())
        await next_snapshot(r)
        started = time.monotonic()
        errors = await node.stop()
        took = time.monotonic() - started
        assert not errors
        assert took < limits.http_drain_s, f"stop took {took:.1f} s: a stream held the drain"
        rest = await asyncio.wait_for(r.content.read(), 5)    # the stream ended (EOF), not hung
        assert b"event: snapshot" not in rest or rest.endswith(b"\n\n")


# --- what a browser may do ------------------------------------------------------------------------
async def register_member(node: Node, address: str) -> str:
    u = "00000000-0000-4000-8000-00000000abcd"
    await node.register_member(u, address)
    return u


def preflight(origin: str, method: str = "GET") -> dict:
    return {"Origin": origin, "Access-Control-Request-Method": method, "Access-Control-Request-Headers": "authorization"}


async def test_cors_preflight_is_answered_only_for_pages_of_members(node, http):
    member = "127.0.0.1:9"
    async with http.options(url(node, "/v1/events"), headers=preflight(f"http://{member}")) as r:
        assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers
    await register_member(node, member)
    for origin in (f"http://{member}", f"https://{member}"):
        async with http.options(url(node, "/v1/events"), headers=preflight(origin)) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Origin"] == origin      # never "*"
            assert r.headers["Access-Control-Allow-Headers"] == "Authorization"
            assert "Origin" in r.headers["Vary"]
    for origin in (EVIL, "null", f"ftp://{member}", f"http://{member}.evil.example", "http://127.0.0.1:99"):
        async with http.options(url(node, "/v1/events"), headers=preflight(origin)) as r:
            assert r.status == 403, origin
            assert "Access-Control-Allow-Origin" not in r.headers, origin
            assert (await r.json())["error"]["code"] == "forbidden_origin"


async def test_a_member_page_reads_with_the_token_and_can_read_a_401(node, http):
    origin = f"http://{node.cfg.address.rsplit(':', 1)[0]}:9"
    await register_member(node, origin.removeprefix("http://"))
    async with http.get(url(node, "/v1/info"), headers=auth(Origin=origin)) as r:
        assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == origin
    async with http.get(url(node, "/v1/events"), headers={"Origin": origin}) as r:
        assert r.status == 401 and r.headers["Access-Control-Allow-Origin"] == origin   # so the page asks for a token
    async with http.get(url(node, "/v1/events"), headers=auth(Origin=origin)) as r:
        assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == origin
        assert (await next_snapshot(r))["info"]["uuid"] == node.uuid


async def test_a_cross_origin_write_is_refused_even_from_a_member_page(node, http):
    origin = "http://127.0.0.1:9"
    await register_member(node, "127.0.0.1:9")
    async with http.options(url(node, "/v1/spaces/kv"), headers=preflight(origin, "PUT")) as r:
        assert r.status == 403 and (await r.json())["error"]["code"] == "cross_origin_write"
    async with http.put(url(node, "/v1/spaces/kv"), json={}, headers=auth(Origin=origin)) as r:
        assert r.status == 403 and (await r.json())["error"]["code"] == "cross_origin_write"
    assert "kv" not in node.store.spaces
    async with http.put(url(node, "/v1/spaces/kv"), json={}, headers=auth(Origin=url(node, ""))) as r:
        assert r.status == 201, "a same-origin page may write (with the token)"


async def test_an_expelled_members_page_is_no_longer_trusted(node, http):
    u = await register_member(node, "127.0.0.1:9")
    async with http.options(url(node, "/v1/info"), headers=preflight("http://127.0.0.1:9")) as r:
        assert r.status == 204
    await node.expel(u)
    async with http.options(url(node, "/v1/info"), headers=preflight("http://127.0.0.1:9")) as r:
        assert r.status == 403


async def test_a_foreign_page_cannot_shut_down_a_tokenless_node_with_a_simple_post(open_node, http):
    """A "simple" request (text/plain POST) needs no preflight: the browser sends it and only hides
    the answer. The Origin header is what refuses it."""
    headers = {"Origin": EVIL, "Content-Type": "text/plain"}
    async with http.post(url(open_node, "/v1/admin/shutdown"), data='{"cluster": true}', headers=headers) as r:
        assert r.status == 403 and (await r.json())["error"]["code"] == "forbidden_origin"
    async with http.get(url(open_node, "/v1/info"), headers={"Origin": EVIL}) as r:
        assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers
    assert open_node.status == "running"


async def test_a_tokenless_node_refuses_browsers_under_a_foreign_host_name(open_node, http):
    """DNS rebinding: a page at evil.example:PORT whose name now points at 127.0.0.1 is
    same-origin with the node; its Host header gives it away."""
    port = open_node.cfg.port
    for fetch in ({"Sec-Fetch-Site": "same-origin"}, {"Origin": f"http://evil.example:{port}"}):
        async with http.get(url(open_node, "/v1/info"), headers={"Host": f"evil.example:{port}", **fetch}) as r:
            assert r.status == 403 and (await r.json())["error"]["code"] == "forbidden_host"
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        async with http.get(url(open_node, "/v1/info"), headers={"Host": host, "Sec-Fetch-Site": "same-origin"}) as r:
            assert r.status == 200, host
    async with http.get(url(open_node, "/v1/info"), headers={"Host": f"some-name:{port}"}) as r:
        assert r.status == 200, "a client that is not a browser is not judged by its Host"


async def test_a_node_with_a_token_answers_browsers_under_any_host_name(node, http):
    port = node.cfg.port
    async with http.get(url(node, "/v1/info"), headers=auth(Host=f"db.example:{port}", **{"Sec-Fetch-Site": "same-origin"})) as r:
        assert r.status == 200
