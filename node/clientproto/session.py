"""One binary-protocol client connection on the node's side: it reads request frames, runs
each request with the HTTP API's rules and error codes, and answers (node/clientproto/wire.py
has the format). The transport is an asyncio.Protocol (node/clientproto/listener.py).

Rules kept here:
- with a client token, nothing but HELLO is served before a HELLO carried the token; a
  connection that sends anything else, a wrong token, more than client_hello_bytes_max bytes,
  or nothing within client_hello_timeout_s is answered 401 (or not at all) and closed;
- every request is checked by node/clientrules.py before it touches the node; a request that
  fails a check is answered with its error and the others of its frame go on; a frame that is
  not a frame of the protocol is answered once and the connection closed: bad input never
  reaches the WAL and never raises out of here (the listener maps anything else to a logged
  bug and a closed connection, the node lives);
- the writes of one frame become one journal entry (node/clientproto/writes.py) and are
  answered after the journal wrote them (wal_mode); reads answer at once; a read with an
  after_vclock, a WAIT and a space creation run as tasks and answer when done;
- a connection holds at most client_pending_requests_max unanswered requests and
  client_send_buffer_bytes_max unsent answer bytes; past either it is not read until it drains."""
from __future__ import annotations

import asyncio
import hmac
import logging
from typing import TYPE_CHECKING, Any, Callable

from node import clientrules, limits
from node.clientproto import wire, writes
from node.core.record import DELETED, LSN, ORIGIN_ID, VALUE
from node.core import validate
from node.core.rows import OP_DELETE, OP_PUT, Op
from node.errors import ClientError

if TYPE_CHECKING:
    from node.process.ports import ClientHost

log = logging.getLogger("replog.client")

_KEY_SAFE = validate.KEY_CHARS_SAFE            # key_error: a key this short is within bounds whatever its chars
_value_fast_ok = validate.decoded_value_ok     # value_error, when sure without walking (else the exact path)
_new = tuple.__new__
_ID_MAX = limits.client_request_id_max


def _bad(req_id: Any, why: str) -> tuple:
    return wire.error_answer(req_id, 400, "bad_request", why)


