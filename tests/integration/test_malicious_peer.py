"""A peer that holds the cluster secret and lies (tests/integration/fakepeer.py), against real
nodes. Every case is a row or a claim that once killed a node for good, or killed its applier
silently (issue 15). The oracle, each time: the node is alive and says why it refused (the
upstream's status and error, its log), nothing of the lie reached its store, the peer's rows
before the lie are there, replication from an honest peer goes on, and a kill -9 restart
recovers the WAL."""
from __future__ import annotations

import os

import pytest

from node import limits
from node.core import messages as m
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_CLUSTER, OP_DELETE, OP_PUT, OP_SPACE, Op
from tests.integration.fakepeer import FakePeer, rows_message, running
from tests.integration.harness import ReplogProcess, wait_for

SECRET = b"the cluster secret the liar holds too"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two honest nodes, A and B, replicating both ways; A will also subscribe to the liar."""
    tmp = tmp_path_factory.mktemp("liar")
    secret = tmp / "secret"
    secret.write_bytes(SECRET)
    from tests.integration.harness import PortReservation
    ra, rb = PortReservation(), PortReservation()     # held until the end: no other test's node takes them
    extra = ["--secret-file", str(secret)]
    a = ReplogProcess(tmp, "a", reservation=ra, peers=[f"127.0.0.1:{rb.port}"], extra=extra)
    b = ReplogProcess(tmp, "b", reservation=rb, peers=[f"127.0.0.1:{ra.port}"], extra=extra)
    nodes = [a, b]
    try:
        for n in nodes:
            n.start(wait=False)
        for n in nodes:
            n.wait_healthy(60)
        a.create_space("kv")
        a.create_space("mine", local=True)
        wait_for(lambda: b.get("/v1/spaces/kv/keys")[0] == 200, 20, "space kv on B")
        yield a, b
    finally:
        for n in nodes:
            n.kill9()
            n.release_port()


def _upstream(node: ReplogProcess, address: str) -> dict:
    if node.proc.poll() is not None:
        raise AssertionError(f"{node.name} exited with {node.proc.returncode}:\n{node.log_tail(15)}")
    return next((u for u in node.info()["upstreams"] if u["address"] == address), {})


def _lie(cluster, script, refusal: str, *, good: int = 2, setup=None) -> None:
    """A subscribes to a liar whose script is `good` honest puts into kv, then `script(peer)`
    (a list of Txns or raw messages); A must refuse with an error containing `refusal`."""
    a, b = cluster
    with running(FakePeer(SECRET), a.address) as (peer, thread):
        if setup:
            setup(peer)
        honest = [peer.txn(i + 1, (Op(OP_PUT, "kv", f"{peer.uuid[:8]}-{i}", i),)) for i in range(good)]
        peer.script = honest + script(peer)
        a.set_peers([b, peer])
        try:
            wait_for(lambda: refusal in _upstream(a, peer.address).get("error", ""), 30,
                     f"A refuses the liar's row with an error saying {refusal!r}")
            _still_sound(a, b, peer, good)
        finally:
            a.set_peers([b])
    a.kill9()                                  # the WAL it wrote must recover
    a.start()
    _still_sound(a, b, peer, good)


def _still_sound(a: ReplogProcess, b: ReplogProcess, peer: FakePeer, good: int) -> None:
    assert a.get("/v1/health")[0] == 200, a.log_tail()
    for i in range(good):                      # the liar's rows before the lie were applied
        assert a.kv_get("kv", f"{peer.uuid[:8]}-{i}")[0] == 200
    assert a.get(f"/v1/spaces/kv/keys/{peer.uuid[:8]}-lie")[0] == 404
    key = f"from-b-{peer.uuid[:8]}-{a.starts}"
    b.kv_put("kv", key, "honest")              # replication from the honest peer goes on
    wait_for(lambda: a.kv_get("kv", key)[0] == 200, 20, "B's write reaches A")
    a.kv_put("kv", key + "-a", 1)
    wait_for(lambda: b.kv_get("kv", key + "-a")[0] == 200, 20, "A's write reaches B")


def _put(peer: FakePeer, lsn: int, value=1, *, space="kv", key=None, **kw):
    return peer.txn(lsn, (Op(OP_PUT, space, key if key is not None else f"{peer.uuid[:8]}-lie", value),), **kw)


def _nested(depth: int):
    v: list = []
    for _ in range(depth - 1):
        v = [v]
    return v


# --- rows that break a rule of their own (the decoders refuse them) ------------------------------
@pytest.mark.parametrize("why, script, refusal", [
    ("a key of 512 bytes (LMDB takes 511)", lambda p: [_put(p, 3, key="k" * 512)], "keys are"),
    ("an empty key", lambda p: [_put(p, 3, key="")], "keys are"),
    ("a value nested 400 deep", lambda p: [_put(p, 3, _nested(400))], "nest"),
    ("a timestamp of 2^64 - 1", lambda p: [_put(p, 3, ts=2**64 - 1)], "timestamps are"),
    ("a _cluster row whose uuid is not a uuid",
     lambda p: [p.txn(3, (Op(OP_CLUSTER, "_cluster", "not-a-uuid", {"id": 77, "address": "", "state": "member"}),),
                      group=GROUP_CLUSTER)], "canonical uuid"),
    ("a space with an unknown conflict resolver",
     lambda p: [p.txn(3, (Op(OP_SPACE, "evil", "", {"local": False, "conflict": "nope"}),))], "conflict"),
    ("a NaN value", lambda p: [_put(p, 3, float("nan"))], "finite"),
    ("a binary value", lambda p: [_put(p, 3, b"\x00")], "binary"),
    ("a map with a binary key", lambda p: [_put(p, 3, {b"k": 1})], "map keys"),
    ("a _cluster row inside a data transaction",
     lambda p: [p.txn(3, (Op(OP_CLUSTER, "_cluster", p.uuid, {"id": p.id, "address": "", "state": "member"}),))],
     "travel alone"),
])
def test_a_row_breaking_a_data_rule_stops_the_link_not_the_node(cluster, why, script, refusal):
    _lie(cluster, script, refusal)


def _txn_of_bytes(p: FakePeer, lsn: int, size: int):
    """A txn of puts of strings that encodes to exactly `size` bytes."""
    from node.core import codec
    chunk = limits.value_bytes_max - 16
    n = size // chunk + 1
    ops = [Op(OP_PUT, "kv", f"big{i}", "v" * chunk) for i in range(n)]
    t = p.txn(lsn, tuple(ops))
    extra = len(codec.pack(t)) - size                # too many bytes: shorten the last value
    ops[-1] = Op(OP_PUT, "kv", f"big{n - 1}", "v" * (chunk - extra))
    t = p.txn(lsn, tuple(ops))
    while len(codec.pack(t)) != size:                # the last string's header may have shrunk
        d = len(codec.pack(t)) - size
        ops[-1] = Op(OP_PUT, "kv", ops[-1].key, "v" * (len(ops[-1].value) - d))
        t = p.txn(lsn, tuple(ops))
    return t


def test_a_transaction_too_large_to_travel_on_is_refused(cluster):
    """A txn that fits in the message it came in, but not in one message with its framing once
    a receiver rewrites its replica id and relays it: refused on receipt (its origin could not
    have written it: local writes are checked against the same bound)."""
    _lie(cluster, lambda p: [rows_message([_txn_of_bytes(p, 3, limits.txn_bytes_max + 1)])], "txn_bytes_max")


# --- rows that break nothing alone but cannot be applied here (the core refuses them) ------------
@pytest.mark.parametrize("why, script, refusal", [
    ("a row for a space that does not exist", lambda p: [_put(p, 3, space="nowhere")], "does not exist"),
    ("a row for a space that is local here", lambda p: [_put(p, 3, space="mine")], "is local here"),
    ("a row of a local space", lambda p: [_put(p, 3, group=GROUP_LOCAL)], "local space"),
    ("a timestamp an hour ahead of the clock",
     lambda p: [_put(p, 3, ts=p.txn(1, ()).timestamp + 3600 * 10**6)], "ahead of this node's clock"),
    ("more spaces than the store can hold",
     lambda p: [p.txn(3, tuple(Op(OP_SPACE, f"s{i}", "", {"local": False, "conflict": "lww"})
                              for i in range(limits.store_spaces_max)))], "store_spaces_max"),
])
def test_a_row_this_node_cannot_apply_stops_the_link_not_the_node(cluster, why, script, refusal):
    _lie(cluster, script, refusal)


def _cluster_row(p: FakePeer, lsn: int, uuid: str, their_id: int, state: str = "member"):
    return p.txn(lsn, (Op(OP_CLUSTER, "_cluster", uuid, {"id": their_id, "address": "", "state": state}),),
                 group=GROUP_CLUSTER)


def test_a_cluster_row_giving_the_receivers_own_id_to_another_uuid_is_refused(cluster):
    """The liar says a new member holds the id it gave A itself: A's map of it would send that
    member's rows to A's own component (an AssertionError killed the applier silently before)."""
    a, _ = cluster
    a_uuid = a.uuid()
    _lie(cluster, lambda p: [_cluster_row(p, 3, "00000000-0000-4000-8000-000000000001",
                                          next(r[1] for r in p.table if r[0] == a_uuid))], "said before")


def test_a_cluster_row_about_the_receiver_changes_nothing_but_an_expel(cluster, tmp_path):
    """The liar tells an anonymous replica that it is a member: its entry is its own rows' (it
    registers through REGISTER, or not at all); it used to turn itself into a writing member
    under an id no master granted."""
    a, b = cluster
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    d = ReplogProcess(tmp_path, "anon", peers=[a], extra=["--anon", "--secret-file", str(secret)])
    try:
        d.start()
        wait_for(lambda: d.get("/v1/spaces/kv/keys")[0] == 200, 20, "the replica has kv")
        d_uuid = d.uuid()
        with running(FakePeer(SECRET), a.address) as (peer, _):
            peer.script = [_cluster_row(peer, 1, d_uuid, 90), _put(peer, 2, key=f"{peer.uuid[:8]}-after")]
            d.set_peers([a, peer])
            try:
                wait_for(lambda: d.kv_get("kv", f"{peer.uuid[:8]}-after")[0] == 200, 30, "the liar's later row")
            finally:
                d.set_peers([a])
        assert d.cluster()[d_uuid]["state"] == "anonymous"
        assert d.info()["read_only"] and d.info()["anon"]
        assert d.put("/v1/spaces/kv/keys/from-anon", 1)[1]["error"]["code"] == "read_only"
    finally:
        d.kill9()


# --- greetings and requests (the liar as a client) ----------------------------------------------
@pytest.mark.parametrize("why, greeting, refusal", [
    ("a 600-byte uuid", {"uuid": "u" * 600}, "canonical uuid"),
    ("a 9 MB address", {"address": "h" * (9 * 1024 * 1024) + ":1"}, "address"),
    ("a host without a port", {"address": "somewhere"}, "host:port"),
    ("a _cluster of junk rows", {"cluster": [["x", "y"]]}, "_cluster"),
    ("a _cluster naming one id twice", {"cluster": [["00000000-0000-4000-8000-00000000000a", 5, "", "member", 0, 0],
                                                    ["00000000-0000-4000-8000-00000000000b", 5, "", "member", 0, 0]]},
     "twice"),
    ("a vclock past lsn_max", {"vclock_uuid": {"00000000-0000-4000-8000-00000000000a": 2**63}}, "lsn"),
])
def test_a_join_with_a_lying_greeting_is_refused_and_registers_nothing(cluster, why, greeting, refusal):
    a, b = cluster
    members = set(a.cluster())
    with running(FakePeer(SECRET), a.address) as (peer, thread):
        answer = thread.call(peer.request(a.address, m.JOIN, greeting=greeting, code=None, id=None))
        assert refusal in str(answer), answer
    assert set(a.cluster()) == members
    assert a.get("/v1/health")[0] == 200
    a.kill9()
    a.start()                                  # every segment header still fits (was: exit at rotation)
    assert set(a.cluster()) == members


def test_an_upstream_greeting_with_junk_cluster_rows_stops_the_link_not_the_node(cluster):
    a, b = cluster
    with running(FakePeer(SECRET), a.address) as (peer, _):
        peer.greeting_extra = {"cluster": peer.table + [[peer.uuid, "x", 3]]}
        a.set_peers([b, peer])
        try:
            wait_for(lambda: "_cluster" in _upstream(a, peer.address).get("error", ""), 30, "A refuses the greeting")
        finally:
            a.set_peers([b])
    assert a.get("/v1/health")[0] == 200


# --- claims about this node's own rows (defect 6: "a greeting vclock of 2^62") -------------------
def _writes(node: ReplogProcess, key: str) -> tuple[int, str]:
    s, d = node.put(f"/v1/spaces/kv/keys/{key}", 1)
    return s, (d.get("error", {}).get("message", "") if s != 200 else "")


def test_a_claim_to_hold_this_nodes_rows_from_a_peer_it_cannot_fetch_them_from_holds_no_write(cluster):
    """A liar greets A as a client only, saying it holds A's own rows up to lsn_max: A cannot
    fetch them from it (it is none of A's upstreams), so the claim cannot hold A's writes (every
    write answered 503 `catching_up` until a restart). It is shown, though: an honest peer that
    says so (an anonymous replica A forgot, a node A's rows reached before A lost them) holds
    rows A's next writes take the lsns of, unless A replicates from it."""
    a, b = cluster
    with running(FakePeer(SECRET), a.address) as (peer, thread):
        answer = thread.call(peer.request(a.address, m.BYE, greeting={"vclock_uuid": {a.uuid(): limits.lsn_max}}))
        assert answer["uuid"] == a.uuid()
        assert _writes(a, f"{peer.uuid[:8]}-after-claim") == (200, "")
    s, d = a.get("/v1/health")
    assert s == 200 and d["status"] == "degraded", d
    said = [w for w in d["warnings"] if peer.uuid in w]
    assert len(said) == 1 and f"up to lsn {limits.lsn_max}" in said[0] and "PUT /v1/admin/peers" in said[0], d


def test_a_claim_to_hold_this_nodes_rows_holds_writes_only_while_its_peer_is_an_upstream(cluster):
    """Rows of A's own that an upstream says it holds come back by SUBSCRIBE, and A's writes wait
    for them (so no lsn of A's is used twice: test_replication's rejoin). A liar's claim holds
    them only while the liar is A's upstream, says whom A waits for, and ends with the link.
    (This liar never heartbeats, so it never looks caught up: the next test is one that does.)"""
    a, b = cluster
    with running(FakePeer(SECRET), a.address) as (peer, _):
        peer.greeting_extra = {"vclock_uuid": {a.uuid(): limits.lsn_max}}
        peer.heartbeats = False
        a.set_peers([b, peer])
        try:
            wait_for(lambda: _upstream(a, peer.address).get("status") == "follow", 30, "A subscribed to the liar")
            s, why = _writes(a, f"{peer.uuid[:8]}-held")
            assert s == 503 and peer.address in why, (s, why)
        finally:
            a.set_peers([b])
        assert _writes(a, f"{peer.uuid[:8]}-free") == (200, "")


def test_an_upstream_that_catches_this_node_up_without_the_rows_it_claimed_is_not_believed(cluster):
    """A relay heartbeats once it has sent all it held: a claim of A's rows that its stream did
    not bear out is dropped (ApplierMachine._on_heartbeat, node/core/link/applier.py), and A writes again with the link still up."""
    a, b = cluster
    with running(FakePeer(SECRET), a.address) as (peer, _):
        peer.greeting_extra = {"vclock_uuid": {a.uuid(): limits.lsn_max}}
        a.set_peers([b, peer])
        try:
            wait_for(lambda: _upstream(a, peer.address).get("status") == "follow", 30,
                     "A subscribed to the liar")
            wait_for(lambda: _writes(a, f"{peer.uuid[:8]}-caught-up")[0] == 200, 5,      # its heartbeats: every 1 s
                     "A writes once the liar's stream caught it up without the rows")
            assert _upstream(a, peer.address).get("status") == "follow"
            assert "its claim is not believed" in a.log_text()
        finally:
            a.set_peers([b])


@pytest.mark.parametrize("store", ["junk", ["dirty"], {"status": "dirty", "initial": "junk"}])
def test_a_restart_among_peers_one_of_which_greets_with_a_junk_store_field_goes_on(cluster, store):
    """A restarting member with a store polls its peers (the join protocol's status exchange):
    a greeting whose `store` field is not an object made start-up die on an AttributeError (and a
    joining node, whose donor greets the same way, after installing the snapshot)."""
    a, b = cluster
    with running(FakePeer(SECRET), a.address) as (peer, _):
        peer.greeting_extra = {"store": store}
        a.kill9()
        a.peers = [peer.address, b.address]      # the liar is polled too, and listed first
        try:
            a.start()
            assert a.get("/v1/health")[0] == 200
        finally:
            a.peers = [b.address]
            a.kill9()
            a.start()


def test_a_peers_error_message_is_cut_to_a_bound_before_it_reaches_logs_and_status(cluster):
    """An ERROR is the peer's text: 8 MB of it went whole into the applier's status (so into
    /v1/info and every dashboard snapshot, each second) and into the log at every retry."""
    a, b = cluster
    size = os.path.getsize(a.log_path)
    with running(FakePeer(SECRET), a.address) as (peer, _):
        peer.script = [m.encode(m.ERROR, code="c" * 100_000, message="m" * (8 << 20))]
        a.set_peers([b, peer])
        try:
            up = wait_for(lambda: (u := _upstream(a, peer.address)).get("status") == "refused" and u, 30,
                          "A refused by the liar's ERROR")
        finally:
            a.set_peers([b])
    assert len(up["error"]) <= 2 * limits.peer_error_chars_max, len(up["error"])
    assert os.path.getsize(a.log_path) - size < 100_000
    assert a.get("/v1/health")[0] == 200
