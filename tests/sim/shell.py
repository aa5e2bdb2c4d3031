"""The membership shell of a simulated node: greetings (Node.greeting / check_peer_greeting),
the own-rows fence (node/fence.py FenceKeeper), the rejoin (node/rejoin.py Rejoiner) and the
loss a start sees (FenceKeeper.loss_at_open). The decisions are the production ones: the rejoin
machine (node.core.lifecycle_rejoin), the fence and own-rows claim rules
(node.core.lifecycle_fence), node.core.membership and NodeCore; what is here is the simulated
node's IO around them (its meta, its network, its store), each naming the function it stands for.
The links run the production link machines (node/core/link/: tests/sim/links.py).

Time here is in ticks: a tick stands for about a heartbeat, so the shell's intervals in
seconds are scaled down to a few ticks (REJOIN_RETRY, REJOIN_COVER_WAIT); the fence is
polled every tick (fence_poll_s).

The rebuild is a generator, stepped once per tick, so that it reads like the async code it
stands for: each `yield` is an await that lets the rest of the cluster run.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core import lifecycle_fence as fence_rules
from node.core.lifecycle_fence import hear_greeting, own_history_lsn
from node.core.link.ready import EMPTY
from node.core.lifecycle_rejoin import RejoinMachine, RejoinState, anon_rejoin_id, link_takes, member_snapshot
from node.core.lifecycle_rejoin_events import NoRebuild, ProbeDonor, Probed, RebuildFailed, Rebuilt, Status
from node.core.membership import expel_bounds, greeting_expel_bounds

if TYPE_CHECKING:
    from tests.sim.harness import Cluster, Conn
    from tests.sim.simnode import Base, SimNode

_IDLE = RejoinState.IDLE
REJOIN_RETRY = 20          # limits.rejoin_retry_s
REJOIN_COVER_WAIT = 30     # limits.rejoin_cover_wait_s
CLUSTER_NAME = "sim"


def resolve(address: str) -> str:
    """A peer address -> the node's name: "B" and its other spelling "B'" are one node."""
    return address.rstrip("'")


# --- greetings ----------------------------------------------------------------------------
def greeting(n: "SimNode") -> dict:
    """Peering.greeting, with what the membership rules read: the cluster, its `_cluster`, the
    vclock by uuid. `own_history_lsn`: its own `_cluster` rows up to there are an earlier
    incarnation's (all of them while a rebuilt store is fenced: Peering.own_history_lsn);
    peers take no ids from them (Peer.history_lsn). Built again only when something it is
    made of changed (`greeting_key`); its readers only read it."""
    key = greeting_key(n)
    if n.greeting_cache is not None and n.greeting_cache[0] == key:
        return n.greeting_cache[1]
    g = _greeting(n)
    n.greeting_cache = (key, g)
    return g


def greeting_key(n: "SimNode") -> tuple:
    """What a greeting is made of: the node's identity and status, and its core's clocks
    (vclock_by_uuid), table (a `_cluster` change is a claim: `claimed` grows) and fence. A core's
    clocks only grow, so their signatures (sums) stand for them."""
    core = n.core
    if core is None:
        return (None, n.uuid, n.anon, n.addr, n.identity_active)
    return (core, n.uuid, n.anon, n.addr, n.status, n.cluster.cluster_uuid, core.vclock.signature, core.claimed.signature,
            len(core.table), core.fence is not None and core.fence.rebuilt, core.own_history_lsn,
            len(core.fence.expelled) if core.fence is not None else -1,
            core.synced.signature if core.bounds_ahead else 0)


def _greeting(n: "SimNode") -> dict:
    core = n.core
    g = {"uuid": n.uuid, "cluster_uuid": None, "cluster_name": CLUSTER_NAME, "options_digest": "", "options": {},
         "anon": n.anon, "address": n.addr, "status": "joining", "vclock_uuid": {}, "cluster": [],
         "own_history_lsn": 0}
    if core is not None:
        rows = core.greeting_rows()
        if core.bounds_ahead:
            n.cluster.stats["greetings stating a bound as far as on disk"] += 1
        g.update(cluster_uuid=n.cluster.cluster_uuid, status=n.status, vclock_uuid=core.vclock_by_uuid(core.claimed),
                 cluster=rows,
                 own_history_lsn=own_history_lsn(core))
        heard = core.expels_heard()
        if heard:
            g["expels_heard"] = heard
    elif n.identity_active:               # its store lost, its identity kept (Lifecycle.greeting_fields)
        g["member_of"] = n.cluster.cluster_uuid
    return g


