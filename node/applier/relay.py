"""The relay: the server side of a replication link (`/v1/replication`).

Once the link is authenticated (node/applier/accept.py) and greetings are exchanged, it
serves one request: JOIN (register + snapshot), FETCH_SNAPSHOT (anonymous bootstrap),
REGISTER (anonymous -> member), SUBSCRIBE (stream the WAL from the subscriber's vclock) or
SHUTDOWN (one phase of an orderly cluster shutdown). Rows go out in this node's ids, in WAL
order, whole transactions, never rows of local spaces; the subscriber translates them.

A subscribed relay reads from one position (segment, offset) on: from the journal's
in-memory tail when it is exactly at a batch the tail holds (caught up: no file read, no
thread hop), else from the WAL file through the thread pool (behind, or fell out of the
tail), never past the journal's durable position either way. Both paths apply the same
filter (relay_wants) to the same frames, so the subscriber cannot tell them apart."""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING

import msgpack

from node import limits
from node.applier.conn import Conn, check_greeting
from node.cluster_space.table import STATE_ANON, STATE_EXPELLED, STATE_MEMBER
from node.core import messages as m
from node.core import rowscan
from node.core.replicaset import relay_wants
from node.core.vclock import VClock
from node.core.rowscan import PackedEntry
from node.errors import ClientError, PeerRefused, RemoteProtocolError
from node.faults import fault
from node.wal import format as walfmt
from node.wal.gc import behind
from node.wal.reader import list_segments, read_header

if TYPE_CHECKING:
    from node.journal import Journal
    from node.server import Node

log = logging.getLogger("replog.relay")
_pack = msgpack.Packer(use_bin_type=True).pack


_FRAME_ALONE_MAX = limits.message_bytes_max - limits.message_margin_bytes   # a frame this size fits a message


def rows_batches(frames: list) -> list[list]:
    """The frames (payloads) of ROWS messages carrying `frames` in order, none over
    message_bytes_max: frames share a message up to relay_batch_bytes_max; a larger one goes alone,
    split into several payloads of whole txns when even alone it would not fit (one txn always
    fits: txn_bytes_max, checked before the WAL). A txn larger than that can only be one an earlier
    version wrote: it cannot be sent, and the link stops saying so."""
    out: list[list] = []
    group: list = []
    size = 0
    for f in frames:
        for p in (f,) if len(f) <= _FRAME_ALONE_MAX else _split(f):
            if group and size + len(p) > limits.relay_batch_bytes_max:
                out.append(group)
                group, size = [], 0
            group.append(p)
            size += len(p)
    if group:
        out.append(group)
    return out


def _split(payload) -> list[bytes]:
    written_us, txns = walfmt.unpack_frame(payload)
    pieces: list[bytes] = []
    chunk: list = []
    size = 0
    for t in txns:
        n = len(_pack(t))
        if n > _FRAME_ALONE_MAX - 32:
            raise PeerRefused("txn_too_large", f"txn {t[0]}:{t[1]} in this node's WAL encodes to {n} bytes, "
                              f"more than one message carries: written before txn_bytes_max was checked, "
                              "it cannot be replicated")
        if chunk and size + n > limits.relay_batch_bytes_max:
            pieces.append(_pack([written_us, chunk]))
            chunk, size = [], 0
        chunk.append(t)
        size += n
    if chunk:
        pieces.append(_pack([written_us, chunk]))
    return pieces


def frame_for(body: bytes, written_us: int, entry, sub: dict[int, int],
              own: tuple[int, int] | None) -> tuple[bytes | None, int]:
    """What a subscriber at `sub` (and `own`: relay_wants) gets of one WAL frame (payload
    `body`, its txns `entry`: a list, or a journal PackedEntry): the payload itself if it
    wants every txn, re-packed if some, None if none; and the rows that go."""
    if type(entry) is PackedEntry:
        every = entry.wanted(sub, own)
        if every is not None:
            return (body, entry.rows) if every else (None, 0)
        entry = entry.txns
    keep = [t for t in entry if relay_wants(t, sub, own)]
    if not keep:
        return None, 0
    rows = sum([len(t[4]) for t in keep])
    return (body if len(keep) == len(entry) else _pack([written_us, keep])), rows


