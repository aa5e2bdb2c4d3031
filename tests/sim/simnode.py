"""One simulated node: its state (the StateView of node.core.apply over dicts), its
journal (queue -> WAL written -> on disk), its store's recovery base and meta, and the WAL
holds and collection of node/retention.py.

Rules kept here, as in journal.py, storage/store.py, server._open_bootstrapped and
node/retention.py:
- entries are written in submission order. wal_mode fsync: a batch is applied (apply_txn,
  then `core.commit_tops(..., on_disk=True)`) only once it is on disk, and relays send only
  what is on disk; wal_mode write: a batch is applied (`on_disk=False`) and may be relayed
  once written, and `core.synced` moves when the journal fsyncs the written tail (every
  wal_sync_interval_s: `sync` here) or at a checkpoint (`core.mark_synced`). So claimed
  (queued) >= applied >= on disk, and ACKs carry `core.ack_durable`;
- a power loss (`crash`) loses the queue and whatever is not on disk; a process kill in wal_mode
  write keeps what was written (the page cache survives it);
- a restart rebuilds state from the base plus the WAL on disk after it (`base_pos`), and builds
  a new NodeCore from that state (its knowledge from the state's, its HLC from the base and the
  WAL, `own_history_lsn` and the own-rows fence from the meta: node/fence.py `restore`);
- a checkpoint (Retention.checkpoint) makes the state the new base (local spaces included),
  marks it synced in the core, gives every registered member without a hold one from the start
  of the WAL (Holds.hold_for_new_members; none where holds lapse, `lapsing`: an anonymous node
  with no row under its own id), writes the holds, then collects the WAL entries
  below every hold (Holds.positions, `keep_vclock`, and the segment rule `collectable_before`
  with one entry per segment; the last entry and any entry a relay is reading stay) and sets
  `gc_vclock`, the start of the oldest entry kept;
- the holds are node/core/holds.py's `Holds`, driven as Retention drives it (hold_all /
  on_subscribe / on_ack); a hold a JOIN or a SUBSCRIBE set is written at once (an anonymous
  one in wal_mode write is synced only with the next sync), one an ACK moved is written with
  the next checkpoint; a restart takes the holds on disk;
- a snapshot (store.snapshot) holds the replicated spaces and data, `_cluster`, and the vclock
  without 0.
Differences from the shell, kept small on purpose: one WAL entry per segment; a checkpoint in
wal_mode write makes the WAL up to the base durable too (the shell's WAL may keep a hole there
after a power loss, which only costs a subscriber a gap it refills from another upstream).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from node import limits
from node.cluster_space.table import ClusterTable, Member
from node.core.apply import apply_txn, apply_txns
from node.core.holds import Hold, Holds, collectable_before, keep_vclock, lapsing
from node.core.anon_followers import FollowerReach, Followers, followers_at_start, followers_to_forget
from node.core.lifecycle_fence import take_up_fence
from node.core.replicaset import NodeCore
from node.core.rows import GROUP_LOCAL, Txn
from node.core.vclock import VClock

if TYPE_CHECKING:
    from tests.sim.harness import Cluster
    from tests.sim.network import Conn

WALL_BASE_US = 1_000_000_000   # wall clock at tick 0
TICK_US = 20_000               # one tick of wall time: ACKs at most every 3 ticks (ack_interval_s),
                               # an idle relay's heartbeat every 50 (heartbeat_interval_s)


# --- state --------------------------------------------------------------------------
@dataclass
class Base:
    """What a node's state starts from before its WAL: bootstrap, a snapshot, a checkpoint."""
    table_rows: list[list]
    vclock: dict[int, int]
    spaces: dict[str, tuple[bool, str]]
    data: dict[str, dict[str, list]]
    knowledge: dict = field(default_factory=dict)   # a checkpoint's (origin, member) -> id
    hlc: int = 0                                      # a checkpoint's hybrid clock


