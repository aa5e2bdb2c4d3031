"""One connection to a node's binary client port (node/clientproto/wire.py has the format).

`call(request)` returns a future at once; every call made before the event loop next runs goes
out in one frame (automatic batching: concurrent callers share frames, and the node writes
their writes as one journal entry). Answers come back in any order and are matched by id.

Rules kept here:
- every call has a deadline; a sweep every `SWEEP_S` fails the calls past theirs with Timeout;
- a frame never passes the node's bounds (from its HELLO answer): calls are split across
  frames, and a single request too large for any frame fails alone with TooLarge;
- when the connection breaks, each call still waiting fails with Unavailable, marked with
  whether its request had been handed to the socket (`sent`): the client's retry rule needs it;
- at most `inflight_max` calls wait at once; more wait for room (back-pressure, never an
  unbounded queue)."""
from __future__ import annotations

import asyncio
import heapq
import ssl
from collections import deque

from node.clientproto import wire
from replog.errors import BadRequest, ReplogError, Timeout, TooLarge, Unavailable, from_answer

SWEEP_S = 0.05                 # how often deadlines are checked while calls wait
CONNECT_TIMEOUT_S = 5.0        # connect + TLS + HELLO
INFLIGHT_MAX = 16_384          # the node's client_pending_requests_max: more would only stall it


class ConnectionLost(Unavailable):
    """The connection broke with this call waiting; `sent`: its request had gone to the socket."""

    def __init__(self, message: str, *, sent: bool, address: str | None = None):
        super().__init__(message, address=address)
        self.sent = sent


