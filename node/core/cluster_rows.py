"""`_cluster` rows as the replication core takes them from a peer: the op that states a
member (`cluster_op`), what the core knows of one upstream (`Peer`: its id map, its stats, its
earlier incarnation's rows), the checks a peer's `_cluster` rows pass before anything changes,
following them (this node's table, the peer's map, the knowledge of every origin's ids, this
node's own row), and translating a row's origin through the peer's map. Part of NodeCore
(node/core/replicaset.py), which mixes `ClusterRows` in; pure like it.

Rules kept here:
- a `_cluster` row states its *origin's* ids: it teaches the map of a directly connected peer
  only when that peer is the origin, and not when it is the peer's earlier incarnation's
  (`Peer.history_lsn`);
- a row whose replica id the peer's map cannot translate is refused, never guessed (the
  knowledge of the peer's own `_cluster` rows, however they came, may teach the map first);
- `_cluster` rows are checked before anything changes: they give no uuid two ids and no id
  two uuids, in this node's table (its own rows, coming back) or in the peer's map, and grow
  `_cluster` no further than members_max;
- on learning a member this node writes its own `_cluster` row for it, returned to be written
  in the same WAL frame, before any row of that member;
- another member's row about this node changes nothing here but an expel; while fenced, a row
  that would change this node's table (and so need an own row) waits until the fence is
  cleared; one that arrives past a gap while fenced still tells the fence which members are
  expelled (OwnRowsFence.hear_expels);
- the expels a fenced peer's greeting states (`expels_heard`) are this node's too, in a row of
  its own, before it answers or subscribes: a fence counts only the word of a member that knows
  of the expels it relies on (OwnRowsFence.unaware)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from node import limits
from node.cluster_space.idmap import IdMap
from node.cluster_space.resolver import resolve_cluster_replace
from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.membership import OwnRowsFence
from node.core.rows import CLUSTER_SPACE, GROUP_CLUSTER, OP_CLUSTER, Op, Txn
from node.core.vclock import VClock
from node.errors import RemoteProtocolError

log = logging.getLogger("replog.core")


@dataclass
class ReceiveStats:
    applied: int = 0
    duplicates: int = 0
    gaps: int = 0
    expelled: int = 0


@dataclass
class Peer:
    """What the core knows of one directly connected upstream."""
    uuid: str
    map: IdMap = field(default_factory=IdMap)
    stats: ReceiveStats = field(default_factory=ReceiveStats)
    # the peer's own `_cluster` rows up to this lsn are its earlier incarnation's (its greeting
    # says so: NodeCore.own_history_lsn there): they state ids it no longer uses
    history_lsn: int = 0
    # this node's lsn of the peer's own rows when a gap in them was logged on this link (-1: none)
    own_gap_at: int = -1
    # this link was subscribed while fenced (NodeCore.subscribe_vclock): the peer's own rows were
    # asked from where it was, so a gap in them is ours even once the fence has lifted
    fenced_subscription: bool = False
    # the peer's table as its greeting stated it, id -> uuid: its ids now, including members
    # this node could not map then (unknown here, or not registered while fenced)
    greeted: dict[int, str] = field(default_factory=dict)


def cluster_op(m: Member) -> Op:
    v = {"id": m.id, "address": m.address, "state": m.state}
    if m.state == STATE_EXPELLED:
        v["expelled_lsn"] = m.expelled_lsn
    return Op(OP_CLUSTER, CLUSTER_SPACE, m.uuid, v)



class ClusterRows:
    """NodeCore's `_cluster` row handling (node/core/replicaset.py keeps the state named here)."""
    uuid: str
    table: ClusterTable
    claimed: VClock
    knowledge: dict[tuple[str, str], int]
    expel_epoch: int
    fence: OwnRowsFence | None
    self_id: int
    local_txn: Callable[[list[Op], int, int], Txn]     # claims the next own lsns (NodeCore.local_txn)
    _note_bound: Callable[[str, Member | None, int], None]   # what backs an expelled member's bound

    def _cluster_rows_refusal(self, peer: Peer, origin: Member, ops, peer_history: bool = False) -> str | None:
        """Why `_cluster` rows of `origin` (arriving from `peer`) cannot be followed, checked
        before anything changes: they would give one uuid two ids or one id two uuids in this
        node's table (its own rows, coming back) or in the peer's map, or grow `_cluster` past
        members_max."""
        mine = origin.uuid == self.uuid
        by_uuid: dict[str, int] = {}
        by_id: dict[int, str] = {}
        new = 0
        for op in ops:
            uuid, their_id = op.key, op.value["id"]
            if by_uuid.setdefault(uuid, their_id) != their_id or by_id.setdefault(their_id, uuid) != uuid:
                return f"the transaction gives {uuid} or id {their_id} two meanings"
            known = self.table.get(uuid)
            if known is None:
                new += 1
            if mine:
                holder = self.table.by_id(their_id)
                if (known is not None and known.id != their_id) or (known is None and holder is not None):
                    return (f"a row of this node's own says {uuid} is id {their_id}, but this node's _cluster "
                            f"has {'it as id ' + str(known.id) if known else 'that id for ' + holder.uuid}")
            if origin.uuid == peer.uuid and not peer_history:
                mapped = peer.map.to_local.get(their_id)
                if mapped is not None and (known is None or mapped != known.id):
                    return (f"{peer.uuid} says its id {their_id} is {uuid}, but it said before that it is "
                            f"{self.table.uuid_of(mapped)}")
                before = peer.map.to_peer.get(known.id) if known is not None else None
                if before is not None and before != their_id:
                    return f"{peer.uuid} says {uuid} is its id {their_id}, but it said before {before}"
        if new and len(self.table) + new > limits.members_max:
            return f"_cluster would grow past members_max ({limits.members_max})"
        return None

    def _fenced_cluster_change(self, origin: Member, ops) -> str | None:
        """While fenced, a `_cluster` row of another member that would change our table (and so
        need a row of our own) waits: it is refused now and comes again after the fence."""
        for op in ops:
            v = op.value
            known = self.table.get(op.key)
            if op.key == self.uuid and v.get("state") != STATE_EXPELLED:
                continue             # another member's row about this node changes nothing here but an expel
            res = resolve_cluster_replace(self.table, op.key, int(v["id"]), str(v.get("address") or ""),
                                          str(v.get("state") or STATE_MEMBER), from_self=(op.key == origin.uuid),
                                          expelled_lsn=int(v.get("expelled_lsn") or 0),
                                          have_lsn=self.claimed.get(known.id) if known else 0)
            if res.changed:
                if res.member.state == STATE_EXPELLED:
                    self.fence.expelled.add(op.key)          # type: ignore[union-attr]
                return (f"it changes {op.key} here ({res.reason}), which needs a row under this node's own id, "
                        "and this node's own rows are not confirmed yet: it is taken after the fence")
        return None

    def _translate(self, peer: Peer, replica_id: int, lsn: int) -> int | None:
        """This node's id for a row's origin, through the peer's map; never guessed. None on a
        link subscribed while fenced, for a member this node could not register then (a fenced
        node registers nobody): NodeCore.subscribe_vclock asked its rows from where the peer
        was, and the ones it writes since are not taken now; they come by the SUBSCRIBE after
        the fence, as the peer's own later rows do (counted with the gaps)."""
        origin = peer.map.to_local.get(replica_id)
        if origin is None:
            origin = self._learn_from_knowledge(peer, replica_id)
        if origin is None:
            if peer.fenced_subscription:
                return None
            raise RemoteProtocolError(
                f"row {replica_id}:{lsn} from {peer.uuid}: id {replica_id} is unknown "
                "to this node's map of that peer; refusing to guess")
        return origin

    def _learn_peer_ids(self, peer: Peer, ops: tuple) -> None:
        for op in ops:
            if op.kind == OP_CLUSTER:
                local_id = self.table.id_of(op.key)
                if local_id is not None:
                    peer.map.learn(int(op.value["id"]), local_id)

    def _learn_from_knowledge(self, peer: Peer, peer_id: int) -> int | None:
        """This node's id for the member behind a peer's id its map lacks: the member its
        greeting listed under that id (its table now), else one it registered since, as its own
        `_cluster` rows say, however they came. Those rows may be an earlier incarnation's (a
        rebuild takes the donor's ids, and its old rows stay in every WAL): a member the greeting
        lists under another id, or already mapped, is not it, and two candidates are no answer."""
        uuid = peer.greeted.get(peer_id)
        if uuid is None:
            listed, mapped = set(peer.greeted.values()), peer.map.to_peer
            named = {member for (origin, member), their_id in self.knowledge.items()
                     if origin == peer.uuid and their_id == peer_id and member not in listed
                     and self.table.id_of(member) not in mapped}
            if len(named) != 1:
                return None
            (uuid,) = named
        local_id = self.table.id_of(uuid)
        if local_id is not None:
            peer.map.learn(peer_id, local_id)
        return local_id

    def _follow_cluster_rows(self, peer: Peer, origin: Member, txn: Txn, wall_us: int,
                             learn: bool = True) -> Txn | None:
        """`learn`: the row states its origin's ids now (not a row of the connected peer's earlier
        incarnation, Peer.history_lsn): maps and knowledge take them."""
        own_ops: list[Op] = []
        for op in txn.ops:
            if op.kind != OP_CLUSTER:
                continue
            v = op.value
            their_id, address, state = int(v["id"]), str(v.get("address") or ""), str(v.get("state") or STATE_MEMBER)
            if learn:
                self.knowledge[(origin.uuid, op.key)] = their_id
            if op.key == self.uuid and origin.uuid != self.uuid:
                # Another member's row about this node changes nothing here but an expel (an
                # administrator's act, done on any member): this node's entry is its own rows'.
                if state != STATE_EXPELLED:
                    if origin.uuid == peer.uuid and learn:
                        peer.map.learn(their_id, self.self_id)
                    continue
                log.error("_cluster: %s says this node is expelled", origin.uuid)
            known = self.table.get(op.key)
            word = int(v.get("expelled_lsn") or 0)
            res = resolve_cluster_replace(self.table, op.key, their_id, address, state,
                                          from_self=(op.key == origin.uuid),
                                          expelled_lsn=word,
                                          have_lsn=self.claimed.get(known.id) if known else 0)
            if res.reason == "expel-lsn":
                self.expel_epoch += 1
            if res.changed:
                self.table.upsert(res.member)
                if origin.uuid != self.uuid:      # a row of our own coming back is our row already
                    own_ops.append(cluster_op(res.member))
                log.info("_cluster: %s %s as id %d (row of %s)", res.reason, op.key, res.local_id, origin.uuid)
            self._note_bound(op.key, known, word)
            if origin.uuid == peer.uuid and learn:
                peer.map.learn(their_id, res.local_id)
        return self.own_cluster_txn(own_ops, wall_us)

    # --- expels a fenced peer states (OwnRowsFence.unaware) -----------------------------
    def expels_heard(self) -> list[str]:
        """While fenced: every member of its table this node knows is expelled (by a row, or
        heard of: OwnRowsFence.is_expelled). Its greeting states them, so that the members whose
        word a fence waits for expel them too before they speak again (OwnRowsFence.unaware,
        adopt_expels), and a fenced member's word knows them. One it heard of has no row here
        saying so yet (none is written while fenced): the lift writes it (clear_fence)."""
        fence = self.fence
        if fence is None:
            return []
        return sorted(m.uuid for m in self.table.members() if m.uuid != self.uuid and fence.is_expelled(self.table, m.uuid))

    def _adopt_expels(self, source: str, expels_heard: list[str] | tuple, own_ops: list[Op]) -> None:
        """A fenced peer's greeting says members of ours are expelled (NodeCore.expels_heard):
        expel them here too, as a `_cluster` row of theirs would (bound: the rows of each we
        hold; the rows that state the expel raise it). The fenced peer waits for no expelled
        member, and may write again, under the same lsns, rows that one alone kept; a member
        that does not know of the expel could take those from it (OwnRowsFence.unaware)."""
        for uuid in expels_heard:
            local = self.table.get(uuid)
            if local is None or local.state != STATE_MEMBER or uuid == self.uuid:
                continue
            res = resolve_cluster_replace(self.table, uuid, local.id, local.address, STATE_EXPELLED,
                                          from_self=False, have_lsn=self.claimed.get(local.id))
            self.table.upsert(res.member)
            self._note_bound(uuid, local, 0)
            own_ops.append(cluster_op(res.member))
            log.info("_cluster: expel %s (bound %d), heard from %s", uuid, res.member.expelled_lsn, source)

    def adopt_expels(self, peer_uuid: str, expels_heard: list[str] | tuple, wall_us: int) -> Txn | None:
        """_adopt_expels for a downstream's greeting (our relay's side): the own `_cluster` txn
        to persist before our greeting answers, or None (nothing new, or we are fenced: then the
        fence hears them instead, observe_peer)."""
        if not expels_heard or self.fence is not None or \
                self.table.get(self.uuid).state != STATE_MEMBER:  # type: ignore[union-attr]
            return None
        own_ops: list[Op] = []
        self._adopt_expels(peer_uuid, expels_heard, own_ops)
        return self.own_cluster_txn(own_ops, wall_us)

    def own_cluster_txn(self, ops: list[Op], wall_us: int) -> Txn | None:
        """The `_cluster` txn of our own that states `ops` (entries already in the table), each
        entry noting its lsn; None for no ops."""
        if not ops:
            return None
        own = self.local_txn(ops, GROUP_CLUSTER, wall_us)
        for op in ops:
            self.table.get(op.key).lsn = own.lsn  # type: ignore[union-attr]
        return own