class SimState:
    """The StateView of node.core.apply over dicts (the LMDB store's in-memory twin)."""

    def __init__(self, base: Base, own_history_lsn: int = 0):
        self.table = ClusterTable(Member.from_row(r) for r in base.table_rows)
        self.vclock = VClock(base.vclock)
        self.spaces: dict[str, tuple[bool, str]] = dict(base.spaces)
        # (records are shared with the base: no record is changed in place, `put` and the
        # replacer store new lists)
        self.data: dict[str, dict[str, list]] = {s: dict(d) for s, d in base.data.items()}
        self.knowledge: dict[tuple[str, str], int] = dict(base.knowledge)
        self.own_history_lsn = own_history_lsn    # Store.own_history_lsn (node.core.apply)

    def space(self, name: str) -> tuple[bool, str] | None:
        return self.spaces.get(name)

    def create_space(self, name: str, local: bool, conflict: str) -> None:
        self.spaces[name] = (local, conflict)
        self.data.setdefault(name, {})

    def get(self, space: str, key: str) -> list | None:
        r = self.data[space].get(key)
        return None if r is None else list(r)

    def put(self, space: str, key: str, record: list) -> None:
        self.data[space][key] = list(record)

    def replacer(self, space: str):
        """StateView.replacer: put a record into `space`, returning the one it replaced (as
        `get` then `put` would: copies in, copies out)."""
        records = self.data[space]

        def replace(key: str, record: list) -> list | None:
            old = records.get(key)
            records[key] = list(record)
            return None if old is None else list(old)
        return replace

    def delete(self, space: str, key: str) -> None:
        self.data[space].pop(key, None)

    def put_member(self, m: Member) -> None:
        pass    # apply_txn has already upserted the member into self.table

    def put_knowledge(self, origin_uuid: str, member_uuid: str, their_id: int) -> None:
        self.knowledge[(origin_uuid, member_uuid)] = their_id


def txn_tops(txns: list[Txn]) -> dict[int, int]:
    """component -> highest last lsn (what the store's apply hands to core.commit_tops)."""
    top: dict[int, int] = {}
    for t in txns:
        c = 0 if t.group == GROUP_LOCAL else t.replica_id
        if t.last_lsn > top.get(c, 0):
            top[c] = t.last_lsn
    return top


# --- nodes ---------------------------------------------------------------------------
@dataclass(eq=False)
class Applier:
    """node/applier/applier.py Applier's state that outlives one link (each link's protocol is
    its Conn's ApplierMachine)."""
    address: str
    conn: "Conn | None" = None
    retry_at: int = 0
    refused: str = ""          # the last refusal reason ("" while none)
    status: str = ""           # "follow" once SUBSCRIBED, "need_rejoin" when told so
    peer_vclock: dict = field(default_factory=dict)   # the upstream's vclock by uuid, from its last greeting
    peer_uuid: str | None = None                      # who answered at this address (claim_link)
    stopping: bool = False                            # (a simulated link closes at once)


