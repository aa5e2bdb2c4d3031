"""Hand-built WALs of two masters, for cases the generator leaves to chance.

Nodes A and B know each other under swapped ids (A: A=1, B=2; B: B=1, A=2). Timeline (µs):
  100 A writes kv/x (A lsn 1)           110 B writes kv/x (B lsn 1): neither saw the other's
  120 B applies A lsn 1                 130 A applies B lsn 1
  140 A writes kv/y (A lsn 2)           150 B applies A lsn 2
  160 B writes kv/y (B lsn 2): B had seen A's write of y, so the pair is causally ordered
  170 A applies B lsn 2"""
from __future__ import annotations

import os

from node.core.rows import GROUP_DEFAULT, OP_PUT, Op, Txn
from node.wal import format as fmt
from node.wal.writer import WalWriter

A = "aaaaaaaa-0000-4000-8000-000000000001"
B = "bbbbbbbb-0000-4000-8000-000000000002"
IDS = {A: {A: 1, B: 2}, B: {B: 1, A: 2}}


def _put(key: str, by: str) -> list:
    return [Op(OP_PUT, "kv", key, {"by": by})]


def build(root: str) -> dict[str, str]:
    """Write the two nodes' WALs under root; returns uuid -> data dir."""
    dirs = {}
    writers = {}
    for u in (A, B):
        d = os.path.join(root, f"node-{u[:1]}")
        w = WalWriter(os.path.join(d, "wal"), "write", u)
        w.rotate({}, [[m, i, f"{m[:1]}:7301", "member", 0] for m, i in IDS[u].items()])
        writers[u], dirs[u] = w, d

    def frame(node: str, written_us: int, origin: str, lsn: int, ops: list, ts: int) -> None:
        txn = Txn(IDS[node][origin], lsn, GROUP_DEFAULT, ts, tuple(ops))
        writers[node].write_batch(fmt.encode_frame([txn.to_wire()], written_us))

    frame(A, 100, A, 1, _put("x", "a"), 100)
    frame(B, 110, B, 1, _put("x", "b"), 110)
    frame(B, 120, A, 1, _put("x", "a"), 100)
    frame(A, 130, B, 1, _put("x", "b"), 110)
    frame(A, 140, A, 2, _put("y", "a"), 140)
    frame(B, 150, A, 2, _put("y", "a"), 140)
    frame(B, 160, B, 2, _put("y", "b"), 160)
    frame(A, 170, B, 2, _put("y", "b"), 160)
    for w in writers.values():
        w.close()
    return dirs
