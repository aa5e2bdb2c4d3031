"""/metrics on real processes: latency histograms that count what happened, the vclock by origin
uuid, WAL and store bytes that match the disk, process and build info, one peer label scheme up
and down; and the Grafana dashboard in docs/ asks only for metrics a node exports."""
from __future__ import annotations

import json
import os
import pathlib
import re
import urllib.request

import promql_parser

from tests.integration.harness import ReplogProcess, mesh, wait_for

REPO = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "docs" / "grafana-replog.json"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})? (\S+)$')


def scrape(node: ReplogProcess) -> list[tuple[str, dict, float]]:
    with urllib.request.urlopen(node.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, line
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def exported(node: ReplogProcess) -> set[str]:
    """Sample names a node exports, also of families declared without a series yet (a labelled
    counter that has not counted anything, like replog_task_failures_total)."""
    with urllib.request.urlopen(node.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    names = {n for n, _, _ in scrape(node)}
    suffixes = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", "")}
    for fam, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        names |= {fam + x for x in suffixes.get(kind, ("",))}
    return names


def value(samples, name: str, **labels) -> float:
    found = [v for n, lab, v in samples if n == name and all(lab.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_metrics_count_latencies_vclocks_disk_and_label_peers_by_uuid_and_address(tmp_path, procs):
    a, b = mesh(tmp_path, 2, extra=["--wal-mode", "fsync"])
    procs.extend([a, b])
    a.create_space("kv")
    for i in range(5):
        a.kv_put("kv", f"k{i}", i)
    wait_for(lambda: a.info()["vclock_uuid"] == b.info()["vclock_uuid"], 20, "B caught up")
    wait_for(lambda: b.info()["downstreams"], 20, "A subscribed to B")
    s = scrape(a)
    info = a.info()

    # histograms: one observation per group-commit batch, fsync mode fsyncs each
    batches = value(s, "replog_commit_batches_total")
    assert value(s, "replog_commit_seconds_count") == batches >= 6
    assert value(s, "replog_wal_write_seconds_count") == batches
    assert value(s, "replog_wal_fsync_seconds_count") == value(s, "replog_wal_fsyncs_total") == batches
    assert value(s, "replog_commit_seconds_bucket", le="+Inf") == batches
    buckets = [v for n, lab, v in s if n == "replog_commit_seconds_bucket"]
    assert buckets == sorted(buckets), "cumulative"
    puts = value(s, "replog_http_request_seconds_count", method="PUT", route="/v1/spaces/{space}/keys/{key}")
    assert puts == 5
    assert not [lab for n, lab, v in s if n == "replog_http_request_seconds_count"
                and lab["route"] in ("/v1/replication", "/v1/events")], "streams are not timed"

    # the vclock by origin uuid, as /v1/info says it
    assert {lab["origin_uuid"]: v for n, lab, v in s if n == "replog_vclock_lsn"} == info["vclock_uuid"]

    # bytes on disk
    wal_dir = os.path.join(a.data_dir, "wal")
    wal_files = [os.path.join(wal_dir, f) for f in os.listdir(wal_dir)]
    assert value(s, "replog_wal_disk_bytes") == sum(os.path.getsize(f) for f in wal_files)
    assert value(s, "replog_wal_segments") == len(wal_files)
    assert value(s, "replog_store_disk_bytes") >= os.path.getsize(os.path.join(a.data_dir, "store", "data.mdb")) > 0

    # process, platform, GC and build info
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds",
                 "python_gc_collections_total"):
        assert any(n == name for n, _, _ in s), name
    [build] = [lab for n, lab, v in s if n == "replog_build_info"]
    assert build["version"] and build["python"] and build["native"] in ("true", "false")
    assert any(n == "python_info" for n, _, _ in s)

    # one label scheme for peers: uuid and address, upstream and downstream alike
    bu = b.uuid()
    for name in ("replog_rows_applied_total", "replog_replication_lag_seconds", "replog_downstream_lag_seconds"):
        [lab] = [lab for n, lab, v in s if n == name]
        assert lab["peer_uuid"] == bu and lab["peer_address"] == b.address, (name, lab)
    assert value(s, "replog_applier_state", peer_uuid=bu, peer_address=b.address, state="follow") == 1
    assert value(s, "replog_up") == 1 and value(s, "replog_ready") == 1 and value(s, "replog_health_warnings") == 0

    b.kill9()
    wait_for(lambda: value(scrape(a), "replog_ready") == 0, 30, "replog_ready follows /readyz")
    assert value(scrape(a), "replog_health_warnings") >= 1


def _selectors(expr) -> list[str]:
    """Metric names of every vector selector in a parsed PromQL expression."""
    if isinstance(expr, promql_parser.VectorSelector):
        return [expr.name]
    out = []
    for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
        sub = getattr(expr, attr, None)
        if sub is not None and not isinstance(sub, (int, float, str)):
            out += _selectors(sub)
    for arg in getattr(expr, "args", None) or []:
        out += _selectors(arg)
    return out


def test_the_grafana_dashboard_is_valid_json_and_every_query_names_an_exported_metric(tmp_path, procs):
    a, b = mesh(tmp_path, 2, extra=["--wal-mode", "fsync"])
    procs.extend([a, b])
    a.create_space("kv")
    a.kv_put("kv", "k", 1)
    wait_for(lambda: b.info()["downstreams"] and a.info()["downstreams"], 20, "links both ways")
    names = exported(a)
    dash = json.loads(DASHBOARD.read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(panels) >= 20 and len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    for p in panels:
        assert p["targets"], p["title"]
        for t in p["targets"]:
            asked = _selectors(promql_parser.parse(t["expr"].replace("$instance", ".*")))
            assert asked, (p["title"], t["expr"])
            missing = set(asked) - names
            assert not missing, f"panel {p['title']!r} asks for {missing}, which a node does not export"
    var = next(v for v in dash["templating"]["list"] if v["name"] == "instance")
    assert re.fullmatch(r"label_values\((\w+), instance\)", var["query"]).group(1) in names