class BinaryConnection(asyncio.Protocol):
    def __init__(self, address: str, vclock_sink=None):
        self.address = address
        self._vclock_sink = vclock_sink      # called with the vclock of every answer frame
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.reader = wire.FrameReader(wire.HEAD.unpack(b"\xff\xff\xff\xff")[0])
        self.pending: dict[int, asyncio.Future] = {}   # id -> its call's future, in id order
        self._next_id = 1
        self._out: list = []
        self._out_futs: list[asyncio.Future] = []
        self._flush_at = False
        self._frames_sent = 0              # frames handed to the transport
        self._deadlines: deque = deque()   # (deadline, last id) of each frame sent, for default-timeout calls
        self._odd: list = []               # heap of (deadline, id) of calls with another timeout
        self._sweeper: asyncio.TimerHandle | None = None
        self.default_timeout_s = 10.0
        self.closed: BaseException | None = None
        self.limits: dict = {"frame_bytes_max": 8 << 20, "frame_requests_max": 4096}
        self.node_uuid = ""
        self._room = asyncio.Event()
        self._room.set()
        self.full = False                  # INFLIGHT_MAX calls wait: callers wait for room
        self._can_write = True

    # --- opening ---------------------------------------------------------------------------
    @classmethod
    async def open(cls, host: str, port: int, *, address: str, token: str | None, ssl_context: ssl.SSLContext | None,
                   timeout_s: float, vclock_sink=None) -> "BinaryConnection":
        loop = asyncio.get_running_loop()
        conn = cls(address, vclock_sink)
        conn.default_timeout_s = timeout_s
        try:
            await asyncio.wait_for(loop.create_connection(lambda: conn, host, port, ssl=ssl_context,
                                                          server_hostname=host if ssl_context else None),
                                   min(timeout_s, CONNECT_TIMEOUT_S))
            hello = await asyncio.wait_for(conn.call((wire.HELLO, {"token": token, "version": wire.VERSION})),
                                           min(timeout_s, CONNECT_TIMEOUT_S))
        except BaseException:
            conn.close()
            raise
        conn.limits.update(hello[0].get("limits") or {})
        conn.node_uuid = hello[0].get("uuid", "")
        return conn

    # --- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport              # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            for payload in self.reader.frames(data):
                vclock, answers = wire.decode_answers(payload)
                if vclock is not None and self._vclock_sink is not None:
                    self._vclock_sink(vclock)
                pending = self.pending
                for a in answers:
                    fut = pending.pop(a[0], None) if type(a) is list and len(a) == 3 else None
                    if fut is None:
                        if type(a) is list and len(a) == 3 and a[0] is None:   # the node refused the connection
                            self._lost(from_answer(a[1], a[2], self.address))
                        continue
                    if not fut.done():
                        if a[1] < 300:
                            fut.set_result((a[2], vclock))
                        else:
                            fut.set_exception(from_answer(a[1], a[2], self.address))
            if self.full and len(self.pending) < INFLIGHT_MAX // 2:
                self.full = False
                self._room.set()
        except wire.ProtocolError as e:
            self._lost(Unavailable(f"the node sent what is not an answer frame: {e}", address=self.address))

    def connection_lost(self, exc: BaseException | None) -> None:
        self._lost(Unavailable(f"connection to {self.address} lost" + (f": {exc}" if exc else ""),
                               address=self.address))

    def pause_writing(self) -> None:
        self._can_write = False

    def resume_writing(self) -> None:
        self._can_write = True

    # --- calls -------------------------------------------------------------------------------
    def call(self, request: tuple, timeout_s: float | None = None) -> asyncio.Future:
        """Send `request` (op, args...) in the next frame; the future gets (body, vclock) or raises.
        Calls with the connection's default timeout share one deadline per frame (set when the
        frame goes out); others keep their own."""
        fut = self.loop.create_future()
        if self.closed is not None:
            fut.set_exception(ConnectionLost(str(self.closed), sent=False, address=self.address))
            return fut
        rid = self._next_id
        self._next_id = rid + 1
        self._out.append((rid, *request))
        self.pending[rid] = fut
        if timeout_s is not None and timeout_s != self.default_timeout_s:
            heapq.heappush(self._odd, (self.loop.time() + timeout_s, rid))
        if not self._flush_at:
            self._flush_at = True
            self.loop.call_soon(self._flush)
        if len(self.pending) >= INFLIGHT_MAX:
            self.full = True
            self._room.clear()
        return fut

    async def room(self) -> None:
        """Wait while INFLIGHT_MAX calls are waiting for answers."""
        if not self._room.is_set():
            await self._room.wait()

    def _flush(self) -> None:
        self._flush_at = False
        out, self._out = self._out, []
        if not out or self.closed is not None:
            return
        self._deadlines.append((self.loop.time() + self.default_timeout_s, out[-1][0]))
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(SWEEP_S, self._sweep)
        nmax = int(self.limits.get("frame_requests_max", 4096))
        bmax = int(self.limits.get("frame_bytes_max", 8 << 20))
        for i in range(0, len(out), nmax):
            self._send(out[i:i + nmax], bmax)

    def _send(self, reqs: list, bmax: int) -> None:
        try:
            data = wire.encode_requests(reqs)
        except (TypeError, ValueError, OverflowError) as e:   # an argument msgpack cannot carry
            if len(reqs) == 1:
                self._refuse(reqs[0][0], BadRequest(f"the request cannot be encoded: {e}", address=self.address))
                return
            data = None             # the calls it shares the frame with go without it
        if data is None or len(data) - wire.HEAD_BYTES > bmax:
            if len(reqs) == 1:
                self._refuse(reqs[0][0], TooLarge(f"the request encodes to {len(data)} bytes; a frame holds at most "
                                                  f"{bmax}", address=self.address))
                return
            half = len(reqs) // 2
            self._send(reqs[:half], bmax)
            self._send(reqs[half:], bmax)
            return
        self.transport.write(data)              # type: ignore[union-attr]
        self._frames_sent += 1

    def _refuse(self, rid: int, why: ReplogError) -> None:
        fut = self.pending.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_exception(why)

    def _sweep(self) -> None:
        self._sweeper = None
        now = self.loop.time()
        pending = self.pending
        q = self._deadlines
        while q and q[0][0] <= now:               # frames past their deadline: every call up to their last id
            _, upto = q.popleft()
            for rid in [r for r in pending if r <= upto]:   # ids grow: dict order is id order
                self._expire(rid)
        odd = self._odd
        while odd and (odd[0][1] not in pending or odd[0][0] <= now):
            _, rid = heapq.heappop(odd)
            self._expire(rid)
        if pending and self.closed is None:
            self._sweeper = self.loop.call_later(SWEEP_S, self._sweep)

    def _expire(self, rid: int) -> None:
        fut = self.pending.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_exception(Timeout(f"no answer from {self.address} within the call's timeout",
                                         address=self.address))

    # --- closing -----------------------------------------------------------------------------
    def _lost(self, why: ReplogError) -> None:
        if self.closed is None:
            self.closed = why
        unsent = {r[0] for r in self._out}
        self._out = []
        pending, self.pending = self.pending, {}
        for rid, fut in pending.items():
            if not fut.done():
                fut.set_exception(ConnectionLost(str(why), sent=rid not in unsent, address=self.address))
        if self.transport is not None:
            self.transport.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self.full = False
        self._room.set()

    def close(self) -> None:
        self._lost(Unavailable(f"connection to {self.address} closed by the client", address=self.address))

    @property
    def usable(self) -> bool:
        return self.closed is None

