"""Health that tells the truth: `/livez`, `/readyz` and `/v1/health`, each with its reasons.

- `/livez`: the process runs and its event loop is responsive. 503 when the loop was late by more
  than `live_loop_lag_max_s` within the last `loop_watch_window_s`, or the node hit a fatal error
  (it is stopping). A supervisor restarts a node that is not live; nothing else makes it fail.
- `/readyz`: the node should get traffic. 503 unless it is running (joined, identity held, not
  forming, not rejoining), holds its own earlier rows again (no own-rows fence), has room to
  write (no NOSPACE alarm), at most `ready_upstreams_down_max` of
  its upstreams are not following, and every following upstream lags at most `ready_lag_max_s`.
- `/v1/health` keeps the SPEC's meaning: 200 while the node serves clients, 503 with
  `{"status", "reason"}` otherwise (503 `no_space` while the NOSPACE alarm is raised: reads are
  served, writes are not). While it serves, `status` is `ok`, or `degraded` with `warnings`
  (every upstream not following, every upstream over the lag bound, a map nearly full, a peer
  that is not an upstream saying it holds more of this node's own rows than the node has, this node
  expelled, by its own `_cluster` or by a member that refused it): a
  node whose upstreams are all down still serves, and says so.
All three need no token (like /metrics): probes carry none. Thresholds are options, reloaded
by SIGHUP (node/config.py)."""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING

from aiohttp import web

from node import limits

if TYPE_CHECKING:
    from node.process.ports import HealthView

WATCH = web.AppKey("loop_watch", object)
UNHEEDED_SHOWN = 3      # peers warnings() names that claim our rows (one with the secret can make up many)


class LoopWatch:
    """How late the event loop runs: a task that sleeps `loop_watch_interval_s` and records by
    how much each wake-up came late; `lag_s()` is the worst lateness in the window, counting a
    wake-up that is overdue right now."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque()   # (monotonic time, lateness s)
        self.last_wake = time.monotonic()
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name="loop-watch")

    async def stop(self) -> None:
        if self.task:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        step = limits.loop_watch_interval_s
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(step)
            now = time.monotonic()
            self.last_wake = now
            self.samples.append((now, max(0.0, now - t0 - step)))
            while self.samples and self.samples[0][0] < now - limits.loop_watch_window_s:
                self.samples.popleft()

    def lag_s(self) -> float:
        overdue = max(0.0, time.monotonic() - self.last_wake - limits.loop_watch_interval_s)
        return max([overdue] + [late for _, late in self.samples])

    def current_s(self) -> float:
        """The latest wake-up's lateness (the metric's value)."""
        return self.samples[-1][1] if self.samples else 0.0


def _upstreams(node: "HealthView") -> tuple[list, list]:
    """(upstreams not following, following upstreams over the lag bound)."""
    down = [a for a in node.appliers.values() if a.status != "follow"]
    slow = [a for a in node.appliers.values() if a.status == "follow" and a.lag_s > node.cfg.ready_lag_max_s]
    return down, slow


def _name(a) -> str:
    return f"{a.address}" + (f" ({a.peer_uuid})" if a.peer_uuid else "")


def _down_line(a) -> str:
    return f"upstream {_name(a)} is {a.status}" + (f": {a.error}" if a.error else "")


def _slow_line(a, bound: float) -> str:
    return f"upstream {_name(a)} lags {a.lag_s:.3f} s (ready_lag_max_s {bound:g})"


def liveness(node: "HealthView", watch: LoopWatch | None) -> list[str]:
    reasons = []
    lag = watch.lag_s() if watch else 0.0
    if lag > node.cfg.live_loop_lag_max_s:
        reasons.append(f"the event loop was {lag:.3f} s late within the last {limits.loop_watch_window_s:g} s "
                       f"(live_loop_lag_max_s {node.cfg.live_loop_lag_max_s:g})")
    if node.fatal is not None:
        reasons.append(f"fatal error, stopping: {node.fatal}")
    return reasons


def readiness(node: "HealthView") -> list[str]:
    if node.status != "running" or node.core is None:
        return [f"node is {node.status}" + (f": {node.status_reason}" if node.status_reason else "")]
    reasons = []
    if node.core.fence is not None:
        reasons.append(node.core.fence_state()[1])
    if node.space.alarm is not None:
        reasons.append(f"no space: {node.space.alarm}")
    awaited = node.own_rows_awaited() if node.own_claims else None
    if awaited is not None:
        have = node.core.claimed.get(node.core.self_id)
        reasons.append(f"this node's own earlier rows (lsn {have + 1}..{awaited[0]}) are still coming "
                       f"back from {awaited[1]}")
    down, slow = _upstreams(node)
    allowed = node.cfg.ready_upstreams_down_max
    if len(down) > allowed:
        reasons += [f"{_down_line(a)} ({len(down)} of {len(node.appliers)} upstreams down, "
                    f"ready_upstreams_down_max {allowed})" for a in down]
    reasons += [_slow_line(a, node.cfg.ready_lag_max_s) for a in slow]
    return reasons


def warnings(node: "HealthView") -> list[str]:
    """What a serving node's /v1/health reports beside `degraded`."""
    down, slow = _upstreams(node)
    out = [_down_line(a) for a in down] + [_slow_line(a, node.cfg.ready_lag_max_s) for a in slow]
    if down and len(down) == len(node.appliers):
        out.insert(0, f"every upstream is down ({len(down)}): this node receives no other member's writes")
    gone = node.core.expelled_reason() if node.core is not None else None
    if gone is not None:
        out.insert(0, f"this node was expelled from the cluster ({gone}): no member takes its rows past the expel, "
                      "so it takes no writes to replicated spaces and registers nobody; stop it, and join a new "
                      "node (a new identity) in its place")
    unheeded = node.own_rows_unheeded() if node.own_claims and node.core is not None else []
    have = node.core.claimed.get(node.core.self_id) if unheeded else 0
    for uuid, lsn, address in unheeded[:UNHEEDED_SHOWN]:
        out.append(f"{uuid} at {address or '?'} says it holds this node's own rows up to lsn {lsn} (this node has "
                   f"{have}); only an upstream can send them back: add it to this node's peers (PUT "
                   f"/v1/admin/peers) to take them, or this node's next rows take those lsns")
    if len(unheeded) > UNHEEDED_SHOWN:
        out.append(f"... and {len(unheeded) - UNHEEDED_SHOWN} more peers say so")
    return out



