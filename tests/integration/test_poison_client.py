"""What a careless or hostile client sends, against real nodes (issue 15). Each bound's largest
accepted value goes all the way — written, replicated, restarted, read back in JSON and msgpack —
and one past it is a 4xx before anything is written; nothing a client sends is a 500, stops a
node, or poisons a WAL; a bug in a background task or a link is logged and survived."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from unittest import mock

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from node import limits
from node.core import codec
from tests.integration.harness import REPLOG, ReplogProcess, mesh, request, wait_for

MSGPACK = {"Accept": "application/msgpack"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two masters replicating both ways, with space kv."""
    nodes = mesh(tmp_path_factory.mktemp("pair"), 2)
    try:
        nodes[0].create_space("kv")
        wait_for(lambda: nodes[1].get("/v1/spaces/kv/keys")[0] == 200, 20, "kv on both")
        yield nodes
    finally:
        for n in nodes:
            n.kill9()


def _read_both(node: ReplogProcess, key: str):
    """The value at key, read in JSON and in msgpack."""
    s, d = node.kv_get("kv", key)
    assert s == 200, (s, d)
    req = urllib.request.Request(f"{node.url}/v1/spaces/kv/keys/{key}", headers=MSGPACK)
    with urllib.request.urlopen(req) as r:
        return d["value"], msgpack.unpackb(r.read(), raw=False)["value"]


def _everywhere_after_restart(pair, key: str, value) -> None:
    a, b = pair
    wait_for(lambda: b.kv_get("kv", key)[0] == 200, 30, f"{key[:20]} replicated")
    for n in pair:
        assert _read_both(n, key) == (value, value)
    b.kill9()
    b.start()
    assert _read_both(b, key) == (value, value)


def _nested(depth: int):
    v: list = []
    for _ in range(depth - 1):
        v = [v]
    return v


# --- keys (defect 1: 512..1024 bytes killed every node for good) --------------------------------
def test_the_largest_key_goes_everywhere_and_one_byte_more_is_refused(pair):
    a, b = pair
    key = "k" * limits.key_bytes_max
    a.kv_put("kv", key, "longest")
    _everywhere_after_restart(pair, key, "longest")
    for k in ("k" * (limits.key_bytes_max + 1), "é" * 256, "k" * 1024):
        path = "/v1/spaces/kv/keys/" + urllib.parse.quote(k)
        assert a.put(path, 1)[1]["error"]["code"] == "bad_key"
        assert a.delete(path)[1]["error"]["code"] == "bad_key"
        s, d = a.post("/v1/txn", {"ops": [{"op": "put", "space": "kv", "key": "ok", "value": 1},
                                          {"op": "delete", "space": "kv", "key": k}]})
        assert (s, d["error"]["code"]) == (400, "bad_key")
    assert a.kv_get("kv", "ok")[0] == 404            # the whole txn was refused
    a.kill9()
    a.start()                                        # nothing poisoned the WAL


# --- values (defects 2 and 5) -------------------------------------------------------------------
def test_the_deepest_value_goes_everywhere_and_one_level_more_is_refused(pair):
    a, _ = pair
    deepest = _nested(limits.value_depth_max)
    a.kv_put("kv", "deepest", deepest)
    _everywhere_after_restart(pair, "deepest", deepest)
    for body in (_nested(limits.value_depth_max + 1), _nested(400), {"a": _nested(limits.value_depth_max)}):
        s, d = a.put("/v1/spaces/kv/keys/deeper", body)
        assert (s, d["error"]["code"]) == (400, "value_too_deep")
        s, d = request("PUT", f"{a.url}/v1/spaces/kv/keys/deeper", raw=msgpack.packb(body),
                       headers={"Content-Type": "application/msgpack"})
        assert (s, d["error"]["code"]) == (400, "value_too_deep")
    for raw in (b"[" * 1000 + b"]" * 1000, b"[" * 100_000):      # past what the JSON parser nests
        s, d = request("PUT", f"{a.url}/v1/spaces/kv/keys/deeper", raw=raw)
        assert s == 400 and d["error"]["code"] in ("value_too_deep", "bad_json"), (s, d)
    assert a.kv_get("kv", "deeper")[0] == 404


def test_the_largest_value_goes_everywhere_and_one_byte_more_is_refused(pair):
    a, _ = pair
    big = "v" * (limits.value_bytes_max - 5)
    assert len(codec.pack(big)) == limits.value_bytes_max
    a.kv_put("kv", "biggest", big)
    _everywhere_after_restart(pair, "biggest", big)
    s, d = a.put("/v1/spaces/kv/keys/bigger", big + "v")
    assert (s, d["error"]["code"]) == (413, "value_too_large")


