"""Membership data-safety rules, pure: when a node may replace its store with a snapshot,
when it may write under its own id again after a loss, and what holds a node's WAL.

Rules kept here (docs/replication.md, "Membership never loses or forks a write"):
- A store is replaced by a snapshot (rejoin) only from a donor whose vclock covers every
  replicated component this node holds (`uncovered` is empty): then everything discarded is
  in the snapshot. A node holding rows the donor lacks keeps them and waits.
- After a loss (a store rebuilt from a snapshot under an identity that wrote before, a store
  restored from a backup, a WAL that may have lost written rows), other members may hold rows
  of this node's own origin that it no longer has. Replication acknowledges after the local
  WAL write, so one member alone may hold such a row: no quorum of members is enough. The
  node writes under its own id again only when every member that is not expelled has told it
  (in a greeting after the loss) how far it holds this node's rows, and this node holds at
  least as far (`OwnRowsFence`). Expelling a member that will never return is the way out.
  An anonymous replica that followed this node within its TTL is waited for like a member
  (remembered beside the identity); any other is not waited for, but what one said it holds counts.
- A node's WAL is held for a registered member from the moment the member joined through it
  or first subscribed to it, at the member's durable position (what it has on disk, not what
  it has applied), persisted, and released only by its expel; anonymous replicas hold it
  only within their TTL (the rules of holds live in node/core/holds.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from node import limits
from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER, ClusterTable


def greeting_vclock(greeting: dict) -> dict[str, int]:
    """A greeting's vclock by uuid (its sender's applied rows), components > 0 only."""
    v = greeting.get("vclock_uuid")
    if not isinstance(v, dict):
        return {}
    return {str(u): n for u, n in v.items() if isinstance(n, int) and not isinstance(n, bool) and n > 0}


def uncovered(mine: dict[str, int], donor: dict[str, int],
              bounds: dict[str, int] | None = None) -> dict[str, tuple[int, int]]:
    """uuid -> (this node's lsn, the donor's) for every component in which this node holds
    rows the donor lacks. Empty: a snapshot of the donor loses nothing this node has. `bounds`:
    expelled members' accepted bounds; rows past one (applied before the expel was heard) are
    refused everywhere, so losing them loses nothing."""
    out = {}
    for u, lsn in mine.items():
        if bounds and u in bounds:
            lsn = min(lsn, bounds[u])
        if lsn > donor.get(u, 0):
            out[u] = (lsn, donor.get(u, 0))
    return out


def expel_bounds(table: ClusterTable) -> dict[str, int]:
    return {m.uuid: m.expelled_lsn for m in table.members() if m.state == STATE_EXPELLED}


def greeting_expel_bounds(greeting: dict) -> dict[str, int]:
    """The members a peer's greeting lists as expelled, with their bounds (its `cluster` rows
    [uuid, id, address, state(, lsn(, expelled_lsn))], checked by decode)."""
    return {str(r[0]): int(r[5]) if len(r) > 5 else 0 for r in greeting.get("cluster") or ()
            if len(r) > 3 and r[3] == STATE_EXPELLED}


def greeting_expels(greeting: dict) -> set[str]:
    """Every member a greeting says is expelled: its `cluster` rows, and every expel a fenced
    sender knows of, by a row or heard of (`expels_heard`, NodeCore.expels_heard)."""
    return set(greeting_expel_bounds(greeting)) | set(greeting.get("expels_heard") or ())


def running_donors(polled: dict) -> list[tuple[str, dict]]:
    """The polled peers (address -> greeting, or the error) a join may ask: running members of
    a cluster that no polled greeting lists as expelled. One may not know of its expel yet and
    serve; but a fence waits for no expelled member, so a member's row that reached it alone
    may since have been written again, differently, by that member: members' rows come from
    members (NodeCore.subscribe_vclock; the rejoin's donors likewise)."""
    greetings = [(a, g) for a, g in polled.items() if isinstance(g, dict)]
    expelled = {u for _, g in greetings for u in greeting_expel_bounds(g)}
    return [(a, g) for a, g in greetings
            if g.get("cluster_uuid") and g.get("status") == "running" and g.get("uuid") not in expelled]


def news_for(fence: "OwnRowsFence", table: ClusterTable, self_uuid: str, peer_uuid: str, said: dict) -> list[str]:
    """The expels this fence relies on that `peer_uuid` did not know when it spoke, if `said`
    (our greeting on the link to it) did not state them: a greeting of ours now does, so the
    link is begun again and the peer, told, greets again (OwnRowsFence.unaware). Else []."""
    lacks = fence.unaware(table, self_uuid).get(peer_uuid)
    if not lacks or greeting_expels(said) >= set(lacks):
        return []
    return lacks


def describe_uncovered(missing: dict[str, tuple[int, int]], limit: int = 4) -> str:
    parts = [f"{u} up to lsn {mine} (it has {theirs})" for u, (mine, theirs) in sorted(missing.items())[:limit]]
    more = len(missing) - limit
    return ", ".join(parts) + (f" and {more} more" if more > 0 else "")


@dataclass
class OwnRowsFence:
    """This node may hold fewer of its own origin's rows than some member does.

    `rebuilt`: the store was rebuilt from a donor's snapshot (its ids are the donor's now), so
    this node's own `_cluster` rows from before the loss are history when they come back; a
    fence over the node's own store (a lost WAL tail) takes them as they are.
    `heard`: member uuid -> how many of this node's rows that member said (in a greeting since
    the loss) it holds. `known`: members this node must hear from beyond its table: those any
    heard member's greeting lists, and those it registered itself before the loss (kept beside
    its identity, node/fence.py). `expelled`: members some peer says are expelled: not waited
    for, but what they said they hold still counts — an expelled member that still runs gives
    this node's rows back if this node follows it (no member takes them from it: members' rows
    come from members). `given_up`: members the operator expelled on this
    node while it was fenced (their expel is written once the fence is lifted): neither waited
    for nor believed. `anonymous`: anonymous replicas (uuid -> address) heard, or remembered as
    followers (those are in `known` too: waited for); what one said it holds counts, and its rows
    come back only if this node replicates from it. `reach`: remembered followers whose entry
    beside the identity bounds the most of this node's rows they may hold (node.core.
    anon_followers Follower): one is not waited for once a word heard reaches that bound
    (`target`), for whatever it holds of ours comes back before the lift and this node's next
    rows go past it; so a follower whose disk was replaced (it comes back under a new uuid)
    does not hold the fence for ever. Cleared when every live member was heard and this node
    holds the most."""
    reason: str
    rebuilt: bool = False
    heard: dict[str, int] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)
    expelled: set[str] = field(default_factory=set)
    given_up: set[str] = field(default_factory=set)
    anonymous: dict[str, str] = field(default_factory=dict)
    reach: dict[str, int] = field(default_factory=dict)
    knows: dict[str, set[str]] = field(default_factory=dict)
    told: dict[str, frozenset[str]] = field(default_factory=dict)

    def hear(self, member_uuid: str, own_lsn: int, knows: Iterable[str] = ()) -> None:
        """`knows`: the members the speaker's greeting lists as expelled (it takes no member's
        rows from those: NodeCore.subscribe_vclock), to at most limits.members_max."""
        if own_lsn > self.heard.get(member_uuid, -1):
            self.heard[member_uuid] = own_lsn
        known = self.knows.setdefault(member_uuid, set())
        for u in knows:
            if len(known) >= limits.members_max:
                break
            known.add(u)

    def hear_expels(self, ops) -> None:
        """A `_cluster` txn that came past a gap while fenced (this node asks every other
        component from where the peer is, so a change made since comes past one), or from a
        member this fenced node could not register (ClusterRows._translate): not applied,
        but what it says of expels is heard, as from a greeting's cluster rows (the same word: the
        peer could say it in its greeting). Without this, a member expelled on a peer while this
        node's links stay up would hold the fence for ever. At most limits.members_max uuids
        (a row's value is a dict: node.core.rows checked it)."""
        for op in ops:
            if op.value.get("state") == STATE_EXPELLED and len(self.expelled) < limits.members_max:
                self.expelled.add(op.key)

    def target(self) -> int:
        """The most of this node's rows any member holds (the word of one the operator gave up on
        no longer counts)."""
        return max((n for u, n in self.heard.items() if u not in self.given_up), default=0)

    def waiting_for(self, table: ClusterTable, self_uuid: str) -> list[str]:
        """Members not yet heard from (expelled ones and anonymous replicas never hold us up),
        and members heard from before they knew of an expel this fence relies on (`unaware`)."""
        members = self._members(table, self_uuid)
        return sorted((members - self.heard.keys()) | self.unaware(table, self_uuid).keys())

    def _members(self, table: ClusterTable, self_uuid: str) -> set[str]:
        members = {m.uuid for m in table.members() if m.state == STATE_MEMBER} | self.known
        for m in table.members():
            if m.state == STATE_EXPELLED:
                members.discard(m.uuid)
        # (not one the table knows: a follower that registered since is a member, and rows of ours
        # it took as one are not bounded by its entry)
        target = self.target()
        members -= {u for u, bound in self.reach.items() if bound <= target and u not in table}
        return members - self.expelled - self.given_up - {self_uuid}

    def disregarded(self, table: ClusterTable, self_uuid: str) -> set[str]:
        """Expelled members in this node's table whose word was not heard: what they hold of
        this node's rows is not waited for."""
        return {m.uuid for m in table.members() if self.is_expelled(table, m.uuid)} \
            - self.heard.keys() - self.given_up - {self_uuid}

    def unaware(self, table: ClusterTable, self_uuid: str) -> dict[str, list[str]]:
        """Heard members whose greetings never listed an expel this fence relies on (member ->
        those expelled members). Not waiting for an expelled member is safe only once no member
        takes this node's rows from it: a member takes none of them from an upstream it knows
        to be expelled, but one that spoke before it knew could take, after its word, a row the
        expelled member alone kept, which this node then writes again under the same lsn. A
        member learns of an expel from this node's greeting (NodeCore.adopt_expels) and greets
        again (RelayMachine: greet_again)."""
        gone = self.disregarded(table, self_uuid)
        if not gone:
            return {}
        out = {}
        for u in self._members(table, self_uuid) & self.heard.keys():
            lacks = gone - self.knows.get(u, set())
            if lacks:
                out[u] = sorted(lacks)
        return out

    def is_expelled(self, table: ClusterTable, uuid: str) -> bool:
        """Heard of as expelled (an expel row past a gap), or so in this node's table."""
        return uuid in self.expelled or table.expelled(uuid)

    def can_clear(self, table: ClusterTable, self_uuid: str, own_lsn: int) -> bool:
        return not self.waiting_for(table, self_uuid) and own_lsn >= self.target()

    def explain(self, table: ClusterTable, self_uuid: str, own_lsn: int) -> str:
        members = self._members(table, self_uuid)
        waiting = sorted(members - self.heard.keys())
        if waiting:
            anon = [u for u in waiting if u in self.anonymous]
            also = f"; {_anonymous(anon)} that followed this node" if anon else ""
            bounded = [f"{u} to lsn {self.reach[u]}" for u in anon if u in self.reach]
            if bounded:
                also += (f" and may hold its rows ({_named(bounded)}): not waited for once a peer heard says it "
                         "holds as many")
            return (f"{self.reason}: this node does not write under its own id until every member has said how "
                    f"many of its rows it holds; not heard from {_named(waiting)} (start it, or expel it if it is gone "
                    f"for good){also}")
        unaware = self.unaware(table, self_uuid)
        if unaware:
            gone = sorted({g for lacks in unaware.values() for g in lacks})
            return (f"{self.reason}: {_named(sorted(unaware))} said how many of this node's rows "
                    f"{'it holds' if len(unaware) == 1 else 'they hold'} before knowing that {_named(gone)} "
                    f"{'is' if len(gone) == 1 else 'are'} expelled (until then a member may take this node's rows "
                    "from it): waiting for a greeting that knows it (this node's greeting tells it; a link between "
                    "them in either direction carries it)")
        target = self.target()
        holders = sorted(u for u, n in self.heard.items() if n == target and u not in self.given_up)
        if own_lsn >= target or not holders:
            return f"{self.reason}: this node's own rows up to lsn {target} are coming back from its peers (it has {own_lsn})"
        gone = [u for u in holders if self.is_expelled(table, u)]
        way_out = (f"; {_named([_at(table, u) for u in gone])} {'is' if len(gone) == 1 else 'are'} expelled: "
                   "its rows come back only if this node replicates from it (add its address to this node's "
                   "peers; members take no member's rows from an expelled one), or expelling it on this node "
                   "too stops the wait (they are then given up)") if gone else ""
        anon = [u for u in holders if u in self.anonymous and u not in gone]
        if anon:
            way_out += (f"; {_anonymous([f'{u} at {self.anonymous[u]}' for u in anon])}: "
                        "its rows come back if this node replicates from it (add its address to this node's "
                        "peers), or expelling it on this node gives them up (it is expelled and keeps rows that "
                        "differ from this node's next ones under the same lsns: rebuild it under a new identity)")
        return (f"{self.reason}: this node's own rows up to lsn {target} are coming back from its peers "
                f"(it has {own_lsn}; {_named(holders)} said it holds them){way_out}")


def _at(table: ClusterTable, uuid: str) -> str:
    m = table.get(uuid)
    return f"{uuid} at {m.address}" if m is not None and m.address else uuid


def _named(uuids: list[str], limit: int = 4) -> str:
    """The first `limit` uuids, and how many more."""
    return ", ".join(uuids[:limit]) + (f" and {len(uuids) - limit} more" if len(uuids) > limit else "")


def _anonymous(named: list[str]) -> str:
    """`named` (_named) and that it is, or they are, anonymous replicas."""
    return f"{_named(named)} {'is an anonymous replica' if len(named) == 1 else 'are anonymous replicas'}"
