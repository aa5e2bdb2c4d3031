"""One real node process: the HTTP API, its errors, auth, and crash durability."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import urllib.request

import aiohttp
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.integration.harness import REPLOG, PortReservation, ReplogProcess, request, wait_for


@pytest.fixture
def node(tmp_path, procs):
    n = ReplogProcess(tmp_path, "solo").start()
    procs.append(n)
    n.create_space("kv")
    return n


def test_a_write_to_a_local_space_names_no_origin(node):
    node.create_space("mine", local=True)
    s, local = node.put("/v1/spaces/mine/keys/k", 1)
    assert s == 200 and local["lsn"] >= 1 and "origin" not in local, "a local space's row is numbered here alone"


def test_put_get_delete_range_and_txn(node):
    r = node.kv_put("kv", "a", {"x": 1})
    assert r["lsn"] >= 1 and r["vclock"]
    s, got = node.kv_get("kv", "a")
    assert s == 200 and got["value"] == {"x": 1} and got["origin"] == node.uuid() and got["lsn"] == r["lsn"]
    assert r["origin"] == got["origin"], "the write's answer names the row as a read of it does"
    for k in ("b", "c", "d"):
        node.kv_put("kv", k, k.upper())
    s, page = node.get("/v1/spaces/kv/keys?limit=2")
    assert s == 200 and [i["key"] for i in page["items"]] == ["a", "b"] and page["next"] == "b"
    s, page = node.get("/v1/spaces/kv/keys?after=b&limit=10")
    assert [i["key"] for i in page["items"]] == ["c", "d"] and page["next"] is None
    s, t = node.post("/v1/txn", {"ops": [{"op": "put", "space": "kv", "key": "e", "value": 5},
                                         {"op": "delete", "space": "kv", "key": "a"}]})
    assert s == 200, t
    assert node.kv_get("kv", "a")[0] == 404
    assert node.kv_get("kv", "e")[1]["value"] == 5
    s, d = node.delete("/v1/spaces/kv/keys/b")
    assert s == 200 and node.kv_get("kv", "b")[0] == 404
    s, spaces = node.get("/v1/spaces")
    assert [x["name"] for x in spaces["spaces"]] == ["kv"]


def test_space_creation_is_idempotent_and_conflicting_options_refused(node):
    s, d = node.put("/v1/spaces/kv", {"local": False})
    assert s == 200 and d["created"] is False
    s, d = node.put("/v1/spaces/kv", {"local": True})
    assert s == 409 and d["error"]["code"] == "space_exists"


def test_msgpack_bodies_and_answers(node):
    body = msgpack.packb({"v": [1, 2, 3]})
    s, _ = request("PUT", node.url + "/v1/spaces/kv/keys/m", raw=body, headers={"Content-Type": "application/msgpack"})
    assert s == 200
    req = urllib.request.Request(node.url + "/v1/spaces/kv/keys/m", headers={"Accept": "application/msgpack"})
    with urllib.request.urlopen(req) as r:
        assert r.headers["Content-Type"].startswith("application/msgpack")
        assert msgpack.unpackb(r.read())["value"] == {"v": [1, 2, 3]}


@pytest.mark.parametrize("value, why", [
    ({"v": msgpack.ExtType(5, b"ab")}, "extension type 5"),
    ({"at": msgpack.Timestamp(7, 9)}, "extension types"),
    ([b"\x00\x01"], "binary data"),
    ({1: "x"}, "map keys are strings"),
    ({b"k": "x"}, "map keys are strings"),
    (float("nan"), "finite"),
    ([float("inf")], "finite"),
    (2**64 - 1, None),
    (-(2**63), None),
])
def test_msgpack_values_json_could_not_read_back_are_refused(node, value, why):
    """The storable domain is what both encodings carry and read back identically: a value outside
    it is a 400 bad_value before anything is written, so no read of it can ever fail."""
    ctype = {"Content-Type": "application/msgpack"}
    s, d = request("PUT", node.url + "/v1/spaces/kv/keys/x", raw=msgpack.packb(value), headers=ctype)
    if why is None:
        assert s == 200, d
        assert node.kv_get("kv", "x")[1]["value"] == value
        return
    assert s == 400 and d["error"]["code"] == "bad_value" and why in d["error"]["message"], d
    assert node.get("/v1/spaces/kv/keys/x")[0] == 404


@pytest.mark.parametrize("method,path,raw,status,code", [
    ("PUT", "/v1/spaces/kv/keys/a", b"{not json", 400, "bad_json"),
    ("PUT", "/v1/spaces/kv/keys/" + "k" * 512, b"1", 400, "bad_key"),
    ("PUT", "/v1/spaces/kv/keys/big", json.dumps("x" * (1024 * 1024 + 10)).encode(), 413, "value_too_large"),
    ("PUT", "/v1/spaces/bad-name", b"{}", 400, "bad_space_name"),
    ("PUT", "/v1/spaces/_cluster/keys/a", b"1", 403, "system_space"),
    ("PUT", "/v1/spaces/nope/keys/a", b"1", 404, "no_such_space"),
    ("GET", "/v1/spaces/nope/keys/a", None, 404, "no_such_space"),
    ("GET", "/v1/spaces/kv/keys/missing", None, 404, "no_such_key"),
    ("GET", "/v1/spaces/kv/keys?limit=0", None, 400, "bad_limit"),
    ("POST", "/v1/txn", b'{"ops": "x"}', 400, "bad_txn"),
    ("POST", "/v1/txn", b'{"ops": [{"op": "upsert", "space": "kv", "key": "a"}]}', 400, "bad_op"),
    ("PUT", "/v1/spaces/kv/keys/a", b"", 400, "empty_body"),
    ("GET", "/v1/nowhere", None, 404, "not_found"),
    ("DELETE", "/v1/cluster/not-a-member", None, 404, "no_such_member"),
])
def test_bad_input_gets_4xx_json_error_and_node_keeps_serving(node, method, path, raw, status, code):
    s, d = request(method, node.url + path, raw=raw)
    assert s == status, d
    assert d["error"]["code"] == code and d["error"]["message"]
    assert node.get("/v1/health")[0] == 200


def test_oversized_body_refused(node):
    s, d = request("POST", node.url + "/v1/txn", raw=b"[" + b"1," * (5 * 1024 * 1024) + b"1]")
    assert s == 413 and d["error"]["code"] == "body_too_large"


JUNK = st.one_of(st.binary(max_size=300), st.text(max_size=200).map(str.encode),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                              lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=4),
                              max_leaves=10).map(lambda v: json.dumps(v).encode()))
PATHS = ["/v1/spaces/kv/keys/j", "/v1/spaces/kv", "/v1/spaces/kv2", "/v1/txn", "/v1/admin/peers",
         "/v1/spaces/kv/keys?after=%ff&limit=x", "/v1/cluster/x", "/v1/spaces/%00/keys/a", "/v1/info"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["GET", "PUT", "POST", "DELETE"]), path=st.sampled_from(PATHS), body=JUNK,
       ctype=st.sampled_from(["application/json", "application/msgpack", "text/plain"]))
def test_generated_junk_never_5xx_and_data_intact(node, method, path, body, ctype):
    node.kv_put("kv", "sentinel", {"keep": True}) if not hasattr(node, "_sentinel") else None
    node._sentinel = True
    s, d = request(method, node.url + path, raw=body if method in ("PUT", "POST") else None,
                   headers={"Content-Type": ctype})
    assert s < 500, (s, d)
    if s >= 400:
        assert isinstance(d, dict) and "code" in d["error"]
    assert node.kv_get("kv", "sentinel")[1]["value"] == {"keep": True}
    assert node.get("/v1/health")[0] == 200


def test_token_required_except_health_and_metrics(tmp_path, procs):
    tok = tmp_path / "token"
    tok.write_text("s3cret\n")
    n = ReplogProcess(tmp_path, "tok", extra=["--token-file", str(tok)], token="s3cret").start()
    procs.append(n)
    assert n.get("/v1/info", token=None)[0] == 401
    assert n.get("/v1/info", token="wrong")[0] == 401
    assert n.get("/v1/info")[0] == 200
    for header, status in [("bearer s3cret", 200), ("BEARER s3cret", 200),      # the scheme: any case
                           ("Bearer S3CRET", 401), ("Basic s3cret", 401), ("Bearer", 401), ("s3cret", 401),
                           ("Bearer s3cret2", 401), ("Bearer  s3cret", 401), ("Bearers3cret", 401)]:
        assert request("GET", n.url + "/v1/info", token=None, headers={"Authorization": header})[0] == status, header
    assert n.get("/v1/health", token=None)[0] == 200
    with urllib.request.urlopen(n.url + "/metrics") as r:
        assert b"replog_rows_written" in r.read()


def test_non_loopback_without_secret_and_token_refuses_to_start(tmp_path):
    port = PortReservation()                 # were it to start after all, no other test's node is there
    try:
        r = subprocess.run(REPLOG + ["serve", "--data-dir", str(tmp_path / "d"), "--listen", f"0.0.0.0:{port.port}"],
                           capture_output=True, text=True, timeout=30)
    finally:
        port.close()
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "secret_file" in lines[0] and "Traceback" not in r.stderr


def test_bad_option_exits_2_with_one_line(tmp_path):
    r = subprocess.run(REPLOG + ["serve", "--data-dir", str(tmp_path / "d"), "--wal-mode", "sometimes"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "wal_mode" in r.stderr


@pytest.mark.parametrize("where, said", [
    ("a-file", "data_dir: {d} is not a directory"),
    ("/proc/replog-data", "data_dir: cannot write in /proc/replog-data: "),   # procfs: nothing is made there
])
def test_a_data_dir_that_cannot_be_one_is_named_not_blamed_on_listen(tmp_path, where, said):
    """Both were 'listen: cannot listen on ...': any OSError of start-up was taken for the port's."""
    (tmp_path / "a-file").write_text("")
    d = str(tmp_path / where) if not where.startswith("/") else where
    port = PortReservation()
    try:
        r = subprocess.run(REPLOG + ["serve", "--data-dir", d, "--listen", f"127.0.0.1:{port.port}"],
                           capture_output=True, text=True, timeout=30)
    finally:
        port.close()
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("replog: error: " + said.format(d=d)), r.stderr


