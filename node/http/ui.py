"""The dashboard at `/ui`: static files shipped in the package, and the hook that wires the
dashboard's parts (events stream, browser rules) into the API app.

Rules kept here:
- Only the files present in `node/http/ui/` when the app is built are served, by exact name:
  no path from the request ever reaches the file system.
- The page holds no secret and needs no token to load (its data calls carry the token); its
  answers forbid framing (the token sits in the page's sessionStorage) and limit scripts to
  the node's own files, while letting the page connect to the other members."""
from __future__ import annotations

import os

from aiohttp import web

from node.http.browser import add_cors_headers
from node.http.events import HUB, EventHub, events_handler

UI_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ui")
UI_PREFIX = "/ui"
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self' http: https:; img-src 'self' data:; "
                               "style-src 'self'; script-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
                               "form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def ui_files() -> dict[str, tuple[bytes, str]]:
    """name -> (content, content type), read once: a file edited later needs a restart."""
    out = {}
    for name in sorted(os.listdir(UI_DIR)):
        ctype = CONTENT_TYPES.get(os.path.splitext(name)[1])
        if ctype is None:
            continue
        with open(os.path.join(UI_DIR, name), "rb") as f:
            out[name] = (f.read(), ctype)
    assert "index.html" in out, f"the dashboard's files are missing from {UI_DIR} (package data)"
    return out


def _static(files: dict[str, tuple[bytes, str]]):
    async def handler(request: web.Request) -> web.Response:
        name = request.match_info.get("name") or "index.html"
        if name not in files:
            raise web.HTTPNotFound(reason=f"no dashboard file {name!r}")
        body, ctype = files[name]
        return web.Response(body=body, content_type=ctype, charset="utf-8", headers=PAGE_HEADERS)
    return handler


def install_ui(app: web.Application, node) -> None:
    """Routes for the page and the events stream; CORS headers on every answer; the stream's
    hub closed when the app shuts down (before the HTTP drain waits for handlers)."""
    hub = EventHub(node)
    app[HUB] = hub
    handler = _static(ui_files())
    app.router.add_get(UI_PREFIX, handler)
    app.router.add_get(UI_PREFIX + "/", handler)
    app.router.add_get(UI_PREFIX + "/{name}", handler)
    app.router.add_get("/v1/events", events_handler)
    app.on_response_prepare.append(add_cors_headers)

    async def close_hub(_app: web.Application) -> None:
        await hub.close()
    app.on_shutdown.append(close_hub)
