"""The client HTTP API (`/v1`, JSON; msgpack when asked) and the replication endpoint.

Every handler validates input before touching the node; every refusal is a ClientError
mapped by one middleware to `{"error": {"code", "message"}}` with a 4xx status.
Malformed input is never a 500 and never stops the node."""
from __future__ import annotations

import asyncio
import errno
import hmac
import json
import logging
import math
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote_to_bytes

import msgpack
from aiohttp import web

from node import limits
from node.applier.accept import handle_replication
from node import clientrules
from node.clientproto import wire
from node.clientrules import check_key, check_space   # the client input rules, shared with node/clientproto
from node.core import codec, validate
from node.errors import ClientError, StorageError
from node.faults import stall
from node.http import render
from node.http.keys import NODE
from node.http.browser import browser_mw
from node.http.health import install_health
from node.http.metrics import install_metrics

if TYPE_CHECKING:
    from node.process.ports import ApiHost

log = logging.getLogger("replog.http")

MSGPACK = "application/msgpack"
# /ui: the page (its data calls carry the token); /livez, /readyz: probes carry none
OPEN_PATHS = ("/v1/health", "/livez", "/readyz", "/metrics", "/v1/replication", "/ui")
JOINING = ("joining", "waiting")    # statuses of a node whose join (or start-up exchange) polls its peers each round


# --- encoding ---------------------------------------------------------------------------
_JSON_TYPE = {"Content-Type": "application/json; charset=utf-8"}
_MSGPACK_TYPE = {"Content-Type": MSGPACK}


def reply(request: web.Request, data: Any, status: int = 200) -> web.Response:
    if MSGPACK in request.headers.get("Accept", ""):
        return web.Response(body=codec.pack(data), status=status, headers=_MSGPACK_TYPE)
    return web.Response(body=render.dumps(data).encode(), status=status, headers=_JSON_TYPE)


def error_body(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


class _NotFinite(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotFinite(name)


_json_decode = json.JSONDecoder(parse_constant=_no_constant).decode
async def read_body(request: web.Request) -> Any:
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):    # never inflated (node/http/listener.py): refused as sent
        raise ClientError(415, "unsupported_encoding", f"request bodies are sent without a Content-Encoding "
                          f"(got {encoding[:40]!r})")
    if request.content_length is not None and request.content_length > limits.body_bytes_max:
        raise ClientError(413, "body_too_large", f"body exceeds {limits.body_bytes_max} bytes")
    try:
        if request.content.is_eof():         # the whole body came with the head: nothing to wait for
            raw = await request.read()
        else:
            raw = await asyncio.wait_for(request.read(), limits.http_body_timeout_s)
    except asyncio.TimeoutError:
        raise ClientError(408, "body_timeout", f"the body did not arrive within {limits.http_body_timeout_s:g} s") \
            from None
    if len(raw) > limits.body_bytes_max:
        raise ClientError(413, "body_too_large", f"body exceeds {limits.body_bytes_max} bytes")
    if not raw:
        raise ClientError(400, "empty_body", "a body is required")
    if request.content_type == MSGPACK:
        try:
            return msgpack.unpackb(raw, raw=False, strict_map_key=False, ext_hook=codec.refuse_ext)
        except codec.ExtTypeRefused as e:
            raise ClientError(400, "bad_value", f"{e} (JSON could not read it back)") from None
        except Exception:  # msgpack raises many types for junk
            raise ClientError(400, "bad_msgpack", "body is not valid msgpack") from None
    try:
        return _json_decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))   # as json.loads does
    except _NotFinite as e:
        raise ClientError(400, "bad_value", f"numbers are finite: {e} cannot be stored") from None
    except RecursionError:
        raise ClientError(400, "value_too_deep", f"values nest at most {limits.value_depth_max} arrays and "
                          "maps deep") from None
    except (ValueError, UnicodeDecodeError):
        raise ClientError(400, "bad_json", "body is not valid JSON") from None


# --- middleware ------------------------------------------------------------------------
@web.middleware
async def errors_mw(request: web.Request, handler):
    try:
        return await handler(request)
    except ClientError as e:
        return reply(request, error_body(e.code, e.message), e.status)
    except web.HTTPException as e:
        if e.status >= 400:
            code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(e.status, "http_error")
            return reply(request, error_body(code, e.reason), e.status)
        raise


