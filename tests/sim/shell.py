"""The membership shell of a simulated node, copied from the real one where the core has no
function for it: greetings (Node.greeting / check_peer_greeting), the own-rows fence
(node/fence.py FenceKeeper), the rejoin (node/rejoin.py Rejoiner) and the loss a start sees
(FenceKeeper.loss_at_open). Each copy names the function it mirrors; the rules themselves are
the real ones (node.core.membership, NodeCore, node/core/link/claims.py). Issue 18 replaces
these copies with shared machines (the links already run node/core/link/: tests/sim/links.py).

Time here is in ticks: a tick stands for about a heartbeat, so the shell's intervals in
seconds are scaled down to a few ticks (REJOIN_RETRY, REJOIN_COVER_WAIT); the fence is
polled every tick (fence_poll_s).

The rejoin is a generator, stepped once per tick, so that it reads like the async code it
copies: each `yield` is an await that lets the rest of the cluster run.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, ClusterTable, Member
from node import limits
from node.core.link import claims
from node.core.membership import expel_bounds, uncovered

if TYPE_CHECKING:
    from tests.sim.harness import Cluster, Conn
    from tests.sim.simnode import Base, SimNode

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
    peers take no ids from them (Peer.history_lsn)."""
    core = n.core
    g = {"uuid": n.uuid, "cluster_uuid": None, "cluster_name": CLUSTER_NAME, "options_digest": "", "options": {},
         "anon": n.anon, "address": n.addr, "status": "joining", "vclock_uuid": {}, "cluster": [],
         "own_history_lsn": 0}
    if core is not None:
        g.update(cluster_uuid=n.cluster.cluster_uuid, status=n.status, vclock_uuid=core.vclock_by_uuid(),
                 cluster=core.table.rows(),
                 own_history_lsn=limits.lsn_max if core.fence is not None and core.fence.rebuilt else core.own_history_lsn)
    return g


def observe(n: "SimNode", theirs: dict) -> None:
    """Peering.check_peer_greeting: the fence hears the peer (FenceKeeper.on_greeting: every
    member's greeting, with the members it lists), and `own_claims` remembers how many of our
    rows it says it holds (node/core/link/claims.py); a peer whose claim a stream belied is
    not heard again (6852e81)."""
    core = n.core
    if core is None or theirs["uuid"] in n.claims_disproved:
        return
    vu = theirs.get("vclock_uuid") or {}
    if core.fence is not None and not theirs.get("anon"):
        core.observe_peer(theirs["uuid"], vu, theirs.get("cluster") or [])
    claims.note_claim(n.own_claims, n.claims_disproved, theirs, n.uuid)


def own_rows_awaited(c: "Cluster", n: "SimNode") -> int:
    """Peering.own_rows_awaited: the most of our rows an upstream (only one can send them back)
    says it holds beyond what we have claimed; 0 if none."""
    upstreams = {c.nodes[resolve(a)].uuid for a in n.appliers}
    awaited = claims.own_rows_awaited(n.own_claims, n.core.claimed.get(n.core.self_id), upstreams)
    return awaited[0] if awaited is not None else 0


def disprove_claim(c: "Cluster", n: "SimNode", peer: "SimNode", have: int) -> None:
    """Peering.disprove_claim (the applier machine's DisproveClaim): the relay caught this node
    up without the rows of ours its greeting claimed: its claim holds neither our writes nor
    our fence."""
    claimed = claims.disprove_claim(n.own_claims, n.claims_disproved, n.core.fence, peer.uuid, have)
    c.stats["claims_disproved"] += 1
    c.log(f"{n}: {peer} said it holds its rows up to {claimed} and sent them only up to {have}: not believed")


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


