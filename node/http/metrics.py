"""`GET /metrics`: Prometheus text, collected from the node's live state at scrape time
(no counters are duplicated outside the objects that own them)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from node.server import Node


class NodeCollector:
    def __init__(self, node: "Node"):
        self.node = node

    def collect(self):
        node = self.node
        j = node.journal
        wal = j.wal if j else None
        yield CounterMetricFamily("replog_rows_written", "Rows persisted (WAL + store)", value=j.rows_written if j else 0)
        yield CounterMetricFamily("replog_txns_written", "Transactions persisted", value=j.txns_written if j else 0)
        yield CounterMetricFamily("replog_commit_batches", "Group-commit batches", value=j.batches if j else 0)
        yield CounterMetricFamily("replog_wal_bytes", "Bytes written to the WAL", value=wal.bytes_written if wal else 0)
        yield CounterMetricFamily("replog_wal_fsyncs", "fsync calls on the WAL", value=wal.fsyncs if wal else 0)
        applied = CounterMetricFamily("replog_rows_applied", "Rows applied from an upstream", labels=["peer"])
        lag = GaugeMetricFamily("replog_replication_lag_seconds", "Replication lag per upstream", labels=["peer"])
        state = GaugeMetricFamily("replog_applier_state", "1 for the applier's current state", labels=["peer", "state"])
        for a in node.appliers.values():
            applied.add_metric([a.address], a.rows)
            lag.add_metric([a.address], a.lag_s)
            state.add_metric([a.address, a.status], 1)
        yield applied
        yield lag
        yield state
        dl = GaugeMetricFamily("replog_downstream_lag_seconds", "Lag reported by each subscriber", labels=["peer"])
        for r in node.relays:
            dl.add_metric([r.uuid], r.lag_s)
        yield dl
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
        up = GaugeMetricFamily("replog_up", "1 when the node serves clients")
        up.add_metric([], 1 if node.status == "running" else 0)
        yield up
        for fam in getattr(node, "extra_metrics", lambda: [])():
            yield fam


async def metrics_handler(request: web.Request) -> web.Response:
    from node.http.api import NODE
    node = request.app[NODE]
    reg = getattr(node, "_metrics_registry", None)
    if reg is None:
        reg = CollectorRegistry()
        reg.register(NodeCollector(node))
        node._metrics_registry = reg
    return web.Response(body=generate_latest(reg), content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type": "text/plain; version=0.0.4"})
