"""The binary client protocol against real `replog serve` processes (node/clientproto/), spoken
by a bare socket client (tests/integration/rawclient.py): every operation, the HTTP API's error
codes for the same mistakes, pipelining with out-of-order answers, many requests per frame,
auth, frames at and past the limits, and garbage that must never hurt the node."""
from __future__ import annotations

import os
import socket
import struct

import msgpack
import pytest

from node import limits
from node.clientproto import wire
from tests.integration.harness import ReplogProcess, request, wait_for
from tests.integration.rawclient import Raw, client_port, http_error


@pytest.fixture
def node(tmp_path, procs):
    n = ReplogProcess(tmp_path, "n1").start()
    procs.append(n)
    n.create_space("kv")
    return n


def test_every_operation_answers_what_the_http_api_holds(node):
    r = Raw(node)
    st, hello = r.call(wire.HELLO, {"token": None, "version": 1})
    assert st == 200 and hello["uuid"] == node.uuid() and hello["limits"]["value_bytes_max"] == limits.value_bytes_max
    st, lsn = r.call(wire.PUT, "kv", "a", {"x": [1, 2.5, None, True, "é"]})
    assert st == 200 and isinstance(lsn, int)
    assert node.kv_get("kv", "a")[1] == {"key": "a", "value": {"x": [1, 2.5, None, True, "é"]},
                                        "origin": node.uuid(), "lsn": lsn}
    assert r.vclocks[-1] == {node.uuid(): lsn}                   # a write answers the node's vclock by uuid
    assert r.call(wire.GET, "kv", "a") == (200, [{"x": [1, 2.5, None, True, "é"]}, node.uuid(), lsn])
    st, lsn2 = r.call(wire.TXN, [[wire.TXN_PUT, "kv", "b", 2], [wire.TXN_PUT, "kv", "c", 3],
                                 [wire.TXN_DELETE, "kv", "a"]])
    assert st == 200 and lsn2 == lsn + 3                         # one transaction, three rows
    assert node.kv_get("kv", "a")[0] == 404
    st, (items, nxt) = r.call(wire.RANGE, "kv", None, 1)
    assert st == 200 and [i[0] for i in items] == ["b"] and nxt == "b"
    st, (items, nxt) = r.call(wire.RANGE, "kv", "b", 10)
    assert [i[:2] for i in items] == [["c", 3]] and nxt is None
    st, lsn3 = r.call(wire.DELETE, "kv", "b")
    assert st == 200 and lsn3 == lsn2 + 1 and node.kv_get("kv", "b")[0] == 404
    st, info = r.call(wire.INFO)
    assert st == 200 and info["uuid"] == node.uuid() and info["client_port"] == client_port(node)
    st, w = r.call(wire.WAIT, {node.uuid(): lsn3}, 1000)
    assert st == 200 and w["vclock"][node.uuid()] >= lsn3
    st, sp = r.call(wire.SPACE, "loc", {"local": True})
    assert st == 201 and sp["created"] is True
    assert r.call(wire.SPACE, "loc", {"local": True})[0] == 200           # idempotent, as over HTTP
    st, lsn4 = r.call(wire.PUT, "loc", "k", "local row")                  # a local space: the exact path
    assert st == 200 and node.kv_get("loc", "k")[1]["value"] == "local row"


DEEP = [1]
for _ in range(limits.value_depth_max):
    DEEP = [DEEP]                   # value_depth_max + 1 containers

