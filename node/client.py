"""A small blocking HTTP client for replog's JSON API: used by the CLI, the demo, the
benchmarks and the integration tests, so every caller speaks to a node the same way."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def request(method: str, url: str, body: Any = None, *, raw: bytes | None = None, token: str | None = None,
            headers: dict | None = None, timeout: float = 10.0) -> tuple[int, Any]:
    """(status, decoded JSON answer). An error answer that is not JSON comes back as its raw bytes."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            payload = r.read()
            return r.status, json.loads(payload) if payload else None
    except urllib.error.HTTPError as e:
        payload = e.read()
        try:
            return e.code, json.loads(payload) if payload else None
        except ValueError:
            return e.code, payload