def try_lift(c: "Cluster", n: "SimNode") -> bool:
    """FenceKeeper.try_lift + _lift: whether the fence is gone. A rebuilt store's fence states
    its whole table again when it lifts (NodeCore.clear_fence); the expels the operator asked for
    while it stood are written then (Node.after_fence). A lifted fence ends the own-rows-only
    subscriptions (the applier's Resubscribe)."""
    core = n.core
    if core is None or core.fence is None:
        return True
    if c.rules["fence"] and not core.fence_state()[0]:
        return False
    restate = core.clear_fence(n.wall_us())
    given_up = sorted(n.meta.get("given_up") or ())
    n.meta["own_fence"] = n.meta["fence_kind"] = n.meta["given_up"] = None
    n.meta["own_history_lsn"] = core.own_history_lsn
    n.state.own_history_lsn = core.own_history_lsn
    if restate is not None:
        n.submit([restate])
    c.log(f"{n} lifts its own-rows fence (own rows up to {core.own_history_lsn} are history)"
          + (f"; it states its table again at lsn {restate.lsn}" if restate is not None else ""))
    c.stats["fences_lifted"] += 1
    for u in given_up:
        mem = core.table.get(u)
        if mem is not None and mem.state != STATE_EXPELLED:
            _, txn = core.register_member(u, mem.address, n.wall_us(), state=STATE_EXPELLED)
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
    """node/rejoin.py Rejoiner: `need_rejoin` decides nothing alone; a node rebuilds only
    when no upstream streams, and only from a donor that covers it."""

    def __init__(self, c: "Cluster", n: "SimNode"):
        self.c, self.n = c, n
        self.need: dict[str, str] = {}
        self.needed: dict[str, dict[str, int]] = {}  # address -> what it collected, by uuid
        self.blocked = ""
        self.attempts = 0
        self.last_try = 0
        self.task: Iterator | None = None
        self.snapshot: "Base | None" = None        # what the rebuild's JOIN brought
        self.conn: "Conn | None" = None

    def on_need_rejoin(self, address: str, reason: str, collected: dict[str, int] | None = None) -> None:
        self.need[address] = reason
        self.needed[address] = dict(collected or {})

    def on_follow(self, address: str) -> None:
        self.need.pop(address, None)
        self.needed.pop(address, None)

    def step(self) -> None:
        """Rejoiner.watch, once per tick."""
        if self.task is not None:
            try:
                next(self.task)
            except StopIteration:
                self.task = None
            return
        n, c = self.n, self.c
        if not self.need:
            return
        self.need = {a: r for a, r in self.need.items() if a in n.appliers}
        self.needed = {a: x for a, x in self.needed.items() if a in self.need}
        if not self.need or n.status != "running" or n.core is None or n.proc:
            return
        wanted = self.wanted()
        if c.rules["cover"] and self.caught_up():
            return                           # caught up past what they collected: the links serve again
        if c.rules["cover"] and self.fed(wanted):
            return                           # the rows come from a streaming upstream
        if self.attempts and c.now - self.last_try < REJOIN_RETRY:
            return
        self.last_try = c.now
        self.attempts += 1
        self.task = self.attempt()
        self.step()

    def caught_up(self) -> bool:
        """Every upstream that said need_rejoin said what it collected, and this node has it."""
        return not self.wanted() and all(self.needed.get(a) for a in self.need)

    def wanted(self) -> dict[str, int]:
        """Rejoiner._wanted: the collected rows this node still lacks (uuid -> lsn to reach)."""
        have = self.n.core.vclock_by_uuid()
        out: dict[str, int] = {}
        for collected in self.needed.values():
            for u, lsn in collected.items():
                if lsn > have.get(u, 0):
                    out[u] = max(out.get(u, 0), lsn)
        return out

    def fed(self, wanted: dict[str, int]) -> bool:
        """Rejoiner._fed: a streaming upstream whose last greeting had what this node lacks (or
        some need was not said)."""
        following = [a for a in self.n.appliers.values() if a.status == "follow" and a.conn is not None]
        if not following:
            return False
        if not wanted:
            return True
        return any(all(a.peer_vclock.get(u, 0) >= lsn for u, lsn in wanted.items()) for a in following)

    def mine(self) -> dict[str, int]:
        """Rejoiner._mine: what a snapshot must cover: this node's components by uuid, expelled
        members' only up to their bound, not an anonymous replica's own."""
        core = self.n.core
        mine = core.vclock_by_uuid()
        if core.anon:
            mine.pop(core.uuid, None)
        return {u: x for u, (x, _) in uncovered(mine, {}, expel_bounds(core.table)).items()}

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
        mine, wanted = self.mine(), self.wanted()
        order = list(self.need) + [a for a in n.peers if a not in self.need]
        best = None
        for address in order:
            theirs = self.probe(address)
            if theirs is None:
                continue
            if c.rules["cover"] and uncovered(wanted, theirs["vclock_uuid"]):
                continue                     # it lacks the collected rows too: nothing to gain
            missing = uncovered(mine, theirs["vclock_uuid"]) if c.rules["cover"] else {}
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
        self.blocked = "no covering donor" if best is not None else \
            "no reachable peer has the collected rows this node lacks, to give a snapshot of"
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
        """Rejoiner._rebuild: nothing if this node caught up meanwhile (_caught_up); else links
        down, journal drained, a JOIN (FETCH_SNAPSHOT for an anonymous replica) into a side
        store that must cover this node, then the swap."""
        c, n = self.c, self.n
        if c.rules["cover"] and self.caught_up():
            # it caught up from another upstream while the attempt probed and waited for cover:
            # a snapshot would gain nothing (and empty the WAL, and take the donor's ids)
            n.status = "running"
            c.stats["rebuilds_skipped_caught_up"] += 1
            c.log(f"{n} caught up past what was collected while looking for a donor: no rebuild")
            return
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
            if anon:
                known = table.get(n.uuid)        # a REGISTER that went through, its answer lost
                my_id = known.id if known is not None else \
                    prev_id if table.by_id(prev_id) is None else table.lowest_free_id()
                snap.table_rows = [r for r in snap.table_rows if r[0] != n.uuid]
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