# (request over the binary protocol, the same mistake over HTTP): both must answer one status and code
MISTAKES = [
    ((wire.PUT, "kv", "", 1), ("PUT", "/v1/spaces/kv/keys/%20", None), None),     # path form cannot be empty
    ((wire.PUT, "kv", "k" * 512, 1), ("PUT", "/v1/spaces/kv/keys/" + "k" * 512, 1), "bad_key"),
    ((wire.PUT, "nope", "k", 1), ("PUT", "/v1/spaces/nope/keys/k", 1), "no_such_space"),
    ((wire.PUT, "_cluster", "k", 1), ("PUT", "/v1/spaces/_cluster/keys/k", 1), "system_space"),
    ((wire.PUT, "bad-name", "k", 1), ("PUT", "/v1/spaces/bad-name/keys/k", 1), "bad_space_name"),
    ((wire.PUT, "kv", "k", "v" * limits.value_bytes_max), ("PUT", "/v1/spaces/kv/keys/k", "v" * limits.value_bytes_max),
     "value_too_large"),
    ((wire.PUT, "kv", "k", DEEP),
     ("PUT", "/v1/spaces/kv/keys/k", DEEP),
     "value_too_deep"),
    ((wire.GET, "kv", "missing"), ("GET", "/v1/spaces/kv/keys/missing", None), "no_such_key"),
    ((wire.GET, "nope", "k"), ("GET", "/v1/spaces/nope/keys/k", None), "no_such_space"),
    ((wire.RANGE, "kv", None, 0), ("GET", "/v1/spaces/kv/keys?limit=0", None), "bad_limit"),
    ((wire.RANGE, "kv", None, limits.range_limit_max + 1),
     ("GET", f"/v1/spaces/kv/keys?limit={limits.range_limit_max + 1}", None), "bad_limit"),
    ((wire.TXN, [[wire.TXN_PUT, "kv", "k", 1]] * (limits.txn_ops_max + 1)),
     ("POST", "/v1/txn", {"ops": [{"op": "put", "space": "kv", "key": "k", "value": 1}] * (limits.txn_ops_max + 1)}),
     "txn_too_large"),
    ((wire.TXN, []), ("POST", "/v1/txn", {"ops": []}), "bad_txn"),
    ((wire.SPACE, "s", {"local": "yes"}), ("PUT", "/v1/spaces/s", {"local": "yes"}), "bad_option"),
    ((wire.WAIT, {"not-a-uuid": 1}, 10), ("GET", "/v1/wait?vclock=not-a-uuid:1&timeout_ms=10", None), "bad_vclock"),
    ((wire.WAIT, {"00000000-0000-4000-8000-000000000000": 1}, 10),
     ("GET", "/v1/wait?vclock=00000000-0000-4000-8000-000000000000:1&timeout_ms=10", None), "wait_timeout"),
    ((wire.WAIT, {}, limits.wait_timeout_ms_max + 1),
     ("GET", f"/v1/wait?vclock=00000000-0000-4000-8000-000000000000:0&timeout_ms={limits.wait_timeout_ms_max + 1}",
      None), "bad_timeout"),
]


@pytest.mark.parametrize("binary, http, code", MISTAKES, ids=[m[2] or "empty_key" for m in MISTAKES])
def test_each_mistake_gets_the_http_apis_status_and_code(node, binary, http, code):
    r = Raw(node)
    before = node.info()["vclock"]
    status, body = r.call(*binary)
    if code is None:            # a key the HTTP path cannot even carry: the rule's own code
        assert (status, body["code"]) == (400, "bad_key")
        return
    hs, hcode = http_error(node, *http)
    assert (status, body["code"]) == (hs, hcode) == (hs, code), (status, body, hs, hcode)
    assert body["message"]
    assert node.info()["vclock"] == before                       # nothing of it reached the WAL
    assert r.call(wire.PUT, "kv", "after", 1)[0] == 200          # the connection goes on


def test_a_read_only_node_refuses_writes_with_409_read_only_as_http_does(tmp_path, procs):
    n = ReplogProcess(tmp_path, "ro").start()
    procs.append(n)
    n.create_space("kv")
    n.stop()
    n.extra = ["--read-only"]
    n.start()
    r = Raw(n)
    st, body = r.call(wire.PUT, "kv", "k", 1)
    assert (st, body["code"]) == (409, "read_only") == http_error(n, "PUT", "/v1/spaces/kv/keys/k", 1)
    assert r.call(wire.TXN, [[wire.TXN_DELETE, "kv", "k"]])[1]["code"] == "read_only"
    assert r.call(wire.SPACE, "other", {})[1]["code"] == "read_only"
    assert r.call(wire.GET, "kv", "k")[1]["code"] == "no_such_key"      # reads are served


def test_pipelined_requests_are_answered_out_of_order_by_id(node):
    r = Raw(node)
    lsn = r.call(wire.PUT, "kv", "p0", 0)[1]
    # A wait for a row not written yet, then (later frames) a read and the write it waits for:
    r.send([[1, wire.WAIT, {node.uuid(): lsn + 1}, 10_000]])
    r.send([[2, wire.GET, "kv", "p0"]])
    r.send([[3, wire.PUT, "kv", "p1", 1]])
    assert r.wait(1, 2, 3)[0][0] == 200
    assert r.order.index(2) < r.order.index(1) and r.order.index(3) <= r.order.index(1), r.order
    assert r.answers[1][1]["vclock"][node.uuid()] == lsn + 1


