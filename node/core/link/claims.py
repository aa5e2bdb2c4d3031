"""Who a node's links are with: the one-link-per-member rule the hosts of the link machines keep
(node/applier/hosts.py, tests/sim/links.py and network.py), in one place so the simulation
runs it too. Pure: the hosts own the dict. (What a peer claims to hold of this node's own rows
is node/core/lifecycle_fence.py's.)

Rules kept here:
- One link per member: the first applier to reach a member keeps it (`followers`: member uuid
  -> its link, anything with `address` and `stopping`); another address of the same member (a
  second spelling) is refused (`duplicate`, a lasting reason) while it does, and a new link
  waits for a removed one to the same member to finish closing (ConnectionError: retried).
- A member that moved: the link at the address it now advertises, while the first link still
  holds one it advertised before (`moved_from`: a container that took a lease slot somewhere
  else, a node restarted at a new address; the old link ends once its peer is gone or fenced),
  is not refused but told to come back soon (PeerNotReady), so the member is followed at its
  new address at once, not after a refusal's backoff."""
from __future__ import annotations

from typing import Any, Collection

from node.errors import PeerNotReady, PeerRefused


def claim_link(followers: dict[str, Any], peer_uuid: str, link: Any, moved_from: Collection[str] = ()) -> None:
    """`link` (at `link.address`) follows the member `peer_uuid`, or raises. `moved_from`: the
    addresses the member advertised before the one it advertises now, if that is `link.address`."""
    owner = followers.get(peer_uuid)
    if owner is not None and owner is not link:
        if owner.stopping:
            raise ConnectionError(f"the previous link to {peer_uuid} ({owner.address}) is still closing")
        if owner.address in moved_from:
            raise PeerNotReady(f"{link.address} is {peer_uuid}, which moved here from {owner.address}: "
                               "following it here once the link there ends")
        raise PeerRefused("duplicate", f"{link.address} is {peer_uuid}, already followed through {owner.address}")
    followers[peer_uuid] = link


def release_link(followers: dict[str, Any], peer_uuid: str | None, link: Any) -> None:
    """`link` ended: another may follow the member now."""
    if peer_uuid and followers.get(peer_uuid) is link:
        del followers[peer_uuid]

