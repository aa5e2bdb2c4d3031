"""The uuid-keyed `_cluster` table: which members this node knows and the local id of each.

Rules:
- keyed by instance uuid; every uuid has exactly one local id and every id one uuid;
- local ids are 1..N, allocated lowest-free, and never reused: an expelled member keeps
  its id occupied for ever;
- a known uuid never changes its id.
This module is pure (no IO); storage persists what it decides."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from node import limits

STATE_MEMBER = "member"
STATE_ANON = "anonymous"      # this node's own entry while it is an anonymous replica
STATE_EXPELLED = "expelled"
STATES = (STATE_MEMBER, STATE_ANON, STATE_EXPELLED)


@dataclass(slots=True)
class Member:
    uuid: str
    id: int
    address: str
    state: str
    lsn: int = 0              # lsn of this node's last row about the member (0: from a snapshot)
    expelled_lsn: int = 0     # expelled: its rows up to this lsn are accepted, later ones refused

    def to_row(self) -> list:
        return [self.uuid, self.id, self.address, self.state, self.lsn, self.expelled_lsn]

    @classmethod
    def from_row(cls, row: Iterable) -> "Member":
        r = list(row)
        return cls(str(r[0]), int(r[1]), str(r[2] or ""), str(r[3]), int(r[4]) if len(r) > 4 else 0,
                   int(r[5]) if len(r) > 5 else 0)


class ClusterTable:
    def __init__(self, members: Iterable[Member] = ()):
        self._by_uuid: dict[str, Member] = {}
        self._by_id: dict[int, Member] = {}
        self._sorted: list[Member] | None = None     # members() until the next upsert
        for m in members:
            self.upsert(m)

    # --- reading ---------------------------------------------------------------
    def get(self, uuid: str) -> Member | None:
        return self._by_uuid.get(uuid)

    def by_id(self, replica_id: int) -> Member | None:
        return self._by_id.get(replica_id)

    def id_of(self, uuid: str) -> int | None:
        m = self._by_uuid.get(uuid)
        return m.id if m else None

    def uuid_of(self, replica_id: int) -> str | None:
        m = self._by_id.get(replica_id)
        return m.uuid if m else None

    def __contains__(self, uuid: str) -> bool:
        return uuid in self._by_uuid

    def expelled(self, uuid: str) -> bool:
        m = self._by_uuid.get(uuid)
        return m is not None and m.state == STATE_EXPELLED

    def __len__(self) -> int:
        return len(self._by_uuid)

    def members(self) -> list[Member]:
        """Every member, by id (`_by_id` holds the same members as `_by_uuid`: upsert sets both).
        The order is kept until the next upsert (the only change); each caller gets its own list."""
        ordered = self._sorted
        if ordered is None:
            by_id = self._by_id
            ordered = self._sorted = [by_id[i] for i in sorted(by_id)]
        return list(ordered)

    def rows(self) -> list[list]:
        return [m.to_row() for m in self.members()]

    def uuid_to_id(self) -> dict[str, int]:
        return {u: m.id for u, m in self._by_uuid.items()}

    def lowest_free_id(self) -> int:
        i = 1
        while i in self._by_id:
            i += 1
        return i

    def copy(self) -> "ClusterTable":
        return ClusterTable(Member(m.uuid, m.id, m.address, m.state, m.lsn, m.expelled_lsn)
                            for m in self._by_uuid.values())

    # --- changing --------------------------------------------------------------
    def upsert(self, m: Member) -> None:
        assert m.id >= 1, m
        assert m.state in STATES, m
        old = self._by_uuid.get(m.uuid)
        if old is not None:
            assert old.id == m.id, f"uuid {m.uuid} would change id {old.id} -> {m.id}"
        holder = self._by_id.get(m.id)
        assert holder is None or holder.uuid == m.uuid, f"id {m.id} taken by {holder}"
        assert old is not None or len(self._by_uuid) < limits.members_max, "too many members"
        self._by_uuid[m.uuid] = m
        self._by_id[m.id] = m
        self._sorted = None