@web.middleware
async def auth_mw(request: web.Request, handler):
    node: ApiHost = request.app[NODE]
    token = node.cfg.token
    if token and not request.path.startswith(OPEN_PATHS):
        # surrogateescape: a header is bytes, and non-UTF-8 ones are just a wrong token
        scheme, _, got = request.headers.get("Authorization", "").partition(" ")
        # the scheme's name is case-insensitive (RFC 9110 11.1): "bearer" is "Bearer"
        if scheme.lower() != "bearer" or not hmac.compare_digest(got.encode("utf-8", "surrogateescape"),
                                                                 token.encode()):
            raise ClientError(401, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required")
    return await handler(request)


# --- handlers ----------------------------------------------------------------------------
def _node(request: web.Request) -> "ApiHost":
    return request.app[NODE]


async def put_space(request: web.Request) -> web.Response:
    name = check_space(request.match_info["space"], write=True)
    body = await read_body(request) if (request.content_length or 0) > 0 else {}
    status, answer = await clientrules.create_space(_node(request), name, body)
    return reply(request, answer, status)


async def list_spaces(request: web.Request) -> web.Response:
    node = _node(request)
    spaces = node.store.spaces if node.store else {}
    return reply(request, {"spaces": [{"name": n, **d.to_dict()} for n, d in sorted(spaces.items())]})


def path_key(request: web.Request) -> str:
    """The key the path names. A percent-escape that is not UTF-8 (`%ff`) is left in the path as
    it was by the URL decoder, so `/keys/%ff` and `/keys/%25ff` would name one key: refused."""
    key = request.match_info["key"]
    if "%" in key:
        raw_key = request.raw_path.split("?", 1)[0].split("/", 5)[5]   # /v1/spaces/{space}/keys/{key}
        try:
            unquote_to_bytes(raw_key).decode("utf-8")
        except UnicodeDecodeError:
            raise ClientError(400, "bad_key", "the key's percent-escapes are not UTF-8") from None
    return key


def query_key(request: web.Request, name: str) -> str | None:
    """A key given in the query string. The query's decoder turns a percent-escape that is not
    UTF-8 (`?after=%ff`) into U+FFFD, silently another key: refused."""
    key = request.query.get(name)
    if key is not None and "\ufffd" in key:
        try:
            parse_qsl(request.rel_url.raw_query_string, keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            raise ClientError(400, "bad_key", f"{name}'s percent-escapes are not UTF-8") from None
    return key


async def put_key(request: web.Request) -> web.Response:
    space, key = request.match_info["space"], path_key(request)
    check_space(space, write=True)     # before the body is read: a bad path costs nothing
    check_key(key)
    op = clientrules.put_op(space, key, await read_body(request))
    stall("stall_write")
    return reply(request, await _node(request).write([op]))


async def delete_key(request: web.Request) -> web.Response:
    op = clientrules.delete_op(request.match_info["space"], path_key(request))
    return reply(request, await _node(request).write([op]))


async def after_vclock(request: web.Request) -> None:
    """`?after_vclock=uuid:lsn,...[&timeout_ms=N]`: wait until this node has applied it."""
    text = request.query.get("after_vclock")
    if text is not None:
        vclock = clientrules.parse_vclock_text(text, "after_vclock")
        timeout_ms = clientrules.parse_timeout_text(request.query.get("timeout_ms"))
        node = _node(request)
        if not node.has_applied(vclock):
            await node.wait_applied(vclock, timeout_ms / 1000)


async def get_key(request: web.Request) -> web.Response:
    node = _node(request)
    space, key = request.match_info["space"], path_key(request)
    clientrules.space_for_read(node, space)
    check_key(key)
    await after_vclock(request)
    key, value, origin, lsn = clientrules.get_record(node, space, key)
    return reply(request, {"key": key, "value": value, "origin": origin, "lsn": lsn})


async def range_keys(request: web.Request) -> web.Response:
    node = _node(request)
    space = request.match_info["space"]
    clientrules.space_for_read(node, space)
    after = query_key(request, "after")
    if after is not None:
        check_key(after)
    try:
        limit = int(request.query.get("limit", limits.range_limit_default))
    except ValueError:
        raise ClientError(400, "bad_limit", "limit is an integer") from None
    clientrules.check_limit(limit)
    await after_vclock(request)
    recs, nxt = clientrules.range_records(node, space, after, limit)
    return reply(request, {"items": [{"key": k, "value": v, "origin": o, "lsn": n} for k, v, o, n in recs],
                           "next": nxt})


async def get_client(request: web.Request) -> web.Response:
    """Where the binary client protocol listens (the SDK asks this first; node/clientproto/)."""
    node = _node(request)
    srv = node.client_server
    return reply(request, {"port": srv.port if srv is not None and srv.port else None, "tls": node.cfg.tls,
                           "version": wire.VERSION})


async def get_wait(request: web.Request) -> web.Response:
    """`GET /v1/wait?vclock=uuid:lsn,...&timeout_ms=N`: 200 with this node's vclock by uuid once
    it has applied `vclock`; 504 wait_timeout if it has not within the timeout."""
    text = request.query.get("vclock")
    if text is None:
        raise ClientError(400, "bad_vclock", "GET /v1/wait needs ?vclock=uuid:lsn[,uuid:lsn...]")
    vclock = clientrules.parse_vclock_text(text, "vclock")
    timeout_ms = clientrules.parse_timeout_text(request.query.get("timeout_ms"))
    return reply(request, {"vclock": await _node(request).wait_applied(vclock, timeout_ms / 1000)})


async def post_txn(request: web.Request) -> web.Response:
    body = await read_body(request)
    if not isinstance(body, dict):
        raise ClientError(400, "bad_txn", "body is {\"ops\": [{\"op\": \"put\"|\"delete\", \"space\", \"key\", \"value\"}]}")
    return reply(request, await _node(request).write(clientrules.txn_ops(body.get("ops"))))


async def get_info(request: web.Request) -> web.Response:
    return reply(request, _node(request).info())


async def get_cluster(request: web.Request) -> web.Response:
    return reply(request, _node(request).cluster_view())


async def delete_member(request: web.Request) -> web.Response:
    doc = await _node(request).expel(request.match_info["uuid"])
    return reply(request, doc, 202 if doc["state"] == "expel_pending" else 200)   # pending: node/fence.py give_up


def _unseen_s(raw: str | None) -> float:
    """The `unseen_s` query parameter: required for the bulk form, a finite number >= 0."""
    if raw is None:
        raise ClientError(400, "bad_unseen_s", "unseen_s is required: forget the followers unseen for at least "
                          "this many seconds (DELETE /v1/admin/followers?unseen_s=86400)")
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0:
        raise ClientError(400, "bad_unseen_s", f"unseen_s is a number of seconds >= 0, not {raw[:40]!r}")
    return v


async def get_followers(request: web.Request) -> web.Response:
    return reply(request, _node(request).followers_view())


async def delete_followers(request: web.Request) -> web.Response:
    """DELETE /v1/admin/followers?unseen_s=N: forget every remembered anonymous follower unseen
    for at least N seconds and not linked (node/process/followers.py)."""
    unseen_s = _unseen_s(request.query.get("unseen_s"))
    return reply(request, _node(request).forget_followers(None, unseen_s))


async def delete_follower(request: web.Request) -> web.Response:
    return reply(request, _node(request).forget_followers(request.match_info["uuid"], None))


async def post_rejoin(request: web.Request) -> web.Response:
    """POST /v1/admin/rejoin {"discard": [uuid, ...]}: let this node's rebuild lose rows of those
    expelled members that no donor has (node/rejoin.py allow_discard; docs/operations.md)."""
    body = await read_body(request)
    uuids = body.get("discard") if isinstance(body, dict) else None
    if not isinstance(uuids, list) or not uuids or len(uuids) > limits.members_max or \
            not all(validate.is_uuid(u) for u in uuids):
        raise ClientError(400, "bad_body", "body is {\"discard\": [\"<expelled member uuid>\", ...]}: "
                          f"1 to {limits.members_max} canonical uuids")
    return reply(request, _node(request).allow_rejoin_discard(sorted(set(uuids))))


async def put_peers(request: web.Request) -> web.Response:
    body = await read_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("peers"), list) or \
            not all(isinstance(p, str) for p in body["peers"]) or len(body["peers"]) > limits.members_max:
        raise ClientError(400, "bad_peers", "body is {\"peers\": [\"host:port\", ...]}")
    for p in body["peers"]:
        err = validate.address_error(p)
        if err is not None:
            raise ClientError(400, "bad_peers", f"peers: {err}")
    node = _node(request)
    if node.status != "running" and node.status not in JOINING:
        raise ClientError(503, "not_ready", f"node is {node.status}")
    for p in body["peers"]:
        if p in (node.cfg.address, node.cfg.listen):
            raise ClientError(400, "bad_peers", f"peers: {p} is this node itself")
    if node.status in JOINING:
        # No links yet: the join polls the peers each round, from the next one on these (a joiner
        # whose peers are all down or cannot register it is pointed at others without a restart)
        node.configure_peers(body["peers"])
        peers = list(dict.fromkeys(body["peers"]))
        log.info("admin: peers := %s (the join polls them from its next round)", peers)
        return reply(request, {"peers": peers, "stopping": []})
    removed = [a for a in node.appliers if a not in body["peers"]]
    stopping = dict(zip(node.configure_peers(body["peers"]), removed))   # stopped in this order (set_peers)
    late = []
    if stopping:
        _, pending = await asyncio.wait(stopping, timeout=limits.peers_stop_wait_s)
        late = sorted(stopping[t] for t in pending)
        if late:
            log.warning("admin: appliers of removed peers %s did not stop within %.0f s", late,
                        limits.peers_stop_wait_s)
    return reply(request, {"peers": list(node.appliers), "stopping": late})


async def post_shutdown(request: web.Request) -> web.Response:
    node = _node(request)
    body = await read_body(request) if (request.content_length or 0) > 0 else {}
    if not isinstance(body, dict) or not isinstance(body.get("cluster", False), bool):
        raise ClientError(400, "bad_body", "body is {\"cluster\": true|false}")
    phase = {k: body[k] for k in ("phase", "shutdown_id", "final") if k in body}   # cluster shutdown steps
    result = await node.request_shutdown(cluster=body.get("cluster", False), **phase)
    return reply(request, result, 202)


async def post_backup(request: web.Request) -> web.Response:
    """A hot backup of this node into a directory on its host (node/ops/backup.py)."""
    from node.ops.backup import BackupError
    from node.ops.backup_node import backup_node
    body = await read_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("to"), str) or not body["to"] \
            or not isinstance(body.get("compact", False), bool):
        raise ClientError(400, "bad_body", "body is {\"to\": \"/absolute/new/dir\", \"compact\": false}")
    try:
        manifest = await backup_node(_node(request), body["to"], compact=body.get("compact", False))
    except BackupError as e:
        raise ClientError(e.status, e.code, e.message) from None
    except OSError as e:       # the destination's disk, not the request
        status, code = (507, "no_space") if e.errno in (errno.ENOSPC, errno.EDQUOT) else (500, "backup_failed")
        raise ClientError(status, code, f"backup to {body['to']} failed: {e}") from None
    except StorageError as e:
        raise ClientError(500, "backup_failed", f"backup to {body['to']} failed: {e}") from None
    return reply(request, {"path": body["to"], **manifest})


