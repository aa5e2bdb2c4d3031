"""The SDK (`import replog`) against real `replog serve` processes: every call of the blocking
and the asyncio client, each typed exception, automatic batching, failover when the first node
is killed mid-stream (no acknowledged write lost, none applied twice), the HTTP fallback, TLS,
timeouts, and read-your-writes across two masters, also over the HTTP API."""
from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import time

import pytest

import replog
from node import limits
from tests.integration.harness import REPLOG, ReplogProcess, mesh, request, vclocks_converged, wait_for


@pytest.fixture
def node(tmp_path, procs):
    n = ReplogProcess(tmp_path, "n1").start()
    procs.append(n)
    return n


def test_the_blocking_client_does_every_operation_and_raises_typed_errors(node):
    with replog.Client([node.address], timeout=10) as c:
        assert c.create_space("kv")["created"] is True
        assert c.create_space("kv")["created"] is False
        w = c.put("kv", "a", {"x": 1})
        assert w.lsn > 0 and w.vclock == {node.uuid(): w.lsn} and c.vclock == w.vclock
        assert c.get("kv", "a") == replog.Item("a", {"x": 1}, node.uuid(), w.lsn)
        assert c.get("kv", "a", after=w.vclock).value == {"x": 1}
        for i in range(25):
            c.put("kv", f"r{i:02}", i)
        assert [it.key for it in c.range("kv", page=4)] == ["a"] + [f"r{i:02}" for i in range(25)]
        assert [it.value for it in c.range("kv", "r20", page=2)] == [21, 22, 23, 24]
        with c.txn() as t:
            t.put("kv", "b", 2).delete("kv", "a")
        assert t.result.lsn == c.vclock[node.uuid()]
        with pytest.raises(replog.NotFound) as e:
            c.get("kv", "a")
        assert e.value.code == "no_such_key" and e.value.status == 404
        with pytest.raises(ZeroDivisionError):              # a block that raises commits nothing
            with c.txn() as t2:
                t2.put("kv", "never", 1)
                1 / 0
        assert t2.result is None
        with pytest.raises(replog.NotFound):
            c.get("kv", "never")
        assert c.delete("kv", "b").lsn == t.result.lsn + 1
        assert c.info()["uuid"] == node.uuid()
        assert c.wait(c.vclock, timeout=2) == c.vclock
        with pytest.raises(replog.BadRequest) as e:
            c.put("kv", "", 1)
        assert e.value.code == "bad_key"
        with pytest.raises(replog.TooLarge):
            c.put("kv", "big", "v" * limits.value_bytes_max)
        with pytest.raises(replog.Forbidden):
            c.put("_cluster", "k", 1)
        with pytest.raises(replog.NotFound) as e:
            c.put("nope", "k", 1)
        assert e.value.code == "no_such_space"
        with pytest.raises(replog.Conflict) as e:
            c.create_space("kv", local=True)
        assert e.value.code == "space_exists"
        with pytest.raises(replog.Timeout) as e:
            c.wait({"00000000-0000-4000-8000-000000000000": 1}, timeout=1)
        assert e.value.code == "wait_timeout"
        with pytest.raises(replog.Timeout):
            c.get("kv", "r00", after={node.uuid(): 10 ** 9}, timeout=1)
        assert c.address == node.address


def test_a_wrong_token_is_unauthorized_and_the_right_one_works(tmp_path, procs):
    tok = tmp_path / "token"
    tok.write_text("t0ken")
    n = ReplogProcess(tmp_path, "tok", extra=["--token-file", str(tok)], token="t0ken").start()
    procs.append(n)
    with pytest.raises(replog.Unauthorized):
        with replog.Client([n.address], token="nope", timeout=5) as c:
            c.info()
    with pytest.raises(replog.Unauthorized):
        with replog.Client([n.address], timeout=5) as c:
            c.info()
    with replog.Client([n.address], token="t0ken", timeout=5) as c:
        c.create_space("kv")
        assert c.get("kv", "k", after=c.put("kv", "k", 1).vclock).value == 1


async def test_the_async_client_batches_concurrent_calls_into_few_frames(node):
    async with replog.AsyncClient([node.address]) as c:
        await c.create_space("kv")
        res = await asyncio.gather(*(c.put("kv", f"b{i:04}", i) for i in range(1000)))
        conn = c._conn
        assert conn is not None and conn._frames_sent < 50, conn._frames_sent   # not one frame per call
        lsns = sorted(r.lsn for r in res)
        assert lsns == list(range(lsns[0], lsns[0] + 1000))
        got = await asyncio.gather(*(c.get("kv", f"b{i:04}") for i in range(0, 1000, 7)))
        assert [g.value for g in got] == list(range(0, 1000, 7))
        items = [it async for it in c.range("kv", page=300)]
        assert len(items) == 1000
        async with c.txn() as t:
            t.put("kv", "t1", 1).put("kv", "t2", 2)
        assert (await c.get("kv", "t2")).lsn == t.result.lsn


