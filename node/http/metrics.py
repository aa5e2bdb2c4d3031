"""`GET /metrics`: Prometheus text, collected from the node's live state at scrape time
(no counters are duplicated outside the objects that own them), and the HTTP request
latency histogram, measured by a middleware.

Rules kept here:
- One label scheme for peers, upstream and downstream alike: `peer_uuid` (empty while an
  upstream has not answered its handshake yet) and `peer_address`.
- vclocks are exported by origin uuid (`origin_uuid`), never by local id: ids differ per node.
- The registry is the node's own (one per app, so tests may run several nodes in a process),
  with prometheus-client's process, platform and GC collectors added back to it.
- Streams (/v1/replication, /v1/events) are not timed: they last as long as their connection.
- docs/grafana-replog.json is built on these names; a test checks that each of its queries
  names a metric a node exports."""
from __future__ import annotations

import os
import platform
import time
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from node.core import rowscan
from node.http.health import WATCH, readiness, warnings
from node.latency import Histogram
from node.version import version

if TYPE_CHECKING:
    from node.process.ports import MetricsView

HTTP_LATENCY = web.AppKey("http_latency", dict)
UNTIMED_PATHS = ("/v1/replication", "/v1/events")


def _hist(name: str, doc: str, labels: list[str] | None = None, series=()) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=labels)
    for values, h in series:
        fam.add_metric(values, h.cumulative(), h.sum)
    return fam


def _dir_bytes(path: str) -> tuple[int, int]:
    """(bytes, files) of the regular files directly in `path` (0, 0 if it is missing)."""
    total = n = 0
    try:
        with os.scandir(path) as it:
            for e in it:
                if e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
                    n += 1
    except OSError:
        pass
    return total, n


