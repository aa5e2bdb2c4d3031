"""The before-replace resolver for `_cluster`, and the registry of resolvers.

Resolvers are a public mechanism: a space names one (`conflict` option) and every
replace into it goes through it before it is stored. The `_cluster` resolver settles id
clashes between members registered on different masters; data spaces default to
last-writer-wins. Resolvers are pure functions of (old, new)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER, ClusterTable, Member


@dataclass(frozen=True, slots=True)
class Resolution:
    local_id: int         # the id this node uses for the uuid (new or kept)
    member: Member        # the tuple to store
    changed: bool         # the table changed: this node must write its own _cluster row
    reason: str           # for logs: "insert", "insert-remapped", "expel", "address", "known"


def resolve_cluster_replace(
    table: ClusterTable, uuid: str, proposed_id: int, address: str, state: str, *, from_self: bool,
    expelled_lsn: int = 0, have_lsn: int = 0,
) -> Resolution:
    """Decide what an incoming `_cluster` tuple {uuid, id, address, state} does here.

    - unknown uuid: insert with the proposed id if free, else the lowest free id;
    - known uuid: keep its id; expelled is final; `from_self` (the member's own row)
      may update its address; anonymous -> member when it registers.
    Expel is made convergent by `expelled_lsn`: the member's rows up to it are accepted
    everywhere, later ones refused. A node expelling takes the larger of the incoming bound
    and `have_lsn` (the rows of that member it already holds), and a larger bound learned
    later raises its own: the bound ends as the same maximum on every node.
    """
    old = table.get(uuid)
    if old is None:
        if state == STATE_ANON:
            # Another node's anonymous entry is its private business: never ours to store.
            state = STATE_MEMBER
        free = proposed_id >= 1 and table.by_id(proposed_id) is None
        local_id = proposed_id if free else table.lowest_free_id()
        m = Member(uuid, local_id, address, state,
                   expelled_lsn=expelled_lsn if state == STATE_EXPELLED else 0)
        return Resolution(local_id, m, True, "insert" if free else "insert-remapped")
    m = Member(old.uuid, old.id, old.address, old.state, old.lsn, old.expelled_lsn)
    reason = "known"
    changed = False
    if state == STATE_EXPELLED and old.state != STATE_EXPELLED:
        m.state, changed, reason = STATE_EXPELLED, True, "expel"
        m.expelled_lsn = max(expelled_lsn, have_lsn)
    elif state == STATE_EXPELLED and expelled_lsn > old.expelled_lsn:
        m.expelled_lsn, changed, reason = expelled_lsn, True, "expel-lsn"
    elif state == STATE_MEMBER and old.state == STATE_ANON:
        m.state, changed, reason = STATE_MEMBER, True, "register"
    if from_self and address and address != old.address and m.state != STATE_EXPELLED:
        m.address = address
        if not changed:
            changed, reason = True, "address"
    return Resolution(old.id, m, changed, reason)


# --- data space resolvers -------------------------------------------------------
# A record is (value, origin_uuid, lsn, hlc, deleted). A resolver returns True when the
# new record replaces the old one.
Record = tuple[Any, str, int, int, bool]
DataResolver = Callable[[Record | None, Record], bool]


def lww(old: Record | None, new: Record) -> bool:
    """Last writer wins on (hybrid logical clock, origin uuid, lsn); deletes leave tombstones.
    The lsn orders the ops of one transaction, which share its timestamp and origin."""
    if old is None:
        return True
    return (new[3], new[1], new[2]) > (old[3], old[1], old[2])


def apply_in_order(old: Record | None, new: Record) -> bool:
    """Arrival order wins (Tarantool's default)."""
    return True


DATA_RESOLVERS: dict[str, DataResolver] = {"lww": lww, "apply": apply_in_order}


def register_resolver(name: str, fn: DataResolver) -> None:
    if name in DATA_RESOLVERS:
        raise ValueError(f"resolver {name!r} already registered")
    DATA_RESOLVERS[name] = fn
