"""A lease holder's start-up after it took its slot (node/identity/lease_node.py LeaseIdentity
drives it; the process calls `wait_ready` and then `mark_serving` before it reports "running"):

- Taking over a slot whose holder did not release (crash, pause): the node does not report
  "running" until every listed peer's greeting shows it has seen our version, or
  `peer_wait_until_ms` passes. It probes the peers itself meanwhile (a greeting a peer sends
  is built before it reads ours, so the second handshake with a reachable peer confirms it).
- Then the holder records in the slot that it serves (the slot's `served`, node/identity/lease.py)
  before the node claims an lsn of its member: a data dir last served under an older version
  is stale from then on (node/identity/slot_dir.py), and a holder that never got this far, a
  standby that could not join, makes none stale.

`holder` is a LeaseIdentity (which imports this module)."""
from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from node import limits
from node.applier.handshake import PROBE_ERRORS, probe
from node.identity import lease as core
from node.identity import slot_dir
from node.identity.lease import LeaseLost
from node.identity.lease_store import LeaseStoreUnavailable

log = logging.getLogger("replog.identity.lease")


def peer_addresses(holder: Any) -> list[str]:
    return [p for p in holder.node.cfg.peers if p != holder.node.cfg.address]


def ready(holder: Any) -> bool:
    """May the node report "running"? False after a loss, and while waiting for peers."""
    if holder.lost_reason is not None:
        return False
    if holder.peer_wait_until_ms is None or holder.peer_wait_outcome is not None:
        return True
    return (holder.manager.now_ms() >= holder.peer_wait_until_ms
            or all(p in holder.peers_confirmed for p in peer_addresses(holder)))


async def wait_ready(holder: Any) -> None:
    """Return when ready() holds; raise LeaseLost if the lease is lost meanwhile. Probes the
    peers that have not yet shown our version (a greeting a peer sends is built before it
    reads ours, so the second handshake with a reachable peer confirms it)."""
    node = holder.node
    if holder.peer_wait_until_ms is not None and holder.peer_wait_outcome is None:
        log.info("lease: slot %d was not released by its previous holder; waiting until peers %s have "
                 "seen version %d (at most %.1f s)", holder.slot, ", ".join(peer_addresses(holder)) or "(none)",
                 holder.version, max(0, holder.peer_wait_until_ms - holder.manager.now_ms()) / 1000)
    delay = limits.lease_peer_probe_s_min
    while not ready(holder):
        if holder.lost_reason is not None:
            break
        pending = [p for p in peer_addresses(holder) if p not in holder.peers_confirmed]
        node.status_reason = (f"waiting until peers see lease slot {holder.slot} version {holder.version}: "
                              f"{', '.join(pending)}")
        answered = await asyncio.gather(*(_probe(holder, p) for p in pending))
        if ready(holder):
            break
        delay = limits.lease_peer_probe_s_min if any(answered) else min(delay * 2, limits.lease_peer_probe_s_max)
        remaining_s = (holder.peer_wait_until_ms - holder.manager.now_ms()) / 1000
        holder.peers_changed.clear()
        try:
            async with asyncio.timeout(max(0.0, min(delay, remaining_s))):   # not wait_for (cancels)
                await holder.peers_changed.wait()
        except TimeoutError:
            pass
    if holder.lost_reason is not None:
        raise LeaseLost(holder.slot, holder.lost_reason)
    if holder.peer_wait_until_ms is not None and holder.peer_wait_outcome is None:
        missing = [p for p in peer_addresses(holder) if p not in holder.peers_confirmed]
        holder.peer_wait_outcome = "timed_out" if missing else "confirmed"
        if missing:
            log.warning("lease: peers %s did not confirm slot %d version %d before the wait ended; "
                        "serving anyway (the previous holder's deadline has passed)",
                        ", ".join(missing), holder.slot, holder.version)
        else:
            log.info("lease: every peer has seen slot %d version %d", holder.slot, holder.version)


async def mark_serving(holder: Any) -> None:
    """Record in the slot that this holder serves, before the node claims an lsn of its member
    (a holder that never gets here makes no dir stale: node/identity/slot_dir.py). Retried
    while the store does not answer, until the lease is lost."""
    loop = asyncio.get_running_loop()
    while True:
        if not holder.serving():
            raise LeaseLost(holder.slot, holder.lost_reason or "lost")
        try:
            await loop.run_in_executor(holder.executor, functools.partial(holder.manager.renew, serving=True))
            # the dir's own note of it (slot_dir.last_served): after the slot's, which it may only
            # trail (a crash between them leaves the dir's older: it then waits, never preempts)
            try:
                await loop.run_in_executor(holder.executor, slot_dir.mark_served, holder.node.data_dir,
                                           holder.version)
            except OSError as e:
                log.warning("lease: could not note in %s that it serves slot %d at version %d (%s): a later "
                            "start on it waits for the slot instead of taking it from a holder that has not "
                            "served", holder.node.data_dir, holder.slot, holder.version, e)
            holder.served_recorded = True
            log.info("lease: recorded in slot %d that this node serves it at version %d", holder.slot, holder.version)
            return
        except LeaseStoreUnavailable as e:
            log.warning("lease: recording that slot %s serves failed, retrying: %s", holder.slot, e)
            await asyncio.sleep(core.retry_interval_ms(holder.manager.duration_ms) / 1000)
        except LeaseLost as e:
            holder.lose_now(e.reason)
            raise LeaseLost(holder.slot, e.reason) from None


async def _probe(holder: Any, address: str) -> bool:
    """One handshake with a peer (check_peer records what its greeting shows). True if it answered."""
    node = holder.node
    try:
        await probe(node, node.http_session, address, limits.handshake_timeout_s)
    except PROBE_ERRORS as e:
        log.debug("lease: peer %s not reachable for the version check: %s", address, e)
        return False
    return True
