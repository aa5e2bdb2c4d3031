"""The HTTP listener: aiohttp's runner and site, with the bounds a server facing the network needs.

Rules kept here:
- a connection must send a whole request head within `http_header_timeout_s` of connecting (or
  of its previous answer), or it is closed (aiohttp's keep-alive timer, which runs from the
  connection's start, is that bound); bodies have their own bound (node/http/api.py: read_body);
- open client connections are capped below the process's fd limit, keeping `http_fds_reserved`
  fds for the WAL, LMDB and replication links: past the cap a new connection gets a 503 and is
  closed at once, instead of the accept loop running the process out of fds;
- the soft fd limit is raised to the hard one at start (as Go's runtime does);
- an accept that fails for want of fds or memory is logged once per
  `accept_error_log_interval_s` with a count, not once per attempt with a traceback (asyncio
  retries the accept every second and logged a traceback for each failure: tens of MB a minute);
- a request HTTP itself refuses (a line or header too long or malformed) is answered 400 by
  aiohttp and logged the same way, once an interval with a count and without a traceback:
  aiohttp logged an ERROR with a traceback for each, at whatever rate a client sent them;
- request bodies are never inflated (no `Content-Encoding` is decoded: node/http/api.py refuses
  one with 415), so a small compressed body cannot cost a gigabyte of work and memory.
This is the one module that reaches inside aiohttp (AppRunner._make_server)."""
from __future__ import annotations

import asyncio
import errno
import logging
import resource
import time
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from node import limits

log = logging.getLogger("replog.http")

_BUSY_BODY = b'{"error": {"code": "too_many_connections", "message": "too many open client connections"}}'
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
         b"Content-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


def raise_fd_limit() -> int:
    """Raise the soft fd limit to the hard one; returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


class _Refuse(asyncio.Protocol):
    """A connection past the cap: answered 503 and closed, without reading it."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(_BUSY)        # type: ignore[attr-defined]
        transport.close()


class _CappedServer:
    """aiohttp's protocol factory (web.Server), refusing connections past `cap`."""

    def __init__(self, server: web.Server, cap: int):
        self._server = server
        self.cap = cap
        self.refused = 0
        self._logged_at = 0.0

    def __call__(self) -> asyncio.Protocol:
        if len(self._server.connections) >= self.cap:
            self.refused += 1
            now = time.monotonic()
            if now - self._logged_at >= limits.accept_error_log_interval_s:
                self._logged_at = now
                log.warning("http: %d open connections: refusing new ones (%d so far)", self.cap, self.refused)
            return _Refuse()
        return self._server()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class RequestErrors(logging.LoggerAdapter):
    """The logger aiohttp's request handler writes to: a request the HTTP parser refused (the
    client's fault, already answered 400) is counted and logged once an interval, in one line;
    everything else (our handlers' bugs) goes through with its traceback."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.count = 0
        self._logged_at = -limits.accept_error_log_interval_s

    def exception(self, msg: Any, *args: Any, exc_info: Any = True, **kw: Any) -> None:
        e = exc_info if isinstance(exc_info, BaseException) else None
        if isinstance(e, HttpProcessingError) and 400 <= (e.code or 400) < 500:
            self.count += 1
            now = time.monotonic()
            if now - self._logged_at >= limits.accept_error_log_interval_s:
                self._logged_at = now
                why = " ".join(str(e.message).split())[:200]
                log.warning("http: refused a malformed request (%s: %s); %d so far, logged once a minute",
                            type(e).__name__, why, self.count)
            return
        self.logger.exception(msg, *args, exc_info=exc_info, **kw)


class Runner(web.AppRunner):
    def __init__(self, app: web.Application, cap: int, **kw: Any):
        super().__init__(app, keepalive_timeout=limits.http_header_timeout_s, auto_decompress=False,
                         logger=RequestErrors(), **kw)
        self._cap = cap

    async def _make_server(self) -> web.Server:
        return _CappedServer(await super()._make_server(), self._cap)   # type: ignore[return-value]


class AcceptErrors:
    """The loop's exception handler: accept failures for want of resources are counted and
    logged once an interval; everything else goes to the handler that was there."""
    _RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.previous = loop.get_exception_handler()
        self.count = 0
        self._logged_at = 0.0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        e = context.get("exception")
        if isinstance(e, OSError) and e.errno in self._RESOURCES and "accept" in context.get("message", ""):
            self.count += 1
            now = time.monotonic()
            if now - self._logged_at >= limits.accept_error_log_interval_s:
                self._logged_at = now
                log.error("http: cannot accept connections: %s (%d failed accepts so far; new clients "
                          "are refused until fds are free)", e.strerror, self.count)
            return
        if self.previous is not None:
            self.previous(loop, context)
        else:
            loop.default_exception_handler(context)


async def start(app: web.Application, host: str, port: int, *, ssl_context=None, **kw: Any) -> Runner:
    """Serve `app` on host:port (over TLS with `ssl_context`) with the bounds of the module comment."""
    soft = raise_fd_limit()
    cap = min(limits.http_connections_max, soft - min(limits.http_fds_reserved, soft // 2))
    loop = asyncio.get_running_loop()
    if not isinstance(loop.get_exception_handler(), AcceptErrors):
        loop.set_exception_handler(AcceptErrors(loop))
    runner = Runner(app, cap, **kw)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_address=True, ssl_context=ssl_context).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
