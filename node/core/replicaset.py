"""The replication core of one node: lsn claims, id translation, `_cluster` handling,
relay filtering. Pure: no asyncio, no sockets, no LMDB, no clock (time is an argument).

The shell calls it in this order for every transaction it will persist:
    txns = core.local_txn(...) | core.receive(peer, txn) | core.greeting(...)   # decide + claim
    persist txns to the WAL, then LMDB, in the order they were returned
    core.commit(txns)                                                            # durable vclock
NodeCore is split along its seams: this module keeps its state (vclocks applied, claimed and
synced; the table; peers; the fence), local writes, registration, the handshake, ACK positions,
the fence and commits, and the relay's filter; rows from a peer are decided in
node/core/receive.py (`Receiving`), `_cluster` rows followed and a peer's ids learned in
node/core/cluster_rows.py (`ClusterRows`; `Peer`, `ReceiveStats` and `cluster_op` are imported
from here too).
Rules kept here:
- an lsn is claimed (`local_txn`, and node/core/receive.py for a peer's rows) in one call with
  no await in between, and only grows;
- a greeting builds the peer's id map from its whole `_cluster` before SUBSCRIBE is sent, and
  registers every member it knows that this node does not (not while fenced), in one own
  `_cluster` txn written before any row of theirs; `_cluster` grows no further than members_max;
- ACKs say what is on disk (`ack_durable`: the synced vclock), never what was only applied;
- a fenced node writes nothing under its own id, asks only for its own rows, and clears the
  fence only when every member has been heard (node.core.membership OwnRowsFence);
- a relay never sends local rows, nor a subscriber's own rows past the cut taken when it
  subscribed (`relay_wanted`)."""
from __future__ import annotations

import logging

from node import limits
from node.cluster_space.resolver import resolve_cluster_replace
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.cluster_rows import Peer, ReceiveStats, cluster_op  # noqa: F401  (imported from here too)
from node.core.hlc import HLC
from node.core.membership import OwnRowsFence
from node.core.receive import Receiving
from node.core.rows import GROUP_LOCAL, OP_SPACE, Op, Txn
from node.core.vclock import VClock
from node.errors import RemoteProtocolError

log = logging.getLogger("replog.core")


