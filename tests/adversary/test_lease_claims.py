"""A peer that holds the cluster secret but lies about leases: "I have seen your slot at version
2^62". A lease node acts only on versions it reads from the lease store, so the claim fences
nobody and never reaches the store; a real newer holder in the store still fences the stale one
(tests/integration/test_lease_cluster.py: the replacement container)."""
from __future__ import annotations

import asyncio
import json

from tests.adversary.attacker import greet
from tests.integration.harness import ReplogProcess, wait_for

LIAR = "11a70000-0000-4000-8000-000000000001"


def test_a_fake_lease_claim_changes_nothing_on_a_real_lease_node(tmp_path, procs):
    secret = tmp_path / "secret"
    secret.write_bytes(b"lease-claims-secret\n")
    store = tmp_path / "leases"
    node = ReplogProcess(tmp_path, "n", extra=["--secret-file", str(secret), "--identity", "lease", "--lease-store",
                                               f"file://{store}", "--cluster-size", "2",
                                               "--lease-duration-s", "3"]).start()
    procs.append(node)
    lease = node.info()["lease"]
    slot = lease["slot"]
    claim = {"slot": 1 - slot, "version": 2 ** 62, "seen": {str(slot): 2 ** 62, str(1 - slot): 2 ** 62}}

    theirs = asyncio.run(greet(node.address, b"lease-claims-secret", LIAR, address="127.0.0.1:9",
                               options={"identity": "lease", "cluster_size": 2}, lease=claim))
    assert theirs["lease"]["slot"] == slot
    # The claim asked for a re-read of the store; then a renewal writes what the node knows.
    wait_for(lambda: node.info()["lease"]["verifications"] >= 1, 10, "the store re-read")
    renewals = node.info()["lease"]["renewals"]
    wait_for(lambda: node.info()["lease"]["renewals"] > renewals, 10, "a renewal after the claim")
    info = node.info()
    assert info["status"] == "running" and info["lease"]["state"] == "held", info["lease"]
    assert info["lease"]["version"] == lease["version"]
    assert all(v < 2 ** 62 for v in info["lease"]["seen"].values()), info["lease"]["seen"]
    for f in store.glob("*.json"):
        doc = json.loads(f.read_text())
        assert all(v < 2 ** 62 for v in doc["known_versions"].values()), (f.name, doc)
    assert node.proc.poll() is None and node.get("/v1/health")[0] == 200