class WalCursor:
    """Reads whole frames from the WAL, never past the journal's durable position:
    `read_tail` from the journal's memory, `read` from the file (in an executor thread)."""

    def __init__(self, wal_dir: str, sub_vclock: dict[int, int], own: tuple[int, int] | None = None):
        self.dir = wal_dir
        self.sub = dict(sub_vclock)
        self.own = own                              # the subscriber's own rows cut (relay_wants)
        self.segment: str | None = None
        self.offset = 0
        self._next: tuple[int, int] | None = None   # (chunk seq, frame index) to read next from the tail
        self.from_tail = 0                          # frames sent from memory / read from the file
        self.from_file = 0
        self.rows = 0                               # rows in the txns handed out (both paths)

    def read_tail(self, journal: "Journal", max_bytes: int) -> list | None:
        """Frame payloads to send from the journal's tail; [] when caught up with the durable
        position; None when the tail does not continue this cursor (read the file)."""
        pos = (self.segment, self.offset)
        if self.segment is None or self.offset == 0:
            return None                                 # not started, or a segment header still to read
        if pos == journal.position:
            return []
        i = 0
        if self._next is not None and self._next[1]:      # resuming inside a chunk
            chunk = journal.tail_get(self._next[0])
            i = self._next[1]
            if chunk is None or chunk.segment != self.segment or chunk.frames[i - 1][0] != self.offset:
                chunk = None
        else:
            chunk = journal.tail_chunk(pos, self._next[0] if self._next is not None else None)
        if chunk is None:
            self._next = None
            return None
        out: list = []
        budget = max_bytes
        while chunk is not None and budget > 0:
            frames, written_us = chunk.frames, chunk.written_us
            while i < len(frames) and budget > 0:
                end, body, entry = frames[i]
                i += 1
                send, rows = frame_for(body, written_us, entry, self.sub, self.own)
                if send is not None:
                    out.append(send)
                    budget -= len(body)
                    self.rows += rows
                self.segment, self.offset = chunk.segment, end
            if i < len(frames):
                self._next = (chunk.seq, i)
                break
            self._next, i = (chunk.seq + 1, 0), 0
            chunk = journal.tail_chunk((self.segment, self.offset), chunk.seq + 1)
        self.from_tail += len(out)
        return out

    def _start(self) -> bool:
        segs = list_segments(self.dir)
        if not segs:
            return False
        start = 0
        for i in range(1, len(segs)):
            hv = read_header(os.path.join(self.dir, segs[i])).vclock
            if all(lsn <= self.sub.get(rid, 0) for rid, lsn in hv.items() if rid != 0):
                start = i
            else:
                break
        self.segment = segs[start]
        self.offset = 0
        return True

    def read(self, position: tuple[str | None, int], max_bytes: int) -> list[bytes]:
        """Frame payloads to send (already filtered, re-packed when filtering dropped txns)."""
        self._next = None
        if self.segment is None and not self._start():
            return []
        out: list[bytes] = []
        budget = max_bytes
        while budget > 0:
            path = os.path.join(self.dir, self.segment)  # type: ignore[arg-type]
            active = self.segment == position[0]
            try:
                size = position[1] if active else os.path.getsize(path)
            except FileNotFoundError:
                raise RemoteProtocolError(f"WAL segment {self.segment} was collected under the relay") from None
            if self.offset == 0:
                with open(path, "rb") as f:
                    _, self.offset = walfmt.decode_header(f.read(limits.segment_header_bytes_max))
            if self.offset >= size:
                if active:
                    break
                segs = list_segments(self.dir)
                nxt = [s for s in segs if walfmt.segment_signature(s) > walfmt.segment_signature(self.segment)]  # type: ignore[arg-type]
                if not nxt:
                    break
                self.segment, self.offset = nxt[0], 0
                continue
            with open(path, "rb") as f:
                buf = os.pread(f.fileno(), min(size - self.offset, max(budget, 1 << 20)), self.offset)
            pos = 0
            while pos < len(buf):
                scanned = rowscan.relay_scan(buf, pos, self.sub, budget, self.own)
                if scanned is not None:        # every frame it can decide alone, natively
                    payloads, rows, pos, status = scanned
                    if payloads:
                        out += payloads
                        budget -= sum(map(len, payloads))
                        self.rows += rows
                    if status != rowscan.RS_STOP:
                        break                  # all read, or the budget is spent
                try:
                    body, nxt_pos = walfmt.decode_frame(buf, pos)
                except walfmt.FormatError as e:
                    if e.torn:
                        if pos == 0:  # one frame larger than what we read: read it whole
                            with open(path, "rb") as f:
                                buf = os.pread(f.fileno(), size - self.offset, self.offset)
                            continue
                        break
                    raise
                pos = nxt_pos
                written_us, txns = walfmt.unpack_frame(body)
                send, rows = frame_for(body, written_us, txns, self.sub, self.own)
                if send is not None:
                    out.append(send)
                    budget -= len(body)
                    self.rows += rows
                if budget <= 0:
                    break
            self.offset += pos
            if pos == 0:
                break
        self.from_file += len(out)
        return out


