"""The membership shell of a simulated node, copied from the real one where the core has no
function for it: greetings (Node.greeting / check_peer_greeting), the own-rows fence
(node/fence.py FenceKeeper), the rejoin (node/rejoin.py Rejoiner) and the loss a start sees
(FenceKeeper.loss_at_open). Each copy names the function it mirrors; the rules themselves are
the real ones (node.core.membership, NodeCore). Issue 18 replaces these copies with shared
protocol machines.

Time here is in ticks: a tick stands for about a heartbeat, so the shell's intervals in
seconds are scaled down to a few ticks (REJOIN_RETRY, REJOIN_COVER_WAIT); the fence is
polled every tick (fence_poll_s).

The rejoin is a generator, stepped once per tick, so that it reads like the async code it
copies: each `yield` is an await that lets the rest of the cluster run.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member
from node.core.membership import uncovered

if TYPE_CHECKING:
    from tests.sim.harness import Cluster, Conn
    from tests.sim.simnode import Base, SimNode

REJOIN_RETRY = 20          # limits.rejoin_retry_s
REJOIN_COVER_WAIT = 30     # limits.rejoin_cover_wait_s


def resolve(address: str) -> str:
    """A peer address -> the node's name: "B" and its other spelling "B'" are one node."""
    return address.rstrip("'")


# --- greetings ----------------------------------------------------------------------------
def greeting(n: "SimNode") -> dict:
    """Node.greeting, the fields the membership rules read."""
    core = n.core
    return {"uuid": n.uuid, "anon": n.anon, "status": n.status if core is not None else "joining",
            "vclock_uuid": core.vclock_by_uuid() if core is not None else {},
            "cluster": core.table.rows() if core is not None else []}


def history_bound(n: "SimNode") -> int:
    """Its own `_cluster` rows up to here state an earlier incarnation's ids (those received while
    it is fenced after a rebuilt store too). Only the workaround "peer_history_ids" reads it."""
    core = n.core
    if core is None:
        return 0
    fenced = core.fence is not None and n.meta.get("fence_kind") == "rejoin"
    return max(int(n.meta.get("own_history_lsn") or 0), core.claimed.get(core.self_id) if fenced else 0)


def observe(n: "SimNode", theirs: dict) -> None:
    """Node.check_peer_greeting: the fence hears the peer (FenceKeeper.on_greeting), and
    `own_lsn_seen` remembers how many of our rows it holds."""
    core = n.core
    if core is None:
        return
    vu = theirs.get("vclock_uuid") or {}
    if core.fence is not None and not theirs.get("anon"):
        core.observe_peer(theirs["uuid"], vu, theirs.get("cluster") or [])
        if "fence_hears_all" in n.cluster.workarounds:
            # the workaround: a member this node's table lacks is heard too, and every member a
            # greeting lists is waited for (its table may lack a member its earlier self registered)
            core.fence.hear(theirs["uuid"], int(vu.get(n.uuid, 0)))
            n.fence_members.update(r[0] for r in theirs.get("cluster") or ()
                                   if len(r) > 3 and r[3] == STATE_MEMBER and r[0] != n.uuid)
    own = vu.get(n.uuid)
    if isinstance(own, int) and own > n.own_lsn_seen:
        n.own_lsn_seen = own


# --- the own-rows fence (node/fence.py) ----------------------------------------------------------
def loss_at_open(n: "SimNode") -> str | None:
    """FenceKeeper.loss_at_open, for a restart of a store with data: the machine restarted
    (a power loss) while this node ran with wal_mode = write."""
    if n.meta.get("own_fence") or n.anon:
        return None
    if n.wal_mode == "write" and n.power_lost and n.meta.get("running"):
        return "the machine restarted while this node ran with wal_mode = write"
    return None


def set_fence(n: "SimNode", reason: str, kind: str = "rejoin") -> None:
    """FenceKeeper.set: persisted before anything else happens. `kind`: "power" for a loss a
    start found (loss_at_open: the store is the same, it lost a tail), "rejoin" for a store
    rebuilt from a snapshot under an identity that wrote before."""
    n.meta["own_fence"] = reason
    n.meta["fence_kind"] = kind


def waiting_beyond_table(n: "SimNode") -> list[str]:
    """The workaround "fence_hears_all": members other greetings list that have not been heard."""
    fence = n.core.fence
    return sorted(u for u in n.fence_members if u not in fence.heard and u not in fence.expelled
                  and ((m := n.core.table.get(u)) is None or m.state == STATE_MEMBER))