def test_many_requests_in_one_frame_become_consecutive_rows_of_one_batch(node):
    r = Raw(node)
    n = 2000
    r.send([[i, wire.PUT, "kv", f"m{i:05}", i] for i in range(n)] + [[n, wire.GET, "kv", "m00000"]])
    got = r.wait(*range(n + 1))
    lsns = [b for _, b in got[:n]]
    assert all(s == 200 for s, _ in got[:n]) and lsns == list(range(lsns[0], lsns[0] + n))
    assert r.call(wire.RANGE, "kv", "m01998", 10)[1][0][0][:2] == ["m01999", 1999]


def test_acknowledged_writes_survive_kill_9_in_write_mode(node):
    r = Raw(node)
    r.send([[i, wire.PUT, "kv", f"d{i}", i] for i in range(500)])
    assert all(s == 200 for s, _ in r.wait(*range(500)))
    node.kill9()
    node.start()
    assert node.kv_get("kv", "d499")[1]["value"] == 499 and node.kv_get("kv", "d0")[1]["value"] == 0


def test_with_a_token_only_hello_with_the_token_opens_the_connection(tmp_path, procs):
    tok = tmp_path / "token"
    tok.write_text("s3cret\n")
    n = ReplogProcess(tmp_path, "tok", extra=["--token-file", str(tok)], token="s3cret").start()
    procs.append(n)
    n.create_space("kv")
    r = Raw(n)                                                   # no HELLO: 401 and closed
    r.send([[1, wire.PUT, "kv", "k", 1]])
    assert r.wait(1)[0][0] == 401 and r.closed_by_node()
    r = Raw(n)                                                   # a wrong token: 401 and closed
    r.send([[1, wire.HELLO, {"token": "wrong", "version": 1}], [2, wire.PUT, "kv", "k", 1]])
    assert r.wait(1)[0][0] == 401 and r.closed_by_node() and 2 not in r.answers
    r = Raw(n)                                                   # unauthenticated bytes past the HELLO bound
    r.send_raw(struct.pack(">I", limits.client_hello_bytes_max + 1) + b"\x00" * 64)
    assert r.closed_by_node() and r.answers[None][0] == 413
    r = Raw(n)
    r.send_raw(wire.encode_requests([[1, wire.HELLO, {"token": "s3cret", "version": 1}]]) +
               wire.encode_requests([[2, wire.PUT, "kv", "k", "v" * 10_000]]))
    assert [s for s, _ in r.wait(1, 2)] == [200, 200]           # a big frame right after HELLO (one write) is fine
    assert n.kv_get("kv", "k")[1]["value"] == "v" * 10_000
    assert n.get("/v1/info", token=None)[0] == 401              # HTTP keeps its own rule


