"""Who a node's links are with, and what its peers say they hold of its own rows: the rules
the hosts of the link machines keep (node/applier/applier.py, node/process/peering.py), in one
place so that the simulation (tests/sim) runs them too. Pure: the hosts own the dicts.

Rules kept here:
- One link per member: the first applier to reach a member keeps it (`followers`: member uuid
  -> its link, anything with `address` and `stopping`); another address of the same member (a
  second spelling, a moved peer) is refused (`duplicate`) while it does, and a new link waits
  for a removed one to the same member to finish closing (ConnectionError: retried).
- A peer saying it holds more of this node's own rows than this node does holds its writes
  (own_rows_awaited) while that peer is one of its upstreams: those rows come back by
  SUBSCRIBE, and no lsn of ours is used twice. A claim an upstream disproved (it streamed
  without those rows) is not believed again while this node runs.
- Claims and disproved peers are bounded by members_max: a peer inventing uuids cannot grow
  them. `own_claims`: peer uuid -> (lsn of our own component it says it holds, its address)."""
from __future__ import annotations

from typing import Any

from node import limits
from node.errors import PeerRefused

Claims = dict[str, tuple[int, str]]


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


def note_claim(own_claims: Claims, disproved: set[str], theirs: dict, self_uuid: str) -> None:
    """A peer's greeting: how many of our own rows it says it holds (a replacement container,
    a rejoin, or a lost unsynced tail: they come back by SUBSCRIBE, and writes wait for them)."""
    vu = theirs.get("vclock_uuid")
    own = vu.get(self_uuid) if isinstance(vu, dict) else None
    uuid = theirs["uuid"]
    if uuid in disproved:
        return
    if isinstance(own, int) and own > own_claims.get(uuid, (0, ""))[0] \
            and (uuid in own_claims or len(own_claims) < limits.members_max):
        own_claims[uuid] = (own, theirs["address"])


def own_claim(own_claims: Claims, peer_uuid: str) -> int:
    """How far the peer said it holds our own rows (0: no claim)."""
    return own_claims.get(peer_uuid, (0, ""))[0]


def disprove_claim(own_claims: Claims, disproved: set[str], fence: Any, uuid: str, have: int) -> int:
    """An upstream caught us up without the rows of ours it said it holds: its word neither
    holds writes nor raises the own-rows fence's target (`fence.heard`). Returns the claim."""
    claim = max(own_claims.pop(uuid, (0, ""))[0], fence.heard.get(uuid, 0) if fence is not None else 0)
    if len(disproved) < limits.members_max:
        disproved.add(uuid)
    if fence is not None:
        fence.heard[uuid] = min(fence.heard.get(uuid, have), have)
    return claim


def own_rows_awaited(own_claims: Claims, have: int, upstreams: set[str]) -> tuple[int, str] | None:
    """(lsn, peer) of our own rows that one of our upstreams (`upstreams`: their uuids or
    addresses) says it holds past `have` (what we claimed). Only an upstream can send them
    back, so only an upstream's claim is believed, and only while it is one; claims that came
    back are forgotten."""
    best: tuple[int, str] | None = None
    for uuid, (lsn, address) in list(own_claims.items()):
        if lsn <= have:
            del own_claims[uuid]
        elif (uuid in upstreams or address in upstreams) and (best is None or lsn > best[0]):
            best = (lsn, f"{address} ({uuid[:8]})")
    return best
