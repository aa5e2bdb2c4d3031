"""What a subscriber needs of rows this node's WAL collected: whether a relay serves it or
tells it to rejoin (node/core/link/relay.py at SUBSCRIBE). Pure.

Rules kept here:
- A subscriber needs no row of an expelled member past the bound it keeps (its greeting's, else
  ours): a node that joined through that member may hold some in its snapshot, which no relay
  can serve (`behind`).
- A component it says it goes without (SUBSCRIBE `without`: its rejoin found no donor for an
  expelled member's rows) does not make it rejoin, but only when every component it lacks here
  is one of those (`split_without`); then no row of them goes on the link, and the rest does.
- A subscriber told to rejoin may try again at once when rows from elsewhere have since brought
  it to what was collected (`caught_up_to`): the relay's own test, `behind`, then passes."""
from __future__ import annotations

from node.cluster_space.table import STATE_EXPELLED, ClusterTable
from node.core.membership import greeting_expel_bounds


def expel_bounds_by_id(table: ClusterTable, greeting: dict | None = None) -> dict[int, int]:
    """id -> accepted bound of each expelled member: the subscriber's, where its `greeting`
    lists one (it takes no row past it), else ours."""
    out = {m.id: m.expelled_lsn for m in table.members() if m.state == STATE_EXPELLED}
    for u, bound in greeting_expel_bounds(greeting or {}).items():
        m = table.get(u)
        if m is not None:
            out[m.id] = bound
    return out


def behind(sub_vclock: dict[int, int], gc_vclock: dict[int, int], bounds: dict[int, int]) -> list[int]:
    """Components in which a subscriber needs rows that were collected. Of an expelled member
    (`bounds`: id -> accepted bound) it needs none past the bound: a node that joined through
    that member may hold some in its snapshot, which no relay can serve."""
    return sorted(rid for rid, lsn in gc_vclock.items()
                  if rid != 0 and sub_vclock.get(rid, 0) < min(lsn, bounds.get(rid, lsn)))


def caught_up_to(mine: dict[str, int], collected: dict[str, int]) -> bool:
    """Whether a node whose vclock is `mine` holds every row an upstream collected (`collected`:
    its gc vclock, both by uuid): that upstream would serve it now. An empty `collected` (the
    refusal named none) is never caught up to: nothing says when to try sooner."""
    return bool(collected) and all(mine.get(u, 0) >= lsn for u, lsn in collected.items())


def split_without(missing: list[int], without: list | None, table: ClusterTable) -> tuple[list[int], list[int]]:
    """(the components of `missing` that make the subscriber rejoin, those it goes without):
    none goes without unless every missing one is among the members `without` names."""
    ids = {mem.id for mem in map(table.get, without or ()) if mem is not None}
    rest = [rid for rid in missing if rid not in ids]
    return (rest, []) if rest else ([], missing)
