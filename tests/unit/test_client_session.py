"""The binary protocol's session on a real node in this process (real LMDB and WAL, no client
socket): the node's write checks hold on the fast path — a node still waiting for its own earlier
rows (own_lsn_seen) refuses with 503 catching_up, a read-only node with 409 read_only, a node not
running with 503 not_ready — and nothing of a refused frame is claimed."""
from __future__ import annotations


from node.applier.applier import Applier
from node.clientproto import wire
from node.clientproto.session import Session
from node.config import load
from node.core.rows import OP_SPACE, Op
from node.server import Node
from tests.waiting import until


async def started(tmp_path, listen, **flags) -> Node:
    cfg = load({"data_dir": str(tmp_path / "n"), "listen": listen(), "client_listen": "off",
                **flags}, env={})
    node = Node(cfg)
    await node.start()
    await until(lambda: node.status == "running", 10, "the node to run")
    return node


def session(node: Node) -> tuple[Session, list]:
    out: list = []
    s = Session(node, lambda b: out.extend(wire.decode_answers(b[wire.HEAD_BYTES:])[1]), lambda: None,
                lambda pause: None)
    return s, out


async def answered(out: list, n: int) -> list:
    await until(lambda: len(out) >= n, 4, f"{n} answers (have {out})")
    return out


async def test_the_fast_path_keeps_every_write_check_of_node_write(tmp_path, listen):
    node = await started(tmp_path, listen)
    try:
        await node.write([Op(OP_SPACE, "kv", "", {"local": False, "conflict": "lww"})])
        s, out = session(node)
        s.on_payload(wire.encode_requests([[1, wire.PUT, "kv", "a", 1], [2, wire.DELETE, "kv", "b"]])[4:])
        assert sorted(a[1] for a in await answered(out, 2)) == [200, 200]
        claimed = node.core.claimed.get(node.core.self_id)
        upstream = "127.0.0.1:9"                     # an upstream (never started) says it holds more of our rows
        node.appliers[upstream] = Applier(node, upstream)
        node.own_claims["0badc0de-0000-4000-8000-000000000001"] = (claimed + 5, upstream)
        out.clear()
        s.on_payload(wire.encode_requests([[3, wire.PUT, "kv", "c", 1], [4, wire.TXN, [[2, "kv", "d", 1]]]])[4:])
        assert [(a[1], a[2]["code"]) for a in await answered(out, 2)] == [(503, "catching_up")] * 2
        assert node.core.claimed.get(node.core.self_id) == claimed       # nothing claimed
        node.own_claims.clear()
        del node.appliers[upstream]
        node.status = "joining"
        out.clear()
        s.on_payload(wire.encode_requests([[5, wire.PUT, "kv", "e", 1]])[4:])
        assert [(a[1], a[2]["code"]) for a in await answered(out, 1)] == [(503, "not_ready")]
        node.status = "running"
    finally:
        await node.stop()


async def test_a_read_only_node_refuses_fast_path_writes_and_serves_reads(tmp_path, listen):
    node = await started(tmp_path, listen)
    await node.write([Op(OP_SPACE, "kv", "", {"local": False, "conflict": "lww"})])
    await node.stop()
    node = await started(tmp_path, listen, read_only=True)
    try:
        s, out = session(node)
        claimed = node.core.claimed.get(node.core.self_id)
        s.on_payload(wire.encode_requests([[1, wire.PUT, "kv", "a", 1], [2, wire.GET, "kv", "a"]])[4:])
        got = {a[0]: (a[1], a[2]["code"]) for a in await answered(out, 2)}
        assert got == {1: (409, "read_only"), 2: (404, "no_such_key")}
        assert node.core.claimed.get(node.core.self_id) == claimed
    finally:
        await node.stop()
