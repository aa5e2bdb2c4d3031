"""The join's rules that read no state of the machine (node/core/lifecycle_join.py): whether a
joined store is fenced, the ids a new registration and an anonymous replica take, a wrong store,
who founds a cluster, and the notes a status shows of its peers. Pure functions of what the
peers' greetings said.

Rules kept here:
- A joined store is fenced (`join_fence`) if this uuid was a member before or the snapshot
  holds rows of its own origin: its peers may hold rows it wrote before.
- Only the lowest uuid among fresh nodes founds, once every peer answered fresh (`founders`); a
  peer that lost its store says `member_of` its cluster and is no fresh peer (`is_fresh`).
- A store whose every answering peer runs another cluster is a wrong store (`wrong_store`)."""
from __future__ import annotations

from typing import Any, Iterable

from node.cluster_space.table import ClusterTable, Member
from node.errors import PeerRefused


def join_fence(uuid: str, went_active: bool | None, theirs_rows: Iterable, table: ClusterTable,
               vclock: dict) -> str | None:
    """Why a store joined from this snapshot is fenced (None: it is not): this uuid was a member
    before (`went_active`; None: the donor's `_cluster` in its greeting lists it), or the snapshot
    holds rows of this node's own origin."""
    existed = uuid in {r[0] for r in theirs_rows} if went_active is None else went_active
    me = table.get(uuid)
    if not existed and not (me is not None and vclock.get(me.id)):
        return None
    return f"this node ({uuid}) rejoined with an empty store: its peers may hold rows it wrote before"


def anon_id(table: ClusterTable) -> int:
    """An anonymous replica's id in the snapshot it fetched: the lowest free there."""
    return table.lowest_free_id()


def requested_id(theirs: dict) -> int | None:
    """The id a new registration asks a donor for: the lowest free in its `_cluster` (None if
    its greeting's `_cluster` does not make a table)."""
    try:
        return ClusterTable(Member.from_row(r) for r in theirs["cluster"]).lowest_free_id()
    except (ValueError, TypeError, IndexError, AssertionError, KeyError):
        return None


def wrong_store(mine: str | None, polled: dict) -> str | None:
    """Peers that answered all belong to another cluster than this node's (Qpid: wrong store):
    what they are, None if some peer is of ours (or this node has no cluster yet)."""
    if mine is None:
        return None
    ours = [a for a, g in polled.items() if isinstance(g, dict) and g.get("cluster_uuid") in (mine, None)]
    other = {a: (g.get("cluster_uuid") if isinstance(g, dict) else str(g)) for a, g in polled.items()
             if (isinstance(g, dict) and g.get("cluster_uuid") not in (mine, None))
             or (isinstance(g, PeerRefused) and g.code == "wrong_cluster")}
    if not other or ours:
        return None
    return "; ".join(f"{a}: {c}" for a, c in sorted(other.items()))


def is_fresh(g: Any) -> bool:
    """A polled peer's greeting says it belongs to no cluster: no store of one, and no identity
    of a member (a member whose store was lost says `member_of` its cluster: it only rejoins)."""
    return isinstance(g, dict) and not g.get("cluster_uuid") and not g.get("member_of")


def founders(uuid: str, polled: dict, peers: list[str]) -> tuple[str, ...] | None:
    """Who founds the cluster with this fresh node, if it does (`cluster_wait_for` 0): every
    peer answered fresh (a peer that did not answer may run a cluster, a member that lost its
    store belongs to one) and this node has the lowest uuid among them; the founders, its own
    uuid last. None: it does not found."""
    fresh = [g["uuid"] for g in polled.values() if is_fresh(g)]
    if len(fresh) != len(peers) or not all(uuid < u for u in fresh):
        return None
    return tuple(fresh) + (uuid,)


def refusal_notes(polled: dict) -> str:
    """The peers' refusals, appended to a status reason."""
    refused = [f"{a} refused: {e}" for a, e in polled.items() if isinstance(e, PeerRefused)]
    return ("; " + "; ".join(refused)) if refused else ""


def lost_store_notes(polled: dict) -> str:
    """The peers that lost their store (no store of a cluster, `member_of` one), appended to a
    status reason: this node waits for them to rejoin."""
    lost = [f"{a} lost its store (a member of cluster {g['member_of']}): waiting for it to rejoin"
            for a, g in sorted(polled.items()) if isinstance(g, dict) and not g.get("cluster_uuid")
            and g.get("member_of")]
    return ("; " + "; ".join(lost)) if lost else ""
