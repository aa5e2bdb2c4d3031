"""A member that moves: a container takes a paused holder's lease slot at another address,
while the other members' links to the old address are still open (a paused process keeps its
sockets; they end when the peers fence it or hear nothing for `peer_timeout_s`).

The members list the new container's address already (a platform's service addresses). Their
applier there hears the member's uuid while the old link still holds it; it was refused as a
second address of a member already followed (`duplicate`, ERROR, retried only after the 10 s
backoff of a lasting refusal), so the members did not follow the new holder for ten seconds
and more. Found by the lease nemesis. Now it is told to come back soon (node/core/link/
claims.py) and follows the member at its new address as soon as the old link ends."""
from __future__ import annotations

import signal
import subprocess

from tests.integration.harness import ReplogProcess, wait_for
from tests.integration.test_lease_cluster import lease_flags, running_lease_cluster

DURATION_S = 2.0


def following(node: ReplogProcess, address: str) -> bool:
    return any(u["address"] == address and u["status"] == "follow" for u in node.info()["upstreams"])


def test_members_follow_a_member_at_its_new_address_as_soon_as_the_link_to_its_paused_holder_ends(tmp_path, procs):
    nodes = running_lease_cluster(tmp_path, procs, 3, duration_s=DURATION_S)
    paused, others = nodes[2], nodes[:2]
    watched = others[0]
    uuid = paused.uuid()
    # The fresh container does not list `watched`: no handshake of its own (a probe while it
    # waits for its peers) tells `watched` of the new version before `watched`'s applier dials
    # it, as the nemesis's container listing another address than the new one's did.
    fresh = ReplogProcess(tmp_path, "fresh", peers=[others[1], paused],
                          extra=lease_flags(f"file://{tmp_path}/leases", 3, DURATION_S))
    procs.append(fresh)
    for n in others:                        # the platform's addresses, the new one among them
        n.set_peers([o for o in nodes if o is not n] + [fresh])
    wait_for(lambda: all(following(n, paused.address) for n in others), 30, "the members following the holder")

    paused.proc.send_signal(signal.SIGSTOP)   # its lease runs out; its sockets stay open
    try:
        fresh.start(wait=False)
        fresh.wait_healthy(60)
        assert fresh.uuid() == uuid, "the fresh container did not take the paused holder's slot"
        try:
            wait_for(lambda: all(following(n, fresh.address) for n in others), 60,
                     "the members following the member at its new address")
        except AssertionError as e:
            raise AssertionError(f"{e}; upstreams: " + "; ".join(
                f"{n.name}: {[(u['address'], u['status'], u.get('error')) for u in n.info()['upstreams']]}"
                for n in others)) from None
    finally:
        paused.proc.send_signal(signal.SIGCONT)
    for n in others:
        log = n.log_text()
        assert "refused: duplicate" not in log, next(line for line in log.splitlines() if "duplicate" in line)
    # the race the test is about happened: a link there heard the member while the old one held it
    assert f"moved here from {paused.address}" in watched.log_text(), \
        "the link to the new address did not hear the member while the old link was open: the test showed nothing"
    fresh.kv_put("kv", "at-the-new-address", {"v": 1})
    wait_for(lambda: all(n.kv_get("kv", "at-the-new-address")[0] == 200 for n in others), 20,
             "the new holder's write on every member")
    try:
        assert paused.proc.wait(30) == 1, "the paused holder did not stop on its lost lease"
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the paused holder still runs 30 s after it went on:\n{paused.log_tail(30)}") from None