def try_lift(c: "Cluster", n: "SimNode") -> bool:
    """FenceKeeper.try_lift + _lift: whether the fence is gone. A lifted fence ends the
    own-rows-only subscriptions (the applier's Resubscribe)."""
    core = n.core
    if core is None or core.fence is None:
        return True
    if not c.rules["fence"] or (core.fence_state()[0] and not waiting_beyond_table(n)):
        history = core.clear_fence()
        if n.meta.get("fence_kind") == "power" and "replay_own_rows" in c.workarounds:
            history = int(n.meta.get("own_history_lsn") or 0)   # the store's own rows stay its own
        n.meta["own_fence"] = n.meta["fence_kind"] = None
        n.meta["own_history_lsn"] = history
        n.state.own_history_lsn = history
        c.log(f"{n} lifts its own-rows fence (own rows up to {history} are history)")
        c.stats["fences_lifted"] += 1
        for conn in list(c.conns.values()):
            if conn.client == n.name and conn.kind == "sub" and conn.fenced:
                c.break_conn(conn, "own rows confirmed: subscribing for every origin", 0)
        return True
    return False


# --- rejoin (node/rejoin.py) -----------------------------------------------------------------------
class Rejoiner:
    """node/rejoin.py Rejoiner: `need_rejoin` decides nothing alone; a node rebuilds only
    when no upstream streams, and only from a donor that covers it."""

    def __init__(self, c: "Cluster", n: "SimNode"):
        self.c, self.n = c, n
        self.need: dict[str, str] = {}
        self.collected: dict[str, list[str]] = {}  # address -> uuids of the components it collected
        self.blocked = ""
        self.attempts = 0
        self.last_try = 0
        self.task: Iterator | None = None
        self.snapshot: "Base | None" = None        # what the rebuild's JOIN brought
        self.conn: "Conn | None" = None

    def on_need_rejoin(self, address: str, reason: str, collected: list[str] | None = None) -> None:
        self.need[address] = reason
        self.collected[address] = list(collected or [])

    def on_follow(self, address: str) -> None:
        self.need.pop(address, None)

    def step(self) -> None:
        """Rejoiner.watch, once per tick."""
        if self.task is not None:
            try:
                next(self.task)
            except StopIteration:
                self.task = None
            return
        n, c = self.n, self.c
        self.need = {a: r for a, r in self.need.items() if a in n.appliers}
        if not self.need or n.status != "running" or n.core is None or n.proc:
            return
        if self.attempts and c.now - self.last_try < REJOIN_RETRY:
            return
        if c.rules["cover"] and self.fed():
            return                           # the rows come from a streaming upstream
        self.last_try = c.now
        self.attempts += 1
        self.task = self.attempt()
        self.step()

    def fed(self) -> bool:
        """Whether an upstream streams to this node (Rejoiner.watch). The workaround
        "rejoin_unless_fed": only one that is ahead of this node in a component a refusing
        upstream collected counts (one that lacks those rows too would keep it waiting for ever)."""
        c, n = self.c, self.n
        following = [a for a in n.appliers.values() if a.status == "follow" and a.conn is not None]
        if "rejoin_unless_fed" not in c.workarounds:
            return bool(following)
        wanted = {u for a in self.need for u in self.collected.get(a, ())}
        mine = n.core.vclock_by_uuid()
        for a in following:
            theirs = c.nodes[a.conn.server].core.vclock_by_uuid()
            if any(theirs.get(u, 0) > mine.get(u, 0) for u in wanted):
                return True
        return False

    def has_needed(self, theirs: dict[str, int], mine: dict[str, int]) -> bool:
        """The workaround "donor_has_needed": a donor is worth a rebuild only if it has more of a
        component a refusing upstream collected than this node has."""
        if "donor_has_needed" not in self.c.workarounds or not self.c.rules["cover"]:
            return True
        wanted = {u for a in self.need for u in self.collected.get(a, ())}
        return not wanted or any(theirs.get(u, 0) > mine.get(u, 0) for u in wanted)

    def mine(self) -> dict[str, int]:
        """What this node holds, by uuid. The workaround "expelled_not_uncovered": an expelled
        member's rows past the bound this node accepts count as refused, so a donor without them
        still covers it; "anon_own_not_uncovered": an anonymous replica's private component
        (its own `_cluster` rows) is not asked of a donor."""
        n = self.n
        mine = n.core.vclock_by_uuid()
        if "anon_own_not_uncovered" in self.c.workarounds and n.core.anon:
            mine.pop(n.uuid, None)         # its private component: no member ever has it
        if "expelled_not_uncovered" in self.c.workarounds:
            for u in list(mine):
                m = n.core.table.get(u)
                if m is not None and m.state == STATE_EXPELLED:
                    mine[u] = min(mine[u], m.expelled_lsn)
        return mine

    def probe(self, address: str) -> dict | None:
        """applier.probe: a greeting exchange with a running member (both sides observe)."""
        c, n = self.c, self.n
        d = c.nodes.get(resolve(address))
        if d is None or d is n or not d.ready or d.proc or not c.reachable(n.name, d.name):
            return None
        theirs = greeting(d)
        observe(d, greeting(n))
        observe(n, theirs)
        return theirs if theirs["status"] == "running" else None

    def attempt(self) -> Iterator[None]:
        """Rejoiner.attempt: find a donor that covers this node and rebuild from it."""
        c, n = self.c, self.n
        mine = self.mine()
        order = list(self.need) + [a for a in n.peers if a not in self.need]
        best = None
        for address in order:
            theirs = self.probe(address)
            if theirs is None:
                continue
            missing = uncovered(mine, theirs["vclock_uuid"]) if c.rules["cover"] else {}
            if not missing and not self.has_needed(theirs["vclock_uuid"], mine):
                continue                     # the workaround "donor_has_needed": it would gain nothing
            donor = c.nodes[resolve(address)]
            if missing and any(x.client == donor.name and x.server == n.name and x.streaming
                               for x in c.conns.values()):
                n.status = "rejoining"       # writes pause while the donor receives our rows
                missing = yield from self.wait_covered(address, theirs)
                if missing:
                    n.status = "running"
            if not missing:
                yield from self.rebuild(address)
                return
            if best is None or len(missing) < len(best):
                best = missing
        self.blocked = "no covering donor" if best is not None else "no peer can give a snapshot now"
        c.stats["rejoins_blocked"] += 1
        c.log(f"{n} cannot rejoin: {self.blocked}")

    def wait_covered(self, address: str, theirs: dict) -> Iterator[None]:
        """Rejoiner._wait_covered: writes are paused; wait a while for the donor to have
        every row this node has."""
        c, n = self.c, self.n
        deadline = c.now + REJOIN_COVER_WAIT
        while True:
            while n.pending:
                yield
            missing = uncovered(self.mine(), theirs["vclock_uuid"])
            if not missing or c.now > deadline:
                return missing
            yield
            theirs = self.probe(address)
            if theirs is None:
                return missing

    def rebuild(self, address: str) -> Iterator[None]:
        """Rejoiner._rebuild: links down, journal drained, a JOIN (FETCH_SNAPSHOT for an
        anonymous replica) into a side store that must cover this node, then the swap."""
        c, n = self.c, self.n
        c.log(f"{n} rebuilds its store from {address}'s snapshot")
        n.status = "rejoining"
        anon, prev_id = n.core.anon, n.core.self_id
        n.in_effect = []                              # node.set_peers([])
        c.apply_links(n)
        while n.pending:
            yield
        mine = self.mine()
        self.snapshot = None
        self.conn = c.open_request("fetch" if anon else "rejoin", n, c.nodes[resolve(address)])
        while self.conn.open and self.snapshot is None:
            yield
        snap, self.conn = self.snapshot, None
        why = None
        if snap is None:
            why = "the link broke"
        else:
            table = ClusterTable(Member.from_row(r) for r in snap.table_rows)
            if anon and table.get(n.uuid) is not None and "anon_rebuild_known" in c.workarounds:
                pass                         # the workaround: a registration that went through stands
            elif anon:
                my_id = prev_id if table.by_id(prev_id) is None else table.lowest_free_id()
                snap.table_rows.append([n.uuid, my_id, n.addr, STATE_ANON, 0])
            elif table.get(n.uuid) is None:
                why = "the snapshot does not register this node"
            if why is None and c.rules["cover"]:
                theirs = {m.uuid: snap.vclock.get(m.id, 0) for m in table.members()}
                if uncovered(mine, theirs):
                    why = f"the snapshot does not cover this node ({uncovered(mine, theirs)})"
        if why is not None:
            n.status, n.in_effect = "running", None
            self.blocked = f"rebuilding from {address} failed: {why}"
            c.stats["rejoins_failed"] += 1
            c.log(f"{n}: {self.blocked}")
            return
        c.swap_after_rejoin(n, carry_over(n, snap, keep_local=c.rules["keep_local"]), anon)
        n.donor_uuid, n.installed_at = c.nodes[resolve(address)].uuid, c.now
        if not anon:
            c.checker.on_held(c.nodes[resolve(address)], n)
        self.need.clear()
        self.blocked = ""


def carry_over(n: "SimNode", snap: "Base", keep_local: bool = True) -> "Base":
    """Rejoiner._carry_over: what the snapshot lacks is carried: this node's local spaces and
    their records, its local component, its meta (not the fence, not the old gc_vclock, not the
    WAL holds), and
    `gc_vclock` = the snapshot's vclock; `own_history_lsn` covers the snapshot's own rows.
    keep_local=False: the rejoin before issue 16, which wiped the local spaces too. The
    workaround "rebuild_keeps_fence" carries the own-rows fence over (the donor covering this
    node says nothing of how many of its rows the other members hold)."""
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
    keep_fence = "rebuild_keeps_fence" in n.cluster.workarounds
    n.meta = {k: v for k, v in n.meta.items() if keep_fence or k not in ("own_fence", "fence_kind")}
    n.holds_disk, n._holds_synced = {}, set()      # "acks" are not carried: they speak the old ids
    n.meta["own_history_lsn"] = max(int(n.meta.get("own_history_lsn") or 0), own)
    return snap
