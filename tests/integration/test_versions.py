"""Versions on disk and on the wire, against real nodes: a store of a newer format is refused at
start with one line; a peer of the previous protocol version (tests/integration/fakepeer.py plays
one as version-2 nodes ran) replicates both ways; a peer outside the range is refused and the
node logs why, naming both versions (docs/upgrade.md)."""
from __future__ import annotations

import os
import subprocess

import pytest

from node.core import messages as m
from node.core.rows import OP_PUT, Op
from node.errors import PeerRefused
from node.storage.store import STORE_FORMAT_VERSION, Store
from tests.integration.fakepeer import FakePeer, running
from tests.integration.harness import REPLOG, ReplogProcess, wait_for

SECRET = b"the secret every member holds"
RANGE = f"{m.PROTOCOL_VERSION_MIN}..{m.PROTOCOL_VERSION}"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("versions")
    (tmp / "secret").write_bytes(SECRET)
    n = ReplogProcess(tmp, "n", extra=["--secret-file", str(tmp / "secret")])
    try:
        n.start()
        n.create_space("kv")
        yield n
    finally:
        n.kill9()


def _upstream(node: ReplogProcess, address: str) -> dict:
    return next((u for u in node.info()["upstreams"] if u["address"] == address), {})


def test_a_node_replicates_from_a_peer_of_the_previous_protocol_version(node):
    with running(FakePeer(SECRET, protocol=m.PROTOCOL_VERSION - 1), node.address) as (peer, _):
        peer.script = [peer.txn(1, (Op(OP_PUT, "kv", "from-old-peer", 1),))]
        node.set_peers([peer.address])
        try:
            wait_for(lambda: node.kv_get("kv", "from-old-peer")[0] == 200, 20, "the old peer's row applied")
            assert _upstream(node, peer.address)["status"] == "follow"
        finally:
            node.set_peers([])
    assert f"speaks protocol {m.PROTOCOL_VERSION - 1}, older than this node's {m.PROTOCOL_VERSION}" in node.log_text()
    assert node.info()["versions"]["protocol"] == [m.PROTOCOL_VERSION_MIN, m.PROTOCOL_VERSION]


def test_a_peer_of_the_previous_protocol_version_subscribes_to_a_node(node):
    with running(FakePeer(SECRET), node.address) as (peer, thread):
        peer.protocol = m.PROTOCOL_VERSION - 1          # greets, then subscribes as a version-2 node
        answer = thread.call(peer.request(node.address, m.SUBSCRIBE, vclock={}))
        assert isinstance(answer, m.Message) and answer.type == m.SUBSCRIBED, answer


def test_a_relay_older_than_the_range_is_refused_and_the_node_says_why(node):
    with running(FakePeer(SECRET), node.address) as (peer, _):
        peer.protocol = m.PROTOCOL_VERSION_MIN - 1
        node.set_peers([peer.address])
        try:
            up = wait_for(lambda: (u := _upstream(node, peer.address)).get("status") == "refused" and u, 20,
                          "the applier refuses the old relay")
        finally:
            node.set_peers([])
    why = f"it speaks protocol {m.PROTOCOL_VERSION_MIN - 1}, this node {RANGE}"
    assert why in up["error"], up
    assert why in node.log_text()
    assert peer.subscribes == 0


def test_a_relay_newer_than_the_range_is_refused_and_the_node_says_why(node):
    newer = (m.PROTOCOL_VERSION + 1, m.PROTOCOL_VERSION + 2)
    with running(FakePeer(SECRET), node.address) as (peer, _):
        peer.protocol = newer
        node.set_peers([peer.address])
        try:
            up = wait_for(lambda: (u := _upstream(node, peer.address)).get("status") == "refused" and u, 20,
                          "the applier refuses the newer relay")
        finally:
            node.set_peers([])
    assert f"it speaks protocol {newer[0]}..{newer[1]}, this node {RANGE}" in up["error"], up


def test_an_applier_announcing_a_version_outside_the_range_is_refused_before_auth_and_logged(node):
    with running(FakePeer(SECRET), node.address) as (peer, thread):
        peer.auth_version = m.PROTOCOL_VERSION + 1
        with pytest.raises(PeerRefused) as refused:
            thread.call(peer.request(node.address, m.BYE))
    assert refused.value.code == "version" and RANGE in refused.value.message, refused.value
    wait_for(lambda: f"it speaks protocol {m.PROTOCOL_VERSION + 1}, this node {RANGE}" in node.log_text(), 10,
             "the refusal in the node's log")


def test_a_store_of_a_newer_format_stops_the_node_with_one_line(tmp_path):
    n = ReplogProcess(tmp_path, "old-binary")
    n.start()
    n.stop()
    store = Store(os.path.join(n.data_dir, "store"))
    assert store.get_meta("store_format") == STORE_FORMAT_VERSION
    store.set_meta(store_format=STORE_FORMAT_VERSION + 1)
    store.close()
    out = subprocess.run(n.argv(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out
    err = [ln for ln in out.stderr.splitlines() if ln.startswith("replog: error:")]
    assert len(err) == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"format version {STORE_FORMAT_VERSION + 1}, newer than this replog reads ({STORE_FORMAT_VERSION})" \
        in err[0], err
    admin = subprocess.run(REPLOG + ["admin", "inspect", n.data_dir], capture_output=True, text=True, timeout=60)
    assert admin.returncode == 1 and "newer than this replog reads" in admin.stderr, admin
