"""Keys in the path of `/v1/spaces/{space}/keys/{key}`, on a real node in this process (real
LMDB, real sockets): one key, one URL. The URL decoder leaves a percent-escape that is not
UTF-8 as it was (`%ff` stays the three characters `%ff`), so `/keys/%ff` and `/keys/%25ff` named
the same key, and a client sending raw bytes stored a key it never meant. Now such a path is a
400 `bad_key` for PUT, GET and DELETE, and every escape that is UTF-8 names its key."""
from __future__ import annotations

import aiohttp
import pytest

from node.core.rows import OP_SPACE, Op
from tests.unit.test_dashboard_http import open_node as node  # noqa: F401 (a fixture: a node without a token)


@pytest.fixture
async def base(node):  # noqa: F811
    await node.write([Op(OP_SPACE, "kv", "", {"local": False, "conflict": "lww"})])
    async with aiohttp.ClientSession() as s:
        yield s, f"http://{node.cfg.address}/v1/spaces/kv/keys/"


async def call(s: aiohttp.ClientSession, method: str, url: str, body: bytes | None = None):
    # encoded=True: the path goes out byte for byte as written here
    async with s.request(method, aiohttp.client.URL(url, encoded=True), data=body) as r:
        return r.status, await r.json()


NOT_UTF8 = ["%ff", "a%FE%FFb", "%c3", "%e2%82", "ok%80", "%ed%a0%80"]   # (the last: a lone surrogate)
UTF8 = [
    ("%25ff", "%ff"),                  # a literal percent sign, escaped: the key it spells
    ("caf%C3%A9", "café"),
    ("a%2Fb", "a/b"),
    ("%F0%9F%98%80", "😀"),
    ("100%25", "100%"),
]


async def test_a_path_key_whose_escapes_are_not_utf8_is_refused(base):
    s, url = base
    for escaped in NOT_UTF8:
        for method in ("PUT", "GET", "DELETE"):
            status, body = await call(s, method, url + escaped, b"1" if method == "PUT" else None)
            assert status == 400 and body["error"]["code"] == "bad_key", (escaped, method, status, body)
    status, body = await call(s, "GET", url.rstrip("/") + "?limit=10")
    assert (status, body["items"]) == (200, []), "a refused key was stored"


async def test_a_path_key_whose_escapes_are_utf8_names_its_key(base):
    s, url = base
    for escaped, key in UTF8:
        status, body = await call(s, "PUT", url + escaped, b'"v"')
        assert status == 200, (escaped, body)
        status, body = await call(s, "GET", url + escaped)
        assert (status, body["key"], body["value"]) == (200, key, "v")
        status, body = await call(s, "GET", url.rstrip("/") + "?limit=10")
        assert [i["key"] for i in body["items"]] == [key]
        status, body = await call(s, "DELETE", url + escaped)
        assert status == 200, (escaped, body)


async def test_a_range_after_key_whose_escapes_are_not_utf8_is_refused(base):
    """`?after=%ff` was decoded to U+FFFD, another key: the range answered from there."""
    s, url = base
    rng = url.rstrip("/")
    for key in ("a", "z", "\ufffd"):
        status, _ = await call(s, "PUT", url + aiohttp.helpers.quote(key, safe=""), b"1")
        assert status == 200
    for escaped in NOT_UTF8:
        status, body = await call(s, "GET", f"{rng}?after={escaped}&limit=10")
        assert status == 400 and body["error"]["code"] == "bad_key", (escaped, status, body)
    # U+FFFD spelled as UTF-8 is a key like any other; and a bad escape in another parameter
    # is not the key's fault (limit's own check answers it)
    status, body = await call(s, "GET", f"{rng}?after=%EF%BF%BD&limit=10")
    assert (status, body["items"]) == (200, [])
    status, body = await call(s, "GET", f"{rng}?after=a&limit=10")
    assert (status, [i["key"] for i in body["items"]]) == (200, ["z", "\ufffd"])
    status, body = await call(s, "GET", f"{rng}?after=a&limit=%ff")
    assert (status, body["error"]["code"]) == (400, "bad_limit")


async def test_a_bad_vclock_in_the_query_names_its_parameter(base):
    s, url = base
    status, body = await call(s, "GET", url.rstrip("/") + "?after_vclock=x")
    assert (status, body["error"]["code"]) == (400, "bad_vclock")
    assert body["error"]["message"].startswith("after_vclock is uuid:lsn"), body
    status, body = await call(s, "GET", url.split("/v1/")[0] + "/v1/wait?vclock=x")
    assert (status, body["error"]["code"]) == (400, "bad_vclock")
    assert body["error"]["message"].startswith("vclock is uuid:lsn"), body