class NodeCore(Receiving):
    def __init__(self, uuid: str, table: ClusterTable, vclock: VClock, *, hlc_last: int = 0,
                 spaces: dict[str, bool] | None = None, own_history_lsn: int = 0):
        me = table.get(uuid)
        assert me is not None, "a node's own uuid is always in its _cluster"
        self.uuid = uuid
        self.table = table
        self.vclock = vclock.copy()      # applied: what the WAL and the store hold (written)
        self.claimed = vclock.copy()     # applied + in flight to the WAL
        self.synced = vclock.copy()      # on disk (fsync'd WAL, or a synced store): what ACKs hold WAL by
        self.hlc = HLC(hlc_last)
        # space name -> local?, for every space created here or claimed (durable or in flight)
        self.spaces: dict[str, bool] = dict(spaces or {})
        self.peers: dict[str, Peer] = {}
        # (origin uuid, member uuid) -> the origin's id for the member, from its _cluster rows
        self.knowledge: dict[tuple[str, str], int] = {}
        # grows when an expelled member's accepted bound grows: appliers resubscribe then,
        # so rows they refused under the smaller bound come again
        self.expel_epoch = 0
        # expelled member uuid -> how much of its bound another node's word or this node's disk
        # backs, where the bound is larger: raised to rows of that member claimed here and not on
        # disk yet (greeting_rows states no more than is backed)
        self.bounds_ahead: dict[str, int] = {}
        # set after a loss: this node may hold fewer of its own rows than a member does, so it
        # writes nothing under its own id (node.core.membership) until the fence is cleared
        self.fence: OwnRowsFence | None = None
        # our own `_cluster` rows up to this lsn were written by an earlier incarnation of this
        # node (before a loss): they come back as history, and our table (the donor's ids since
        # the rebuild) is not theirs to change. While fenced, every own row received is history.
        self.own_history_lsn = own_history_lsn
        # members whose relay refused this node as expelled (address -> what it said), though the
        # expel row may not have reached it: while any did, it is out of the cluster (expelled_reason)
        self.expelled_by: dict[str, str] = {}

    def told_expelled(self, address: str, message: str) -> None:
        """The relay at `address` refused this node as expelled (its ERROR expelled). The expel
        row may be far from here (it comes past a gap, or this node is fenced), and meanwhile a
        member this node registered would be registered by a row past its expel bound, which no
        member takes: the newcomer would hold rows nobody else can have (a stall), and a client's
        write here would be acknowledged and reach nobody. So while any member says so, until a
        restart, this node is out (expelled_reason); a peer that lies could as well write an expel
        row every member applies. At most members_max addresses are kept, each with the first
        thing it said."""
        if len(self.expelled_by) < limits.members_max:
            self.expelled_by.setdefault(address, message)

    def expelled_reason(self) -> str | None:
        """Why this node is out of the cluster, if it is: its own `_cluster` entry says it was
        expelled (the row reached it), or a member refused its link as expelled (told_expelled).
        No member takes its rows past its expel bound, so it takes no writes to replicated
        spaces (node/process/writes.py), registers nobody and expels nobody (node.core.link.relay)."""
        if self.table.get(self.uuid).state == STATE_EXPELLED:  # type: ignore[union-attr]
            return "its _cluster says it was expelled"
        for address, said in self.expelled_by.items():
            return f"{address} refused it as expelled ({said})"
        return None

    # --- identity ----------------------------------------------------------------
    @property
    def self_id(self) -> int:
        return self.table.id_of(self.uuid)  # type: ignore[return-value]

    @property
    def anon(self) -> bool:
        return self.table.get(self.uuid).state == STATE_ANON  # type: ignore[union-attr]

    def vclock_by_uuid(self, vclock: VClock | None = None) -> dict[str, int]:
        v = vclock if vclock is not None else self.vclock
        out = {}
        for rid, lsn in v.items():
            if rid == 0:
                continue
            u = self.table.uuid_of(rid)
            if u is not None:
                out[u] = lsn
        return out

    # --- local writes ------------------------------------------------------------
    def local_txn(self, ops: list[Op], group: int, wall_us: int) -> Txn:
        """Claim the next lsns for a transaction written on this node."""
        assert ops, "a transaction has at least one row"
        assert self.fence is None or group == GROUP_LOCAL, "no row under this node's own id while it is fenced"
        component = 0 if group == GROUP_LOCAL else self.self_id
        lsn = self.claimed.get(component) + 1
        txn = Txn(self.self_id, lsn, group, self.hlc.now(wall_us), tuple(ops))
        self.claimed.follow(component, txn.last_lsn)
        for op in ops:
            if op.kind == OP_SPACE and op.space not in self.spaces:
                self.spaces[op.space] = bool(op.value.get("local"))
        return txn

    def register_member(self, uuid: str, address: str, wall_us: int,
                        proposed_id: int = 0, state: str = STATE_MEMBER) -> tuple[int, Txn | None]:
        """Register (or re-state) a member on this node: JOIN, REGISTER, expel, a new
        address. Returns its local id and the own `_cluster` txn to write, if any."""
        known = self.table.get(uuid)
        if known is None and len(self.table) >= limits.members_max:
            raise RemoteProtocolError(f"_cluster holds {limits.members_max} members (members_max): "
                                      f"cannot register {uuid}")
        have = self.claimed.get(known.id) if known else 0
        res = resolve_cluster_replace(self.table, uuid, proposed_id, address, state, from_self=True,
                                      have_lsn=have)
        if not res.changed:
            return res.local_id, None
        self.table.upsert(res.member)
        self._note_bound(uuid, known, 0)
        txn = self.own_cluster_txn([cluster_op(res.member)], wall_us)
        log.info("_cluster: %s %s as id %d", res.reason, uuid, res.local_id)
        return res.local_id, txn

    def _note_bound(self, uuid: str, was: Member | None, word: int) -> None:
        """After `uuid`'s entry may have changed from `was` (None: it is new here): `word` is a
        bound another node stated for it (a row, a greeting; 0 for none). What backs its bound
        grows by that word; a bound this node raised past what backs it, to rows it has claimed,
        is in bounds_ahead. (A member not expelled has bound 0: nothing is ahead.)"""
        bound = self.table.get(uuid).expelled_lsn     # type: ignore[union-attr]
        backed = self.bounds_ahead.get(uuid)
        if backed is None:
            backed = was.expelled_lsn if was is not None else 0
        backed = max(backed, word)
        if bound > backed:
            self.bounds_ahead[uuid] = backed
        else:
            self.bounds_ahead.pop(uuid, None)

    def greeting_rows(self) -> list[list]:
        """`_cluster` as this node's greeting states it. An expelled member's bound is raised to
        the rows of that member this node has claimed, so as to take the rows in flight; but a
        peer takes a greeting's bound as its own and states it in a row of its own, so stated
        before those rows are on disk here, a crash here would lose them and leave every member
        a bound naming rows no member has (the simulation's full mix, seed 16143). The bound is
        stated as far as another node's word or this node's disk backs it; the row of our own
        that raised it is on disk after those rows, and peers take the rest from it."""
        rows = self.table.rows()
        ahead = self.bounds_ahead
        if ahead:
            synced = self.synced
            for r in rows:
                backed = ahead.get(r[0])
                if backed is not None:
                    on_disk = synced.get(r[1])
                    if on_disk >= r[5]:
                        del ahead[r[0]]               # on disk up to the bound now
                    else:
                        r[5] = max(backed, on_disk)
        return rows

    # --- handshake ---------------------------------------------------------------
    def greeting(self, peer_uuid: str, peer_rows: list[list], wall_us: int, history_lsn: int = 0,
                 expels_heard: list[str] | tuple = ()) -> list[Txn]:
        """An upstream's greeting carried its whole `_cluster`; build its id map before
        SUBSCRIBE is sent (the answer to the reference's open question) and register
        every member it knows that we do not, before any of its rows is applied; expel those a
        fenced upstream heard are expelled (`expels_heard`: _adopt_expels)."""
        old = self.peers.get(peer_uuid)   # a map lives as long as one session: rebuilt from each greeting
        peer = Peer(peer_uuid, stats=old.stats) if old is not None else Peer(peer_uuid)
        peer.history_lsn = history_lsn
        peer.greeted = {row[1]: row[0] for row in peer_rows}
        out: list[Txn] = []
        own_ops: list[Op] = []
        # A peer's anonymous entry is taken only for the peer itself and only by an anonymous
        # replica (one following another): a member never registers an anonymous replica it
        # replicates from (its relay sends none of its private rows, node.core.link.relay).
        self_anon = self.anon
        new = 0 if self.fence is not None else \
            sum(1 for r in peer_rows
                if r[0] not in self.table and (r[3] != STATE_ANON or (r[0] == peer_uuid and self_anon)))
        if new and len(self.table) + new > limits.members_max:
            raise RemoteProtocolError(f"{peer_uuid}'s greeting would grow _cluster past members_max "
                                      f"({limits.members_max})")
        for row in peer_rows:            # [uuid, id, address, state(, lsn(, expelled_lsn))], checked by decode
            uuid, rid, state = row[0], row[1], row[3]
            if state == STATE_ANON and (uuid != peer_uuid or not self_anon):
                continue            # the peer's private entry: not ours
            local = self.table.get(uuid)
            if local is None and self.fence is not None:
                # Registering writes a row under our own id: not while fenced. Its rows cannot be
                # translated on this link, and the fenced subscription asks for none of them.
                continue
            if local is None:
                m = Member.from_row(row)
                # an expelled peer's bound for itself is its own word (it may hold rows past what any
                # member took): not taken, as _raise_bounds takes none (full-mix seed 24624); the
                # members' rows and greetings raise it to theirs
                res = resolve_cluster_replace(self.table, m.uuid, m.id, m.address, m.state, from_self=False,
                                              expelled_lsn=m.expelled_lsn if uuid != peer_uuid else 0)
                self.table.upsert(res.member)
                own_ops.append(cluster_op(res.member))
                log.info("_cluster: %s %s as id %d (from %s's greeting)", res.reason, m.uuid, res.local_id, peer_uuid)
                local = res.member
            self.knowledge[(peer_uuid, uuid)] = rid
            peer.map.learn(rid, local.id)
        self.peers[peer_uuid] = peer
        if self.fence is None:
            self._adopt_expels(peer_uuid, expels_heard, own_ops)
            self._raise_bounds(peer_uuid, peer_rows, own_ops)
        txn = self.own_cluster_txn(own_ops, wall_us)
        if txn is not None:
            out.append(txn)
        return out

    def _raise_bounds(self, peer_uuid: str, peer_rows: list[list], own_ops: list[Op]) -> None:
        """At a greeting, raise each expelled member's bound to the most that the greeting states
        or that this node holds, and state it in a row of our own (as a `_cluster` row's bound
        is taken: node/cluster_space/resolver.py). Rows an expelled member's bound does not
        cover reach a node only inside a snapshot (a joiner through that member, or a rebuild
        from such a joiner), and the bound such a node has may have come in the snapshot too:
        no row of its own stated either, and a member that never rebuilds from it would keep
        a smaller bound for ever (full-mix seed 3372). The expelled member's own word (its
        greeting's row about itself) is not taken: its rows past what members hold are its own
        alone; nor this node's."""
        stated = {str(r[0]): int(r[5]) for r in peer_rows
                  if len(r) > 5 and r[3] == STATE_EXPELLED and r[0] != peer_uuid}
        for m in self.table.members():
            if m.state != STATE_EXPELLED or m.uuid == self.uuid:
                continue
            word = stated.get(m.uuid, 0)
            bound = max(word, self.claimed.get(m.id))
            if bound > m.expelled_lsn:
                raised = Member(m.uuid, m.id, m.address, STATE_EXPELLED, m.lsn, bound)   # the resolver's expel-lsn
                self.expel_epoch += 1             # rows refused under the smaller bound may come now
                self.table.upsert(raised)
                own_ops.append(cluster_op(raised))
                log.info("_cluster: expel-lsn %s to %d (at %s's greeting)", m.uuid, bound, peer_uuid)
            self._note_bound(m.uuid, m, word)

    def subscribe_vclock(self, peer_uuid: str, peer_vclock: dict[str, int] | None = None,
                         peer_rows: list[list] | None = None) -> VClock:
        """What we ask the peer for, in the peer's ids (unknown components left out). While
        fenced, with the peer's vclock by uuid and `_cluster` rows (its greeting's), only our own
        rows: every other component is asked from where the peer is, so the rows before it are
        not sent now (they come once the fence is cleared and the applier subscribes again).
        That includes members the peer has and this node does not (a fenced node registers
        nobody): their rows could not be translated here, and would stop the link before our
        own rows came.

        From a peer expelled here, with its vclock, only the rows of expelled members (its own
        up to the bound, wanted from it while it runs): every other component is asked from
        where it is. A fence waits for no expelled member, so a row of a member's that reached
        the expelled one alone may since have been written again, differently, by that member,
        which lost it (docs/replication.md, seed 27742); taken from there, it would fork us.
        Members' rows come from members."""
        peer = self.peers[peer_uuid]
        outside = self.fence is None and self.table.expelled(peer_uuid)
        if peer_vclock is None or (self.fence is None and not outside):
            peer.fenced_subscription = False
            return peer.map.vclock_to_peer(self.claimed)
        peer.fenced_subscription = self.fence is not None
        want = self.claimed.copy()
        for rid, _ in list(want.items()) + [(m.id, 0) for m in self.table.members()]:
            u = self.table.uuid_of(rid)
            if outside:
                theirs = peer_vclock.get(u, 0) if u is not None and not self.table.expelled(u) else 0
            else:
                theirs = peer_vclock.get(u, 0) if u is not None and u != self.uuid else 0
            if theirs > want.get(rid):
                want.follow(rid, theirs)
        out = peer.map.vclock_to_peer(want)
        for row in peer_rows or ():
            u, their_id = str(row[0]), int(row[1])
            if u != self.uuid and self.table.get(u) is None and peer_vclock.get(u, 0) > out.get(their_id):
                out.follow(their_id, peer_vclock[u])
        return out

    def ack_vclock(self, peer_uuid: str) -> VClock:
        """What we have applied, in the peer's ids (its lag, its relay's progress)."""
        return self.peers[peer_uuid].map.vclock_to_peer(self.vclock)

    def ack_durable(self, peer_uuid: str) -> VClock:
        """What we have on disk, in the peer's ids: what its WAL may be collected up to."""
        return self.peers[peer_uuid].map.vclock_to_peer(self.synced)

    def mark_synced(self, vclock: VClock) -> None:
        """Everything up to `vclock` (a vclock this node had applied) is on disk now."""
        for rid, lsn in vclock.items():
            if lsn > self.synced.get(rid):
                self.synced.follow(rid, lsn)

    # --- the own-rows fence (node.core.membership) -------------------------------------
    def observe_peer(self, peer_uuid: str, vclock_by_uuid: dict[str, int], cluster_rows: list[list],
                     anonymous: str | None = None, expels_heard: list[str] | tuple = ()) -> None:
        """A peer's greeting (either direction): while fenced, how many of our rows it holds,
        which members it knows (each must be heard from too) and which it knows to be expelled
        (those are not waited for). `anonymous`: the address of an anonymous replica's greeting
        (its word counts; it is waited for only as a follower the node remembers). At most
        members_max + anon_followers_max peers are heard."""
        fence = self.fence
        if fence is None:
            return
        if peer_uuid not in fence.heard and len(fence.heard) >= limits.members_max + limits.anon_followers_max:
            return                 # greetings under made-up uuids (a peer with the secret) grow it no further
        if anonymous is not None:
            fence.anonymous[peer_uuid] = anonymous
        knows = list(expels_heard)             # a fenced peer's (checked by decode)
        for row in cluster_rows:
            if len(row) > 3 and row[3] == STATE_EXPELLED:
                knows.append(str(row[0]))
            elif len(row) > 3 and row[3] == STATE_MEMBER:
                fence.known.add(str(row[0]))     # a member we must hear from too, if we do not know it
                fence.reach.pop(str(row[0]), None)   # (a follower that registered: its entry no longer bounds it)
        fence.hear(peer_uuid, int(vclock_by_uuid.get(self.uuid, 0)), knows)
        for u in knows:                        # expelled as far as we know too (our greeting says it)
            if len(fence.expelled) < limits.members_max:
                fence.expelled.add(u)

    def clear_fence(self, wall_us: int) -> Txn | None:
        """Every member has been heard and our own rows are back: we may write under our own id
        again. After a rebuild, own rows received while fenced stay history (own_history_lsn
        rises to them), and this node states its whole table again in its own ids (returned, to
        persist): peers that took its earlier incarnation's rows learn its ids now. (Rows only a
        peer the operator gave up on holds are not skipped past: members wait at a gap in a
        peer's own rows, so the next lsn is the one after ours, and that peer, expelled, keeps
        rows that differ under those lsns.)"""
        fence = self.fence
        assert fence is not None
        heard = sorted(fence.expelled)
        self.fence = None
        # expels heard while fenced (no row could say them then) are this node's own now, before
        # any applier subscribes for every origin: members' rows come from members
        expels: list[Op] = []
        self._adopt_expels("greetings while fenced", heard, expels)
        if not fence.rebuilt:
            return self.own_cluster_txn(expels, wall_us)
        self.own_history_lsn = max(self.own_history_lsn, self.claimed.get(self.self_id))
        return self.own_cluster_txn([cluster_op(m) for m in self.table.members() if m.state != STATE_ANON], wall_us)

    def fence_state(self) -> tuple[bool, str]:
        """(may clear now, why not / what it waited for)."""
        fence = self.fence
        assert fence is not None
        own = self.vclock.get(self.self_id)
        return fence.can_clear(self.table, self.uuid, own), fence.explain(self.table, self.uuid, own)

    def drop_peer(self, peer_uuid: str, peer: Peer | None = None) -> None:
        """Forget a peer's map when its link ends; with `peer`, only if it is still that link's
        (a newer link to the same member may have greeted since)."""
        if peer is None or self.peers.get(peer_uuid) is peer:
            self.peers.pop(peer_uuid, None)

    # --- after persistence -----------------------------------------------------------
    def commit(self, txns: list[Txn]) -> None:
        """The txns are durable: each component advances once, to the highest last lsn."""
        top: dict[int, int] = {}
        get = top.get
        for t in txns:
            c = 0 if t[2] == GROUP_LOCAL else t[0]            # group, replica_id
            last = t[1] + len(t[4]) - 1                       # lsn, ops
            if last > get(c, 0):
                top[c] = last
        self.commit_tops(top)

    def commit_tops(self, top: dict[int, int], on_disk: bool = False) -> None:
        """commit() given what the store's apply computed: component -> highest last lsn.
        `on_disk`: the batch was fsync'd (wal_mode fsync), so it is synced too."""
        v = self.vclock
        for c, last in top.items():
            if last > v.get(c):
                v.follow(c, last)
        if on_disk:
            s = self.synced
            for c, last in top.items():
                if last > s.get(c):
                    s.follow(c, last)


