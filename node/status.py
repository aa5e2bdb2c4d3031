"""`replog status`: one table of every member, its id on each node, vclocks and lag.

It follows the member addresses the named nodes report, but sends the client token only to
the URLs it was given: a member's address is learned from the cluster, and anyone holding the
cluster secret can register a member at an address it listens on. A learned member that wants
the token is listed as such; name it on the command line to see it."""
from __future__ import annotations

import replog

from node.cli import sdk_client


def status_table(urls: list[str], token: str | None = None, ca_file: str | None = None) -> str:
    infos, clusters = {}, {}
    given = set(urls)
    scheme = urls[0].split("://", 1)[0] if urls else "http"
    queue = list(urls)
    seen = set()
    needs_token = []
    while queue:
        u = queue.pop(0)
        if u in seen:
            continue
        seen.add(u)
        try:
            # An empty token, not None: None would fall back to $REPLOG_TOKEN (node.cli.sdk_client).
            with sdk_client(u, token if u in given else "", ca_file, timeout=3, transport="http") as c:
                info, cl = c.info(), c.cluster()
        except replog.Unauthorized:
            needs_token.append(u)
            continue
        except replog.ReplogError:
            continue
        if not isinstance(info, dict) or "uuid" not in info:
            continue
        infos[info["uuid"]], clusters[info["uuid"]] = info, cl
        for mem in cl.get("members", []):
            if mem.get("address") and mem["state"] != "expelled":
                queue.append(f"{scheme}://" + mem["address"])
    nodes = list(infos)
    uuids = []
    for n in nodes:
        for mem in clusters[n].get("members", []):
            if mem["uuid"] not in uuids:
                uuids.append(mem["uuid"])
    for n in nodes:
        if n not in uuids:
            uuids.append(n)
    head = ["member", "state", "address"] + [f"id@{n[:8]}" for n in nodes] + ["lsn (max)", "lag_s"]
    rows = []
    for u in uuids:
        ids, state, addr, lsn = [], "", "", 0
        for n in nodes:
            mem = next((x for x in clusters[n].get("members", []) if x["uuid"] == u), None)
            ids.append(str(mem["id"]) if mem else "-")
            if mem:
                state, addr = mem["state"], mem["address"]
            lsn = max(lsn, infos[n].get("vclock_uuid", {}).get(u, 0))
        info = infos.get(u)
        if info and info.get("anon"):
            state = "anonymous"
            addr = info.get("address", addr)
        lag = max([x.get("lag_s", 0) for x in (info or {}).get("upstreams", [])] or [0])
        rows.append([u[:8], state, addr] + ids + [str(lsn), f"{lag:.3f}" if info else "-"])
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in [head] + rows]
    lines.append("")
    for n in nodes:
        i = infos[n]
        lines.append(f"{n[:8]} {i['status']:<8} vclock {i['vclock']}")
    if needs_token:
        lines.append(f"not shown (they need the token, which goes only to the URLs given): {', '.join(needs_token)}")
    return "\n".join(lines)