@pytest.mark.parametrize("wal_mode", ["write", "fsync"])
def test_kill9_during_write_load_keeps_every_acknowledged_write(tmp_path, procs, wal_mode):
    n = ReplogProcess(tmp_path, "crash", extra=["--wal-mode", wal_mode]).start()
    procs.append(n)
    n.create_space("kv")
    acked: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def writer(w: int) -> None:
        i = 0
        while not stop.is_set():
            key = f"w{w}-{i}"
            try:
                s, d = request("PUT", f"{n.url}/v1/spaces/kv/keys/{key}", i, timeout=5)
            except OSError:
                return
            if s == 200:
                with lock:
                    acked[key] = i
            i += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    wait_for(lambda: len(acked) >= 300, 30, "300 acknowledged writes")
    n.kill9()
    stop.set()
    for t in threads:
        t.join(10)
    snapshot = dict(acked)
    n.start()
    missing = [k for k, v in snapshot.items() if n.kv_get("kv", k) != (200, {"key": k, "value": v, "origin": n.uuid(),
                                                                              "lsn": n.kv_get("kv", k)[1].get("lsn")})]
    assert not missing, f"{len(missing)} acknowledged writes lost after kill -9, e.g. {missing[:5]}"


def test_sigterm_is_an_orderly_shutdown_and_restart_keeps_data(tmp_path, procs):
    n = ReplogProcess(tmp_path, "term").start()
    procs.append(n)
    n.create_space("kv")
    n.kv_put("kv", "k", 1)
    uuid = n.uuid()
    assert n.stop() == 0
    n.start()
    assert n.uuid() == uuid and n.kv_get("kv", "k")[1]["value"] == 1


async def test_sigterm_does_not_wait_for_links_in_their_handshake_or_unfinished_requests(tmp_path, procs):
    # A peer that connected but never answered HELLO, and a client that sent headers but not its
    # body: neither may turn an orderly stop into a failed one (exit 1, "shutdown: http failed").
    n = ReplogProcess(tmp_path, "term").start()
    procs.append(n)
    async with aiohttp.ClientSession() as session:
        link = await session.ws_connect(f"{n.url}/v1/replication")
        assert (await link.receive(timeout=10)).type == aiohttp.WSMsgType.BINARY   # HELLO, then silence
        reader, writer = await asyncio.open_connection("127.0.0.1", n.port)
        writer.write(b"PUT /v1/spaces/kv HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{")
        await writer.drain()
        assert (await asyncio.to_thread(n.get, "/v1/health"))[0] == 200   # a round trip after it
        rc = await asyncio.to_thread(n.stop, 30.0)
        writer.close()
    log = n.log_text()
    assert rc == 0, log[-3000:]
    assert "shutdown:" not in log, log[-3000:]
