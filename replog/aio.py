"""`replog.AsyncClient`: the asyncio SDK over a list of nodes.

    async with replog.AsyncClient(["10.0.0.1:7301", "10.0.0.2:7301"], token=...) as c:
        w = await c.put("kv", "a", {"x": 1})           # WriteResult(lsn, vclock by uuid)
        item = await c.get("kv", "a", after=w.vclock)   # on any node: waits until it has w
        async for item in c.range("kv"): ...
        async with c.txn() as t:
            t.put("kv", "b", 2).delete("kv", "a")

Addresses are the nodes' HTTP addresses (`host:port`, `http://...`, `https://...`). For each node
the client asks `GET /v1/client` where its binary port is and speaks the binary protocol there;
if that port cannot be reached it speaks HTTP to the node instead (same calls, same answers).

Rules kept here (docs/client.md):
- one node at a time; a node that cannot be reached, or breaks, is left for the next one in the
  list (round robin), and a call that failed that way goes to the next node by the retry rule;
- the retry rule: a read (get, range, info, wait) is retried on the next node after any
  connection failure or 503; a write (put, delete, txn, space) is retried only when it surely was
  not applied: it never left for the node (connection not opened, or broken before its frame was
  written), or the node refused it before claiming anything (503 not_ready, catching_up,
  too_busy). A write whose connection broke after it was sent raises OutcomeUnknown and is not
  retried: it may have been applied, and applying it twice could undo a later write;
- every call has a timeout (the client's, or the call's own `timeout=`), which bounds the whole
  call, retries included;
- `vclock` is the merge of every vclock the nodes answered with: `get(..., after=c.vclock)`
  reads this client's own writes on any node."""
from __future__ import annotations

import asyncio
import ssl
from typing import Any, AsyncIterator, NamedTuple

import aiohttp
import msgpack

from node import limits
from node.clientproto import wire
from replog.binary import BinaryConnection, ConnectionLost
from replog.errors import NOT_APPLIED_CODES, OutcomeUnknown, ReplogError, Timeout, Unauthorized, Unavailable
from replog.http import HttpConnection

DEFAULT_TIMEOUT_S = 10.0
RANGE_PAGE = 1000


class WriteResult(NamedTuple):
    lsn: int
    vclock: dict            # the node's vclock by uuid after the write: pass it as `after=`


class Item(NamedTuple):
    key: str
    value: Any
    origin: str             # uuid of the member that wrote it
    lsn: int