class SimNode:
    def __init__(self, cluster: "Cluster", name: str, uuid: str, skew_us: int, anon: bool):
        self.cluster = cluster
        self.name = name
        self.uuid = uuid
        self._repr = f"{name}({uuid[:8]})"      # (name and uuid never change: every log line names nodes)
        self.addr = f"{name.lower()}.sim:7301"
        self.skew_us = skew_us
        self.anon = anon                      # configured anonymous (until it registers)
        self.wal_mode = "fsync"               # "fsync" | "write" (cfg.wal_mode)
        self.sync_p: float | None = None      # this node's chance per tick of an fsync (None: the cluster's)
        self.up = True
        self.retired = False                  # down for good: never restarted again
        self.let_go_seen: tuple[frozenset, int] = (frozenset(), 0)   # Cluster._let_go: what blocks it, since which attempt
        self.base: Base | None = None         # None: fresh (or its disk was lost)
        self.wal: list[list[Txn]] = []        # entries (frames) in WAL order
        self.durable = 0                      # entries wal[:durable] are on disk
        self.base_pos = 0                     # wal[:base_pos] are in the base (a checkpoint)
        self.wal_gc = 0                       # wal[:wal_gc] were collected
        self.wal_vc0: dict[int, int] = {}     # the vclock (local ids, with 0) at WAL entry 0
        self._gc_vc: dict[int, int] = {}      # the vclock at WAL entry wal_gc
        self.gc_vclock: dict[int, int] = {}   # meta gc_vclock (without 0)
        self.wal_start: dict[int, int] = {}   # where the WAL began: its store's snapshot (the checker's)
        self.holds: dict[str, Hold] = {}      # Retention.holds, in memory
        self.joining: set[str] = set()        # joiners held by hold_all that have not subscribed here (stats)
        self.holds_disk: dict[str, Hold] = {}  # ... as the store has them
        self._holds_synced: set[str] = set()  # ... of which these survive a power loss
        self.meta: dict = {}                  # own_fence (reason), own_history_lsn, running
        self.identity_active = False          # identity file: this uuid went active (kept on a lost store)
        self.queue: list[list[Txn]] = []      # submitted, not yet written
        self.state: SimState | None = None
        self.core: NodeCore | None = None
        self.status = "running"               # "rejoining" while a rejoin pauses or rebuilds
        self.own_claims: dict[str, tuple[int, str]] = {}  # Peering.own_claims (node/core/lifecycle_fence.py)
        self.claims_disproved: set[str] = set()   # Node.claims_disproved: peers whose claim the stream belied
        self.greeting_cache: tuple | None = None   # (shell.greeting_key, the greeting built for it)
        self.peers: list[str] = []            # configured upstream addresses (configure_peers)
        self.in_effect: list[str] | None = None   # set_peers([]) during a rebuild; None: = peers
        self.links_applied: tuple = ()        # what Cluster.apply_links last made the appliers match
        self.appliers: dict[str, Applier] = {}
        self.followers: dict[str, Applier] = {}   # member uuid -> its one link's applier (claims.claim_link)
        self.proc: str = ""                   # "join" | "fetch" | "register" while one is wanted
        self.proc_via: str | None = None      # the donor the operator named, if any
        self.proc_conn: Conn | None = None
        self.proc_retry_at = 0
        self.join_peers: list[str] = []       # the peers a new node was started with to join (none: `peers`)
        self.polls: dict = {}                 # a join's poll: peer address -> its link, or what it gave
        self.poll_until = 0                   # ... the tick its unanswered polls time out
        self.rejoiner = None                  # tests.sim.shell.Rejoiner, once bootstrapped
        self.joiner = None                    # node.core.lifecycle_join.JoinMachine of its requests (joins.py)
        self.power_lost = False               # the next start sees a new boot id (node/fence.py)
        self.greetings = 0                    # greetings taken by the core (the checker's cue)
        # node/fence.py registered_members: members this node registered, beside its identity
        # (a lost store keeps them; its fence waits for them too)
        self.registered: set[str] = set()
        # node/fence.py anonymous_followers: anonymous replicas that follow this node, beside its identity
        self.anon_followers: Followers = {}
        self.reach = FollowerReach(0)              # Retention.reach: how far of our rows each may hold

    def __repr__(self) -> str:
        return self._repr

    @property
    def ready(self) -> bool:
        return self.up and self.core is not None

    @property
    def submitted(self) -> int:
        return len(self.wal) + len(self.queue)

    @property
    def applied_pos(self) -> int:
        """WAL entries applied to the state (and that relays may send)."""
        return self.durable if self.wal_mode == "fsync" else len(self.wal)

    @property
    def pending(self) -> bool:
        """Journal.pending: entries submitted and not yet applied."""
        return bool(self.queue) or self.applied_pos < len(self.wal)

    def links(self) -> list[str]:
        return self.peers if self.in_effect is None else self.in_effect

    def wall_us(self) -> int:
        return WALL_BASE_US + self.cluster.now * TICK_US + self.skew_us

    # --- journal ----------------------------------------------------------------------
    def submit(self, entry: list[Txn]) -> None:
        assert self.ready and entry
        self.queue.append(entry)

    def write_some(self, n: int) -> None:
        new = self.queue[:n]
        self.wal.extend(new)
        del self.queue[:n]
        if self.wal_mode == "write":
            self._apply([t for e in new for t in e], on_disk=False)

    def sync(self) -> None:
        """fsync. wal_mode fsync: then apply and commit as synced; wal_mode write: the journal's
        periodic fsync of the written tail (Journal._sync_written), then `core.mark_synced`."""
        new = self.wal[self.durable:]
        self.durable = len(self.wal)
        if self.wal_mode == "fsync":
            self._apply([t for e in new for t in e], on_disk=True)
        else:
            self.core.mark_synced(self.core.vclock.copy())

    def _apply(self, txns: list[Txn], on_disk: bool) -> None:
        """The store's apply of a batch (Store.apply: apply_entries, one apply_txns per run of
        txns; apply_txns is apply_txn on each), then the commit of its tops."""
        if txns:
            apply_txns(self.state, txns, self.uuid)
        self.core.commit_tops(txn_tops(txns), on_disk=on_disk)

    def flush(self) -> None:
        self.write_some(len(self.queue))
        self.sync()

    # --- lifecycle ----------------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild state and core from the base and the WAL on disk, as a restart does. The store
        opens with own_history_lsn = lsn_max if its meta holds a `rebuilt` fence (Store.__init__:
        its ids are the donor's, so all its own `_cluster` rows replay as history), else the
        meta's: a fence over its own store, as one this start set (server.start: loss_at_open),
        keeps the members it registered. FenceKeeper.restore then takes the fence up (`rebuilt`
        from its kind), with the members this node registered itself and those the operator
        gave up on; a rebuilt fence holds every own row as history while it stands."""
        assert self.base is not None
        fence = self.meta.get("own_fence")
        rebuilt = self.meta.get("fence_kind") == "rejoin"
        history = int(self.meta.get("own_history_lsn") or 0)
        at_open = limits.lsn_max if fence and rebuilt else history
        self.state = SimState(self.base, at_open)
        # as Store.install_records: the HLC starts above every record of the snapshot
        hlc = max([self.base.hlc] + [r[3] for recs in self.base.data.values() for r in recs.values()])
        for entry in self.wal[self.base_pos:self.durable]:
            for t in entry:
                apply_txn(self.state, t, self.uuid)
                hlc = max(hlc, t.timestamp)
        self.core = NodeCore(self.uuid, self.state.table.copy(), self.state.vclock, hlc_last=hlc,
                             spaces={n: d[0] for n, d in self.state.spaces.items()}, own_history_lsn=history)
        self.core.knowledge = dict(self.state.knowledge)
        if fence:                                   # FenceKeeper.restore
            meta = {"reason": fence, "rebuilt": rebuilt, "given_up": self.meta.get("given_up")}
            if take_up_fence(self.core, meta, self.registered, self.anon_followers):
                self.state.own_history_lsn = limits.lsn_max
        self.holds = dict(self.holds_disk)         # Retention.load
        own = self.core.claimed.get(self.core.self_id)     # Retention.load
        self.anon_followers.update(followers_at_start(self.anon_followers, own, self.core.fence is not None))
        self.reach = FollowerReach.load(self.anon_followers, own, self.core.fence is not None)
        self.status = "running"

    def install(self, base: Base) -> None:
        assert self.base is None and not self.wal
        self.base = base
        self.wal_vc0 = dict(base.vclock)
        self._gc_vc = dict(base.vclock)
        self.wal_start = {k: v for k, v in base.vclock.items() if k}
        self.recover()

    def lose_power(self) -> int:
        """The queue and whatever is not on disk are gone; returns how many entries."""
        lost = len(self.queue) + len(self.wal) - self.durable
        self.queue.clear()
        del self.wal[self.durable:]
        self.holds_disk = {u: h for u, h in self.holds_disk.items() if u in self._holds_synced}
        self.power_lost = True
        return lost

    def lose_disk(self) -> None:
        """The store and the WAL are gone; the uuid and the identity file stay."""
        self.queue.clear()
        self.wal, self.durable, self.base_pos, self.wal_gc = [], 0, 0, 0
        self.base, self.state, self.core = None, None, None
        self.wal_vc0, self._gc_vc, self.gc_vclock = {}, {}, {}
        self.holds, self.holds_disk, self._holds_synced = {}, {}, set()
        self.meta = {}

    def snapshot(self) -> Base:
        """store.snapshot(): replicated spaces and data, `_cluster`, vclock without 0."""
        st = self.state
        spaces = {n: d for n, d in st.spaces.items() if not d[0]}
        return Base(st.table.rows(), {k: v for k, v in st.vclock.items() if k != 0}, spaces,
                    {n: {k: list(r) for k, r in st.data.get(n, {}).items()} for n in spaces})

    # --- WAL retention (node/retention.py; the rules are node/core/holds.py's Holds) -------
    @property
    def holds(self) -> dict[str, Hold]:
        """Retention.holds, in memory."""
        return self.book.by_uuid

    @holds.setter
    def holds(self, holds: dict[str, Hold]) -> None:
        self.book = Holds(holds)

    def _wal_start(self) -> dict[int, int]:
        """Retention._oldest: where the WAL still here starts."""
        return {k: v for k, v in self._gc_vc.items() if k}

    def _written(self, hold: Hold | None) -> bool:
        """Retention._written: a hold a JOIN or a SUBSCRIBE set is written at once; synced as
        Hold.sync_when_set says, or by the store itself in wal_mode fsync."""
        if hold is None:
            return False
        self.holds_disk = dict(self.holds)
        if hold.sync_when_set or self.wal_mode == "fsync":
            self._holds_synced = set(self.holds_disk)
        return True

    def hold_all(self, uuid: str, anon: bool, now: int) -> None:
        """Retention.hold_all: from the start of the oldest WAL entry still here."""
        if self._written(self.book.hold_all(uuid, anon, self._wal_start(), self.core.table, now)):
            self.joining.add(uuid)

    def on_subscribe(self, uuid: str, durable: dict[int, int], anon: bool, now: int) -> bool:
        """Retention.on_subscribe; whether the hold was set."""
        self.joining.discard(uuid)
        return self._written(self.book.on_subscribe(uuid, durable, anon, self.core.table, now))

    def on_ack(self, uuid: str, durable: dict[int, int], anon: bool, now: int) -> None:
        """Retention.on_ack."""
        self.book.on_ack(uuid, durable, anon, self.core.table, now)

    @property
    def lapse(self) -> bool:
        """Every hold here lapses with the TTL (node.core.holds.lapsing; Retention._lapse)."""
        core = self.core
        return lapsing(core.anon, core.claimed.get(core.self_id))

    def checkpoint(self, now: int, anon_ttl: int, reading: list[int], new_members: bool = True) -> int:
        """Retention.checkpoint: the state becomes the base (synced), the holds are written,
        and the WAL entries below every hold are collected. `reading`: the cursors of the
        relays streaming from this node; `new_members` False: the rule before issue 16 (no hold
        for a member that never subscribed). Returns how many entries were collected."""
        st, core = self.state, self.core
        synced = dict(st.vclock.items())
        # (the records are shared, not copied: neither a state nor a base changes a record in
        # place, SimState.put and its replacer store a new list)
        self.base = Base(st.table.rows(), dict(synced), dict(st.spaces),
                         {n: dict(d) for n, d in st.data.items()}, dict(st.knowledge), core.hlc.last)
        self.base_pos = self.applied_pos
        self.durable = max(self.durable, self.base_pos)
        core.mark_synced(st.vclock.copy())
        lapse = self.lapse                  # (new holds change neither the core's table nor its clocks)
        if new_members:
            self.book.hold_for_new_members(self.uuid, core.table, self._wal_start, now, lapse)
        keep = keep_vclock(synced, self.book.positions(core.table, now, anon_ttl, lapse))
        if core.fence is None:
            for uuid in followers_to_forget(self.anon_followers, self.book.by_uuid, core.table, now, anon_ttl,
                                            self.reach, core.self_id)[0]:
                del self.anon_followers[uuid]
                self.reach.forget(uuid)
        limit = min([len(self.wal) - 1] + reading)     # the current segment, segments being read
        i, vc = self.wal_gc, dict(self._gc_vc)
        while i < limit:
            nxt = dict(vc)
            for t in self.wal[i]:
                c = 0 if t.group == GROUP_LOCAL else t.replica_id
                if t.last_lsn > nxt.get(c, 0):
                    nxt[c] = t.last_lsn
            if not collectable_before(nxt, keep):
                break
            i, vc = i + 1, nxt
        self.holds_disk = dict(self.holds)
        self._holds_synced = set(self.holds_disk)
        collected = i - self.wal_gc
        if collected:
            self.wal_gc, self._gc_vc = i, vc
            self.gc_vclock = {rid: lsn for rid, lsn in vc.items() if rid}
        return collected