async def serve_link(node: "Node", conn: Conn) -> None:
    """An authenticated inbound link (node/applier/accept.py): greetings, then the one request
    it came for."""
    try:
        hello = await conn.expect(m.GREETING, timeout=limits.handshake_timeout_s)
        theirs = hello.body
        conn.peer = f"{theirs['address']} ({theirs['uuid'][:8]})"
        mine = node.greeting()
        try:
            check_greeting(mine, theirs, conn.peer, conn.session.peer_uuid)
            node.check_peer_greeting(theirs)
        except PeerRefused as e:
            await conn.refuse(e.code, e.message, **(getattr(e, "body", None) or {}))
            raise
        me = node.core.table.get(theirs["uuid"]) if node.core else None
        if me is not None and me.state == STATE_EXPELLED:
            await conn.refuse("expelled", f"{theirs['uuid']} was expelled from this cluster")
            raise PeerRefused("expelled", f"refused expelled member {theirs['uuid']}")
        await conn.send(m.GREETING, **mine)
        req = await conn.expect(m.JOIN, m.FETCH_SNAPSHOT, m.REGISTER, m.SUBSCRIBE, m.SHUTDOWN, m.BYE,
                                timeout=limits.handshake_timeout_s)
        if req.type == m.BYE:
            return
        if req.type == m.SHUTDOWN:
            await _shutdown_step(node, conn, theirs, req)
            return
        if node.core is None:
            await conn.refuse("not_ready", "this node has not joined a cluster yet")
            return
        if req.type in (m.JOIN, m.REGISTER):
            # Crash-safe registration (node/lifecycle.py): the apply is idempotent for one uuid +
            # register code; REGISTERED {id} answers it, an ERROR register_rejected refuses it.
            if node.core.anon:
                await conn.refuse("anon", "an anonymous replica cannot register members")
                return
            if node.status != "running":
                await conn.refuse("not_ready", f"this node is {node.status}: {node.status_reason}")
                return
            known = node.core.table.get(theirs["uuid"])
            if node.core.fence is not None and (known is None or known.state != STATE_MEMBER):
                # registering writes a row under our own id; a member we have needs none
                await conn.refuse("not_ready", "this node's own rows are not confirmed yet: it registers nobody new")
                return
            applied = await node.life.apply_registration(theirs, req.body)
            if not applied.ok:
                await conn.send(m.ERROR, code="register_rejected", message=applied.reason, next_id=applied.next_id)
                return
            if fault("lose_apply_answer"):
                log.warning("relay: fault point lose_apply_answer: dropping the answer to %s", conn.peer)
                return
            await conn.send(m.REGISTERED, id=applied.id)
            if req.type == m.REGISTER:
                req = await conn.expect(m.SUBSCRIBE, m.BYE, timeout=limits.handshake_timeout_s)
        if req.type in (m.JOIN, m.FETCH_SNAPSHOT):
            # The joiner's hold exists before its snapshot is read and holds all that is here
            # until it subscribes and says where it is (it may take its snapshot elsewhere in the
            # end), whoever restarts meanwhile (node/retention.py).
            node.retention.hold_all(theirs["uuid"], anon=req.type == m.FETCH_SNAPSHOT)
            await send_snapshot(node, conn)
            req = await conn.expect(m.SUBSCRIBE, m.BYE, timeout=limits.handshake_timeout_s)
        if req.type == m.SUBSCRIBE:
            durable = req.get("durable")
            await Relay(node, conn, theirs, m.vclock_from_wire(req["vclock"]),
                        m.vclock_from_wire(durable) if durable is not None else None,
                        own_rows=req.get("own_rows") is True).run()
    except PeerRefused as e:
        log.warning("relay: refused %s: %s", conn.peer, e)
        await conn.refuse(e.code, e.message)        # (a second ERROR after the greeting's is harmless)
    except RemoteProtocolError as e:
        log.info("relay: link to %s dropped: %s", conn.peer, e)
        await conn.refuse("protocol", str(e))
    except (ConnectionError, asyncio.TimeoutError) as e:
        log.info("relay: link to %s lost: %s", conn.peer, e)
    except Exception as e:  # noqa: BLE001 - the relay's one place: anything else is our bug, not the peer's
        node.note_failure(f"relay to {conn.peer}", e)
        await conn.refuse("internal", f"{type(e).__name__}: {e}")


