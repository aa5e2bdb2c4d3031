"""The link machines' hosts over a running node: what node/core/link/applier.py's
ApplierContext and node/core/link/relay.py's RelayContext ask of the rest of the node,
answered from the process's ports (node/process/ports.py). The simulation answers the same
questions over its fakes (tests/sim/links.py ApplierHost, RelayHost).

Rules kept here:
- Synchronous and in-memory, as the machines require: no await, no IO (a machine steps, checks
  and claims in one call).
- One link per member (node/core/link/claims.py): an applier's link is claimed in the node's
  `followers` when the machine names its peer, and released when the link ends."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from node.core.lifecycle_fence import claim_of
from node.core.link import claims

if TYPE_CHECKING:
    from node.process.ports import ApplierHost, RelayHost

__all__ = ["NodeApplierContext", "NodeRelayContext"]


class NodeApplierContext:
    """ApplierContext for one applier `link` (anything with `address`, `stopping` and
    `peer_uuid`: node/applier/applier.py Applier)."""

    __slots__ = ("node", "link")

    def __init__(self, node: "ApplierHost", link: Any):
        self.node = node
        self.link = link

    def check_peer_greeting(self, theirs: dict) -> None:
        self.node.check_peer_greeting(theirs)

    def claim_link(self, peer_uuid: str) -> None:
        """The first applier to reach a member keeps it; another address of the same member is
        refused while it does (told to come back soon if the member moved there), and a new link
        waits for a removed one to finish closing."""
        self.link.peer_uuid = peer_uuid
        addresses = self.node.life
        moved_from = addresses.moved_from.get(peer_uuid, ()) \
            if addresses.advertised.get(peer_uuid) == self.link.address else ()
        claims.claim_link(self.node.followers, peer_uuid, self.link, moved_from)

    def journal_pending(self) -> int:
        return self.node.journal.pending

    def own_claim(self, peer_uuid: str) -> int:
        return claim_of(self.node.own_claims, self.node.core.fence, peer_uuid)

    def going_without(self) -> list[str]:
        return list(self.node.rejoiner.going_without())

    def release(self) -> None:
        """The link ended: another link may follow its member now."""
        claims.release_link(self.node.followers, self.link.peer_uuid, self.link)


class NodeRelayContext:
    """RelayContext over the node an inbound link reached."""

    __slots__ = ("node",)

    def __init__(self, node: "RelayHost"):
        self.node = node

    @property
    def core(self):
        return self.node.core

    def greeting(self) -> dict:
        return self.node.greeting()

    def check_peer_greeting(self, theirs: dict) -> None:
        self.node.check_peer_greeting(theirs)

    def status(self) -> tuple[str, str]:
        lease = self.node.lease
        if lease is not None:
            lease.serving()            # past its deadline the loss begins here: the status says so
        return self.node.status, self.node.status_reason

    def serves_wal(self) -> bool:
        return self.node.journal is not None and self.node.journal.wal is not None

    def gc_vclock(self) -> dict[int, int]:
        return self.node.store.get_meta("gc_vclock") or {}
