"""The numbers a replication message carries (node/core/messages.py) are protocol: a peer of the
previous release sends and reads them, so they never change meaning. Each message written byte
by byte as such a peer sends it (its type spelled as a literal) decodes as the message it names,
and this node encodes that message to the same bytes; the protocol versions spoken are the ones
docs/upgrade.md promises (2..3)."""
import msgpack
import pytest

from node.core import messages as m
from node.core import session as sess
from node.errors import RemoteProtocolError

UUID = "0000000a-0000-4000-8000-00000000000b"
VCLOCK = {1: 5}
CLUSTER = [[UUID, 1, "127.0.0.1:7301", "member"]]

# (type as the wire spells it, name, a body its schema accepts)
GOLDEN = [
    (1, "HELLO", {"version": 2, "versions": [2, 3], "nonce": b"n" * 16, "uuid": UUID}),
    (2, "AUTH", {"nonce": b"n" * 16, "uuid": UUID, "mac": b"m" * 32, "version": 3}),
    (3, "AUTH_OK", {"mac": b"m" * 32}),
    (4, "GREETING", {"uuid": UUID, "cluster_uuid": None, "cluster_name": "c", "options_digest": "d",
                     "anon": False, "address": "127.0.0.1:7301", "cluster": CLUSTER, "status": "running"}),
    (5, "ERROR", {"code": "register_rejected", "message": "why"}),
    (10, "JOIN", {}),
    (11, "FETCH_SNAPSHOT", {}),
    (12, "SUBSCRIBE", {"vclock": VCLOCK, "durable": VCLOCK, "own_rows": True}),
    (13, "REGISTER", {}),
    (14, "BYE", {}),
    (15, "SHUTDOWN", {"phase": "quiesce", "shutdown_id": UUID}),
    (20, "SNAPSHOT", {"vclock": VCLOCK, "cluster": CLUSTER, "spaces": {}}),
    (21, "SNAPSHOT_ROWS", {"space": "s", "rows": []}),
    (22, "SNAPSHOT_END", {}),
    (23, "SUBSCRIBED", {"vclock": VCLOCK}),
    (24, "REGISTERED", {"id": 2}),
    (25, "SHUTDOWN_OK", {"status": "ok"}),
    (31, "ACK", {"vclock": VCLOCK, "durable": VCLOCK}),
    (32, "HEARTBEAT", {"now_us": 7}),
]


def test_every_message_type_of_the_protocol_is_in_the_golden_list():
    assert sorted(name for _, name, _ in GOLDEN) == sorted(n for n in m.NAMES.values() if n != "ROWS")
    assert sorted(m.SCHEMA) == sorted(m.NAMES)


@pytest.mark.parametrize("number, name, body", GOLDEN, ids=[g[1] for g in GOLDEN])
def test_a_message_as_a_peer_of_the_last_release_sends_it_decodes_as_the_message_it_names(number, name, body):
    wire = msgpack.packb([number, body], use_bin_type=True)
    msg = m.decode(wire)
    assert (msg.type, msg.name) == (number, name)
    assert msg.body == body
    assert m.encode(getattr(m, name), **body) == wire


def test_a_rows_message_is_type_30_with_its_frames_spliced_in():
    frame = msgpack.packb([7, [[1, 1, 0, 5, [[1, "s", "k", "v"]]]]], use_bin_type=True)
    wire = msgpack.packb([30, {"frames": [msgpack.unpackb(frame)]}], use_bin_type=True)
    assert m.encode_rows([frame]) == wire
    msg = m.decode(wire)
    assert (msg.type, msg.name) == (30, "ROWS")
    assert [(t.replica_id, t.lsn) for t in msg["txns"]] == [(1, 1)]
    assert msg["error"] is None


def test_a_type_no_release_used_is_refused_naming_it():
    for number in (0, 6, 16, 26, 29, 33):
        with pytest.raises(RemoteProtocolError, match=f"unknown message type {number}"):
            m.decode(msgpack.packb([number, {}]))


def _hello(version: int, versions: list | None = None) -> bytes:
    """A relay's HELLO as the wire spells it (type 1)."""
    body = {"version": version, "nonce": b"n" * 16, "uuid": UUID}
    if versions is not None:
        body["versions"] = versions
    return msgpack.packb([1, body], use_bin_type=True)


@pytest.mark.parametrize("wire, outcome", [
    (_hello(3, [3, 3]), 3), (_hello(2), 2), (_hello(2, [2, 3]), 3), (_hello(3, [3, 4]), 3),
    (_hello(1), "it speaks protocol 1, this node 2..3"), (_hello(4, [4, 5]), "it speaks protocol 4..5, this node 2..3"),
])
def test_this_release_speaks_protocol_2_and_3_as_docs_upgrade_promises(wire, outcome):
    hello = m.decode(wire)
    ours = (m.PROTOCOL_VERSION_MIN, m.PROTOCOL_VERSION)
    assert sess.negotiate(ours, hello["version"], hello.get("versions")) == outcome


def test_a_relay_of_this_release_accepts_an_auth_of_version_2_or_3_only():
    ours = (m.PROTOCOL_VERSION_MIN, m.PROTOCOL_VERSION)
    for version in range(6):
        auth = m.decode(msgpack.packb([2, {"nonce": b"n" * 16, "uuid": UUID, "mac": b"m" * 32, "version": version}]))
        assert (sess.accepted(ours, auth["version"]) is None) == (version in (2, 3))
