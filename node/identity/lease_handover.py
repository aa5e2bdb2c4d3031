"""An orderly stop of a lease node hands its rows over before the slot goes.

Why: a lease node's disk is meant to be ephemeral, and a released slot is taken at once by the
next container (a warm standby, a rolling deploy's new task), which starts from a peer's
snapshot. A row this node acknowledged and no peer has taken yet would be on the stopping
container's disk only: gone with it, or, on a persistent volume, moved aside as stale once the
next holder writes (node/identity/slot_dir.py). So before the links close and the slot is
released, the node stops taking writes (status `handing_over`: 503, writes and registrations
refused, replication going on, links from peers still accepted) and waits until a member peer
has acknowledged every row of this member it holds, for at most `limits.lease_handover_s`.
One peer is enough: the others take the rows from it, and a new holder of the slot takes them
back from whichever peer holds them before it writes (its own rows' fence).

Not done after a loss (the rows of a node that may no longer serve must not go), nor for a node
that is not running (starting up, quiesced for a cluster shutdown that already agreed on one
vclock), nor without peers."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from node import limits

if TYPE_CHECKING:
    from node.process.ports import HandoverHost

log = logging.getLogger("replog.identity.lease")


def _holders(node: "HandoverHost", own_id: int, lsn: int) -> list:
    """The member peers subscribed here that acknowledged this member's rows up to `lsn`."""
    return [r for r in node.relays if not r.anon and r.acked.get(own_id, 0) >= lsn]


async def hand_over(node: "HandoverHost") -> None:
    """Wait (bounded) until a member peer holds every row of this member this node holds."""
    lease, core = node.lease, node.core
    peers = [p for p in node.cfg.peers if p != node.cfg.address]
    if lease is None or core is None or core.anon or not peers or node.status != "running" or not lease.serving():
        return
    own_id = core.self_id
    node.status = "handing_over"
    node.status_reason = (f"stopping: waiting until a peer holds this node's rows before releasing lease slot "
                          f"{lease.slot}")
    began = time.monotonic()
    deadline = began + limits.lease_handover_s
    log.info("lease: handing over before releasing slot %s: waiting (at most %.0f s) until a peer holds this "
             "node's rows up to lsn %d", lease.slot, limits.lease_handover_s, core.vclock.get(own_id))
    while True:
        lsn = core.vclock.get(own_id)
        in_flight = core.claimed.get(own_id) > lsn      # claimed before the stop, still being written
        holders = [] if in_flight else _holders(node, own_id, lsn)
        if holders:
            log.info("lease: this node's rows up to lsn %d are held by %s (%.2f s); releasing slot %s", lsn,
                     ", ".join(sorted(r.address or r.uuid for r in holders)), time.monotonic() - began, lease.slot)
            return
        if not lease.serving():
            return          # lost meanwhile: nothing more goes out
        if time.monotonic() >= deadline:
            best = max((r.acked.get(own_id, 0) for r in node.relays if not r.anon), default=None)
            log.warning("lease: no peer took this node's rows up to lsn %d within %.0f s (%s): rows %d..%d are "
                        "on this node's disk only, and are lost with it if the next holder of slot %s starts "
                        "elsewhere", lsn, limits.lease_handover_s,
                        "no peer subscribed" if best is None else f"the most a peer acknowledged is lsn {best}",
                        (best or 0) + 1, lsn, lease.slot)
            return
        await asyncio.sleep(limits.lease_handover_poll_s)
