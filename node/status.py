"""`replog status`: every member of the cluster, whether it answers, whether it is ready, its
upstreams and their lag, its id on each node, and vclocks by member uuid.

Rules kept here:
- Members are followed from the `_cluster` tables (and anonymous subscribers) of the nodes that
  answer, but the client token goes only to the URLs given on the command line: a member's
  address is learned from the cluster, and anyone holding the cluster secret can register a
  member at an address it listens on. A learned member is still asked `/readyz`, which needs no
  token, so its reachability and readiness are known; its details need it named on the command line.
- vclocks are shown by member uuid, never in one node's local ids.
- The report is healthy only when every member that is not expelled answers and is ready.
- `collect` makes the requests (through node.cli_http.http); `render_*` only format a Report."""
from __future__ import annotations

import json
import urllib.error
from dataclasses import dataclass, field

from node.cli_http import http
from node.limits import status_request_timeout_s


@dataclass
class Report:
    nodes: dict[str, dict] = field(default_factory=dict)        # uuid -> /v1/info of nodes read in full
    clusters: dict[str, list] = field(default_factory=dict)     # uuid -> its /v1/cluster members
    ready: dict[str, dict] = field(default_factory=dict)        # address or uuid -> /readyz answer
    unreachable: dict[str, str] = field(default_factory=dict)   # url -> why
    needs_token: list[str] = field(default_factory=list)        # learned urls that want the token
    by_url: dict[str, str] = field(default_factory=dict)        # url -> uuid, for urls that answered /v1/info

    @property
    def healthy(self) -> bool:
        return bool(self.nodes) and all(m["reachable"] and m["ready"] is not False
                                        for m in members(self) if m["state"] != "expelled")


def _get(url: str, path: str, token: str | None, ca_file: str | None) -> tuple[int, object]:
    """token None means $REPLOG_TOKEN (node.cli_http.http); "" sends none."""
    return http("GET", url + path, token=token, timeout=status_request_timeout_s, ca_file=ca_file)


def collect(urls: list[str], token: str | None = None, ca_file: str | None = None) -> Report:
    r = Report()
    given = set(urls)
    scheme = urls[0].split("://", 1)[0] if urls else "http"
    queue, seen = list(urls), set()
    while queue:
        u = queue.pop(0)
        if u in seen:
            continue
        seen.add(u)
        t = token if u in given else ""        # learned addresses get no token, ever
        try:
            ready_status, ready = _get(u, "/readyz", "", ca_file)
            status, info = _get(u, "/v1/info", t, ca_file)
            if status == 401:
                r.needs_token.append(u)
                if ready_status != 404 and isinstance(ready, dict):
                    r.ready[u] = ready
                continue
            _, cl = _get(u, "/v1/cluster", t, ca_file)
        except (urllib.error.URLError, OSError) as e:
            r.unreachable[u] = str(getattr(e, "reason", e))
            continue
        if not isinstance(info, dict) or "uuid" not in info or not isinstance(cl, dict):
            r.unreachable[u] = f"not a replog node (HTTP {status})"
            continue
        uid = info["uuid"]
        r.nodes[uid], r.clusters[uid], r.by_url[u] = info, cl.get("members", []), uid
        if ready_status != 404:            # a node older than /readyz: readiness unknown, not "not ready"
            r.ready[uid] = ready if isinstance(ready, dict) and "status" in ready else \
                {"status": f"HTTP {ready_status}", "reasons": [f"/readyz answered HTTP {ready_status}"]}
        for mem in r.clusters[uid]:
            if mem.get("address") and mem.get("state") != "expelled":
                queue.append(f"{scheme}://" + mem["address"])
        for d in info.get("downstreams", []):
            if d.get("anon") and d.get("address"):
                queue.append(f"{scheme}://" + d["address"])
    return r


def members(r: Report) -> list[dict]:
    """One entry per member uuid (and anonymous replica) that any answering node knows."""
    order: dict[str, dict] = {}
    for n, cl in r.clusters.items():
        for mem in cl:
            e = order.setdefault(mem["uuid"], {"uuid": mem["uuid"], "address": mem.get("address", ""),
                                               "state": mem.get("state", ""), "ids": {}})
            e["ids"][n] = mem.get("id")
            if mem.get("state") == "expelled":
                e["state"] = "expelled"
                e["expelled_lsn"] = max(e.get("expelled_lsn", 0), int(mem.get("expelled_lsn") or 0))
    for n, info in r.nodes.items():
        e = order.setdefault(n, {"uuid": n, "address": info.get("address", ""), "state": "", "ids": {}})
        if info.get("anon"):
            e["state"] = "anonymous"
        e["address"] = info.get("address") or e["address"]
    url_of_address = {u.split("://", 1)[1]: u for u in list(r.unreachable) + r.needs_token}
    url_of_address.update({u.split("://", 1)[1]: u for u in r.by_url})
    out = []
    for e in order.values():
        info = r.nodes.get(e["uuid"])
        url = url_of_address.get(e["address"])
        ready = r.ready.get(e["uuid"]) or (r.ready.get(url) if url else None)
        e["reachable"] = info is not None or (url in r.needs_token)
        e["error"] = None if e["reachable"] else (r.unreachable.get(url) if url else "not tried") \
            if e["state"] != "expelled" else "expelled"
        e["details"] = "shown" if info else ("needs the token: name it on the command line"
                                             if url in r.needs_token else None)
        e["status"] = info.get("status") if info else None
        e["ready"] = None if ready is None else ready.get("status") == "ready"
        e["reasons"] = ready.get("reasons", []) if ready else []
        ups = [{"uuid": a.get("uuid"), "address": a.get("address"), "status": a.get("status"),
                "lag_s": a.get("lag_s"), "error": a.get("error") or None} for a in (info or {}).get("upstreams", [])]
        e["upstreams"] = ups
        following = [a["lag_s"] for a in ups if a["status"] == "follow"]
        e["lag_s"] = max(following) if following else None
        e["vclock"] = info.get("vclock_uuid") if info else None
        out.append(e)
    return out


