"""The SDK over a node's HTTP API, for when its binary port cannot be reached (or
`transport="http"`): the same calls as replog/binary.py, each one HTTP request in msgpack,
answered in the binary protocol's shapes so the client above has one code path.

Rules kept here:
- the token goes only to the address the caller named (as node/client.py does);
- every request has the call's timeout; a connection that fails is ConnectionLost with `sent`
  False only when the request surely never left (the connection could not be opened)."""
from __future__ import annotations

import asyncio
import ssl
from typing import Any
from urllib.parse import quote

import aiohttp
import msgpack

from node.clientproto import wire
from node.core import codec, validate
from replog.binary import ConnectionLost
from replog.errors import BadRequest, Timeout, from_answer

MSGPACK = "application/msgpack"


def _q(s: str, rule=validate.key_error, code: str = "bad_key") -> str:
    """A space or key for the path, checked by the node's own rule first: what cannot be one
    (not a string, empty, not UTF-8) fails as the binary port answers it, not as a TypeError
    of the URL's quoting or a 404 of a path that names no key."""
    err = rule(s)
    if err is not None:
        raise BadRequest(err, status=400, code=code)
    return quote(s, safe="")


def _s(s: str) -> str:
    return _q(s, validate.space_name_error, "bad_space_name")


def _pack(body: Any) -> bytes:
    """The body as the binary port encodes its requests (wire's codec), so one value has one
    fate on both transports."""
    try:
        return codec.pack(body)
    except (TypeError, ValueError, OverflowError) as e:
        raise BadRequest(f"the request cannot be encoded: {e}", status=400, code="bad_request") from None


def vclock_text(v: dict[str, int]) -> str:
    """An after_vclock in its query-string form, uuid:lsn,..."""
    return ",".join(f"{u}:{n}" for u, n in v.items())


class HttpConnection:
    def __init__(self, base_url: str, address: str, session: aiohttp.ClientSession, token: str | None,
                 ssl_context: ssl.SSLContext | None, timeout_s: float, vclock_sink=None):
        self.base = base_url
        self.address = address
        self.session = session
        self.headers = {"Accept": MSGPACK, "Content-Type": MSGPACK}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.ssl = ssl_context if ssl_context is not None else (None if base_url.startswith("https:") else False)
        self.default_timeout_s = timeout_s
        self._vclock_sink = vclock_sink
        self.closed = None
        self.node_uuid = ""
        self.full = False

    @property
    def usable(self) -> bool:
        return self.closed is None

    def close(self) -> None:
        self.closed = True

    async def room(self) -> None:
        return None

    def call(self, request: tuple, timeout_s: float | None = None) -> "asyncio.Future":
        return asyncio.ensure_future(self._call(request, timeout_s or self.default_timeout_s))

    async def _call(self, request: tuple, timeout_s: float) -> tuple[Any, Any]:
        op = request[0]
        method, path, query, body = self._route(op, request)
        try:
            async with self.session.request(method, self.base + path, params=query, headers=self.headers,
                                            data=None if body is None else _pack(body),
                                            ssl=self.ssl, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                raw = await r.read()
                status = r.status
        except asyncio.TimeoutError:
            raise Timeout(f"no answer from {self.address} within {timeout_s:g} s", address=self.address) from None
        except aiohttp.ClientConnectorError as e:
            raise ConnectionLost(f"cannot reach {self.address}: {e}", sent=False, address=self.address) from None
        except (aiohttp.ClientError, OSError) as e:
            raise ConnectionLost(f"connection to {self.address} lost: {e}", sent=True, address=self.address) from None
        try:
            doc = msgpack.unpackb(raw, raw=False, strict_map_key=False) if raw else None
        except Exception:  # an answer that is not msgpack: a proxy's page, a node's plain-text error
            doc = {"error": {"code": "http", "message": f"HTTP {status}: {raw[:200]!r}"}}
        if status >= 400:
            raise from_answer(status, doc, self.address)
        return self._shape(op, doc, status)

    async def get_json(self, path: str, timeout_s: float | None = None) -> Any:
        """GET a path of the HTTP API that has no binary op (/v1/cluster, /v1/health): its answer."""
        body, _ = await self._call(("GET", path), timeout_s or self.default_timeout_s)
        return body

    def _route(self, op: Any, r: tuple) -> tuple[str, str, dict, Any]:
        if op == "GET":
            return "GET", r[1], {}, None
        if op == wire.GET:
            return "GET", f"/v1/spaces/{_s(r[1])}/keys/{_q(r[2])}", self._after(r, 3), None
        if op == wire.PUT:
            return "PUT", f"/v1/spaces/{_s(r[1])}/keys/{_q(r[2])}", {}, r[3]
        if op == wire.DELETE:
            return "DELETE", f"/v1/spaces/{_s(r[1])}/keys/{_q(r[2])}", {}, None
        if op == wire.RANGE:
            q = {"limit": str(r[3])}
            if r[2] is not None:
                _q(r[2])
                q["after"] = r[2]
            return "GET", f"/v1/spaces/{_s(r[1])}/keys", {**q, **self._after(r, 4)}, None
        if op == wire.TXN:
            ops = [{"op": "put", "space": o[1], "key": o[2], "value": o[3]} if o[0] == wire.TXN_PUT
                   else {"op": "delete", "space": o[1], "key": o[2]} for o in r[1]]
            return "POST", "/v1/txn", {}, {"ops": ops}
        if op == wire.INFO:
            return "GET", "/v1/info", {}, None
        if op == wire.WAIT:
            q = {"vclock": vclock_text(r[1])}
            if len(r) > 2 and r[2] is not None:
                q["timeout_ms"] = str(r[2])
            return "GET", "/v1/wait", q, None
        if op == wire.SPACE:
            return "PUT", f"/v1/spaces/{_s(r[1])}", {}, r[2]
        raise ValueError(f"no HTTP route for op {op}")

    @staticmethod
    def _after(r: tuple, i: int) -> dict:
        q = {}
        if len(r) > i and r[i]:
            q["after_vclock"] = vclock_text(r[i])
            if len(r) > i + 1 and r[i + 1] is not None:
                q["timeout_ms"] = str(r[i + 1])
        return q

    def _shape(self, op: Any, d: Any, status: int) -> tuple[Any, Any]:
        """An HTTP answer in the binary protocol's body shape, with the vclock it carried."""
        if op == "GET":
            return d, None
        vclock = d.get("vclock_uuid") if isinstance(d, dict) else None
        if op == wire.GET:
            body = (d["value"], d["origin"], d["lsn"])
        elif op in (wire.PUT, wire.DELETE, wire.TXN):
            body = d["lsn"]
        elif op == wire.RANGE:
            body = ([(i["key"], i["value"], i["origin"], i["lsn"]) for i in d["items"]], d["next"])
        elif op == wire.WAIT:
            body, vclock = d, d.get("vclock")
        elif op == wire.INFO:
            body, vclock = d, d.get("vclock_uuid")
        else:
            body = d
        if vclock and self._vclock_sink is not None:
            self._vclock_sink(vclock)
        return body, vclock