def observe(n: "SimNode", theirs: dict) -> None:
    """Node.check_peer_greeting: the fence hears the peer, and `own_claims` remembers how many
    of our rows it says it holds; a peer whose claim a stream belied is not heard again
    (node.core.lifecycle_fence.hear_greeting)."""
    if n.core is not None:
        hear_greeting(n.core, n.own_claims, n.claims_disproved, theirs, n.uuid)


def own_rows_awaited(c: "Cluster", n: "SimNode") -> int:
    """Peering.own_rows_awaited: the most of our rows an upstream (only one can send them back)
    says it holds beyond what we have claimed; 0 if none."""
    upstreams = {c.nodes[resolve(a)].uuid for a in n.appliers}
    awaited = fence_rules.own_rows_awaited(n.own_claims, n.core.claimed.get(n.core.self_id), upstreams)
    return awaited[0] if awaited else 0


def disprove_claim(c: "Cluster", n: "SimNode", peer: "SimNode", have: int) -> None:
    """Peering.disprove_claim (the applier machine's DisproveClaim): the relay caught this node
    up without the rows of ours its greeting claimed: its claim holds neither our writes nor
    our fence (node.core.lifecycle_fence.disprove_claim)."""
    claimed = fence_rules.disprove_claim(n.own_claims, n.claims_disproved, n.core.fence, peer.uuid, have)
    c.stats["claims_disproved"] += 1
    c.log(f"{n}: {peer} said it holds its rows up to {claimed} and sent them only up to {have}: not believed")


# --- the own-rows fence (node/fence.py) ----------------------------------------------------------
def loss_at_open(n: "SimNode") -> str | None:
    """FenceKeeper.loss_at_open, for a restart of a store with data (an anonymous replica's
    start looks for no loss: Opening.open): a power loss is a new boot id."""
    if n.anon:
        return None
    return fence_rules.loss_at_open(fenced=bool(n.meta.get("own_fence")), wal_mode=n.wal_mode, wal_present=True,
                                    was_running=bool(n.meta.get("running")), boot_before="boot",
                                    boot_now="boot after a power loss" if n.power_lost else "boot")


def set_fence(n: "SimNode", reason: str, kind: str = "rejoin") -> None:
    """FenceKeeper.set: persisted before anything else happens. `kind`: "power" for a loss a
    start found (loss_at_open: the store is the same, it lost a tail), "rejoin" for a store
    rebuilt from a snapshot under an identity that wrote before."""
    n.meta["own_fence"] = reason
    n.meta["fence_kind"] = kind


def try_lift(c: "Cluster", n: "SimNode") -> bool:
    """FenceKeeper.try_lift + _lift: whether the fence is gone. A rebuilt store's fence states
    its whole table again when it lifts (NodeCore.clear_fence); the expels the operator asked for
    while it stood are written then (Node.after_fence). A lifted fence ends the own-rows-only
    subscriptions (the applier's Resubscribe)."""
    core = n.core
    if core is None or core.fence is None:
        return True
    rebuilding = n.rejoiner is not None and n.rejoiner.machine.state is RejoinState.REBUILDING
    if c.rules["fence"] and not fence_rules.may_lift(core, rebuilding):
        if rebuilding and fence_rules.may_lift(core):
            c.stats["fence lifts deferred by a rebuild"] += 1
        return False
    lifted = fence_rules.lift(core, n.wall_us(), n.meta.get("given_up"))
    restate, given_up = lifted.restate, lifted.given_up
    n.meta["own_fence"] = n.meta["fence_kind"] = n.meta["given_up"] = None
    n.meta["own_history_lsn"] = n.state.own_history_lsn = lifted.own_history_lsn
    if restate is not None:
        n.submit([restate])
    c.log(f"{n} lifts its own-rows fence (own rows up to {core.own_history_lsn} are history)"
          + (f"; it states its table again at lsn {restate.lsn}" if restate is not None else ""))
    c.stats["fences_lifted"] += 1
    for u, address in fence_rules.expels_after_lift(core, given_up):
        _, txn = core.register_member(u, address, n.wall_us(), state=STATE_EXPELLED)
        if txn is not None:
            n.submit([txn])
            c.stats["pending_expels_written"] += 1
            c.log(f"{n} writes the expel of {u[:8]} it was asked for while fenced")
    for conn in list(c.conns.values()):
        if conn.client == n.name and conn.kind == "sub" and conn.fenced:
            c.break_conn(conn, "own rows confirmed: subscribing for every origin", 0)
    return True


