"""`GET /v1/events`: the dashboard's live stream (Server-Sent Events), one JSON snapshot a second.

Rules kept here:
- A snapshot is built once per node per interval and the same encoded frame is queued to
  every listener; nothing is built while nobody listens.
- Bounded: at most `events_listeners_max` streams (the next gets 503); each listener queues at
  most `events_queue_frames_max` frames, and one that falls further behind, or whose socket takes
  longer than `events_write_timeout_s` to accept a frame, is dropped (its browser reconnects).
- A slow build (a very large `_cluster`) stretches the interval, so the dashboard takes at most
  `events_cpu_share_max` of the event loop.
- The stream ends when the app shuts down, so it never holds the HTTP drain.
- The token is checked by the API's middleware like any call: browsers read this stream with
  fetch() and an Authorization header, never a token in the URL (URLs land in logs)."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import TYPE_CHECKING

from aiohttp import web

from node import limits
from node.core.holds import holding
from node.errors import ClientError

if TYPE_CHECKING:
    from node.process.ports import EventsView

log = logging.getLogger("replog.http")


# --- the snapshot -------------------------------------------------------------------------
def _rows_behind(vclock: dict[int, int], acked: dict) -> int:
    """Rows of this node's vclock that a subscriber has not acknowledged (what its hold keeps)."""
    got = {int(k): v for k, v in acked.items()}
    return sum(max(0, lsn - got.get(rid, 0)) for rid, lsn in vclock.items() if rid != 0)


def wal_view(node: "EventsView") -> dict:
    """WAL size on disk and who holds it (node/core/holds.py has the retention rule)."""
    from node.wal.reader import list_segments
    size = 0
    segments = list_segments(node.wal_dir)
    for name in segments:
        try:
            size += os.path.getsize(os.path.join(node.wal_dir, name))
        except FileNotFoundError:
            pass   # collected between the listing and the stat
    core, now = node.core, time.time()
    vclock = dict(core.vclock.items()) if core else {}
    holds = []
    lapse = node.retention.lapse
    for uuid, h in node.retention.view().items():
        mem = core.table.get(uuid) if core else None
        age = now - h.seen_s
        holds.append({"uuid": uuid, "anon": h.anon, "seen_s_ago": round(age, 1),
                      "holding": holding(h, mem, now, node.cfg.anon_ttl_s, lapse),
                      "rows_behind": _rows_behind(vclock, h.vclock)})
    return {"segments": len(segments), "bytes": size, "holds": holds, "anon_ttl_s": node.cfg.anon_ttl_s}


def counters(node: "EventsView") -> dict:
    """Monotonic counters the page turns into rates. Rows by vclock: lsns count rows, so the
    node's own component (+ local spaces, component 0) is what it wrote, the others what it
    applied from peers, each origin's row once whatever route it came by; they survive restarts."""
    core, j = node.core, node.journal
    own = core.self_id if core else None
    written = applied = 0
    if core is not None:
        for rid, lsn in core.vclock.items():
            if rid == 0 or rid == own:
                written += lsn
            else:
                applied += lsn
    wal = j.wal if j else None
    return {"rows_written": written, "rows_applied": applied,
            "rows_persisted": j.rows_written if j else 0, "wal_bytes_written": wal.bytes_written if wal else 0}


def snapshot(node: "EventsView") -> dict:
    return {"t": round(time.time(), 3), "info": node.info(), "cluster": node.cluster_view(),
            "counters": counters(node), "wal": wal_view(node),
            "interval_s": limits.events_interval_s}


# --- the hub ------------------------------------------------------------------------------
class Listener:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(limits.events_queue_frames_max)

    def offer(self, frame: bytes) -> bool:
        try:
            self.queue.put_nowait(frame)
            return True
        except asyncio.QueueFull:
            return False

    def close(self) -> None:
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)


class EventHub:
    def __init__(self, node: "EventsView") -> None:
        self.node = node
        self.listeners: set[Listener] = set()
        self.last: bytes | None = None
        self.last_at = 0.0
        self.frames = 0          # snapshots built (tests: one per interval, not one per listener)
        self.dropped = 0         # listeners cut for falling behind
        self.streams = 0         # handlers still running (a dropped one until its write returns or times out)
        self._task: asyncio.Task | None = None
        self._closed = False

    def subscribe(self) -> Listener:
        if self._closed:
            raise ClientError(503, "stopping", "the node is shutting down")
        if len(self.listeners) >= limits.events_listeners_max:
            raise ClientError(503, "too_many_listeners",
                              f"at most {limits.events_listeners_max} event streams per node; close one")
        lst = Listener()
        if self.last is not None and time.monotonic() - self.last_at < limits.events_interval_s:
            lst.offer(self.last)    # a fresh snapshot at once; the next on the common beat
        self.listeners.add(lst)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="events")
        return lst

    def unsubscribe(self, lst: Listener) -> None:
        self.listeners.discard(lst)

    def _drop(self, lst: Listener) -> None:
        self.listeners.discard(lst)
        lst.close()
        self.dropped += 1
        log.info("events: dropped a listener %d snapshots behind", limits.events_queue_frames_max)

    async def _run(self) -> None:
        while self.listeners:
            started = time.monotonic()
            try:
                frame = b"event: snapshot\ndata: " + json.dumps(snapshot(self.node), separators=(",", ":")).encode() + b"\n\n"
            except Exception:   # noqa: BLE001 - the one place for this service: a view that cannot be
                # built is a bug in the view, not in the data; the streams end (browsers reconnect
                # and show it), the node and its replication go on.
                log.exception("events: building a snapshot failed; closing the streams")
                self.close_listeners()
                return
            self.frames += 1
            self.last, self.last_at = frame, time.monotonic()
            for lst in list(self.listeners):
                if not lst.offer(frame):
                    self._drop(lst)
            took = time.monotonic() - started
            await asyncio.sleep(max(limits.events_interval_s, took / limits.events_cpu_share_max) - took)

    def close_listeners(self) -> None:
        for lst in list(self.listeners):
            lst.close()
        self.listeners.clear()

    async def close(self) -> None:
        """App shutdown: every stream ends now, so none holds the HTTP drain."""
        self._closed = True
        self.close_listeners()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


HUB = web.AppKey("events_hub", EventHub)


async def events_handler(request: web.Request) -> web.StreamResponse:
    hub = request.app[HUB]
    lst = hub.subscribe()
    hub.streams += 1
    try:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        while (frame := await lst.queue.get()) is not None:
            try:
                async with asyncio.timeout(limits.events_write_timeout_s):   # not wait_for: keeps a cancel
                    await resp.write(frame)
            except TimeoutError:
                log.info("events: a listener took over %.0f s to take a snapshot; cut", limits.events_write_timeout_s)
                if request.transport is not None:
                    request.transport.abort()
                break
            except ConnectionError:
                break   # the browser went away
        return resp
    finally:
        hub.streams -= 1
        hub.unsubscribe(lst)
