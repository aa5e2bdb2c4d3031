"""`replog admin`: manual recovery after the whole cluster failed or stopped dirty (Qpid).

  replog admin inspect DIR        status, signatures, vclock by uuid, identity, members of one data dir
  replog admin compare DIR...     same cluster? which store is the latest? (concurrent ones said so)
  replog admin mark-clean DIR     mark that store clean, final signature from its own vclock

inspect and compare never write: the store is opened read-only (a running node may keep it open)
and the identity files are only read. A store's vclock is the store's own, advanced by any WAL rows
past it (what the node would replay at start), keyed by member uuid, since local ids mean nothing
across nodes. mark-clean refuses a data dir a running node holds. The procedure is in
docs/operations.md ("Recovering a cluster that stopped dirty")."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from node.core.link import twins
from node.core.vclock import Order
from node.errors import ReplogError
from node.identity import identity_file as idf
from node.identity.signature import (FinalSignature, StoreInfo, StoreStatus, compare_stores, final_to_wire,
                                     stored_status)
from node.lifecycle import LOCK_FILE
from node.storage.store import Store, read_only_view


class AdminError(ReplogError):
    pass


def _identity(data_dir: str) -> str:
    d = Path(data_dir)
    try:
        ident = idf._decode(d / idf.IDENTITY_FILE, idf.Identity)      # read only: no cleanup of a leftover temp
        pending = idf._decode(d / idf.PENDING_FILE, idf.PendingRegistration)
    except idf.IdentityFileError as e:
        return f"DAMAGED: {e}"
    if ident is not None:
        extra = " (a leftover identity.temp is removed at the next start)" if pending is not None else ""
        return (f"id {ident.replica_id} in cluster {ident.cluster_uuid}, register code "
                f"{ident.register_code[:8]}…{extra}")
    if pending is not None:
        asked = "the lowest free id" if pending.requested_id is None else f"id {pending.requested_id}"
        return (f"registration unfinished: asks {asked} of cluster {pending.cluster_uuid}, register code "
                f"{pending.register_code[:8]}… (the next start retries it with the same code)")
    return "none"


def _wal_vclock(data_dir: str, ids: dict[int, str]) -> tuple[dict[str, int], str]:
    """Highest lsn per origin uuid in the WAL (rows of local spaces left out), and a note."""
    from node.wal.dump import iter_rows
    out: dict[str, int] = {}
    unknown = 0
    try:
        for row in iter_rows(data_dir):
            if row["group"] == "local":
                continue
            origin = row["origin"] or ids.get(row["replica_id"])
            if origin is None:
                unknown += 1
                continue
            if row["lsn"] > out.get(origin, 0):
                out[origin] = row["lsn"]
    except ReplogError as e:
        return out, f"WAL damaged: {e}"
    return out, (f"{unknown} WAL rows of unknown origin left out" if unknown else "")


def load(data_dir: str) -> dict:
    """What one data dir holds, read-only."""
    if not os.path.isdir(data_dir):
        raise AdminError(f"{data_dir}: not a directory")
    store_dir = os.path.join(data_dir, "store")
    view = read_only_view(store_dir) if os.path.isfile(os.path.join(store_dir, "data.mdb")) \
        else {"meta": {}, "cluster": []}
    meta, cluster = view["meta"], view["cluster"]
    status, initial, final = stored_status(meta.get)
    ids = {int(r[1]): str(r[0]) for r in cluster}
    vclock = {ids[int(rid)]: int(lsn) for rid, lsn in (meta.get("vclock") or {}).items()
              if int(rid) != 0 and int(rid) in ids and lsn}
    wal, note = _wal_vclock(data_dir, ids) if status is not StoreStatus.EMPTY else ({}, "")
    for u, lsn in wal.items():
        if lsn > vclock.get(u, 0):
            vclock[u] = lsn
    return {"dir": data_dir, "meta": meta, "cluster": cluster, "status": status, "initial": initial,
            "final": final, "vclock": dict(sorted(vclock.items())), "wal_note": note,
            "identity": _identity(data_dir)}


def _initial_text(s) -> str:
    if s is None:
        return "none"
    return f"cluster {s.cluster_uuid}, created_s {s.created_s}, founders {', '.join(s.founders)}"


def cmd_inspect(data_dir: str) -> int:
    info = load(data_dir)
    meta = info["meta"]
    final = info["final"]
    lines = [
        ("data dir", info["dir"]),
        ("uuid", meta.get("uuid") or "none"),
        ("identity", info["identity"]),
        ("cluster", f"{meta.get('cluster_uuid') or 'none'} ({meta.get('cluster_name') or '?'})"),
        ("status", info["status"].value + (" (anonymous replica)" if meta.get("anon") else "")),
        ("initial signature", _initial_text(info["initial"])),
        ("final signature", "none" if final is None else
         f"shutdown {final.shutdown_id}, vclock {json.dumps(final.vclock_by_uuid, sort_keys=True)}"
         + ("" if info["status"] is StoreStatus.CLEAN else " (from an earlier clean shutdown; the store ran since)")),
        ("vclock by uuid", json.dumps(info["vclock"], sort_keys=True)),
        ("store format", str(meta.get("store_format") or 1)),
    ]
    restored = meta.get("restored_from")       # node/ops/restore.py
    if isinstance(restored, dict):
        lines.append(("restored from", f"backup of {restored.get('backup_uuid')} at vclock "
                      f"{json.dumps(restored.get('vclock'), sort_keys=True)}"
                      + (" as a new member" if restored.get("as_new_member") else "")))
    twin = os.path.join(data_dir, twins.STOPPED_FILE)
    if os.path.exists(twin):             # node/core/link/twins.py: this dir does not serve again unasked
        lines.append(("twin stopped", f"a process on this dir stopped as the younger of two processes of its "
                      f"member, with no fence up ({twin}): it may hold rows under lsns the other used"))
    if info["wal_note"]:
        lines.append(("wal", info["wal_note"]))
    width = max(len(k) for k, _ in lines) + 1
    for k, v in lines:
        print(f"{k + ':':<{width}} {v}")
    print(f"{'members:':<{width}} {len(info['cluster'])}")
    for r in sorted(info["cluster"], key=lambda r: r[1]):
        print(f"  id {r[1]:<4} {r[0]}  {r[3]:<9} {r[2]}")
    return 0


_REL = {Order.BEFORE: "is behind", Order.AFTER: "is ahead of", Order.EQUAL: "equals",
        Order.CONCURRENT: "is concurrent with"}


def cmd_compare(dirs: list[str]) -> int:
    infos = [load(d) for d in dirs]
    for i in infos:
        print(f"{i['dir']}: {i['status'].value}; {_initial_text(i['initial'])}; "
              f"vclock {json.dumps(i['vclock'], sort_keys=True)}"
              + (f"; final signature: shutdown {i['final'].shutdown_id}" if i["status"] is StoreStatus.CLEAN else "")
              + (f"; {i['wal_note']}" if i["wal_note"] else ""))
    cmp = compare_stores(StoreInfo(i["dir"], i["initial"], i["final"], i["vclock"]) for i in infos)
    for a, b, order in cmp.relations:
        print(f"  {a} {_REL[order]} {b}")
    if cmp.same_cluster:
        print("same cluster: yes")
        print(f"latest: {', '.join(cmp.latest) if cmp.latest else 'none (no single latest store)'}")
        if cmp.concurrent:
            print("concurrent: " + "; ".join(f"{a} and {b}" for a, b in cmp.concurrent))
    else:
        print("same cluster: no")
    print(cmp.summary)
    return 0 if cmp.same_cluster else 1


def manual_shutdown_id(vclock: dict[str, int]) -> str:
    """Two stores marked clean by hand at one vclock get one final signature."""
    return "manual-" + hashlib.sha256(json.dumps(vclock, sort_keys=True).encode()).hexdigest()[:16]


def cmd_mark_clean(data_dir: str) -> int:
    import fcntl
    if not os.path.isdir(data_dir):
        raise AdminError(f"{data_dir}: not a directory")
    fd = os.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AdminError(f"{data_dir} is in use by a running replog node; stop it first") from None
        info = load(data_dir)
        if info["status"] is StoreStatus.EMPTY:
            raise AdminError(f"{data_dir}: the store is empty; there is nothing to mark clean")
        if info["wal_note"].startswith("WAL damaged"):
            raise AdminError(f"{data_dir}: {info['wal_note']}; the node would not start from it")
        if info["meta"].get("anon"):
            raise AdminError(f"{data_dir}: an anonymous replica's store is not a member's; mark a member's store")
        final = FinalSignature(info["vclock"], manual_shutdown_id(info["vclock"]))
        if info["status"] is StoreStatus.CLEAN and info["final"] == final:
            print(f"{data_dir}: already clean (shutdown {final.shutdown_id})")
            return 0
        store = Store(os.path.join(data_dir, "store"))
        try:
            store.set_meta(store_status=StoreStatus.CLEAN.value, final_signature=final_to_wire(final))
            store.sync()
        finally:
            store.close()
        print(f"{data_dir}: marked clean; final signature: shutdown {final.shutdown_id}, "
              f"vclock {json.dumps(final.vclock_by_uuid, sort_keys=True)}")
        print("restart the cluster: members without a clean store catch up from this one")
        return 0
    finally:
        os.close(fd)


def main(args: argparse.Namespace) -> int:
    try:
        if args.admin_cmd == "inspect":
            return cmd_inspect(args.dir)
        if args.admin_cmd == "compare":
            return cmd_compare(args.dirs)
        if args.admin_cmd == "mark-clean":
            return cmd_mark_clean(args.dir)
    except (ReplogError, ValueError) as e:
        sys.stderr.write(f"replog: error: {e}\n")
        return 2 if isinstance(e, AdminError) else 1
    except BrokenPipeError:
        return 0
    raise AssertionError(f"unknown admin command {args.admin_cmd!r}")