def render_json(r: Report) -> str:
    return json.dumps({"healthy": r.healthy, "members": members(r), "unreachable": r.unreachable,
                       "needs_token": r.needs_token}, indent=2, ensure_ascii=False)


def _short(u: str | None) -> str:
    return (u or "?")[:8]


def _grid(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(x[i])) for x in [head] + rows) for i in range(len(head))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(x, widths)).rstrip() for x in [head] + rows]


def render_table(r: Report, names: dict[str, str] | None = None) -> str:
    """The report as text; `names` (address -> name, the demo's) label members instead of uuid prefixes."""
    ms = members(r)
    nodes = list(r.nodes)
    label = {e["uuid"]: (names or {}).get(e["address"]) or _short(e["uuid"]) for e in ms}
    _label = label.get
    head = ["member", "address", "state", "reachable", "status", "ready", "upstreams", "lag_s"] + \
        [f"id@{_label(n, _short(n))}" for n in nodes]
    rows = []
    for e in ms:
        ups = e["upstreams"]
        up = "-" if not e["vclock"] else \
            (f"{sum(a['status'] == 'follow' for a in ups)}/{len(ups)} follow" if ups else "none")
        lag = "-" if e["lag_s"] is None else f"{e['lag_s']:.3f}"
        reach = "yes" if e["reachable"] else ("expelled" if e["state"] == "expelled" else "NO")
        ready = {True: "yes", False: "NO", None: "-"}[e["ready"]]
        rows.append([label[e["uuid"]], e["address"], e["state"] or "-", reach, e["status"] or "-", ready, up, lag]
                    + [str(e["ids"].get(n, "-")) for n in nodes])
    lines = _grid(head, rows)
    origins = sorted({o for n in nodes for o in r.nodes[n].get("vclock_uuid", {})}, key=_order(ms))
    if nodes and origins:
        lines += ["", "vclock by member uuid (rows: nodes; columns: origins)"]
        lines += _grid(["node"] + [_label(o, _short(o)) for o in origins],
                       [[_label(n, _short(n))] + [str(r.nodes[n].get("vclock_uuid", {}).get(o, 0)) for o in origins]
                        for n in nodes])
    problems = [p for e in ms if e["state"] == "expelled" and (p := _short_of_bound(r, e, ms, label))]
    for e in ms:
        if e["state"] == "expelled":
            continue
        if not e["reachable"]:
            problems.append(f"{label[e['uuid']]} at {e['address'] or '?'} is unreachable: {e['error']}")
        for why in e["reasons"]:
            problems.append(f"{label[e['uuid']]} is not ready: {why}")
        said = " ".join(e["reasons"])
        for a in e["upstreams"]:
            if a["status"] != "follow" and f"upstream {a['address']} " not in said:
                problems.append(f"{label[e['uuid']]} upstream {a['address']} ({_label(a['uuid'], _short(a['uuid']))}) is "
                                f"{a['status']}" + (f": {a['error']}" if a["error"] else ""))
    for u in r.needs_token:
        problems.append(f"{u} answers, but its details need the token, which goes only to the URLs given: "
                        "name it on the command line")
    lines += [""] + (problems or ["every member answers and is ready"])
    return "\n".join(lines)


def _short_of_bound(r: Report, x: dict, ms: list[dict], label: dict[str, str]) -> str | None:
    """An expelled member whose rows up to its bound not every member that answered holds yet:
    it alone may hold the rest (docs/replication.md, "A bound is only as safe as the disk that
    backs it"), so it must run, followed, until they do."""
    bound = x.get("expelled_lsn", 0)
    members = {e["uuid"] for e in ms if e["state"] not in ("expelled", "anonymous")}
    have = {n: info.get("vclock_uuid", {}).get(x["uuid"], 0) for n, info in r.nodes.items() if n in members}
    short = [(label.get(n, _short(n)), lsn) for n, lsn in have.items() if lsn < bound]
    if not short:
        return None
    held = ", ".join(f"{name} holds them to {lsn}" for name, lsn in short)
    return (f"{label[x['uuid']]} is expelled with its rows accepted up to lsn {bound}, but {held}: keep it "
            "running and followed until every member holds them all, or those rows are lost with it")


def _order(ms: list[dict]):
    pos = {e["uuid"]: i for i, e in enumerate(ms)}
    return lambda u: (pos.get(u, len(pos)), u)


def convergence(r: Report, names: dict[str, str] | None = None) -> str:
    """One line: whether every node that answered holds the same rows, or who lags by how much."""
    if not r.nodes:
        return "no node answered"
    vcs = {n: info.get("vclock_uuid", {}) for n, info in r.nodes.items()}
    origins = {o for v in vcs.values() for o in v}
    top = {o: max(v.get(o, 0) for v in vcs.values()) for o in origins}
    behind = {n: sum(top[o] - v.get(o, 0) for o in origins) for n, v in vcs.items()}
    label = {n: (names or {}).get(info.get("address", "")) or _short(n) for n, info in r.nodes.items()}
    if not any(behind.values()):
        return f"converged: all {len(vcs)} nodes hold the same {sum(top.values())} rows"
    worst = sorted((b, label[n]) for n, b in behind.items() if b)[::-1]
    return "lagging: " + ", ".join(f"{name} is {b} rows behind" for b, name in worst)


def status_table(urls: list[str], token: str | None = None, ca_file: str | None = None) -> str:
    """The table for `urls` (tests)."""
    return render_table(collect(urls, token, ca_file))