def _split(address: str, ca_file: str | None) -> tuple[str, str, int, bool]:
    """(base url, host, port, tls) of a node address."""
    a = address.rstrip("/")
    tls = bool(ca_file)
    if a.startswith("https://"):
        a, tls = a[8:], True
    elif a.startswith("http://"):
        a, tls = a[7:], False
    host, _, port = a.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a node address is host:port (or http[s]://host:port), not {address!r}")
    host = host.strip("[]")
    return f"{'https' if tls else 'http'}://{a}", host, int(port), tls


class AsyncClient:
    def __init__(self, addresses: list[str] | str, *, token: str | None = None, ca_file: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S, transport: str = "auto"):
        if isinstance(addresses, str):
            addresses = [addresses]
        if not addresses:
            raise ValueError("at least one node address")
        if transport not in ("auto", "binary", "http"):
            raise ValueError("transport is auto, binary or http")
        self.nodes = [_split(a, ca_file) for a in addresses]
        self.addresses = list(addresses)
        self.token = token
        self.timeout = float(timeout)
        self.transport = transport
        self._ssl = ssl.create_default_context(cafile=ca_file) if any(n[3] for n in self.nodes) else None
        self._i = 0                         # the node in use (index into nodes)
        self._conn: BinaryConnection | HttpConnection | None = None
        self._connecting: asyncio.Future | None = None
        self._session: aiohttp.ClientSession | None = None
        self.vclock: dict[str, int] = {}    # merge of every vclock answered (read-your-writes)

    # --- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def address(self) -> str | None:
        """The node in use, if connected."""
        return self._conn.address if self._conn is not None and self._conn.usable else None

    def _merge(self, v: dict) -> None:
        mine = self.vclock
        for u, n in v.items():
            if n > mine.get(u, 0):
                mine[u] = n

    # --- connecting ------------------------------------------------------------------------
    async def _connection(self, deadline: float) -> BinaryConnection | HttpConnection:
        c = self._conn
        if c is not None and c.usable:
            return c
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect(deadline))
        fut = self._connecting
        try:
            return await asyncio.shield(fut)
        finally:
            if fut.done():
                self._connecting = None

    async def _connect(self, deadline: float) -> BinaryConnection | HttpConnection:
        """The next node that answers, starting with the current one; Unavailable if none does."""
        loop = asyncio.get_running_loop()
        errors = []
        for k in range(len(self.nodes)):
            i = (self._i + k) % len(self.nodes)
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                conn = await self._open(i, left)
            except (OSError, asyncio.TimeoutError, ReplogError) as e:
                if isinstance(e, ReplogError) and e.status in (401, 403):
                    raise                    # a wrong token is wrong on every node
                errors.append(f"{self.addresses[i]}: {e or type(e).__name__}")
                continue
            self._i, self._conn = i, conn
            return conn
        raise Unavailable("no node could be reached: " + "; ".join(errors or ["timed out"]))

    async def _open(self, i: int, left: float) -> BinaryConnection | HttpConnection:
        base, host, port, tls = self.nodes[i]
        address = self.addresses[i]
        if self._session is None:
            self._session = aiohttp.ClientSession()
        http = HttpConnection(base, address, self._session, self.token, self._ssl, self.timeout, self._merge)
        if self.transport == "http":
            await asyncio.wait_for(http.call((wire.INFO,), left), left)   # reachable, and the token is right
            return http
        where = await asyncio.wait_for(self._client_port(http, left), left)
        cport = where.get("port") if isinstance(where, dict) else None
        if cport:
            try:
                return await BinaryConnection.open(host, int(cport), address=address, token=self.token,
                                                   ssl_context=self._ssl if where.get("tls") else None,
                                                   timeout_s=min(self.timeout, left), vclock_sink=self._merge)
            except (OSError, asyncio.TimeoutError, Unavailable):
                if self.transport == "binary":
                    raise
        elif self.transport == "binary":
            raise Unavailable(f"{address} serves no binary client port", address=address)
        return http                          # the binary port is unreachable here: HTTP, same calls

    async def _client_port(self, http: HttpConnection, left: float) -> Any:
        """`GET /v1/client`: where the node's binary port is ({} for a node without one)."""
        try:
            async with http.session.get(http.base + "/v1/client", headers=http.headers, ssl=http.ssl,
                                        timeout=aiohttp.ClientTimeout(total=left)) as r:
                if r.status == 401:
                    raise Unauthorized("the node refused the token", address=http.address)
                if r.status == 404:
                    return {}                # a node from before the binary protocol: HTTP
                if r.status >= 400:
                    raise Unavailable(f"GET /v1/client answered {r.status}", address=http.address)
                return msgpack.unpackb(await r.read(), raw=False)
        except (aiohttp.ClientError, ValueError, msgpack.UnpackException) as e:
            raise Unavailable(f"cannot reach {http.address}: {e}", address=http.address) from None

    def _drop(self, conn: Any) -> None:
        """This connection failed: close it, and start the next call at the next node."""
        conn.close()
        if self._conn is conn:
            self._conn = None
            self._i = (self._i + 1) % len(self.nodes)

    # --- calling ---------------------------------------------------------------------------
    async def _call(self, request: tuple, timeout: float | None, write: bool) -> tuple[Any, Any]:
        conn = self._conn
        last: ReplogError | None = None
        if timeout is None and conn is not None and conn.closed is None and not conn.full:
            try:                                 # the usual case: connected, room, the default timeout
                return await conn.call(request)
            except Unavailable as e:
                self._failed(conn, e, write)
                last = e
        loop = asyncio.get_running_loop()
        t = self.timeout if timeout is None else float(timeout)
        deadline = loop.time() + t
        for _ in range(2 * len(self.nodes)):
            if loop.time() >= deadline:
                break
            conn = await self._connection(deadline)
            await conn.room()
            try:
                return await conn.call(request, None if timeout is None else max(0.0, deadline - loop.time()))
            except Unavailable as e:
                self._failed(conn, e, write)
                last = e
        if last is None:
            raise Timeout(f"the call did not finish within {t:g} s")
        raise last

    def _failed(self, conn: Any, e: Unavailable, write: bool) -> None:
        """A call failed for want of a node: raise unless the retry rule lets it go to the next one."""
        if isinstance(e, ConnectionLost):
            self._drop(conn)
            if write and e.sent:
                raise OutcomeUnknown(f"the connection to {e.address} broke after the write was sent: it may "
                                     "or may not have been applied", address=e.address) from None
            return
        if write and e.code not in NOT_APPLIED_CODES:
            raise e
        self._drop(conn)

    # --- operations ------------------------------------------------------------------------
    async def put(self, space: str, key: str, value: Any, *, timeout: float | None = None) -> WriteResult:
        body, vclock = await self._call((wire.PUT, space, key, value), timeout, True)
        return WriteResult(body, vclock)

    async def delete(self, space: str, key: str, *, timeout: float | None = None) -> WriteResult:
        body, vclock = await self._call((wire.DELETE, space, key), timeout, True)
        return WriteResult(body, vclock)

    async def get(self, space: str, key: str, *, after: dict | None = None,
                  timeout: float | None = None) -> Item:
        """The key's item, or NotFound. `after`: a vclock by uuid this node must have applied
        first (it waits up to the timeout: Timeout if it has not)."""
        req = (wire.GET, space, key) if not after else (wire.GET, space, key, after, self._wait_ms(timeout))
        body, _ = await self._call(req, timeout, False)
        return Item(key, body[0], body[1], body[2])

    async def range_page(self, space: str, after_key: str | None = None, limit: int = RANGE_PAGE, *,
                         after: dict | None = None, timeout: float | None = None) -> tuple[list[Item], str | None]:
        """One page: up to `limit` items after `after_key`, and the key to continue after (None at the end)."""
        req = (wire.RANGE, space, after_key, limit) if not after else \
            (wire.RANGE, space, after_key, limit, after, self._wait_ms(timeout))
        (items, nxt), _ = await self._call(req, timeout, False)
        return [Item(*i) for i in items], nxt

    async def range(self, space: str, after_key: str | None = None, *, page: int = RANGE_PAGE,
                    after: dict | None = None, timeout: float | None = None) -> AsyncIterator[Item]:
        """Every live key after `after_key`, in key order, fetched `page` at a time."""
        while True:
            items, nxt = await self.range_page(space, after_key, page, after=after, timeout=timeout)
            for it in items:
                yield it
            if nxt is None:
                return
            after_key, after = nxt, None

    def txn(self) -> "AsyncTxn":
        return AsyncTxn(self)

    async def commit(self, ops: list[tuple], *, timeout: float | None = None) -> WriteResult:
        """One atomic transaction of ops [(2, space, key, value) put | (3, space, key) delete]."""
        body, vclock = await self._call((wire.TXN, [list(o) for o in ops]), timeout, True)
        return WriteResult(body, vclock)

    async def create_space(self, space: str, *, local: bool = False, conflict: str = "lww",
                           timeout: float | None = None) -> dict:
        body, _ = await self._call((wire.SPACE, space, {"local": local, "conflict": conflict}), timeout, True)
        return body

    async def info(self, *, timeout: float | None = None) -> dict:
        body, _ = await self._call((wire.INFO,), timeout, False)
        return body

    async def cluster(self, *, timeout: float | None = None) -> dict:
        """`GET /v1/cluster` of the node in use: its members in its own ids (over HTTP)."""
        return await self._http_get("/v1/cluster", timeout)

    async def _http_get(self, path: str, timeout: float | None) -> Any:
        conn = self._conn if isinstance(self._conn, HttpConnection) and self._conn.usable else None
        if conn is None:
            base, _, _, _ = self.nodes[self._i]
            if self._session is None:
                self._session = aiohttp.ClientSession()
            conn = HttpConnection(base, self.addresses[self._i], self._session, self.token, self._ssl, self.timeout)
        try:
            return await conn.get_json(path, timeout)
        except ConnectionLost as e:
            raise Unavailable(str(e), address=e.address) from None

    async def wait(self, vclock: dict, *, timeout: float | None = None) -> dict:
        """Wait until the node in use has applied `vclock` (by uuid); returns its vclock then."""
        body, _ = await self._call((wire.WAIT, vclock, self._wait_ms(timeout)), timeout, False)
        return body["vclock"]

    def _wait_ms(self, timeout: float | None) -> int:
        """How long the node may wait for an after-vclock: a little less than the call's timeout,
        so its wait_timeout answer arrives before the call's own deadline."""
        t = self.timeout if timeout is None else timeout
        return max(0, min(int(t * 1000) - 200 if t > 0.5 else int(t * 600), wire_wait_max()))


def wire_wait_max() -> int:
    return limits.wait_timeout_ms_max


class TxnOps:
    """What both transaction builders collect: ops, nothing sent before commit."""
    ops: list

    def put(self, space: str, key: str, value: Any):
        self.ops.append((wire.TXN_PUT, space, key, value))
        return self

    def delete(self, space: str, key: str):
        self.ops.append((wire.TXN_DELETE, space, key))
        return self


class AsyncTxn(TxnOps):
    """A transaction builder: `t.put(...).delete(...)`, then `await t.commit()` (or leave an
    `async with` block without an exception). Nothing is sent before commit."""

    def __init__(self, client: AsyncClient):
        self.client = client
        self.ops: list[tuple] = []
        self.result: WriteResult | None = None

    async def commit(self, *, timeout: float | None = None) -> WriteResult:
        self.result = await self.client.commit(self.ops, timeout=timeout)
        return self.result

    async def __aenter__(self) -> "AsyncTxn":
        return self

    async def __aexit__(self, et, e, tb) -> None:
        if et is None and self.ops:
            await self.commit()