async def _shutdown_step(node: "Node", conn: Conn, theirs: dict, req: m.Message) -> None:
    """One phase of an orderly cluster shutdown, asked by its coordinator: a member of this
    cluster, authenticated by the session (never by the client token; cluster_shutdown.py)."""
    member = node.core.table.get(theirs["uuid"]) if node.core else None
    if member is None or member.state != STATE_MEMBER:
        await conn.refuse("not_member", f"{theirs['uuid']} is not a member here: it cannot coordinate a shutdown")
        return
    try:
        answer = await node.cluster_shutdown.phase(req.body)
    except ClientError as e:
        await conn.refuse(e.code, e.message)
        return
    await conn.send(m.SHUTDOWN_OK, **answer)


async def send_snapshot(node: "Node", conn: Conn) -> None:
    loop = asyncio.get_running_loop()
    it = node.store.snapshot()
    kind, meta = await loop.run_in_executor(None, next, it)
    assert kind == "meta"
    await conn.send(m.SNAPSHOT, **meta)
    while True:
        item = await loop.run_in_executor(None, next, it, None)
        if item is None:
            break
        space, rows = item[1]
        await conn.send(m.SNAPSHOT_ROWS, space=space, rows=rows)
    await conn.send(m.SNAPSHOT_END)


class Relay:
    def __init__(self, node: "Node", conn: Conn, greeting: dict, sub_vclock: dict[int, int],
                 durable: dict[int, int] | None = None, own_rows: bool = False):
        self.node = node
        self.conn = conn
        self.uuid = greeting["uuid"]
        self.address = greeting["address"]
        self.anon = greeting["anon"]
        self.status = "subscribed"
        self.acked: dict[int, int] = dict(sub_vclock)
        self.acked_at = time.monotonic()
        self.last_sent_at = 0.0
        self.lag_s = 0.0
        self.error = ""
        self.cursor = WalCursor(node.wal_dir, sub_vclock)
        # what the subscriber has on disk (its hold; an older peer says nothing: its vclock), and
        # whether it wants its own rows back whatever this node held of them when it subscribed
        # (a fenced subscriber catching them up: node/fence.py)
        self.durable = dict(durable) if durable is not None else dict(sub_vclock)
        self.own_rows = own_rows
        self._wake = asyncio.Event()     # set by the journal after each durable batch

    def info(self) -> dict:
        return {"uuid": self.uuid, "address": self.address, "status": self.status, "anon": self.anon,
                "lag_s": round(self.lag_s, 6), "error": self.error,
                "vclock": {str(k): v for k, v in sorted(self.acked.items())},
                "rows_sent": self.cursor.rows,
                "frames_from_memory": self.cursor.from_tail, "frames_from_file": self.cursor.from_file}

    async def run(self) -> None:
        node = self.node
        if node.journal is None or node.journal.wal is None:
            await self.conn.refuse("wal_mode", "wal_mode = none: this node keeps no WAL and cannot serve replicas")
            return
        gc_vclock = node.store.get_meta("gc_vclock") or {}
        missing = behind(self.acked, gc_vclock)
        if missing:
            # the collected rows by uuid: the subscriber asks whether another upstream can give them
            await self.conn.refuse("need_rejoin", f"rows of components {missing} below {gc_vclock} were "
                                   "collected from this node's WAL; rejoin from a snapshot",
                                   gc_vclock_uuid=node.core.vclock_by_uuid(VClock(gc_vclock)))
            log.warning("relay: %s is behind collected WAL %s: told to rejoin", self.uuid, gc_vclock)
            return
        member = node.core.table.get(self.uuid)
        if member is not None and member.state != STATE_ANON and not self.own_rows:
            # its own rows past what this node holds of them now come from it: not echoed back
            self.cursor.own = (member.id, node.core.vclock.get(member.id))
        node.retention.on_subscribe(self.uuid, self.durable, self.anon)
        for old in [r for r in node.relays if r.uuid == self.uuid]:
            # One link per subscriber: the newest is the one it is reading (an older one may be a
            # half-open connection the subscriber gave up on).
            log.info("relay: %s subscribed again; closing its older link", self.uuid)
            old.error = "replaced by a newer subscription"
            await old.conn.close()
        await self.conn.send(m.SUBSCRIBED, vclock={k: v for k, v in node.core.vclock.items() if k})
        node.relays.add(self)
        sender = asyncio.create_task(self._send_loop(), name=f"relay-send-{self.uuid[:8]}")
        try:
            await self._recv_loop(sender)
        finally:
            sender.cancel()
            try:
                await sender
            except asyncio.CancelledError:
                pass
            except (ConnectionError, RemoteProtocolError, RuntimeError) as e:
                self.error = str(e)
            node.relays.discard(self)
            self.status = "stopped"

    async def _recv_loop(self, sender: asyncio.Task) -> None:
        while not sender.done():
            msg = await self.conn.recv(timeout=limits.peer_timeout_s)
            if msg.type == m.ACK:
                self.acked = m.vclock_from_wire(msg["vclock"])
                self.acked_at = time.monotonic()
                lag_us = msg.get("lag_us")
                self.lag_s = lag_us / 1e6 if isinstance(lag_us, int) and lag_us >= 0 else 0.0
                durable = msg.get("durable")
                self.node.retention.on_ack(self.uuid, m.vclock_from_wire(durable) if durable is not None
                                           else self.acked, self.anon)
            elif msg.type == m.BYE:
                return
            elif msg.type != m.HEARTBEAT:
                raise RemoteProtocolError(f"unexpected {msg.name} from subscriber")
        await sender  # re-raise its error

    async def _send_loop(self) -> None:
        journal = self.node.journal
        loop = asyncio.get_running_loop()
        wake, cursor = self._wake, self.cursor
        journal.listen(wake)
        try:
            last_send = loop.time()
            while True:
                wake.clear()         # before looking: a batch made durable from here on wakes us
                if self.anon and journal.wal.mode == "write":
                    # only rows on disk: the journal's memory tail runs ahead of that (Journal.synced_position)
                    frames = await loop.run_in_executor(None, cursor.read, journal.synced_position,
                                                        limits.relay_batch_bytes_max)
                else:
                    frames = cursor.read_tail(journal, limits.relay_batch_bytes_max)
                    if frames is None:
                        frames = await loop.run_in_executor(None, cursor.read, journal.position,
                                                            limits.relay_batch_bytes_max)
                if frames:
                    for batch in rows_batches(frames):
                        await self.conn.send_rows(batch)
                    last_send = loop.time()
                    continue
                if loop.time() - last_send >= limits.heartbeat_interval_s:
                    await self.conn.send(m.HEARTBEAT, now_us=time.time_ns() // 1000)
                    last_send = loop.time()
                    continue
                timer = loop.call_at(last_send + limits.heartbeat_interval_s, wake.set)
                try:
                    await wake.wait()
                finally:
                    timer.cancel()
        finally:
            journal.unlisten(wake)