async def replication(request: web.Request) -> web.StreamResponse:
    return await handle_replication(_node(request), request)


def make_app(node: "ApiHost") -> web.Application:
    app = web.Application(middlewares=[errors_mw, browser_mw, auth_mw], client_max_size=limits.body_bytes_max)
    app[NODE] = node
    r = app.router
    install_health(app, node, reply)      # /v1/health, /livez, /readyz
    install_metrics(app, node)            # /metrics, and the HTTP latency histogram
    r.add_get("/v1/replication", replication)
    r.add_get("/v1/spaces", list_spaces)
    r.add_put("/v1/spaces/{space}", put_space)
    r.add_get("/v1/spaces/{space}/keys", range_keys)
    r.add_put(r"/v1/spaces/{space}/keys/{key:[\s\S]+}", put_key)
    r.add_get(r"/v1/spaces/{space}/keys/{key:[\s\S]+}", get_key)
    r.add_delete(r"/v1/spaces/{space}/keys/{key:[\s\S]+}", delete_key)
    r.add_post("/v1/txn", post_txn)
    r.add_get("/v1/info", get_info)
    r.add_get("/v1/wait", get_wait)
    r.add_get("/v1/client", get_client)
    r.add_get("/v1/cluster", get_cluster)
    r.add_delete("/v1/cluster/{uuid}", delete_member)
    r.add_get("/v1/admin/followers", get_followers)
    r.add_delete("/v1/admin/followers", delete_followers)
    r.add_delete("/v1/admin/followers/{uuid}", delete_follower)
    r.add_put("/v1/admin/peers", put_peers)
    r.add_post("/v1/admin/rejoin", post_rejoin)
    r.add_post("/v1/admin/shutdown", post_shutdown)
    r.add_post("/v1/admin/backup", post_backup)
    from node.http.ui import install_ui
    install_ui(app, node)    # the dashboard: /ui, /v1/events, CORS for the members' pages
    return app