class NodeCollector:
    def __init__(self, node: "MetricsView", app: web.Application):
        self.node = node
        self.app = app

    def collect(self):
        node = self.node
        j = node.journal
        wal = j.wal if j else None
        yield CounterMetricFamily("replog_rows_written", "Rows persisted (WAL + store)", value=j.rows_written if j else 0)
        yield CounterMetricFamily("replog_txns_written", "Transactions persisted", value=j.txns_written if j else 0)
        yield CounterMetricFamily("replog_commit_batches", "Group-commit batches", value=j.batches if j else 0)
        yield CounterMetricFamily("replog_wal_bytes", "Bytes written to the WAL", value=wal.bytes_written if wal else 0)
        yield CounterMetricFamily("replog_wal_fsyncs", "fsync calls on the WAL", value=wal.fsyncs if wal else 0)
        yield from self._latency(j, wal)
        yield from self._disk()
        yield from self._vclock()
        yield from self._peers()
        guard = node.link_guard
        yield CounterMetricFamily("replog_link_auth_failures", "Inbound links that failed before authenticating "
                                  "(wrong secret, garbage, too large, refused handshakes)", value=guard.failures.failures)
        yield CounterMetricFamily("replog_link_handshakes_refused", "Inbound handshakes refused before the upgrade "
                                  "(too many in flight)", value=guard.gate.refused)
        failures = CounterMetricFamily("replog_task_failures", "Unexpected failures (bugs) of background tasks "
                                       "and links; each is logged with its traceback", labels=["task"])
        for name, f in getattr(node, "task_failures", {}).items():
            failures.add_metric([name], f["failures"])
        yield failures
        space = node.space.now()
        alarm = GaugeMetricFamily("replog_alarm", "1 while an alarm is raised (NOSPACE: writes refused for lack "
                                  "of disk or map space)", labels=["alarm"])
        alarm.add_metric(["NOSPACE"], 1 if space["alarms"] else 0)
        yield alarm
        yield CounterMetricFamily("replog_nospace_alarms", "Times the NOSPACE alarm was raised", value=space["raised"])
        for name, key, what in (("replog_store_map_size_bytes", "map_size_bytes", "The store's LMDB map size (map_size)"),
                                ("replog_store_map_used_bytes", "map_used_bytes", "High-water mark of the store's "
                                 "LMDB map (pages ever used; freed ones are reused)"),
                                ("replog_disk_free_bytes", "disk_free_bytes", "Free bytes on the data dir's file system")):
            if space[key] is not None:
                yield GaugeMetricFamily(name, what, value=space[key])
        yield from self._health()
        yield from self._build()
        for fam in getattr(node, "extra_metrics", lambda: [])():
            yield fam

    def _latency(self, j, wal):
        empty = Histogram()
        yield _hist("replog_wal_write_seconds", "write() of one group-commit batch to the WAL",
                    series=[([], wal.write_seconds if wal else empty)])
        yield _hist("replog_wal_fsync_seconds", "fsync of one group-commit batch (wal_mode fsync)",
                    series=[([], wal.fsync_seconds if wal else empty)])
        yield _hist("replog_commit_seconds", "One group-commit batch from its WAL write to durable in the store "
                    "(WAL write, fsync, LMDB commit)", series=[([], j.commit_seconds if j else empty)])
        yield _hist("replog_http_request_seconds", "HTTP requests by method and route, until the answer is built",
                    ["method", "route"], sorted(self.app[HTTP_LATENCY].items()))

    def _disk(self):
        node = self.node
        wal_bytes, segments = _dir_bytes(node.wal_dir)
        store_bytes, _ = _dir_bytes(os.path.join(node.data_dir, "store"))
        yield GaugeMetricFamily("replog_wal_disk_bytes", "Bytes of WAL segments on disk", value=wal_bytes)
        yield GaugeMetricFamily("replog_wal_segments", "WAL segment files on disk", value=segments)
        yield GaugeMetricFamily("replog_store_disk_bytes", "Bytes of the LMDB store's files on disk", value=store_bytes)

    def _vclock(self):
        core = self.node.core
        lsn = GaugeMetricFamily("replog_vclock_lsn", "This node's vclock: the last lsn applied of each origin "
                                "(replicated rows), by origin uuid", labels=["origin_uuid"])
        if core is not None:
            for u, v in sorted(core.vclock_by_uuid().items()):
                lsn.add_metric([u], v)
        yield lsn
        yield GaugeMetricFamily("replog_vclock_local_lsn", "Rows of local spaces written here (vclock component 0)",
                                value=core.vclock.get(0) if core is not None else 0)

    def _peers(self):
        node = self.node
        labels = ["peer_uuid", "peer_address"]
        applied = CounterMetricFamily("replog_rows_applied", "Rows applied from an upstream", labels=labels)
        lag = GaugeMetricFamily("replog_replication_lag_seconds", "Replication lag per upstream", labels=labels)
        state = GaugeMetricFamily("replog_applier_state", "1 for the applier's current state",
                                  labels=labels + ["state"])
        for a in node.appliers.values():
            ids = [a.peer_uuid or "", a.address]
            applied.add_metric(ids, a.rows)
            lag.add_metric(ids, a.lag_s)
            state.add_metric(ids + [a.status], 1)
        yield applied
        yield lag
        yield state
        dl = GaugeMetricFamily("replog_downstream_lag_seconds", "Lag reported by each subscriber",
                               labels=labels + ["anon"])
        for r in node.relays:
            dl.add_metric([r.uuid, r.address, "true" if r.anon else "false"], r.lag_s)
        yield dl

    def _health(self):
        node = self.node
        running = node.status == "running"
        yield GaugeMetricFamily("replog_up", "1 when the node serves clients", value=1 if running else 0)
        yield GaugeMetricFamily("replog_ready", "1 when /readyz answers ready", value=0 if readiness(node) else 1)
        yield GaugeMetricFamily("replog_health_warnings", "Warnings /v1/health reports (upstreams down or lagging)",
                                value=len(warnings(node)) if running else 0)
        watch = self.app.get(WATCH)
        yield GaugeMetricFamily("replog_event_loop_lag_seconds", "How late the event loop's last watch wake-up "
                                "came", value=watch.current_s() if watch else 0.0)
        yield GaugeMetricFamily("replog_start_time_seconds", "When the node process started (Unix time)",
                                value=node.started_at)

    def _build(self):
        info = GaugeMetricFamily("replog_build_info", "replog's version, the Python running it, and whether the "
                                 "native row scanner is built (1 always)", labels=["version", "python", "native"])
        info.add_metric([version(), platform.python_version(), "true" if rowscan.native is not None else "false"], 1)
        yield info


def install_metrics(app: web.Application, node: "MetricsView") -> None:
    """Route /metrics and time every HTTP request but the streams."""
    app[HTTP_LATENCY] = {}
    reg = CollectorRegistry()
    reg.register(NodeCollector(node, app))
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    GCCollector(registry=reg)

    @web.middleware
    async def latency_mw(request: web.Request, handler):
        if request.path.startswith(UNTIMED_PATHS):
            return await handler(request)
        t0 = time.perf_counter()
        try:
            return await handler(request)
        finally:
            info = request.match_info
            route = info.route.resource.canonical if info.route.resource is not None else "unmatched"
            key = (request.method, route)
            h = app[HTTP_LATENCY].get(key)
            if h is None:
                h = app[HTTP_LATENCY][key] = Histogram()
            h.observe(time.perf_counter() - t0)

    app.middlewares.insert(0, latency_mw)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(reg), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type": "text/plain; version=0.0.4"})

    app.router.add_get("/metrics", metrics)