@pytest.mark.parametrize("raw, code", [
    (b"NaN", "bad_value"), (b"[Infinity]", "bad_value"), (b'{"x": -Infinity}', "bad_value"),
    (b"1e400", "bad_value"), (b"18446744073709551616", "bad_value"), (b'"\\ud800"', "bad_value"),
])
def test_json_values_json_could_not_read_back_are_refused(pair, raw, code):
    a, _ = pair
    s, d = request("PUT", f"{a.url}/v1/spaces/kv/keys/nan", raw=raw)
    assert (s, d["error"]["code"]) == (400, code), d
    assert a.kv_get("kv", "nan")[0] == 404


def test_the_extreme_numbers_json_and_msgpack_share_go_everywhere(pair):
    a, _ = pair
    value = [2**64 - 1, -(2**63), 1.7976931348623157e308, -0.0, 5e-324, "\U0010ffff", None, True, {}]
    a.kv_put("kv", "numbers", value)
    _everywhere_after_restart(pair, "numbers", value)


# --- transactions (defect 3) ---------------------------------------------------------------------
def _post_txn(node: ReplogProcess, nvalues: int, floats: int):
    """POST /v1/txn of `nvalues` puts of `floats` floats each, as compact JSON (4 bytes a float)."""
    ops = [{"op": "put", "space": "kv", "key": f"t{i}", "value": [1.5] * floats} for i in range(nvalues)]
    raw = json.dumps({"ops": ops}, separators=(",", ":")).encode()
    assert len(raw) <= limits.body_bytes_max
    return request("POST", node.url + "/v1/txn", raw=raw)


def test_a_transaction_too_large_for_one_message_is_refused_before_the_wal(pair):
    """8 MiB of JSON floats is ~18 MiB of msgpack: it was acknowledged, then no peer could
    ever receive it and its origin's replication stopped for good."""
    a, b = pair
    floats = (limits.value_bytes_max - 16) // 9
    s, d = _post_txn(a, 17, floats)                          # 17 values of ~1 MiB
    assert (s, d["error"]["code"]) == (413, "txn_too_large"), d
    assert a.kv_get("kv", "t0")[0] == 404
    s, d = _post_txn(a, 15, floats)                          # ~15 MiB: fits one message
    assert s == 200, d
    wait_for(lambda: b.kv_get("kv", "t14")[0] == 200, 60, "the largest txn replicated")
    b.kill9()
    b.start()
    assert b.kv_get("kv", "t14")[1]["value"] == [1.5] * floats


# --- snapshots (defect 3: a space of large values could never be joined) --------------------------
def test_a_space_of_large_values_can_be_joined_fetched_and_rejoined(tmp_path, procs):
    a = ReplogProcess(tmp_path, "a")
    procs.append(a)
    a.start()
    a.create_space("kv")
    big = "v" * (limits.value_bytes_max - 64)
    for i in range(40):                                      # ~40 MiB: a 4096-row chunk was one message
        a.kv_put("kv", f"big{i}", big + str(i))
    c = ReplogProcess(tmp_path, "c", peers=[a])
    anon = ReplogProcess(tmp_path, "anon", peers=[a], extra=["--anon"])
    procs.extend([c, anon])                                  # killed at the end even if a start fails
    c.start(timeout=120)
    anon.start(timeout=120)
    for n in (c, anon):
        assert n.kv_get("kv", "big39")[1]["value"] == big + "39"
    c.kill9()                                                # lose the store, keep the identity
    shutil.rmtree(os.path.join(c.data_dir, "store"))
    shutil.rmtree(os.path.join(c.data_dir, "wal"))
    c.start(timeout=120)
    assert c.kv_get("kv", "big0")[1]["value"] == big + "0"


# --- space options (defect 9) --------------------------------------------------------------------
@pytest.mark.parametrize("body", [{"conflict": ["lww"]}, {"conflict": {"x": 1}}, {"conflict": None},
                                  {"local": "yes"}, {"conflict": "nope"}])
def test_space_options_of_the_wrong_type_are_a_400(pair, body):
    a, _ = pair
    s, d = a.put("/v1/spaces/opts", body)
    assert (s, d["error"]["code"]) == (400, "bad_option"), d
    assert a.get("/v1/health")[0] == 200


