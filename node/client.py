"""A small blocking HTTP client for replog's JSON API: used by the CLI, the demo, the
benchmarks and the integration tests, so every caller speaks to a node the same way.

https:// URLs verify the node's certificate against `ca_file` (a PEM bundle; the system's CAs
when None) and its host name, as node/tls.py does between nodes. The bearer token goes only
to the URL the caller names."""
from __future__ import annotations

import functools
import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from node import limits


@functools.lru_cache(maxsize=8)
def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """Loading a CA bundle takes milliseconds: once per bundle, not per request."""
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def request(method: str, url: str, body: Any = None, *, raw: bytes | None = None, token: str | None = None,
            headers: dict | None = None, timeout: float = limits.client_request_timeout_s, ca_file: str | None = None) -> tuple[int, Any]:
    """(status, decoded JSON answer). An error answer that is not JSON comes back as its raw bytes."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    context = tls_context(ca_file) if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            payload = r.read()
            return r.status, json.loads(payload) if payload else None
    except urllib.error.HTTPError as e:
        payload = e.read()
        try:
            return e.code, json.loads(payload) if payload else None
        except ValueError:
            return e.code, payload
