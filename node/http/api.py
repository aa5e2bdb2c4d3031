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
from typing import TYPE_CHECKING, Any

import msgpack
from aiohttp import web

from node import limits
from node.applier.accept import handle_replication
from node.core import codec, validate
from node.core.rows import OP_DELETE, OP_PUT, OP_SPACE, Op
from node.errors import ClientError, StorageError
from node.http import render
from node.http.browser import browser_mw
from node.http.health import install_health
from node.http.metrics import install_metrics

if TYPE_CHECKING:
    from node.server import Node

log = logging.getLogger("replog.http")

MSGPACK = "application/msgpack"
NODE = web.AppKey("node", object)
# /ui: the page (its data calls carry the token); /livez, /readyz: probes carry none
OPEN_PATHS = ("/v1/health", "/livez", "/readyz", "/metrics", "/v1/replication", "/ui")


# --- encoding ---------------------------------------------------------------------------
def reply(request: web.Request, data: Any, status: int = 200) -> web.Response:
    if MSGPACK in request.headers.get("Accept", ""):
        return web.Response(body=msgpack.packb(data, use_bin_type=True), status=status, content_type=MSGPACK)
    return web.Response(text=render.dumps(data), status=status, content_type="application/json")


def error_body(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


class _NotFinite(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotFinite(name)


_json_decode = json.JSONDecoder(parse_constant=_no_constant).decode
_TOO_LARGE = {"value_too_large", "txn_too_large"}


def invalid(e: validate.Invalid) -> ClientError:
    """A broken data rule (node.core.validate) as the client's error."""
    return ClientError(413 if e.code in _TOO_LARGE else 400, e.code, e.message)


async def read_body(request: web.Request) -> Any:
    if request.content_length is not None and request.content_length > limits.body_bytes_max:
        raise ClientError(413, "body_too_large", f"body exceeds {limits.body_bytes_max} bytes")
    try:
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


def check_space(name: str, *, write: bool) -> str:
    try:
        validate.check_space_name(name)
    except validate.Invalid as e:
        raise invalid(e) from None
    if write and name.startswith("_"):
        raise ClientError(403, "system_space", f"{name!r} is a system space; clients cannot write it")
    return name


def check_key(key: Any) -> str:
    try:
        return validate.check_key(key)
    except validate.Invalid as e:
        raise invalid(e) from None


def check_value(value: Any) -> int:
    """The value's size as stored (msgpack); refuses what cannot be stored or read back."""
    try:
        return validate.value_size(value)
    except validate.Invalid as e:
        raise invalid(e) from None


def check_txn_size(ops_bytes: int) -> None:
    try:
        validate.check_txn_bytes(ops_bytes)
    except validate.Invalid as e:
        raise invalid(e) from None


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
    node: Node = request.app[NODE]
    token = node.cfg.token
    if token and not request.path.startswith(OPEN_PATHS):
        # surrogateescape: a header is bytes, and non-UTF-8 ones are just a wrong token
        got = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(got, f"Bearer {token}".encode()):
            raise ClientError(401, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required")
    return await handler(request)


# --- handlers ----------------------------------------------------------------------------
def _node(request: web.Request) -> "Node":
    return request.app[NODE]


async def put_space(request: web.Request) -> web.Response:
    node = _node(request)
    name = check_space(request.match_info["space"], write=True)
    body = await read_body(request) if (request.content_length or 0) > 0 else {}
    if not isinstance(body, dict):
        raise ClientError(400, "bad_body", "body is an object like {\"local\": false}")
    local = body.get("local", False)
    conflict = body.get("conflict", "lww")
    err = validate.space_def_error({"local": local, "conflict": conflict})
    if err is not None:
        raise ClientError(400, "bad_option", err)
    existing = node.store.spaces.get(name) if node.store else None
    if existing is not None:
        if existing.local != local or existing.conflict != conflict:
            raise ClientError(409, "space_exists", f"space {name!r} exists with other options {existing.to_dict()}")
        return reply(request, {"space": name, **existing.to_dict(), "created": False})
    if node.core is not None and len(node.core.spaces) >= limits.spaces_max:   # with creates in flight
        raise ClientError(409, "too_many_spaces", f"at most {limits.spaces_max} spaces")
    res = await node.write([Op(OP_SPACE, name, "", {"local": local, "conflict": conflict})])
    return reply(request, {"space": name, "local": local, "conflict": conflict, "created": True, **res}, 201)


async def list_spaces(request: web.Request) -> web.Response:
    node = _node(request)
    spaces = node.store.spaces if node.store else {}
    return reply(request, {"spaces": [{"name": n, **d.to_dict()} for n, d in sorted(spaces.items())]})


async def put_key(request: web.Request) -> web.Response:
    space = check_space(request.match_info["space"], write=True)
    key = check_key(request.match_info["key"])
    value = await read_body(request)
    check_txn_size(check_value(value) + len(space) + len(key.encode()) + 16)
    return reply(request, await _node(request).write([Op(OP_PUT, space, key, value)]))


async def delete_key(request: web.Request) -> web.Response:
    space = check_space(request.match_info["space"], write=True)
    key = check_key(request.match_info["key"])
    return reply(request, await _node(request).write([Op(OP_DELETE, space, key, None)]))


def _space_for_read(node: "Node", name: str) -> None:
    check_space(name, write=False)
    if node.store is None or name not in node.store.spaces:
        raise ClientError(404, "no_such_space", f"space {name!r} does not exist")


async def get_key(request: web.Request) -> web.Response:
    node = _node(request)
    space = request.match_info["space"]
    _space_for_read(node, space)
    key = check_key(request.match_info["key"])
    rec = node.store.get(space, key)
    if rec is None or rec.deleted:
        raise ClientError(404, "no_such_key", f"key {key!r} is not in {space!r}")
    origin = node.uuid if rec.origin_id == 0 else node.store.table.uuid_of(rec.origin_id)
    return reply(request, {"key": key, "value": rec.value, "origin": origin, "lsn": rec.lsn})


async def range_keys(request: web.Request) -> web.Response:
    node = _node(request)
    space = request.match_info["space"]
    _space_for_read(node, space)
    after = request.query.get("after")
    if after is not None:
        check_key(after)
    try:
        limit = int(request.query.get("limit", limits.range_limit_default))
    except ValueError:
        raise ClientError(400, "bad_limit", "limit is an integer") from None
    if not (1 <= limit <= limits.range_limit_max):
        raise ClientError(400, "bad_limit", f"limit is 1..{limits.range_limit_max}")
    recs, nxt = node.store.range(space, after, limit)
    uuid_of = node.store.table.uuid_of
    items = [{"key": r.key, "value": r.value, "origin": node.uuid if r.origin_id == 0 else uuid_of(r.origin_id),
              "lsn": r.lsn} for r in recs]
    return reply(request, {"items": items, "next": nxt})


async def post_txn(request: web.Request) -> web.Response:
    body = await read_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("ops"), list) or not body["ops"]:
        raise ClientError(400, "bad_txn", "body is {\"ops\": [{\"op\": \"put\"|\"delete\", \"space\", \"key\", \"value\"}]}")
    if len(body["ops"]) > limits.txn_ops_max:
        raise ClientError(413, "txn_too_large", f"at most {limits.txn_ops_max} ops in one transaction")
    ops = []
    size = 0                          # the ops' encoding, row by row (a row adds <= 16 bytes of framing)
    for i, o in enumerate(body["ops"]):
        if not isinstance(o, dict) or o.get("op") not in ("put", "delete") or not isinstance(o.get("space"), str):
            raise ClientError(400, "bad_op", f"op {i} is not {{\"op\": \"put\"|\"delete\", \"space\", \"key\", ...}}")
        space = check_space(o["space"], write=True)
        key = check_key(o.get("key"))
        size += len(space) + len(key.encode()) + 16
        if o["op"] == "put":
            if "value" not in o:
                raise ClientError(400, "bad_op", f"op {i}: put needs a value")
            size += check_value(o["value"])
            ops.append(Op(OP_PUT, space, key, o["value"]))
        else:
            ops.append(Op(OP_DELETE, space, key, None))
    check_txn_size(size)
    return reply(request, await _node(request).write(ops))


async def get_info(request: web.Request) -> web.Response:
    return reply(request, _node(request).info())


async def get_cluster(request: web.Request) -> web.Response:
    return reply(request, _node(request).cluster_view())


async def delete_member(request: web.Request) -> web.Response:
    return reply(request, await _node(request).expel(request.match_info["uuid"]))


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
    if node.status != "running":
        raise ClientError(503, "not_ready", f"node is {node.status}")
    for p in body["peers"]:
        if p in (node.cfg.address, node.cfg.listen):
            raise ClientError(400, "bad_peers", f"peers: {p} is this node itself")
    stopping = node.configure_peers(body["peers"])
    if stopping:
        await asyncio.wait(stopping, timeout=limits.shutdown_deadline_s)
    return reply(request, {"peers": list(node.appliers)})


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
    from node.ops.backup import BackupError, backup_node
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


def make_app(node: "Node") -> web.Application:
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
    r.add_get("/v1/cluster", get_cluster)
    r.add_delete("/v1/cluster/{uuid}", delete_member)
    r.add_put("/v1/admin/peers", put_peers)
    r.add_post("/v1/admin/shutdown", post_shutdown)
    r.add_post("/v1/admin/backup", post_backup)
    from node.http.ui import install_ui
    install_ui(app, node)    # the dashboard: /ui, /v1/events, CORS for the members' pages
    return app
