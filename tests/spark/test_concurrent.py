"""spark.concurrent without Spark: the pairs of a bucket against the definition, whatever the
slicing, and buckets that depend on the key alone."""
from __future__ import annotations

import random

import pyarrow as pa

from spark import concurrent

WRITERS = ["u-a", "u-b", "u-c"]


def _writes(seed: int, n: int) -> pa.Table:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        o = rng.randrange(len(WRITERS))
        key = "hot" if rng.random() < 0.3 else f"k{rng.randrange(n // 3)}"
        rows.append((rng.choice(["s", "t"]), key, o, rng.randrange(1, 50), rng.randrange(10**6),
                     [rng.randrange(0, 50) for _ in WRITERS]))
    schema = concurrent.writes_schema(len(WRITERS))
    return pa.Table.from_arrays([pa.array(list(c), f.type) for c, f in zip(zip(*rows), schema)], schema=schema)


def _definition(w: pa.Table) -> list[tuple]:
    ws = w.to_pylist()
    return sorted((a["space"], a["key"], WRITERS[a["origin_idx"]], a["origin_lsn"], a["timestamp"],
                   WRITERS[b["origin_idx"]], b["origin_lsn"], b["timestamp"])
                  for a in ws for b in ws
                  if a["space"] == b["space"] and a["key"] == b["key"] and a["origin_idx"] < b["origin_idx"]
                  and b["seen"][a["origin_idx"]] < a["origin_lsn"] and a["seen"][b["origin_idx"]] < b["origin_lsn"])


def _pairs(w: pa.Table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in concurrent.concurrent_pairs(w, WRITERS).to_pylist())


def test_pairs_are_the_definitions_in_one_slice_or_row_by_row(monkeypatch):
    w = _writes(1, 300)
    want = _definition(w)
    assert want, "the input must hold concurrent pairs"
    assert _pairs(w) == want
    monkeypatch.setattr(concurrent, "pairs_max", 5)       # hot keys one row at a time, keys alone
    assert _pairs(w) == want
    assert _pairs(w.slice(0, 0)) == []


def test_a_key_has_one_bucket_wherever_its_array_starts():
    keys = pa.array(["", "a", "hot1", "k00001234", "a", "", "é"])
    whole = concurrent.bucket_of(keys, 7).tolist()
    assert concurrent.bucket_of(keys.slice(1, 4), 7).tolist() == whole[1:5]
    assert concurrent.bucket_of(pa.chunked_array([keys[:2], keys[2:]]), 7).tolist() == whole
    assert whole[1] == whole[4] and whole[0] == whole[5]
    spread = concurrent.bucket_of(pa.array([f"k{i:08d}" for i in range(8000)]), 8)
    assert min(sum(spread == b) for b in range(8)) > 800