# --- headers and connections (defects 7 and 9) ------------------------------------------------------
def test_an_authorization_header_that_is_not_utf8_is_a_401(tmp_path, procs):
    tok = tmp_path / "token"
    tok.write_text("s3cret")
    n = ReplogProcess(tmp_path, "tok", extra=["--token-file", str(tok)], token="s3cret")
    procs.append(n)
    n.start()
    with socket.create_connection(("127.0.0.1", n.port), timeout=10) as s:
        s.sendall(b"GET /v1/info HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\x80\r\n"
                  b"Connection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"unauthorized" in answer
    assert n.get("/v1/health")[0] == 200


def test_a_token_file_that_is_not_utf8_exits_2_with_one_line(tmp_path):
    tok = tmp_path / "token"
    tok.write_bytes(b"\xff\xfe secret")
    r = subprocess.run(REPLOG + ["serve", "--data-dir", str(tmp_path / "d"), "--token-file", str(tok)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "token_file" in r.stderr and "Traceback" not in r.stderr


def _raw(node: ReplogProcess, request_bytes: bytes) -> bytes:
    """Send one raw request, read the whole answer (the node closes the connection)."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=30) as s:
        s.sendall(request_bytes)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def test_malformed_requests_are_a_400_each_and_logged_once_an_interval_without_a_traceback(pair):
    """A request line or header that HTTP itself refuses: aiohttp logged an ERROR with a whole
    traceback for each, so any client could write the node's log at the rate it sends."""
    a, _ = pair
    size = os.path.getsize(a.log_path)
    junk = [b"GET /v1/info?" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /v1/info HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 10_000 + b"\r\n\r\n",
            b"GET /v1/info HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
            b"GET /v1/info HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"]
    for i in range(50):
        answer = _raw(a, junk[i % len(junk)])
        assert re.match(rb"HTTP/1\.[01] 400 ", answer), answer[:200]
    logged = a.log_text()[-(os.path.getsize(a.log_path) - size):]
    assert "Traceback" not in logged and len(logged) < 5_000, logged[-2000:]
    assert a.get("/v1/health")[0] == 200


@pytest.mark.parametrize("encoding, body", [("gzip", b"not gzip at all"), ("gzip", None), ("deflate", b"x"),
                                            ("br", b"x")])
def test_a_compressed_request_body_is_refused_before_anything_is_inflated(pair, encoding, body):
    """A body in a Content-Encoding was inflated before the handler saw it: junk was a 500, and
    1 MB of gzip became a gigabyte of work and memory for one 413. The API takes plain bodies."""
    import gzip
    a, _ = pair
    if body is None:
        body = gzip.compress(b"0" * (1 << 30), 9)            # ~1 MB that inflates to 1 GiB
    started = time.monotonic()
    answer = _raw(a, b"PUT /v1/spaces/kv/keys/z HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Encoding: "
                  + encoding.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert answer.startswith(b"HTTP/1.1 415"), answer[:300]
    assert b'"unsupported_encoding"' in answer
    assert time.monotonic() - started < 2.0
    assert a.kv_get("kv", "z")[0] == 404


def test_a_request_whose_headers_never_finish_is_closed(pair):
    a, _ = pair
    with socket.create_connection(("127.0.0.1", a.port), timeout=limits.http_header_timeout_s + 10) as s:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        started = time.monotonic()
        for _ in range(3):                      # a trickle of header bytes does not reset the bound
            time.sleep(1)
            s.sendall(b"a")
        assert s.recv(4096) == b""              # closed by the node, not answered
        took = time.monotonic() - started
    assert took <= limits.http_header_timeout_s + 2, took
    assert a.get("/v1/health")[0] == 200


def test_at_the_fd_limit_new_clients_are_refused_with_a_bounded_log(tmp_path, procs):
    """With few fds, a crowd of idle connections: the node refuses the excess (a 503, or a
    failed connect), logs it a few times, not once per attempt, and serves again as they go."""
    import resource

    def low_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (96, 96))

    n = ReplogProcess(tmp_path, "fds")
    n.exec_only = True                          # its limit is set between fork and exec
    procs.append(n)
    with mock.patch("subprocess.Popen", _popen_with(low_fds)):
        n.start()
    with open(f"/proc/{n.proc.pid}/limits") as f:
        assert any(line.startswith("Max open files") and line.split()[3:5] == ["96", "96"] for line in f), \
            "the node runs without the low fd limit"
    socks = []
    for _ in range(200):
        try:
            socks.append(socket.create_connection(("127.0.0.1", n.port), timeout=2))
            socks[-1].sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            break
    time.sleep(3)                               # the accept loop meets the limit over and over
    size = os.path.getsize(n.log_path)
    for s in socks:
        s.close()
    wait_for(lambda: n.get("/v1/health")[0] == 200, 30, "the node serves again")
    assert size < 20_000, f"{size} bytes of log in 3 s"
    assert n.log_text().count("Traceback") == 0


def _popen_with(preexec):
    real = subprocess.Popen

    def popen(*args, **kw):
        return real(*args, preexec_fn=preexec, **kw)
    return popen


# --- bugs in background work (supervision) --------------------------------------------------------
def test_a_bug_in_an_applier_stops_that_link_only_and_says_so(tmp_path, procs):
    a, b = mesh(tmp_path, 2)
    procs.extend([a, b])
    a.create_space("kv")
    wait_for(lambda: b.get("/v1/spaces/kv/keys")[0] == 200, 20, "kv on B")
    a.kill9()
    with mock.patch.dict(os.environ, {"REPLOG_FAULT_POINT": "applier_bug:1"}):
        a.start()
    b.kv_put("kv", "x", 1)
    up = wait_for(lambda: next((u for u in a.info()["upstreams"] if u["status"] == "failed"), None), 30,
                  "A's applier shows the failure")
    assert "AssertionError" in up["error"] and "applier_bug" in up["error"]
    assert "Traceback" in a.log_text() and "a bug; the node serves on" in a.log_text()
    with urllib.request.urlopen(a.url + "/metrics") as r:
        assert b'replog_task_failures_total{task="applier' in r.read()
    assert a.get("/v1/health")[0] == 200
    a.kv_put("kv", "still", "writes")
    a.set_peers([])                             # removing the failed link is an ordinary stop
    a.set_peers([b])                            # and a new one works
    wait_for(lambda: a.kv_get("kv", "x")[0] == 200, 30, "B's row after the link came back")
    assert a.get("/v1/health")[0] == 200


def test_a_bug_in_the_checkpoint_is_logged_and_the_checkpoint_goes_on(tmp_path, procs):
    n = ReplogProcess(tmp_path, "cp", extra=["--checkpoint-interval-s", "0.2"])
    procs.append(n)
    with mock.patch.dict(os.environ, {"REPLOG_FAULT_POINT": "checkpoint_bug:1"}):
        n.start()
    tasks = wait_for(lambda: n.info()["tasks"].get("checkpoint"), 30, "the failure shown in /v1/info")
    assert tasks["failures"] == 1 and "checkpoint_bug" in tasks["error"]
    assert n.get("/v1/health")[0] == 200
    wait_for(lambda: n.log_text().count("checkpoint") >= 2, 30, "the checkpoint ran again")


# --- what is already on disk ---------------------------------------------------------------------------
def _append_frame(node: ReplogProcess, txn_wire: list) -> None:
    """A frame as a version before the checks wrote it, at the end of the node's last segment."""
    from node.wal import format as walfmt
    from node.wal.reader import list_segments
    wal = os.path.join(node.data_dir, "wal")
    with open(os.path.join(wal, list_segments(wal)[-1]), "ab") as f:
        f.write(walfmt.encode_frame([txn_wire], time.time_ns() // 1000))


def test_a_wal_holding_a_poisoned_row_stops_start_up_with_one_line_until_force_recovery(tmp_path, procs):
    """The 512-byte key of defect 1, already in a WAL: recovery used to die on it with a
    traceback at every start, --force-recovery included."""
    n = ReplogProcess(tmp_path, "poisoned")
    procs.append(n)
    n.start()
    n.create_space("kv")
    n.kv_put("kv", "before", 1)
    own = n.info()["vclock"]["1"]
    assert n.stop() == 0
    _append_frame(n, [1, own + 1, 0, time.time_ns() // 1000, [[1, "kv", "k" * 512, "poison"]]])
    r = subprocess.run(n.argv(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("replog: error:") and "byte" in last and "--force-recovery" in last, last
    assert "Traceback" not in r.stderr
    n.extra.append("--force-recovery")
    n.start()
    assert n.kv_get("kv", "before")[1]["value"] == 1
    n.kv_put("kv", "after", 2)
    assert n.stop() == 0
    n.extra.remove("--force-recovery")
    n.start()                                       # the skip was counted: no flag needed again
    assert n.kv_get("kv", "after")[1]["value"] == 2


def test_values_stored_before_the_value_rule_are_read_in_json_by_the_fallback(tmp_path, procs):
    """A store from before the rule may hold a msgpack timestamp, bin, NaN and maps with other
    keys (defect 5: every JSON GET and range page of them was a 500)."""
    from node.storage.store import Store
    n = ReplogProcess(tmp_path, "legacy")
    procs.append(n)
    n.start()
    n.create_space("kv")
    n.kv_put("kv", "plain", 1)
    assert n.stop() == 0
    legacy = {"at": msgpack.Timestamp(7, 9), "raw": b"\x00\xff", "nan": float("nan"), "inf": float("-inf"),
              "keys": {1: "int", b"\x01": "bin", None: "nil"}}
    store = Store(os.path.join(n.data_dir, "store"))
    with store.env.begin(write=True) as t:
        t.put(b"old", codec.pack([legacy, 1, 99, 1, False]), db=store._db("kv"))
    store.close()
    n.start()
    s, d = n.kv_get("kv", "old")
    assert s == 200, d
    assert d["value"] == {"at": {"$timestamp": "1970-01-01T00:00:07.000000009Z"}, "raw": {"$base64": "AP8="},
                          "nan": "NaN", "inf": "-Infinity", "keys": {"1": "int", "AQ==": "bin", "null": "nil"}}
    s, page = n.get("/v1/spaces/kv/keys")
    assert s == 200 and [i["key"] for i in page["items"]] == ["old", "plain"]
    req = urllib.request.Request(f"{n.url}/v1/spaces/kv/keys/old", headers=MSGPACK)
    with urllib.request.urlopen(req) as r:
        got = msgpack.unpackb(r.read(), raw=False, strict_map_key=False)["value"]
    assert got["at"] == legacy["at"] and got["raw"] == legacy["raw"] and got["keys"][b"\x01"] == "bin"


# --- generated input through both encodings ---------------------------------------------------------
_EDGE_SCALARS = (st.none() | st.booleans() | st.integers(-(2**63) - 1, 2**64) | st.floats()
                 | st.text(max_size=20) | st.binary(max_size=8)
                 | st.sampled_from([msgpack.Timestamp(1, 2), msgpack.ExtType(9, b"x"), 2**64 - 1, -(2**63)]))
_EDGE_VALUES = st.recursive(_EDGE_SCALARS, lambda c: st.lists(c, max_size=4) | st.dictionaries(
    st.text(max_size=6) | st.integers(-3, 3) | st.binary(max_size=2), c, max_size=4), max_leaves=20) \
    | st.integers(limits.value_depth_max - 1, limits.value_depth_max + 2).map(_nested)
_EDGE_KEYS = st.text(min_size=0, max_size=8) | st.sampled_from(["k" * limits.key_bytes_max,
                                                                "k" * (limits.key_bytes_max + 1), "é" * 256])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_EDGE_VALUES, key=_EDGE_KEYS, as_msgpack=st.booleans())
def test_every_generated_value_is_stored_and_read_back_identically_or_refused_with_a_4xx(pair, value, key, as_msgpack):
    """The oracle is the rule (node.core.validate): a value within it is stored, replicated and
    read back the same in JSON and msgpack; anything else is a 4xx naming the rule; never a 5xx."""
    from node.core import validate
    a, b = pair
    if key in ("", ".", "..") or "/" in key:
        return                                   # the route itself decides (404/405): nothing to store
    if as_msgpack:
        try:
            raw = msgpack.packb(value)
        except (TypeError, ValueError, OverflowError):
            return                               # not even msgpack: nothing to send
        headers = {"Content-Type": "application/msgpack"}
    else:
        try:
            raw = json.dumps(value).encode()
        except (TypeError, ValueError, RecursionError):
            return
        headers = {}
    path = "/v1/spaces/kv/keys/" + urllib.parse.quote(key, safe="")
    s, d = request("PUT", a.url + path, raw=raw, headers=headers)
    assert s < 500, (s, d)
    sent = msgpack.unpackb(raw, raw=False, strict_map_key=False) if as_msgpack else json.loads(raw)
    storable = validate.key_error(key) is None and validate.value_error(sent) is None
    assert (s == 200) == storable, (s, d, key, value)
    if not storable:
        assert 400 <= s < 500 and d["error"]["code"]
        return
    assert _read_both(a, urllib.parse.quote(key, safe="")) == (sent, sent)
    wait_for(lambda: b.kv_get("kv", urllib.parse.quote(key, safe=""))[1].get("lsn") == d["lsn"], 20, "replicated")
