"""`replog.Client`: the blocking SDK, for code without an event loop.

    with replog.Client(["127.0.0.1:7301", "127.0.0.1:7302"]) as c:
        w = c.put("kv", "a", 1)
        c.get("kv", "a", after=w.vclock)
        for item in c.range("kv"): ...
        with c.txn() as t:
            t.put("kv", "b", 2).delete("kv", "a")

It runs an AsyncClient on an event loop of its own, in one background thread; every method
hands its call to that loop and waits for the answer. So it is safe to share between threads,
and calls made by many threads at once are batched into frames like concurrent asyncio calls.
The same failover, retry rule, timeouts and exceptions as AsyncClient (replog/aio.py)."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Iterator

from replog.aio import RANGE_PAGE, AsyncClient, Item, TxnOps, WriteResult, _split
from replog.errors import Timeout

_MARGIN_S = 5.0          # the thread waits this much past a call's own timeout before giving up on it


def _new_loop(tls: bool) -> asyncio.AbstractEventLoop:
    """uvloop's loop where it is installed (less CPU per call), else asyncio's; asyncio's for
    TLS, where uvloop 0.23 can leave a connect that a restarting node reset registered on a closed
    descriptor, and refuse every later socket on that number (node/config.py loop_module)."""
    if tls:
        return asyncio.new_event_loop()
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Client:
    def __init__(self, addresses: list[str] | str, *, token: str | None = None, ca_file: str | None = None,
                 timeout: float = 10.0, transport: str = "auto"):
        self.timeout = float(timeout)
        addrs = [addresses] if isinstance(addresses, str) else list(addresses)
        self._loop = _new_loop(any(_split(a, ca_file)[3] for a in addrs))    # the AsyncClient's own rule
        self._thread = threading.Thread(target=self._loop.run_forever, name="replog-client", daemon=True)
        self._thread.start()
        self._closed = False

        async def make() -> AsyncClient:
            return AsyncClient(addresses, token=token, ca_file=ca_file, timeout=timeout, transport=transport)
        self._aclient: AsyncClient = self._run(make(), None)

    def _run(self, coro, timeout: float | None) -> Any:
        if self._closed:
            coro.close()
            raise RuntimeError("this replog.Client is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        t = (self.timeout if timeout is None else timeout) + _MARGIN_S
        try:
            return fut.result(t)
        except TimeoutError:
            fut.cancel()
            raise Timeout(f"the call did not finish within {t:g} s") from None

    # --- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._aclient.close(), self._loop).result(self.timeout)
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(self.timeout)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def vclock(self) -> dict[str, int]:
        """The merge of every vclock the nodes answered this client with (read-your-writes)."""
        return dict(self._aclient.vclock)

    @property
    def address(self) -> str | None:
        return self._aclient.address

    # --- operations ------------------------------------------------------------------------
    def put(self, space: str, key: str, value: Any, *, timeout: float | None = None) -> WriteResult:
        return self._run(self._aclient.put(space, key, value, timeout=timeout), timeout)

    def delete(self, space: str, key: str, *, timeout: float | None = None) -> WriteResult:
        return self._run(self._aclient.delete(space, key, timeout=timeout), timeout)

    def get(self, space: str, key: str, *, after: dict | None = None, timeout: float | None = None) -> Item:
        return self._run(self._aclient.get(space, key, after=after, timeout=timeout), timeout)

    def range_page(self, space: str, after_key: str | None = None, limit: int = RANGE_PAGE, *,
                   after: dict | None = None, timeout: float | None = None) -> tuple[list[Item], str | None]:
        return self._run(self._aclient.range_page(space, after_key, limit, after=after, timeout=timeout), timeout)

    def range(self, space: str, after_key: str | None = None, *, page: int = RANGE_PAGE,
              after: dict | None = None, timeout: float | None = None) -> Iterator[Item]:
        """Every live key after `after_key`, in key order, fetched `page` at a time as you iterate."""
        while True:
            items, nxt = self.range_page(space, after_key, page, after=after, timeout=timeout)
            yield from items
            if nxt is None:
                return
            after_key, after = nxt, None

    def txn(self) -> "Txn":
        return Txn(self)

    def commit(self, ops: list[tuple], *, timeout: float | None = None) -> WriteResult:
        return self._run(self._aclient.commit(ops, timeout=timeout), timeout)

    def create_space(self, space: str, *, local: bool = False, conflict: str = "lww",
                     timeout: float | None = None) -> dict:
        return self._run(self._aclient.create_space(space, local=local, conflict=conflict, timeout=timeout), timeout)

    def info(self, *, timeout: float | None = None) -> dict:
        return self._run(self._aclient.info(timeout=timeout), timeout)

    def cluster(self, *, timeout: float | None = None) -> dict:
        return self._run(self._aclient.cluster(timeout=timeout), timeout)

    def wait(self, vclock: dict, *, timeout: float | None = None) -> dict:
        return self._run(self._aclient.wait(vclock, timeout=timeout), timeout)


class Txn(TxnOps):
    """The blocking transaction builder: `with c.txn() as t: t.put(...)` commits at the end of
    the block (not if it raised); or call `t.commit()`."""

    def __init__(self, client: Client):
        self.client = client
        self.ops: list[tuple] = []
        self.result: WriteResult | None = None

    def commit(self, *, timeout: float | None = None) -> WriteResult:
        self.result = self.client.commit(self.ops, timeout=timeout)
        return self.result

    def __enter__(self) -> "Txn":
        return self

    def __exit__(self, et, e, tb) -> None:
        if et is None and self.ops:
            self.commit()
