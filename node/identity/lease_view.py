"""What a lease holder (node/identity/lease_node.py LeaseIdentity) shows, and what it reads of
its peers' leases: the "lease" field of a peer's greeting, the "lease" section of /v1/info,
and the lease metrics of /metrics.

Rules kept here:
- A peer's lease field is checked whole before any of it is believed: slot and version ints
  in range, `seen` a map of at most cluster_size_max slots; anything else is the peer's
  protocol error (RemoteProtocolError), never ours.
- Views read the holder's state (`holder`: a LeaseIdentity, which imports this module) and
  change nothing."""
from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from node import limits
from node.errors import RemoteProtocolError


def state(holder: Any) -> str:
    """acquiring, waiting_for_peers, held, lost or released."""
    if holder.lost_reason is not None:
        return "lost"
    if holder.released:
        return "released"
    if holder.slot is None:
        return "acquiring"
    if not holder.ready():
        return "waiting_for_peers"
    return "held"


def parse_greeting_lease(theirs: dict) -> tuple[int, int, dict[int, int]]:
    """(slot, version, seen) from a peer greeting's "lease" field; a malformed field is the
    peer's protocol error."""
    peer = f"{theirs.get('address')} ({str(theirs.get('uuid'))[:8]})"
    f = theirs.get("lease")
    if not isinstance(f, dict):
        raise RemoteProtocolError(f"{peer}: greeting has no lease field although identity = lease")
    slot, version, seen = f.get("slot"), f.get("version"), f.get("seen", {})
    if any(type(x) is not int for x in (slot, version)) or not (0 <= slot < limits.lease_cluster_size_max) or version < 0:
        raise RemoteProtocolError(f"{peer}: greeting's lease slot/version are not valid: {f!r:.200}")
    if not isinstance(seen, dict) or len(seen) > limits.lease_cluster_size_max:
        raise RemoteProtocolError(f"{peer}: greeting's lease 'seen' is not a map of at most "
                                  f"{limits.lease_cluster_size_max} slots")
    out: dict[int, int] = {}
    for k, v in seen.items():
        try:
            s = int(k)
        except (TypeError, ValueError):
            raise RemoteProtocolError(f"{peer}: greeting's lease 'seen' has a bad slot {k!r:.50}") from None
        if type(v) is not int or v < 0 or not (0 <= s < limits.lease_cluster_size_max):
            raise RemoteProtocolError(f"{peer}: greeting's lease 'seen' has a bad entry {k!r:.50}: {v!r:.50}")
        out[s] = v
    return slot, version, out


def info(holder: Any) -> dict:
    mgr = holder.manager
    lease = mgr.lease if mgr else None
    now = mgr.now_ms() if mgr else 0
    expires_ms = lease.expires_ms if lease else None
    return {
        "state": state(holder),
        "slot": holder.slot,
        "version": holder.version,
        "member_uuid": holder.member_uuid,
        "task_id": holder.task_id,
        "store": holder.store.url if holder.store else holder.node.cfg.lease_store,
        "cluster_size": holder.node.cfg.cluster_size,
        "duration_s": mgr.duration_ms / 1000 if mgr else holder.node.cfg.lease_duration_s,
        "expires_ms": expires_ms,
        "expires_in_s": round((expires_ms - now) / 1000, 3) if expires_ms else None,
        "renew_deadline_ms": mgr.renew_deadline_ms if mgr else None,
        "renewals": mgr.renewals if mgr else 0,
        "renew_failures": mgr.renew_failures if mgr else 0,
        "fenced": holder.fenced,
        "verifications": holder.verifications,
        "seen": {str(k): v for k, v in sorted(holder.seen.items())},
        "lost_reason": holder.lost_reason,
        "peer_wait": None if holder.peer_wait_until_ms is None else {
            "until_ms": holder.peer_wait_until_ms, "outcome": holder.peer_wait_outcome,
            "confirmed": sorted(holder.peers_confirmed)},
    }

def metrics(holder: Any) -> list:
    mgr = holder.manager
    lease = mgr.lease if mgr else None
    labels = [str(holder.slot) if holder.slot is not None else ""]
    renewals = CounterMetricFamily("replog_lease_renewals", "Successful lease renewals", labels=["slot"])
    renewals.add_metric(labels, mgr.renewals if mgr else 0)
    failures = CounterMetricFamily("replog_lease_renew_failures",
                                   "Lease renewals that failed (store unavailable, or the lease lost)",
                                   labels=["slot"])
    failures.add_metric(labels, mgr.renew_failures if mgr else 0)
    fenced = CounterMetricFamily("replog_lease_fenced",
                                 "Handshakes refused because the peer's lease version was stale")
    fenced.add_metric([], holder.fenced)
    held = GaugeMetricFamily("replog_lease_held", "1 while this node holds its lease slot", labels=["slot"])
    held.add_metric(labels, 1 if lease is not None and holder.lost_reason is None else 0)
    version = GaugeMetricFamily("replog_lease_version", "Version of the held lease slot", labels=["slot"])
    version.add_metric(labels, holder.version or 0)
    expiry = GaugeMetricFamily("replog_lease_expires_in_seconds",
                               "Seconds until the held lease expires unless renewed", labels=["slot"])
    expiry.add_metric(labels, (lease.expires_ms - mgr.now_ms()) / 1000 if lease else 0)
    return [renewals, failures, fenced, held, version, expiry]