def test_the_largest_accepted_key_value_and_txn_work_and_one_past_each_is_refused(node):
    r = Raw(node)
    big_key = "é" * (limits.key_bytes_max // 2) + "k"            # 511 bytes of UTF-8
    assert len(big_key.encode()) == limits.key_bytes_max
    assert r.call(wire.PUT, "kv", big_key, 1)[0] == 200 and r.call(wire.GET, "kv", big_key)[1][0] == 1
    assert r.call(wire.PUT, "kv", big_key + "x", 1)[1]["code"] == "bad_key"
    big_value = "v" * (limits.value_bytes_max - 5)                 # str32 head + bytes = value_bytes_max
    assert r.call(wire.PUT, "kv", "bigv", big_value)[0] == 200
    assert r.call(wire.GET, "kv", "bigv")[1][0] == big_value
    assert node.kv_get("kv", "bigv")[1]["value"] == big_value  # and over HTTP, in JSON
    assert r.call(wire.PUT, "kv", "bigv2", big_value + "v") == \
        (413, {"code": "value_too_large", "message": f"values are at most {limits.value_bytes_max} bytes as msgpack"})
    ops = [[wire.TXN_PUT, "kv", f"t{i}", i] for i in range(limits.txn_ops_max)]
    st, last = r.call(wire.TXN, ops)
    assert st == 200 and node.kv_get("kv", f"t{limits.txn_ops_max - 1}")[1]["lsn"] == last
    assert r.call(wire.TXN, ops + [[wire.TXN_DELETE, "kv", "t0"]])[0] == 413


def test_a_frame_past_the_frame_bound_is_refused_and_closed_before_it_is_read(node):
    r = Raw(node)
    r.send_raw(struct.pack(">I", limits.client_frame_bytes_max + 1))   # only the length: nothing else comes
    assert r.closed_by_node() and r.answers[None] == (413, r.answers[None][1])
    assert r.answers[None][1]["code"] == "frame_too_large"
    r = Raw(node)
    reqs = [[i, wire.PUT, "kv", f"f{i}", 1] for i in range(limits.client_frame_requests_max + 1)]
    r.send(reqs)
    assert r.closed_by_node() and r.answers[None][1]["code"] == "frame_too_large"
    assert Raw(node).call(wire.GET, "kv", "f0")[0] == 404          # none of that frame was written


GARBAGE = [
    b"\x00\x00\x00\x05hello",                                  # not msgpack
    b"\x00\x00\x00\x01\xc1",                                   # a reserved msgpack byte
    b"\x00\x00\x00\x00",                                       # an empty frame
    wire.frame(msgpack.packb({"not": "a list"})),
    wire.frame(msgpack.packb([])),
    wire.frame(msgpack.packb([[1]])),
    wire.frame(msgpack.packb([["x", 1]])),
    wire.frame(msgpack.packb([[1, 99, "kv"]])),
    wire.frame(msgpack.packb([[1, wire.PUT, "kv", "k"]])),
    wire.frame(msgpack.packb([[1, wire.PUT, ["kv"], "k", 1]])),
    wire.frame(msgpack.packb([[1, wire.PUT, "kv", {"k": 1}, 1]])),
    wire.frame(msgpack.packb([[1, wire.PUT, "kv", "k", msgpack.ExtType(5, b"x")]])),
    wire.frame(msgpack.packb([[1, wire.PUT, "kv", "k", b"bytes"]], use_bin_type=True)),
    wire.frame(msgpack.packb([[1, wire.PUT, "kv", "k", float("nan")]])),
    wire.frame(msgpack.packb([[1, wire.PUT, "kv", "k", {1: 2}]])),
    wire.frame(msgpack.packb([[-1, wire.PUT, "kv", "k", 1]])),
    wire.frame(msgpack.packb([[2 ** 64 - 1, wire.PUT, "kv", "k", 1]])),
    wire.frame(msgpack.packb([[1, wire.TXN, [[9, "kv", "k"]]]])),
    wire.frame(msgpack.packb([[1, wire.GET, "kv", "k", {"u": "x"}, 5]])),
    wire.frame(b"\x91" * 200_000 + b"\xc0"),                     # nested deeper than any decoder recurses
    wire.frame(msgpack.packb([[1, wire.PUT, "kv", "k", 1]]))[:-3],   # truncated: the connection ends mid-frame
]


def test_garbage_frames_and_truncated_frames_never_hurt_the_node(node):
    before = node.info()["vclock"]
    for g in GARBAGE:
        r = Raw(node, timeout=10)
        r.send_raw(g)
        r.sock.shutdown(socket.SHUT_WR)
        r.closed_by_node()
        for rid, (status, body) in r.answers.items():
            assert 400 <= status < 500 and body["code"], (g[:40], rid, status, body)
        r.close()
    r = Raw(node)
    r.send_raw(os.urandom(3))                                  # a partial length, then the client vanishes
    r.close()
    assert node.get("/v1/health")[0] == 200
    assert node.info()["vclock"] == before                     # nothing unvalidated reached the WAL
    assert "a bug" not in node.log_text() and "Traceback" not in node.log_text()
    assert Raw(node).call(wire.PUT, "kv", "still", "serving")[0] == 200


def test_the_client_port_serves_tls_when_the_node_does(tmp_path, procs):
    from bench.throwaway_ca import ThrowawayCA
    tls = ThrowawayCA(str(tmp_path / "ca")).issue("n")
    n = ReplogProcess(tmp_path, "tls", tls=tls).start()
    procs.append(n)
    assert n.get("/v1/client")[1]["tls"] is True
    r = Raw(n, ca_file=tls.ca_file)
    assert r.call(wire.SPACE, "kv", {})[0] == 201 and r.call(wire.PUT, "kv", "k", 1)[0] == 200
    plain = socket.create_connection(("127.0.0.1", client_port(n)), timeout=10)
    plain.sendall(wire.encode_requests([[1, wire.GET, "kv", "k"]]))
    assert plain.recv(100)[:1] != b"\x00"                       # no answer frame in plaintext
    plain.close()
    wait_for(lambda: n.get("/v1/health")[0] == 200, 10, "node serves on")
    assert request("GET", n.url + "/v1/health", ca_file=tls.ca_file)[0] == 200
