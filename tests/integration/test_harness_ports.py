"""The harness's ports (tests/integration/harness.py, bench/common.py PortReservation): a port it
picks for a node is handed by the kernel to no other process until the test ends, the node still
binds it, and a node that cannot have its port fails to start with its own log, never answering
with another process's data. The node's derived binary client port (HTTP + 1000) is held with it,
so no other node takes that one while it is reserved for this node. (A restored node once answered a backup test with another worker's
empty node: "space 'kv' does not exist".)"""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from bench.common import PortReservation, client_port_of
from tests.integration.harness import ReplogProcess, listens_on

_OTHER_PROCESS = """
import json, socket, sys
got = set()
for _ in range(int(sys.argv[1])):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        got.add(s.getsockname()[1])
print(json.dumps(sorted(got)))
"""


def test_a_reserved_port_is_handed_to_no_other_process_that_asks_the_kernel_for_a_free_port():
    held = [PortReservation() for _ in range(40)]
    try:
        ports = {r.port for r in held} | {r.client_port for r in held}
        out = subprocess.run([sys.executable, "-c", _OTHER_PROCESS, "4000"], capture_output=True, text=True,
                             timeout=60, check=True)
        theirs = set(json.loads(out.stdout))
        # 4,000 draws over the kernel's ~14,000 bind ports would meet 40 unreserved ones ~11 times
        assert len(theirs) > 1000, "the other process was handed ports"
        assert not ports & theirs, f"reserved ports handed to another process: {sorted(ports & theirs)}"
    finally:
        for r in held:
            r.close()


def test_a_node_binds_and_serves_on_the_port_reserved_for_it(tmp_path, procs):
    n = ReplogProcess(tmp_path, "n")
    procs.append(n)
    assert n.reservation is not None and n.reservation.port == n.port
    n.start()
    assert listens_on(n.proc.pid, n.port) is True
    with socket.socket() as s, pytest.raises(OSError):
        s.bind(("127.0.0.1", n.port))


def test_a_node_whose_port_another_node_holds_fails_to_start_and_the_harness_never_takes_the_other_answer(
        tmp_path, procs):
    other = ReplogProcess(tmp_path, "other")
    procs.append(other)
    other.start()
    late = ReplogProcess(tmp_path, "late", port=other.port)
    procs.append(late)
    with pytest.raises(AssertionError, match="cannot listen"):
        late.start()
    assert other.get("/v1/health")[0] == 200, "the other node answers on that port all along"


def test_a_nodes_reservation_holds_its_derived_client_port_and_the_node_listens_on_both(tmp_path, procs):
    n = ReplogProcess(tmp_path, "n")
    procs.append(n)
    assert n.reservation.client_port == client_port_of(n.port) != n.port
    with socket.socket() as s, pytest.raises(OSError):
        s.bind(("127.0.0.1", n.reservation.client_port))      # held before the node starts
    n.start()
    s_, client = n.get("/v1/client")
    assert s_ == 200 and client["port"] == n.reservation.client_port, client
    assert listens_on(n.proc.pid, n.reservation.client_port) is True


def test_a_reservation_for_something_other_than_a_node_holds_its_one_port_only():
    r = PortReservation(client_port=False)
    try:
        assert r.client_port is None
        with socket.socket() as s, pytest.raises(OSError):
            s.bind(("127.0.0.1", r.port))
    finally:
        r.close()


def test_client_port_of_follows_the_nodes_rule_at_the_top_of_the_port_range():
    assert client_port_of(40000) == 41000
    assert client_port_of(64535) == 65535
    assert client_port_of(64536) == 63536
