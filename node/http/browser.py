"""What a web browser may do with a node: the cross-origin rules behind the dashboard.

The dashboard served by one member reads every other member directly, so a node answers
CORS, but only for pages served by the cluster's own members, and only to read. Rules kept here:
- An origin is trusted when it is this node's own (same-origin) or `http(s)://<address>` of a
  member in this node's `_cluster` (expelled members excluded) or of a subscriber on a live
  replication link (anonymous replicas are in no master's `_cluster`; they held the secret to get
  there). Never `*`: a token-less loopback node must not become readable by any page a user visits.
- A cross-origin request may only read (GET, HEAD, and the OPTIONS preflight for them). A request
  from any other origin, or a cross-origin write, is refused with 403 before authentication: a
  page elsewhere cannot shut down or write to a node through the user's browser (a "simple" POST
  needs no preflight, so refusing it here is what stops it).
- A node without a token answers a browser only under a Host that is an IP literal, `localhost`,
  or a member's address: a DNS-rebinding page (its own name pointed at 127.0.0.1) is refused.
  A node with a token is safe from that page anyway (the page never gets the token).
- Requests without an Origin or Sec-Fetch-Site header (curl, the SDK, peers) pass untouched."""
from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from aiohttp import web

from node import limits
from node.cluster_space.table import STATE_EXPELLED
from node.errors import ClientError
from node.http.keys import NODE

if TYPE_CHECKING:
    from node.process.ports import BrowserView

READ_METHODS = ("GET", "HEAD")


def _node(request: web.Request) -> "BrowserView":
    return request.app[NODE]


def member_addresses(node: "BrowserView") -> set[str]:
    """Addresses of the cluster as this node knows it: itself, its `_cluster` (not expelled),
    and every subscriber on a live replication link."""
    addrs = {node.cfg.address}
    if node.core is not None:
        addrs.update(m.address for m in node.core.table.members() if m.state != STATE_EXPELLED and m.address)
    addrs.update(r.address for r in node.relays if r.address)
    return addrs


def trusted_origin(node: "BrowserView", origin: str) -> bool:
    scheme, sep, address = origin.partition("://")
    return bool(sep) and scheme in ("http", "https") and address in member_addresses(node)


def host_known(node: "BrowserView", host: str) -> bool:
    """A Host header a browser may use to reach a token-less node (see the module's rules)."""
    name = host.rpartition(":")[0] if host.rpartition(":")[2].isdigit() else host
    name = name.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return host in member_addresses(node)


def _cross_origin(request: web.Request, origin: str) -> bool:
    return origin != f"{request.scheme}://{request.host}"


@web.middleware
async def browser_mw(request: web.Request, handler):
    origin = request.headers.get("Origin")
    if origin is None and "Sec-Fetch-Site" not in request.headers:
        return await handler(request)          # not a browser: nothing to decide here
    node = _node(request)
    if not node.cfg.token and not host_known(node, request.host):
        raise ClientError(403, "forbidden_host", f"this node answers browsers only at its own address, "
                          f"not {request.host!r} (it has no token)")
    if origin is None or not _cross_origin(request, origin):
        return await handler(request)          # same-origin (or a navigation): the page is ours
    if not trusted_origin(node, origin):
        raise ClientError(403, "forbidden_origin", f"origin {origin!r} is not a member of this cluster")
    preflight = request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers
    wanted = request.headers.get("Access-Control-Request-Method", "") if preflight else request.method
    if wanted not in READ_METHODS:
        raise ClientError(403, "cross_origin_write", "pages of other members may only read this node")
    if preflight:
        return web.Response(status=204, headers={
            "Access-Control-Allow-Methods": ", ".join(READ_METHODS),
            "Access-Control-Allow-Headers": "Authorization",
            "Access-Control-Max-Age": str(limits.cors_max_age_s)})
    return await handler(request)


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: also reaches streamed answers (/v1/events) and errors (a 401 the
    page must be able to read to ask for a token)."""
    if "Origin" not in request.headers:
        return
    response.headers.add("Vary", "Origin")
    origin = request.headers["Origin"]
    if _cross_origin(request, origin) and request.method in READ_METHODS + ("OPTIONS",) \
            and trusted_origin(_node(request), origin):
        response.headers["Access-Control-Allow-Origin"] = origin