# --- rejoin (node/rejoin.py) -----------------------------------------------------------------------
class Rejoiner:
    """node/rejoin.py Rejoiner: a driver of the real rejoin machine (node.core.lifecycle_rejoin),
    with the simulated network for the probes and a simulated store for the rebuild. Time is
    the tick; the machine ticks once per tick (Rejoiner.watch).

    `rules["cover"]` False turns the machine's cover rules back on this node's instance (the
    rejoin before issue 16: at once, from any donor, even while an upstream streams)."""

    def __init__(self, c: "Cluster", n: "SimNode"):
        self.c, self.n = c, n
        self.machine = RejoinMachine(self, retry_s=REJOIN_RETRY, cover_wait_s=REJOIN_COVER_WAIT, cover_poll_s=1)
        if not c.rules["cover"]:
            self.machine.caught_up = lambda: False
            self.machine.fed = lambda wanted: False
            self.machine.uncovered = lambda have, theirs, bounds=None: {}
        self._rebuilding: Iterator | None = None
        self.snapshot: "Base | None" = None        # what the rebuild's JOIN brought
        self.conn: "Conn | None" = None

    need = property(lambda self: self.machine.need)
    blocked = property(lambda self: self.machine.blocked)
    task = property(lambda self: self.machine if self.machine.running else None)   # an attempt under way

    def on_need_rejoin(self, address: str, reason: str, collected: dict[str, int] | None = None) -> None:
        self.machine.note_need(address, reason, collected)

    def on_follow(self, address: str) -> None:
        self.machine.note_follow(address)

    def on_duplicate(self, address: str) -> None:
        self.machine.note_duplicate(address)

    # --- what the machine reads (RejoinContext) --------------------------------------------------
    def core(self):
        return self.n.core

    def may_rejoin(self) -> bool:
        n = self.n
        return n.status == "running" and n.core is not None and not n.proc

    def upstreams(self) -> dict:
        return {addr: (a.status == "follow" and a.conn is not None, a.peer_vclock)
                for addr, a in self.n.appliers.items()}

    def peers(self) -> list[str]:
        return list(self.n.peers)

    def journal_pending(self) -> int:
        return int(bool(self.n.pending))

    # --- acting on it -----------------------------------------------------------------------------
    def step(self) -> None:
        """Rejoiner.watch, once per tick. (An idle machine with no need noted and nothing gone
        without does nothing on its tick, and its outbox was emptied by the last `_act`: nothing
        else steps it.)"""
        machine = self.machine
        if self._rebuilding is None and machine.state is _IDLE and not machine.need and not machine.without:
            return
        if self._rebuilding is not None:
            self._advance_rebuild()
        else:
            self.machine.tick(self.c.now)
        self._act()

    def _act(self) -> None:
        machine = self.machine
        while (rd := machine.ready()) is not EMPTY:      # (nothing pending: the one EMPTY Ready)
            for note in rd.apply:
                self._show(note)
            for e in rd.effects:
                if type(e) is ProbeDonor:
                    machine.step(self.probe(e.address), self.c.now)
                else:
                    self._rebuilding = self.rebuild(e.address, e.donor_anon, e.discarding)
                    self._advance_rebuild()
            machine.advance(rd)

    def _show(self, note) -> None:
        c, n = self.c, self.n
        if type(note) is Status:
            n.status = note.status
        elif type(note) is NoRebuild:
            c.stats["rebuilds_skipped_caught_up"] += 1
            c.log(f"{n} caught up past what was collected while looking for a donor: no rebuild")
        elif note.on_links:
            c.stats["rejoins_blocked"] += 1
            c.log(f"{n} cannot rejoin: {note.why}")
        else:
            c.stats["rejoins_failed"] += 1
            c.log(f"{n}: {note.why}")

    def _advance_rebuild(self) -> None:
        try:
            next(self._rebuilding)
        except StopIteration:
            self._rebuilding = None

    def probe(self, address: str) -> Probed:
        """applier.probe: a greeting exchange with a running member (both sides observe)."""
        c, n = self.c, self.n
        d = c.nodes.get(resolve(address))
        if d is None or d is n or not d.ready or d.proc or not c.reachable(n.name, d.name):
            return Probed(address, None)
        theirs = greeting(d)
        observe(d, greeting(n))
        observe(n, theirs)
        if theirs["status"] != "running":
            return Probed(address, None)
        link = next((x.relay for x in c.conns.values() if x.client == d.name and x.server == n.name and x.streaming),
                    None)
        if not c.rules["cover_links"]:   # before session 49: any link of the donor's, whatever it takes, was waited for
            return Probed(address, theirs["vclock_uuid"], receiving=link is not None,
                          bounds=greeting_expel_bounds(theirs), anon=theirs["anon"], uuid=theirs["uuid"])
        receiving, without = link_takes(link)
        return Probed(address, theirs["vclock_uuid"], receiving=receiving, bounds=greeting_expel_bounds(theirs),
                      anon=theirs["anon"], uuid=theirs["uuid"], receiving_without=without)

    def rebuild(self, address: str, donor_anon: bool = False, discarding: tuple = ()) -> Iterator[None]:
        """Rejoiner._rebuild: links down, journal drained, a JOIN (FETCH_SNAPSHOT for an
        anonymous replica, or from one: `donor_anon`) into a side store that must cover this
        node, then the swap."""
        c, n = self.c, self.n
        c.log(f"{n} rebuilds its store from {address}'s snapshot")
        anon, prev_id = n.core.anon, n.core.self_id
        n.in_effect = []                              # node.set_peers([])
        c.apply_links(n)
        while n.pending:
            yield
        mine = self.machine.mine()
        claimed = n.core.claimed.copy()               # nothing more may be claimed: the swap would lose it
        self.snapshot = None
        self.conn = c.open_request("fetch" if anon or donor_anon else "rejoin", n, c.nodes[resolve(address)])
        while self.conn.open and self.snapshot is None:
            yield
        snap, self.conn = self.snapshot, None
        why = None
        if snap is None:
            why = "the link broke"
        else:
            if donor_anon and not anon:
                snap.table_rows, snap.vclock = member_snapshot(snap.table_rows, snap.vclock)
            table = ClusterTable(Member.from_row(r) for r in snap.table_rows)
            if anon:
                my_id = anon_rejoin_id(table, n.uuid, prev_id)
                snap.table_rows = [r for r in snap.table_rows if r[0] != n.uuid]
                snap.table_rows.append([n.uuid, my_id, n.addr, STATE_ANON, 0])
            elif table.get(n.uuid) is None or table.get(n.uuid).state != STATE_MEMBER:
                why = "the snapshot does not register this node"
            if why is None:
                uncovered = self.machine.snapshot_uncovered(mine, {m.uuid: snap.vclock.get(m.id, 0)
                                                                   for m in table.members()}, expel_bounds(table))
                why = None if uncovered is None else f"the snapshot {uncovered}"
        if why is not None:
            n.in_effect = None
            self.machine.step(RebuildFailed(address, why), c.now)
            return
        assert n.core.claimed == claimed, f"{n} claimed rows while its snapshot came: {claimed} -> {n.core.claimed}"
        if donor_anon and not anon:
            c.stats["members rebuilt from an anonymous replica"] += 1
        if discarding:
            c.stats["rebuilds that discard rows the operator let go"] += 1
            c.log(f"{n} discards, as the operator let it: " + ", ".join(
                f"{c.by_uuid[u].name}'s rows {got + 1}-{have}" for u, have, got in discarding))
        c.swap_after_rejoin(n, carry_over(n, snap, keep_local=c.rules["keep_local"]), anon,
                            {u for u, _, _ in discarding})
        n.donor_uuid, n.installed_at = c.nodes[resolve(address)].uuid, c.now
        if not anon and not donor_anon:         # (an anonymous donor's holds last its TTL)
            c.checker.on_held(c.nodes[resolve(address)], n)
        self.machine.step(Rebuilt(address), c.now)