class Session:
    def __init__(self, node: "ClientHost", write: Callable[[bytes], None], close: Callable[[], None],
                 pause: Callable[[bool], None]):
        self.node = node
        self._write = write            # bytes of whole answer frames to the socket
        self._close = close
        self._pause = pause            # pause(True) stops reading the connection, pause(False) resumes
        self.authed = not node.cfg.token
        self.closed = False
        self.pending = 0               # requests read, not answered yet
        self.frames_read = 0
        self.paused_reads = False
        self.send_paused = False
        self._tasks: set[asyncio.Task] = set()

    # --- frames in ---------------------------------------------------------------------
    def on_payload(self, payload: bytes) -> None:
        self.frames_read += 1
        try:
            reqs = wire.decode_requests(payload, limits.client_frame_requests_max)
        except wire.ProtocolError as e:
            self.refuse(e.status, e.code, e.message)
            return
        node = self.node
        answers: list = []
        batch: list[list[Op]] = []      # the fast path's transactions, and their ids
        batch_ids: list[int] = []
        spaces = node.core.spaces if node.core is not None else {}
        stored = node.store.spaces if node.store is not None else {}
        reads: list[tuple[int, str, str]] = []   # the fast path's gets: read in one LMDB transaction
        self.pending += len(reqs)
        vclock_needed = False
        for req in reqs:
            if self.closed:
                return
            if type(req) is not list or len(req) < 2 or type(req[0]) is not int or type(req[1]) is not int:
                answers.append(_bad(req[0] if type(req) is list and req and type(req[0]) is int else None,
                                    "a request is [id, op, args...] with an integer id and op"))
                continue
            rid, op = req[0], req[1]
            if not self.authed and op != wire.HELLO:
                answers.append(wire.error_answer(rid, 401, "unauthorized", "this node needs a HELLO with the "
                                                 "client token first"))
                self._send(None, answers)
                self.close()
                return
            n = len(req)
            # the frequent case first: a put or delete of a short key to an existing replicated space (its
            # name passed space_name_error when it was made; clientrules: a client never writes "_" spaces)
            if (op == wire.PUT and n == 5) or (op == wire.DELETE and n == 4):
                space, key = req[2], req[3]
                if 0 <= rid <= _ID_MAX and type(space) is str and spaces.get(space) is False and space[0] != "_" \
                        and type(key) is str and 0 < len(key) <= _KEY_SAFE:
                    if op == wire.PUT:
                        if _value_fast_ok(req[4]):
                            batch.append((_new(Op, (OP_PUT, space, key, req[4])),))
                            batch_ids.append(rid)
                            continue
                    else:
                        batch.append((_new(Op, (OP_DELETE, space, key, None)),))
                        batch_ids.append(rid)
                        continue
            elif op == wire.GET and n == 4:
                space, key = req[2], req[3]
                if 0 <= rid <= _ID_MAX and type(space) is str and space in stored \
                        and type(key) is str and 0 < len(key) <= _KEY_SAFE:
                    reads.append((rid, space, key))
                    continue
            try:
                if not 0 <= rid <= _ID_MAX:
                    raise ClientError(400, "bad_request", f"request ids are 0..{_ID_MAX}")
                got = self._request(rid, op, req, n, spaces)
            except ClientError as e:
                answers.append(wire.error_answer(rid, e.status, e.code, e.message))
                continue
            if got is None:
                continue                # a task answers it
            if type(got) is list:       # checked ops for the batch
                batch.append(got)
                batch_ids.append(rid)
                continue
            answers.append(got)
            vclock_needed = True
        if batch:
            self._submit(batch, batch_ids, answers)
        if reads:
            self._read(reads, answers)
            vclock_needed = True
        if answers:
            self._send(node.vclock_uuid() if vclock_needed else None, answers)
        if self.pending > limits.client_pending_requests_max and not self.paused_reads:
            self.paused_reads = True
            self._pause(True)

    def _request(self, rid: int, op: int, req: list, n: int, spaces: dict) -> Any:
        """Answer one request: an answer tuple, a list of checked ops for the write batch, or
        None when a task answers it. Raises ClientError for what the HTTP API refuses."""
        node = self.node
        if op == wire.PUT and n == 5:
            o = clientrules.put_op(req[2], req[3], req[4])
            return self._route(rid, [o], spaces)
        if op == wire.DELETE and n == 4:
            return self._route(rid, [clientrules.delete_op(req[2], req[3])], spaces)
        if op == wire.GET and n in (4, 5, 6):
            if n > 4 and req[4] is not None and not self._applied(req[4], req[5] if n == 6 else None):
                self._spawn(rid, self._after(req[4], req[5] if n == 6 else None, self._get, req))
                return None
            return self._get(rid, req)
        if op == wire.RANGE and n in (5, 6, 7):
            if n > 5 and req[5] is not None and not self._applied(req[5], req[6] if n == 7 else None):
                self._spawn(rid, self._after(req[5], req[6] if n == 7 else None, self._range, req))
                return None
            return self._range(rid, req)
        if op == wire.TXN and n == 3:
            return self._route(rid, clientrules.txn_ops(_txn_dicts(req[2])), spaces)
        if op == wire.INFO and n == 2:
            return (rid, wire.OK, node.info())
        if op == wire.WAIT and n in (3, 4):
            v = clientrules.check_vclock_uuid(req[2])
            t = clientrules.check_timeout_ms(req[3]) if n == 4 and req[3] is not None \
                else limits.wait_timeout_ms_default
            self._spawn(rid, self._wait(v, t))
            return None
        if op == wire.SPACE and n == 4:
            self._spawn(rid, self._space(req[2], req[3]))
            return None
        if op == wire.HELLO and n == 3:
            return self._hello(rid, req[2])
        raise ClientError(400, "bad_request", f"op {op} with {n - 2} arguments is not a request of "
                                              f"protocol version {wire.VERSION}")

    def _route(self, rid: int, ops: list[Op], spaces: dict) -> Any:
        """Checked ops: to the batch if every space exists and is replicated, else through the
        exact path (local spaces; Node.write refuses missing ones)."""
        for o in ops:
            if spaces.get(o.space) is not False:
                self._spawn(rid, self._exact_write(ops))
                return None
        return ops

    # --- reads ---------------------------------------------------------------------------
    def _read(self, reads: list[tuple[int, str, str]], answers: list) -> None:
        """GETs of checked keys in existing spaces, as clientrules.get_record answers them."""
        store = self.node.store
        uuid_of, me = store.table.uuid_of, self.node.uuid
        for (rid, space, key), rec in zip(reads, store.get_many([(s, k) for _, s, k in reads])):
            if rec is None or rec[DELETED]:
                answers.append(wire.error_answer(rid, 404, "no_such_key", f"key {key!r} is not in {space!r}"))
            else:
                origin = rec[ORIGIN_ID]
                answers.append((rid, wire.OK, (rec[VALUE], me if origin == 0 else uuid_of(origin), rec[LSN])))

    def _get(self, rid: int, req: list) -> tuple:
        _, value, origin, lsn = clientrules.get_record(self.node, req[2], req[3])
        return (rid, wire.OK, (value, origin, lsn))

    def _range(self, rid: int, req: list) -> tuple:
        recs, nxt = clientrules.range_records(self.node, req[2], req[3], req[4])
        return (rid, wire.OK, (recs, nxt))

    def _applied(self, vclock: Any, timeout_ms: Any) -> bool:
        clientrules.check_vclock_uuid(vclock)
        if timeout_ms is not None:
            clientrules.check_timeout_ms(timeout_ms)
        return self.node.has_applied(vclock)

    async def _after(self, vclock: dict, timeout_ms: int | None, read, req: list) -> tuple:
        t = limits.wait_timeout_ms_default if timeout_ms is None else timeout_ms
        await self.node.wait_applied(vclock, t / 1000)
        return read(req[0], req)

    async def _wait(self, vclock: dict, timeout_ms: int) -> Any:
        return {"vclock": await self.node.wait_applied(vclock, timeout_ms / 1000)}

    async def _space(self, name: Any, body: Any) -> Any:
        status, answer = await clientrules.create_space(self.node, name, body)
        return status, answer

    async def _exact_write(self, ops: list[Op]) -> Any:
        return (await self.node.write(ops))["lsn"]

    def _hello(self, rid: int, body: Any) -> tuple:
        node = self.node
        if type(body) is not dict:
            raise ClientError(400, "bad_request", "HELLO carries {\"token\": str|nil, \"version\": 1}")
        token = node.cfg.token
        if token:
            got = body.get("token")
            if type(got) is not str or not hmac.compare_digest(got.encode("utf-8", "surrogateescape"),
                                                               token.encode()):
                self._send(None, [wire.error_answer(rid, 401, "unauthorized", "a valid client token is required")])
                self.close()
                return None
        self.authed = True
        return (rid, wire.OK, {"version": wire.VERSION, "uuid": node.uuid, "status": node.status,
                               "limits": {"frame_bytes_max": limits.client_frame_bytes_max,
                                          "frame_requests_max": limits.client_frame_requests_max,
                                          "key_bytes_max": limits.key_bytes_max,
                                          "value_bytes_max": limits.value_bytes_max,
                                          "txn_ops_max": limits.txn_ops_max,
                                          "range_limit_max": limits.range_limit_max,
                                          "wait_timeout_ms_max": limits.wait_timeout_ms_max}})

    # --- writes ----------------------------------------------------------------------------
    def _submit(self, batch: list, ids: list[int], answers: list) -> None:
        try:
            got = writes.submit(self.node, batch)
        except ClientError as e:
            answers.extend(wire.error_answer(i, e.status, e.code, e.message) for i in ids)
            return
        if got is None:                 # the scanner did not take it: each by the exact path
            for rid, ops in zip(ids, batch):
                self._spawn(rid, self._exact_write(list(ops)))
            return
        fut, lasts = got
        fut.add_done_callback(lambda f: self._written(f, ids, lasts))

    def _written(self, fut: asyncio.Future, ids: list[int], lasts: list[int]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            e = fut.exception() if not fut.cancelled() else None
            why = f"the write failed: {type(e).__name__}: {e}" if e else "the write was cancelled"
            self._send(None, [wire.error_answer(i, 503, "write_failed", why) for i in ids])
            return
        try:
            self.node.ack_check()
        except ClientError as e:
            self._send(None, [wire.error_answer(i, e.status, e.code, e.message) for i in ids])
            return
        self._send(self.node.vclock_uuid(), list(zip(ids, [wire.OK] * len(ids), lasts)))

    # --- tasks -----------------------------------------------------------------------------
    def _spawn(self, rid: int, coro) -> None:
        if len(self._tasks) >= limits.client_waits_max:
            coro.close()
            self._send(None, [wire.error_answer(rid, 503, "too_busy", "too many requests of this connection "
                                                "are waiting; retry shortly")])
            return
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(lambda t: self._task_done(t, rid))

    def _task_done(self, t: asyncio.Task, rid: int) -> None:
        self._tasks.discard(t)
        if t.cancelled():
            return
        e = t.exception()
        if e is None:
            r = t.result()
            if type(r) is tuple and len(r) == 3:          # a read answered after its wait
                ans = r
            elif type(r) is tuple:                        # (status, body)
                ans = (rid, r[0], r[1])
            else:
                ans = (rid, wire.OK, r)
            self._send(self.node.vclock_uuid(), [ans])
        elif isinstance(e, ClientError):
            self._send(None, [wire.error_answer(rid, e.status, e.code, e.message)])
        else:   # a bug, not the client's: said loudly, answered, the connection and the node go on
            log.error("client request %d failed: %s: %s", rid, type(e).__name__, e, exc_info=e)
            self._send(None, [wire.error_answer(rid, 500, "internal", f"{type(e).__name__}: {e}")])

    # --- frames out --------------------------------------------------------------------------
    def _send(self, vclock: dict | None, answers: list) -> None:
        self.pending -= len(answers)
        if self.closed:
            return
        self._write(wire.encode_answers(vclock, answers))
        if self.paused_reads and self.pending <= limits.client_pending_requests_max // 2 and not self.send_paused:
            self.paused_reads = False
            self._pause(False)

    def refuse(self, status: int, code: str, message: str) -> None:
        """A protocol error: one answer with id nil, then the connection closes."""
        if not self.closed:
            self._write(wire.encode_answers(None, [wire.error_answer(None, status, code, message)]))
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._close()

    def lost(self) -> None:
        """The connection is gone: tasks still waiting for it stop."""
        self.closed = True
        for t in list(self._tasks):
            t.cancel()


def _txn_dicts(raw: Any) -> Any:
    """TXN's ops in the binary form ([2, space, key, value] / [3, space, key]) as the HTTP
    form clientrules.txn_ops checks; anything else is passed on for it to refuse."""
    if type(raw) is not list:
        return raw
    out = []
    for i, o in enumerate(raw):
        if type(o) is list and len(o) == 4 and o[0] == wire.TXN_PUT:
            out.append({"op": "put", "space": o[1], "key": o[2], "value": o[3]})
        elif type(o) is list and len(o) == 3 and o[0] == wire.TXN_DELETE:
            out.append({"op": "delete", "space": o[1], "key": o[2]})
        else:
            raise ClientError(400, "bad_op", f"op {i} is not [2, space, key, value] (put) or [3, space, key] "
                                             "(delete)")
    return out
