"""What a running node shows of itself: /v1/info and /v1/cluster (and the dashboard's snapshot,
node/http/events.py). Read-only: nothing here changes the node.

Rules kept here:
- A node that has no store yet (loading, joining) answers with what it has, never an error:
  ids and vclocks empty, `cluster_uuid` null.
- Vclocks are shown by local id as strings ({"1": 10}) and by member uuid, as SPEC.md says."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from node.cluster_space.table import STATE_EXPELLED
from node.core import messages as m
from node.core.vclock import VClock
from node.storage.store import STORE_FORMAT_VERSION
from node.wal.format import FORMAT_VERSION as WAL_FORMAT_VERSION
from node.wal.reader import list_segments

if TYPE_CHECKING:
    from node.process.ports import InfoHost


def info(node: "InfoHost") -> dict:
    core = node.core
    vc = core.vclock if core else VClock()
    rejoiner = node.rejoiner
    return {
        "uuid": node.uuid,
        "run": node.run,
        "id": core.self_id if core else None,
        "cluster_uuid": node.store.get_meta("cluster_uuid") if node.store else None,
        "cluster_name": node.cfg.cluster_name,
        "status": node.status,
        "status_reason": node.status_reason,
        "read_only": node.cfg.read_only or bool(core and core.anon),
        "anon": bool(core.anon) if core else node.cfg.anon,
        "address": node.cfg.address,
        "client_port": node.client_server.port if node.client_server else None,
        "wal_mode": node.cfg.wal_mode,
        "vclock": {str(k): v for k, v in vc.items()},
        "vclock_uuid": core.vclock_by_uuid() if core else {},
        "upstreams": [a.info() for a in node.appliers.values()],
        "downstreams": [r.info() for r in node.relays],
        "uptime_s": round(time.time() - node.started_at, 3),
        "lease": node.lease.info() if node.lease else None,
        "wal": wal_info(node),
        "tasks": node.task_failures,
        "own_rows_fence": node.fence.info(),
        "rejoin": rejoin_info(rejoiner),
        "space": node.space.now(),
        "versions": {"protocol": [m.PROTOCOL_VERSION_MIN, m.PROTOCOL_VERSION], "store_format": STORE_FORMAT_VERSION,
                     "wal_format": WAL_FORMAT_VERSION},     # docs/upgrade.md
    }


def rejoin_info(rejoiner) -> dict | None:
    """Who told this node to rejoin and why no rebuild yet; `going_without`: the expelled
    members (uuid -> the lsn it lacks them to) whose collected rows it goes without, its links
    asking their upstreams for the rest (docs/replication.md, "A rejoin discards nothing");
    `discard`: the expelled members whose rows the operator let a rebuild lose
    (POST /v1/admin/rejoin), until one is done."""
    without = rejoiner.going_without()
    if not rejoiner.need and not without:
        return None
    return {"needed_by": sorted(rejoiner.need), "blocked": rejoiner.blocked,
            "going_without": without, "discard": sorted(rejoiner.discard)}


def wal_info(node: "InfoHost") -> dict:
    return {"segments": len(list_segments(node.wal_dir)),
            "gc_vclock": {str(k): v for k, v in (node.store.get_meta("gc_vclock") or {}).items()}
            if node.store else {}}


def cluster_view(node: "InfoHost") -> dict:
    core = node.core
    if core is None:
        return {"members": []}
    out = []
    for mem in node.store.table.members():
        ids = {o: i for (o, mu), i in core.knowledge.items() if mu == mem.uuid}
        ids[node.uuid] = mem.id
        row = {"uuid": mem.uuid, "id": mem.id, "address": mem.address, "state": mem.state,
               "lsn": core.vclock.get(mem.id), "ids": ids}
        if mem.state == STATE_EXPELLED:
            row["expelled_lsn"] = mem.expelled_lsn     # its rows up to it are accepted, later ones refused
        out.append(row)
    return {"members": out}