def carry_over(n: "SimNode", snap: "Base", keep_local: bool = True) -> "Base":
    """Rejoiner._carry_over: what the snapshot lacks is carried: this node's local spaces and
    their records, its local component, its meta (not the fence, not the old gc_vclock, not the
    WAL holds), and
    `gc_vclock` = the snapshot's vclock; `own_history_lsn` covers the snapshot's own rows.
    keep_local=False: the rejoin before issue 16, which wiped the local spaces too. A fence
    stands, now `rebuilt` (the donor covering this node says nothing of how many of its rows
    the other members hold; its ids are the donor's, so own rows coming back are history)."""
    st = n.state
    for name, d in st.spaces.items() if keep_local else ():
        if d[0]:
            snap.spaces[name] = d
            snap.data[name] = {k: list(r) for k, r in st.data.get(name, {}).items()}
    if st.vclock.get(0) and keep_local:
        snap.vclock[0] = st.vclock.get(0)
    snap.hlc = max(snap.hlc, n.core.hlc.last)
    table = ClusterTable(Member.from_row(r) for r in snap.table_rows)
    me = table.get(n.uuid)
    own = snap.vclock.get(me.id, 0) if me is not None else 0
    if n.meta.get("own_fence"):
        n.meta["fence_kind"] = "rejoin"
    n.holds_disk, n._holds_synced = {}, set()      # "acks" are not carried: they speak the old ids
    n.meta["own_history_lsn"] = max(int(n.meta.get("own_history_lsn") or 0), own)
    return snap