def test_without_a_binary_port_the_sdk_speaks_http_with_the_same_answers(tmp_path, procs):
    n = ReplogProcess(tmp_path, "http", extra=["--client-listen", "off"]).start()
    procs.append(n)
    assert n.get("/v1/client")[1]["port"] is None
    with replog.Client([n.address]) as c:
        c.create_space("kv")
        w = c.put("kv", "k", [1, {"a": None}])
        assert w.vclock == {n.uuid(): w.lsn}
        assert c.get("kv", "k", after=w.vclock) == replog.Item("k", [1, {"a": None}], n.uuid(), w.lsn)
        with pytest.raises(replog.NotFound):
            c.get("kv", "missing")
        assert [i.key for i in c.range("kv")] == ["k"]
        with pytest.raises(replog.TooLarge):
            c.commit([(2, "kv", "x", 1)] * (limits.txn_ops_max + 1))


def test_failover_when_the_first_node_is_killed_mid_stream_loses_no_acknowledged_write(tmp_path, procs):
    a, b = mesh(tmp_path, 2)
    procs.extend([a, b])
    a.create_space("kv")
    wait_for(lambda: b.get("/v1/spaces")[1]["spaces"], 20, "space on b")
    acked: dict[str, int] = {}
    unknown: list[str] = []
    killed = False

    async def stream() -> None:
        nonlocal killed
        async with replog.AsyncClient([a.address, b.address], timeout=10) as c:
            async def writer(w: int) -> None:
                nonlocal killed
                for i in range(150):
                    key = f"w{w}-{i}"
                    try:
                        await c.put("kv", key, i)
                        acked[key] = i
                    except replog.OutcomeUnknown:
                        unknown.append(key)          # sent, connection broke: the rule says not retried
                    if w == 0 and i == 40 and not killed:
                        killed = True
                        a.kill9()                    # mid-stream: other writers have puts in flight
            await asyncio.gather(*(writer(w) for w in range(16)))
            assert c.address == b.address

    asyncio.run(stream())
    assert killed and len(acked) + len(unknown) == 16 * 150
    assert len(acked) > 16 * 150 - 16 * 41, (len(acked), len(unknown))   # the stream went on at b
    a.start()
    wait_for(lambda: vclocks_converged([a, b]), 60, "a and b converge after a restarts")
    with replog.Client([b.address]) as c:
        for key, v in acked.items():
            assert c.get("kv", key).value == v, key
    # No key was applied twice: every key's row appears at most once across both WALs' origins.
    rows = collections.Counter()
    dump = subprocess.run(REPLOG + ["wal", "dump", os.path.join(b.data_dir, "wal")], capture_output=True, text=True,
                          timeout=120)
    for line in dump.stdout.splitlines():
        row = json.loads(line)
        if row["space"] == "kv" and row["op"] == "put":
            rows[row["key"]] += 1
    assert rows, dump.stdout[:500]
    assert max(rows.values()) == 1, [k for k, n in rows.items() if n > 1][:5]
    assert set(acked) <= set(rows)


