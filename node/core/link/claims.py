"""Who a node's links are with: the one-link-per-member rule the hosts of the link machines keep
(node/applier/hosts.py, tests/sim/links.py and network.py), in one place so the simulation
runs it too. Pure: the hosts own the dict. (What a peer claims to hold of this node's own rows
is node/core/lifecycle_fence.py's.)

Rules kept here:
- One link per member: the first applier to reach a member keeps it (`followers`: member uuid
  -> its link, anything with `address` and `stopping`); another address of the same member (a
  second spelling, a moved peer) is refused (`duplicate`) while it does, and a new link waits
  for a removed one to the same member to finish closing (ConnectionError: retried)."""
from __future__ import annotations

from typing import Any

from node.errors import PeerRefused


def claim_link(followers: dict[str, Any], peer_uuid: str, link: Any) -> None:
    """`link` (at `link.address`) follows the member `peer_uuid`, or raises."""
    owner = followers.get(peer_uuid)
    if owner is not None and owner is not link:
        if owner.stopping:
            raise ConnectionError(f"the previous link to {peer_uuid} ({owner.address}) is still closing")
        raise PeerRefused("duplicate", f"{link.address} is {peer_uuid}, already followed through {owner.address}")
    followers[peer_uuid] = link


def release_link(followers: dict[str, Any], peer_uuid: str | None, link: Any) -> None:
    """`link` ended: another may follow the member now."""
    if peer_uuid and followers.get(peer_uuid) is link:
        del followers[peer_uuid]

