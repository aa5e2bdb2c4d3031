"""The vector clock: {replica_id: lsn}, component 0 counts rows of local spaces.

Rules kept here: lsns only grow (follow() asserts it), zero components are never
stored, the signature (sum of components) is cached, and comparison is four-way.
The canonical text form `{1: 10, 2: 5}` is used in logs and tests."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from enum import Enum


class Order(Enum):
    BEFORE = "before"
    EQUAL = "equal"
    AFTER = "after"
    CONCURRENT = "concurrent"


_new = object.__new__     # a VClock whose fields the caller sets (copy, permute): no __init__ checks


class VClock:
    __slots__ = ("_c", "_sig")

    def __init__(self, components: Mapping[int, int] | Iterable[tuple[int, int]] | None = None):
        self._c: dict[int, int] = {}
        self._sig = 0
        if components:
            items = components.items() if isinstance(components, Mapping) else components
            seen: set[int] = set()
            for rid, lsn in items:
                rid, lsn = int(rid), int(lsn)
                if rid < 0 or lsn < 0:
                    raise ValueError(f"vclock component {rid}: {lsn} is negative")
                if rid in seen:
                    # pairs (parse_vclock) may repeat an id; counting it twice would
                    # leave a cached signature that disagrees with the components
                    raise ValueError(f"vclock component {rid} is given twice")
                seen.add(rid)
                if lsn:
                    self._c[rid] = lsn
                    self._sig += lsn

    # --- reading ---------------------------------------------------------------
    def get(self, replica_id: int) -> int:
        return self._c.get(replica_id, 0)

    __getitem__ = get

    def __contains__(self, replica_id: int) -> bool:
        return replica_id in self._c

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._c))

    def __len__(self) -> int:
        return len(self._c)

    def items(self) -> list[tuple[int, int]]:
        return sorted(self._c.items())

    @property
    def signature(self) -> int:
        return self._sig

    def to_dict(self) -> dict[int, int]:
        return dict(sorted(self._c.items()))

    def copy(self) -> "VClock":
        v = _new(VClock)
        v._c = dict(self._c)
        v._sig = self._sig
        return v

    # --- changing --------------------------------------------------------------
    def follow(self, replica_id: int, lsn: int) -> None:
        """Advance one component; an lsn that does not grow is a bug."""
        prev = self._c.get(replica_id, 0)
        assert lsn > prev, f"vclock follow {replica_id}: {lsn} <= {prev}"
        self._c[replica_id] = lsn
        self._sig += lsn - prev

    def merge(self, other: "VClock") -> None:
        """Component-wise max."""
        for rid, lsn in other._c.items():
            prev = self._c.get(rid, 0)
            if lsn > prev:
                self._c[rid] = lsn
                self._sig += lsn - prev

    # --- comparing -------------------------------------------------------------
    def compare(self, other: "VClock", ignore_zero: bool = False) -> Order:
        # every component of either side, each once: ours against theirs (0 where they have
        # none), then theirs that we lack against 0 (no set of the union is built)
        mine, theirs = self._c, other._c
        le = ge = True
        get = theirs.get
        for rid, a in mine.items():
            if ignore_zero and rid == 0:
                continue
            b = get(rid, 0)
            if a < b:
                ge = False
            elif a > b:
                le = False
            if not le and not ge:
                return Order.CONCURRENT
        for rid in theirs:
            if rid not in mine and not (ignore_zero and rid == 0):
                if not le:                   # (no component is stored at 0: one only they
                    return Order.CONCURRENT  # have is ahead of ours)
                ge = False
        if le and ge:
            return Order.EQUAL
        return Order.BEFORE if le else Order.AFTER

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VClock) and self._c == other._c

    def __hash__(self) -> int:  # pragma: no cover - vclocks are mutable; never hash
        raise TypeError("VClock is mutable")

    def __le__(self, other: "VClock") -> bool:
        return self.compare(other) in (Order.BEFORE, Order.EQUAL)

    def __ge__(self, other: "VClock") -> bool:
        return self.compare(other) in (Order.AFTER, Order.EQUAL)

    def __str__(self) -> str:
        return "{" + ", ".join(f"{r}: {l}" for r, l in self.items()) + "}"

    __repr__ = __str__

    # --- translation -----------------------------------------------------------
    def permute(self, id_map: Mapping[int, int]) -> "VClock":
        """Rename components through id_map; components missing from it are left out."""
        c: dict[int, int] = {}
        sig = 0
        get = id_map.get
        for rid, lsn in self._c.items():
            to = get(rid)
            if to is not None:
                c[to] = lsn
                sig += lsn
        out = _new(VClock)
        out._c, out._sig = c, sig
        return out


def parse_vclock(text: str) -> VClock:
    """Parse the canonical text form `{1: 10, 2: 5}`."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError(f"not a vclock: {text!r}")
    body = body[1:-1].strip()
    if not body:
        return VClock()
    pairs = []
    for part in body.split(","):
        rid, _, lsn = part.partition(":")
        pairs.append((int(rid), int(lsn)))
    return VClock(pairs)