# --- relay side ----------------------------------------------------------------------
def relay_wanted(txns: list, sub_vclock: dict[int, int], own: tuple[int, int] | None = None) -> tuple[list, int]:
    """Which of these WAL txns (wire form or Txns, relay's ids, in WAL order) should a relay send
    to a subscriber whose vclock (in the relay's ids) is sub_vclock? Returns them in order, and
    the rows they hold. Local rows never leave the node.

    `own` = (the subscriber's id, the relay's durable lsn of it when it subscribed): the
    subscriber's own rows go back to it only up to that cut (after Tarantool's relay). Those
    are what it may have lost and what its greeting told it to wait for (the relay's greeting
    came on the same link, before the cut); a row of it past the cut was written by the
    subscriber that is alive and subscribed now, so sending it back would be an echo.
    (One loop over a frame's txns: a relay runs it for every frame to every subscriber.)"""
    keep = []
    rows = 0
    get = sub_vclock.get
    for txn_wire in txns:
        rid, lsn, group = txn_wire[0], txn_wire[1], txn_wire[2]
        if group == GROUP_LOCAL:
            continue
        if own is not None and rid == own[0] and lsn > own[1]:
            continue
        n = len(txn_wire[4])
        if lsn + n - 1 > get(rid, 0):
            keep.append(txn_wire)
            rows += n
    return keep, rows


def relay_wants(txn_wire: list, sub_vclock: dict[int, int], own: tuple[int, int] | None = None) -> bool:
    """relay_wanted's rule for one txn."""
    keep, _ = relay_wanted((txn_wire,), sub_vclock, own)
    return bool(keep)