def test_read_your_writes_across_two_masters(tmp_path, procs):
    a, b = mesh(tmp_path, 2)
    procs.extend([a, b])
    with replog.Client([a.address]) as ca, replog.Client([b.address]) as cb:
        w0 = ca.create_space("kv")
        cb.wait(w0["vclock_uuid"], timeout=20)
        b.set_peers([])                                        # b stops following a
        wait_for(lambda: not b.info()["upstreams"], 20, "b has no upstream")
        w = ca.put("kv", "mine", "written on a")
        with pytest.raises(replog.Timeout):
            cb.get("kv", "mine", after=w.vclock, timeout=1)
        s, d = request("GET", f"{b.url}/v1/spaces/kv/keys/mine?after_vclock={a.uuid()}:{w.lsn}&timeout_ms=300")
        assert (s, d["error"]["code"]) == (504, "wait_timeout")
        b.set_peers([a])
        assert cb.get("kv", "mine", after=w.vclock, timeout=20).value == "written on a"
        s, d = request("GET", f"{b.url}/v1/spaces/kv/keys/mine?after_vclock={a.uuid()}:{w.lsn}")
        assert s == 200 and d["value"] == "written on a"
        s, d = request("GET", f"{b.url}/v1/wait?vclock={a.uuid()}:{w.lsn}&timeout_ms=1000")
        assert s == 200 and d["vclock"][a.uuid()] >= w.lsn
        s, d = request("GET", f"{b.url}/v1/spaces/kv/keys?after_vclock={a.uuid()}:{w.lsn}")
        assert s == 200 and [i["key"] for i in d["items"]] == ["mine"]
        for bad in ("nonsense", f"{a.uuid()}:x", f"{a.uuid()}:1,{a.uuid()}:2", "abc:1"):
            s, d = request("GET", f"{b.url}/v1/wait?vclock={bad}")
            assert (s, d["error"]["code"]) == (400, "bad_vclock"), bad
        s, d = request("GET", f"{b.url}/v1/wait?vclock={a.uuid()}:1&timeout_ms=-1")
        assert (s, d["error"]["code"]) == (400, "bad_timeout")
        # The session vclock: a client reads its own writes on any node without passing it around.
        with replog.Client([a.address, b.address]) as c:
            c.put("kv", "s1", 1)
            with replog.Client([b.address]) as other:
                assert other.get("kv", "s1", after=c.vclock, timeout=20).value == 1


def test_a_call_to_a_node_that_stops_answering_times_out(node):
    with replog.Client([node.address], timeout=2) as c:
        c.create_space("kv")
        os.kill(node.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises((replog.Timeout, replog.Unavailable)):
                c.put("kv", "k", 1, timeout=1)
            assert time.monotonic() - t0 < 5
        finally:
            os.kill(node.proc.pid, signal.SIGCONT)
        assert c.put("kv", "k2", 2).lsn > 0


def test_the_sdk_speaks_tls_with_the_ca_file(tmp_path, procs):
    from bench.throwaway_ca import ThrowawayCA
    tls = ThrowawayCA(str(tmp_path / "ca")).issue("n")
    n = ReplogProcess(tmp_path, "tls", tls=tls).start()
    procs.append(n)
    with replog.Client([n.address], ca_file=tls.ca_file) as c:
        c.create_space("kv")
        assert c.get("kv", "k", after=c.put("kv", "k", "sealed").vclock).value == "sealed"
        from replog.binary import BinaryConnection
        assert isinstance(c._aclient._conn, BinaryConnection)
    with pytest.raises(replog.Unavailable):
        with replog.Client([n.address], timeout=3) as c:    # plaintext to a TLS node: no node answers
            c.info()


BAD_CALLS = [                                   # (what, put's args, the code both transports raise)
    ("an int key", ("kv", 123, 1), "bad_key"),
    ("a bytes key", ("kv", b"abc", 1), "bad_key"),
    ("an empty key", ("kv", "", 1), "bad_key"),
    ("a key with a lone surrogate", ("kv", "\ud800", 1), None),
    ("no space", (None, "a", 1), "bad_space_name"),
    ("an int past msgpack's", ("kv", "big", 2 ** 64), "bad_request"),
    ("a negative one", ("kv", "big", -2 ** 63 - 1), "bad_request"),
]


@pytest.mark.parametrize("transport", ["binary", "http"])
async def test_an_argument_that_cannot_be_sent_fails_its_own_call_at_once_on_both_transports(node, transport):
    """The binary transport encoded a frame's requests together after the call returned: a value
    msgpack cannot carry raised inside the event loop's callback, and that call and every call
    sharing its frame waited out their timeout. The HTTP transport raised TypeError or
    OverflowError, stored a bytes key, and answered an empty key 404."""
    async with replog.AsyncClient([node.address], transport=transport, timeout=20) as c:
        await c.create_space("kv")
        for what, args, code in BAD_CALLS:
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(replog.BadRequest) as e:
                await c.put(*args)
            assert asyncio.get_running_loop().time() - t0 < 5, f"{what}: not at once"
            assert code is None or e.value.code == code, (what, e.value.code, str(e.value))
        # batched with good calls, a bad one fails alone and the others are written
        calls = [c.put("kv", f"good{i}", i) for i in range(5)]
        calls.insert(2, c.put("kv", "bad", 2 ** 70))
        res = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(res[2], replog.BadRequest)
        assert all(isinstance(r, replog.WriteResult) for i, r in enumerate(res) if i != 2), res
        assert [(await c.get("kv", f"good{i}")).value for i in range(5)] == list(range(5))
        keys = [i.key async for i in c.range("kv")]
        assert keys == [f"good{i}" for i in range(5)], keys