def install_health(app: web.Application, node: "HealthView", reply) -> None:
    """Routes /v1/health, /livez and /readyz; `reply(request, doc, status)` encodes an answer
    (JSON, or msgpack when asked)."""
    watch = app[WATCH] = LoopWatch()

    async def get_livez(request: web.Request) -> web.Response:
        reasons = liveness(node, watch)
        doc = {"status": "not_live" if reasons else "live", "reasons": reasons, "loop_lag_s": round(watch.lag_s(), 6)}
        return reply(request, doc, 503 if reasons else 200)

    async def get_readyz(request: web.Request) -> web.Response:
        reasons = readiness(node)
        ups = node.appliers.values()
        doc = {"status": "not_ready" if reasons else "ready", "reasons": reasons,
               "upstreams": {"configured": len(ups), "following": sum(a.status == "follow" for a in ups),
                             "down_max": node.cfg.ready_upstreams_down_max},
               "lag_s": round(max([a.lag_s for a in ups if a.status == "follow"] or [0.0]), 6),
               "lag_max_s": node.cfg.ready_lag_max_s}
        return reply(request, doc, 503 if reasons else 200)

    async def get_health(request: web.Request) -> web.Response:
        if node.status != "running":
            return reply(request, {"status": node.status, "reason": node.status_reason}, 503)
        space = node.space
        space.sample()                   # a few microseconds: health tells what is true now
        if space.alarm is not None:      # reads are served, writes are not (etcd's NOSPACE)
            return reply(request, {"status": "no_space", "reason": space.alarm, "alarms": space.info()["alarms"]}, 503)
        warn = warnings(node) + space.warnings()
        return reply(request, {"status": "degraded" if warn else "ok", "warnings": warn}, 200)

    app.router.add_get("/v1/health", get_health)
    app.router.add_get("/livez", get_livez)
    app.router.add_get("/readyz", get_readyz)

    async def start_watch(app: web.Application) -> None:
        watch.start()

    async def stop_watch(app: web.Application) -> None:
        await watch.stop()

    app.on_startup.append(start_watch)
    app.on_cleanup.append(stop_watch)
