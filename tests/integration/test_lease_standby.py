"""A standby that took a slot and never served leaves the slot's data dir current (the slot's
`served`, node/identity/lease.py), on real `replog serve` processes.

Found by the lease nemesis (tests/integration/lease_nemesis.py): the only container holding
the cluster's latest rows stopped; a fresh one took its slot, stalled before it could join,
and lost the slot; the first container came back on its own dir and found it "stale" (another
node had held the slot since), moved it aside and started empty: every row only it held was
gone, though the holder in between had written none of that member's rows."""
from __future__ import annotations

import os

from tests.integration.harness import ReplogProcess, silent_address, wait_for
from tests.integration.oracles import Acked, acked_everywhere
from tests.integration.test_lease_cluster import lease_flags, running_lease_cluster


def health(n: ReplogProcess) -> int | None:
    try:
        return n.get("/v1/health")[0]
    except OSError:
        return None


def owner_gone_with_rows_only_it_has(tmp_path, procs):
    """Three lease nodes; the owner of one slot, cut off, takes ten writes and is killed (no
    hand-over: its slot is left to expire). Returns (nodes, owner, slot, uuid, acked)."""
    nodes = running_lease_cluster(tmp_path, procs, 3, duration_s=2)
    owner, others = nodes[0], nodes[1:]
    slot, uuid = owner.info()["lease"]["slot"], owner.uuid()
    for n in others:                             # cut off: what the owner takes now is on its disk only
        n.set_peers([o for o in others if o is not n])
    owner.set_peers([])
    acked = Acked()
    for i in range(10):
        acked.put(owner, "kv", f"only-here-{i}", {"i": i})
    owner.kill9()
    return nodes, owner, slot, uuid, acked


def start_standby(tmp_path, procs, nowhere: str, slot: int, uuid: str) -> ReplogProcess:
    """A fresh container with no peer to join from: it takes the owner's expired slot and waits."""
    standby = ReplogProcess(tmp_path, "standby", peers=[nowhere],
                            extra=lease_flags(f"file://{tmp_path}/leases", 3, 2))
    procs.append(standby)
    standby.start(wait=False)
    wait_for(lambda: f"serving as member {uuid} of slot {slot}" in standby.log_text(), 30,
             "the standby taking the owner's slot")
    wait_for(lambda: health(standby) is not None, 30, "the standby listening")
    assert health(standby) == 503, "the standby served without a peer to join from"
    return standby


def owner_back(nodes, owner, slot, uuid, acked) -> None:
    """The owner starts on its own dir, as the same member, keeps it, and every node ends with
    every acknowledged write."""
    others = nodes[1:]
    owner.peers = [o.address for o in others]
    owner.start(wait=False)
    owner.wait_healthy(60)
    info = owner.info()["lease"]
    assert (info["slot"], info["member_uuid"]) == (slot, uuid), info
    assert not [d for d in os.listdir(owner.data_dir) if ".stale-" in d], \
        f"the owner's data dir was moved aside:\n{owner.log_tail(30)}"
    for n in others:
        n.set_peers([o for o in nodes if o is not n])
    acked_everywhere(nodes, acked, 30)


def test_a_standby_that_never_served_does_not_make_the_slot_dir_it_held_stale(tmp_path, procs):
    nodes, owner, slot, uuid, acked = owner_gone_with_rows_only_it_has(tmp_path, procs)
    with silent_address() as nowhere:
        start_standby(tmp_path, procs, nowhere, slot, uuid).kill9()
    owner_back(nodes, owner, slot, uuid, acked)


def test_the_owner_takes_its_slot_from_a_standby_that_cannot_join_and_that_standby_stops(tmp_path, procs):
    """The standby stays up, renewing, unable to join: the owner, back on its own dir, used to
    wait for the slot to expire, which it never did (a cluster restarted at once stalled like
    this, each stuck container waiting on the other). Now it takes the slot over at once
    (node/identity/lease.py preemptable), and the standby finds it lost and exits 1."""
    nodes, owner, slot, uuid, acked = owner_gone_with_rows_only_it_has(tmp_path, procs)
    with silent_address() as nowhere:
        standby = start_standby(tmp_path, procs, nowhere, slot, uuid)
        owner_back(nodes, owner, slot, uuid, acked)
        assert standby.proc.wait(30) == 1, standby.log_tail(20)
    assert "has not served it; this node's data is the member's" in owner.log_text(), owner.log_tail(30)
    assert f"lease slot {slot} lost: the slot is held by" in standby.log_text(), standby.log_tail(20)


def test_a_new_holder_writes_nothing_as_the_member_before_it_has_recorded_that_it_serves(tmp_path, procs):
    """A fresh container takes a killed owner's slot, joins, and waits up to a lease duration for
    the peers to see its version (the owner's address never answers). Its own-rows fence lifted
    meanwhile, and the lift's `_cluster` transaction went out under the member's id while the
    slot still said the owner's dir served last: the owner, back on that dir, took the slot from
    a holder that "had not served", and its next rows took the lsns that transaction had used (a
    fork, found by the lease nemesis). Now the fence lifts only after the holder's record."""
    nodes = running_lease_cluster(tmp_path, procs, 3, duration_s=2)
    owner, others = nodes[0], nodes[1:]
    owner.kv_put("kv", "k", {"v": 1})
    for n in others:
        wait_for(lambda: n.kv_get("kv", "k")[0] == 200, 20, f"the row on {n.name}")
    owner.kill9()
    fresh = ReplogProcess(tmp_path, "fresh", peers=[n.address for n in nodes],
                          extra=lease_flags(f"file://{tmp_path}/leases", 3, 2))
    procs.append(fresh)
    fresh.start(wait=False)
    fresh.wait_healthy(60)
    log = fresh.log_text()
    recorded, lifted = log.find("that this node serves it at version"), log.find("own rows are back")
    assert recorded != -1 and lifted != -1, fresh.log_tail(30)
    assert recorded < lifted, "the fence lifted (a row under the member's id) before the slot said this node " \
                              "serves:\n" + fresh.log_tail(30)


def test_the_owner_killed_again_before_it_served_still_takes_its_slot_from_a_standby(tmp_path, procs):
    """The owner comes back, takes its slot again (version 2) and is killed while it waits for
    its peers, before the slot records that it serves: it wrote no row under version 2. Its dir
    took the slot last at 2 but served last at 1, the slot's `served`. A standby then takes the
    slot and cannot join. The owner, back once more, takes the slot from it: the dir's
    `served_version` stamp (node/identity/slot_dir.py) says it served last. Judged by the version
    it last took the slot at, it waited for a lease the standby renewed forever."""
    nodes, owner, slot, uuid, acked = owner_gone_with_rows_only_it_has(tmp_path, procs)
    with silent_address() as nowhere:
        owner.peers = [nowhere]                  # its wait for its peers lasts the whole lease duration
        owner.start(wait=False)
        wait_for(lambda: f"of slot {slot} at version 2" in owner.log_text(), 30, "the owner taking its slot again")
        owner.kill9()
        assert "that this node serves it at version 2" not in owner.log_text(), owner.log_tail(20)
        standby = start_standby(tmp_path, procs, nowhere, slot, uuid)
        owner_back(nodes, owner, slot, uuid, acked)
        assert standby.proc.wait(30) == 1, standby.log_tail(20)
    assert "has not served it; this node's data is the member's" in owner.log_text(), owner.log_tail(30)
