"""Requests from the command line tools (`replog` client commands, `replog status`, the demo)
to a node: one function per request shape, so the transport can change in one place.

The client token goes only to the URL the caller names (`token`, else $REPLOG_TOKEN; "" sends
none): callers that follow addresses learned from a cluster pass "" for those."""
from __future__ import annotations

import os
from typing import Any


def http(method: str, url: str, body: Any = None, token: str | None = None, timeout: float = 10,
         ca_file: str | None = None) -> tuple[int, Any]:
    """One call to the node at `url`: (status, decoded JSON); an error answer that is not JSON
    comes back as an error document."""
    from node.client import request
    status, doc = request(method, url, body, token=token if token is not None else os.environ.get("REPLOG_TOKEN"),
                          timeout=timeout,
                          ca_file=ca_file or os.environ.get("REPLOG_CA_FILE") or None)
    if status >= 400 and not isinstance(doc, dict):
        doc = {"error": {"code": "http", "message": f"HTTP {status}"}}
    return status, doc


def base_url(u: str, ca_file: str | None = None) -> str:
    """host:port alone means http://, or https:// when a CA file is given."""
    if u.startswith(("http://", "https://")):
        return u.rstrip("/")
    tls = ca_file or os.environ.get("REPLOG_CA_FILE")
    return f"{'https' if tls else 'http'}://{u}".rstrip("/")


def sdk_client(url: str, token: str | None = None, ca_file: str | None = None, timeout: float = 10.0,
               transport: str = "auto"):
    """The SDK's blocking client (replog.Client) for one node named on the command line; the token
    (else $REPLOG_TOKEN) and CA file (else $REPLOG_CA_FILE) go to that node only."""
    import replog
    return replog.Client([url], token=token if token is not None else os.environ.get("REPLOG_TOKEN") or None,
                         ca_file=ca_file or os.environ.get("REPLOG_CA_FILE") or None, timeout=timeout,
                         transport=transport)
