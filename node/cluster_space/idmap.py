"""Per-peer id maps: "this peer's id k is my id m".

A map is built from the peer's whole `_cluster` in its greeting (before SUBSCRIBE is
sent) and extended by `_cluster` rows whose origin is that peer. Ids are stable on every
node (a uuid never changes id, ids are never reused), so an entry, once learned, is
true for ever: a map can be learned early and never needs to be unlearned. Both directions
are one-to-one: learning a second meaning for either id is a bug (asserted), since callers
refuse contradicting `_cluster` rows before they reach the map."""
from __future__ import annotations

from node.cluster_space.table import ClusterTable
from node.core.vclock import VClock


class IdMap:
    __slots__ = ("to_local", "to_peer")

    def __init__(self) -> None:
        self.to_local: dict[int, int] = {}   # peer id -> local id
        self.to_peer: dict[int, int] = {}    # local id -> peer id

    def learn(self, peer_id: int, local_id: int) -> None:
        old = self.to_local.get(peer_id)
        assert old is None or old == local_id, f"peer id {peer_id} maps to {old}, not {local_id}"
        back = self.to_peer.get(local_id)
        assert back is None or back == peer_id, f"local id {local_id} is the peer's {back}, not {peer_id}"
        self.to_local[peer_id] = local_id
        self.to_peer[local_id] = peer_id

    def learn_table(self, peer_table: dict[str, int], local: ClusterTable) -> None:
        """peer_table: uuid -> the peer's id; learns every uuid both know."""
        for uuid, peer_id in peer_table.items():
            local_id = local.id_of(uuid)
            if local_id is not None:
                self.learn(peer_id, local_id)

    def vclock_to_peer(self, vclock: VClock) -> VClock:
        """Permute a local vclock into the peer's ids; unknown components and 0 are left out."""
        return vclock.permute(self.to_peer)

    def vclock_to_local(self, vclock: VClock) -> VClock:
        return vclock.permute(self.to_local)

    def as_dict(self) -> dict[int, int]:
        return dict(sorted(self.to_local.items()))
