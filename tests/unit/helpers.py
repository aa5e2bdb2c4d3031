"""Small builders shared by the WAL, recovery and journal tests: transactions, a store
bootstrapped the way node/server.py does it, a WAL writer that rotates by size the way
the journal does, and readers that turn a WAL back into transactions."""
from __future__ import annotations

import os
import shutil

from node.cluster_space.table import STATE_MEMBER, Member
from node.core.rows import (CLUSTER_SPACE, GROUP_CLUSTER, GROUP_DEFAULT, GROUP_LOCAL, OP_CLUSTER,
                            OP_PUT, OP_SPACE, Op, Txn, txn_from_wire)
from node.core.vclock import VClock
from node.storage.store import Store
from node.wal import format as fmt
from node.wal.reader import iter_wal, list_segments
from node.wal.writer import WalWriter

UUID_A = "aaaaaaaa-0000-4000-8000-000000000001"
UUID_B = "bbbbbbbb-0000-4000-8000-000000000002"
UUID_C = "cccccccc-0000-4000-8000-000000000003"
ADDR_A = "127.0.0.1:7301"

STORE_MAP_BYTES = 1 << 26       # tests write kilobytes; a small map keeps many stores cheap


# --- transactions ---------------------------------------------------------------------
def space_txn(rid: int, lsn: int, name: str, *, local: bool = False, ts: int = 1) -> Txn:
    return Txn(rid, lsn, GROUP_DEFAULT, ts, (Op(OP_SPACE, name, "", {"local": local, "conflict": "lww"}),))


def put_txn(rid: int, lsn: int, space: str, *pairs: tuple[str, object], group: int = GROUP_DEFAULT,
            ts: int | None = None) -> Txn:
    ops = tuple(Op(OP_PUT, space, k, v) for k, v in pairs)
    return Txn(rid, lsn, group, ts if ts is not None else 1000 + lsn, ops)


def cluster_txn(rid: int, lsn: int, *members: tuple[str, int], ts: int = 1) -> Txn:
    ops = tuple(Op(OP_CLUSTER, CLUSTER_SPACE, u, {"id": i, "address": "", "state": STATE_MEMBER})
                for u, i in members)
    return Txn(rid, lsn, GROUP_CLUSTER, ts, ops)


def local_put_txn(rid: int, lsn: int, space: str, *pairs: tuple[str, object]) -> Txn:
    return put_txn(rid, lsn, space, *pairs, group=GROUP_LOCAL)


# --- store -----------------------------------------------------------------------------
def open_store(path, self_uuid: str = UUID_A, *, self_id: int = 1, bootstrap: bool = True,
               sync: bool = False) -> Store:
    """A store as `_bootstrap_new_cluster` leaves it before its first WAL write: the
    node's own member entry, written outside the WAL."""
    store = Store(str(path), sync=sync, map_size=STORE_MAP_BYTES)
    if bootstrap and store.table.get(self_uuid) is None:
        store.put_cluster_member(Member(self_uuid, self_id, ADDR_A, STATE_MEMBER))
        store.set_meta(uuid=self_uuid, cluster_uuid="cluster-1")
    return store


def store_state(store: Store) -> dict:
    """Everything recovery must reproduce: vclock, hlc, `_cluster`, spaces and records."""
    data = {}
    for name in sorted(store.spaces):
        data[name] = {r.key: (r.value, r.origin_id, r.lsn, r.hlc, r.deleted)
                      for r in _all_records(store, name)}
    return {"vclock": store.vclock.to_dict(), "stored_vclock": store.get_meta("vclock"),
            "hlc": store.get_meta("hlc"), "cluster": store.load_cluster().rows(),
            "spaces": {n: store.spaces[n].to_dict() for n in sorted(store.spaces)}, "data": data}


def _all_records(store: Store, space: str):
    with store.env.begin(db=store._db(space)) as t:
        keys = [k.decode() for k, _ in t.cursor()]
    return [store.get(space, k) for k in keys]


# --- WAL ---------------------------------------------------------------------------------
class WalBuilder:
    """Writes one frame per entry through WalWriter, rotating by size exactly as the
    journal does (rotate when needs_rotation, with the vclock and `_cluster` at that point)."""

    def __init__(self, wal_dir, uuid: str = UUID_A, *, segment_bytes_max: int = 1 << 20,
                 cluster: list[list] | None = None, mode: str = "write"):
        self.dir = str(wal_dir)
        self.w = WalWriter(self.dir, mode, uuid, segment_bytes_max=segment_bytes_max)
        self.uuid = uuid
        self.vclock = VClock()
        self.cluster = cluster if cluster is not None else [[uuid, 1, ADDR_A, STATE_MEMBER, 0]]
        self.rotations: list[tuple[str, dict, list]] = []   # (segment, vclock, cluster) at each rotation
        self.frames: list[tuple[str, int, int]] = []         # (segment, start, end) per frame

    def write(self, *txns: Txn, written_us: int = 1_700_000_000_000_000) -> tuple[str, int, int]:
        if self.w.needs_rotation:
            vc = self.vclock.to_dict()
            rows = [list(r) for r in self.cluster]
            self.w.rotate(vc, rows)
            self.rotations.append((self.w.segment, vc, rows))
        pos = self.w.write_batch(fmt.encode_frame([t.to_wire() for t in txns], written_us))
        self.frames.append(pos)
        for t in txns:
            if t.last_lsn > self.vclock.get(t.component):
                self.vclock.follow(t.component, t.last_lsn)
        return pos

    def close(self) -> None:
        self.w.close()


def wal_txns(wal_dir, **kw) -> list[Txn]:
    out = []
    for _, ref in iter_wal(str(wal_dir), **kw):
        _, txns = fmt.unpack_frame(ref.body)
        out.extend(txn_from_wire(t) for t in txns)
    return out


def segment_paths(wal_dir) -> list[str]:
    return [os.path.join(str(wal_dir), n) for n in list_segments(str(wal_dir))]


def copy_dir(src, dst) -> str:
    shutil.copytree(str(src), str(dst))
    return str(dst)
