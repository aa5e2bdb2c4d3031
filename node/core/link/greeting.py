"""The greeting check both sides of a link run: lasting reasons to refuse a peer.

Rules kept here:
- The greeting's uuid is the one the handshake proof covered, or the peer is lying: a
  RemoteProtocolError (retried). Everything else here is a lasting reason: PeerRefused.
- A must-match option that differs is named with the refuser's value (Lifecycle.check_must_match
  lets the node that starts with the other value stop naming both).
- A peer with this node's uuid is this node itself (`self`), unless both greetings carry lease
  versions and they differ: then it is another holder of the member's slot, and one of the two is
  stale (`lease_fenced`, which node/applier/outcome.py retries as a transient refusal); and unless
  both greetings carry runs and they differ: another process with this uuid (`twin`,
  node/core/link/twins.py)."""
from __future__ import annotations

from typing import Any

from node.core.link import twins
from node.errors import PeerRefused, RemoteProtocolError
from node.identity.signature import first_mismatch


def check_greeting(mine: dict, theirs: dict, peer: str, authenticated: str | None = None) -> None:
    """Lasting reasons to refuse a peer, from either side's point of view. `authenticated`:
    the uuid the peer's handshake proof covered (conn.session.peer_uuid)."""
    if authenticated is not None and theirs["uuid"] != authenticated:
        raise RemoteProtocolError(f"{peer}: greeting names uuid {theirs['uuid']!r:.80}, its handshake {authenticated!r}")
    if theirs["uuid"] == mine["uuid"]:
        ours, others = mine.get("lease"), theirs.get("lease")
        if isinstance(ours, dict) and isinstance(others, dict) and others.get("version") != ours.get("version"):
            # Two processes of one member under different lease versions: the older holder is stale
            # and stops within a lease duration, and its address may serve another member next.
            raise PeerRefused("lease_fenced", f"{peer} is another process of this node's member (uuid {mine['uuid']}) "
                              f"under lease version {others.get('version')!r:.20}, this node under "
                              f"{ours.get('version')!r:.20}: the older is a stale holder and must stop")
        run, other = twins.run_of(theirs), twins.run_of(mine)
        if run is not None and other is not None and run != other:
            raise twins.refusal(mine["uuid"], peer, run, other, "this node", met=True)
        raise PeerRefused("self", f"{peer} is this node itself (uuid {mine['uuid']})")
    if mine["cluster_uuid"] and theirs["cluster_uuid"] and mine["cluster_uuid"] != theirs["cluster_uuid"]:
        raise PeerRefused("wrong_cluster", f"{peer} belongs to cluster {theirs['cluster_uuid']}, "
                          f"this node to {mine['cluster_uuid']} (wrong store)")
    if mine["cluster_name"] != theirs["cluster_name"]:
        raise _must_match("cluster_name", mine["cluster_name"], f"{peer} has cluster_name {theirs['cluster_name']!r}, "
                          f"this node {mine['cluster_name']!r}")
    if mine["options_digest"] != theirs["options_digest"]:
        ours, others = mine.get("options"), theirs.get("options")
        # an option is named only when both sides sent their options: read against an absent
        # map, every option would seem to differ and the first named (cluster_name) be blamed
        both = isinstance(ours, dict) and isinstance(others, dict) and bool(ours) and bool(others)
        name = first_mismatch(ours, others) if both else None
        if name is None:
            raise PeerRefused("options", f"{peer} has different must-match options (digest "
                              f"{theirs['options_digest']}, this node {mine['options_digest']})")
        raise _must_match(name, ours.get(name), f"{peer} has different must-match options: {name} is "
                          f"{others.get(name)!r} there, {ours.get(name)!r} here")


def _must_match(option: str, value: Any, message: str) -> PeerRefused:
    """A must-match option differs: the refusal says which and the refuser's value, so that the
    node that starts with the other value can stop naming both (Lifecycle.check_must_match)."""
    e = PeerRefused("cluster_name" if option == "cluster_name" else "options", message)
    e.body = {"option": option, "value": value}
    return e
