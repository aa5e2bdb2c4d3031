"""The SDK's exceptions: one class per kind of answer, so an application catches what it can
handle (`except replog.NotFound`) and lets the rest go. Every error a node answers carries the
HTTP API's status and code (`e.status`, `e.code`) and its message.

    ReplogError
    ├── BadRequest        400, 405: the request breaks a rule (bad key, value, space name, ...)
    │   ├── TooLarge      413: a value, transaction or frame past its bound
    │   └── Forbidden     403: a system space
    ├── Unauthorized      401: no token, or a wrong one
    ├── NotFound          404: no such key, space or member
    ├── Conflict          409: read_only or expelled node, space exists with other options, too many spaces
    ├── Timeout           504 wait_timeout, or no answer within the call's timeout
    ├── Unavailable       503, or no node could be reached
    │   └── OutcomeUnknown  a write was sent and its connection broke before the answer:
    │                       it may or may not have been applied (never retried by the SDK)
    └── ServerError       500 and anything else unexpected"""
from __future__ import annotations

from typing import Any


class ReplogError(Exception):
    status = 0
    code = "error"

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None,
                 address: str | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.address = address          # the node that answered, when one did

    def __str__(self) -> str:
        where = f" (from {self.address})" if self.address else ""
        return f"{self.code}: {self.message}{where}" if self.status else f"{self.message}{where}"


class BadRequest(ReplogError):
    status, code = 400, "bad_request"


class TooLarge(BadRequest):
    status, code = 413, "too_large"


class Forbidden(BadRequest):
    status, code = 403, "forbidden"


class Unauthorized(ReplogError):
    status, code = 401, "unauthorized"


class NotFound(ReplogError):
    status, code = 404, "not_found"


class Conflict(ReplogError):
    status, code = 409, "conflict"


class Timeout(ReplogError):
    status, code = 504, "timeout"


class Unavailable(ReplogError):
    status, code = 503, "unavailable"


class OutcomeUnknown(Unavailable):
    code = "outcome_unknown"


class ServerError(ReplogError):
    status, code = 500, "internal"


_BY_STATUS = {400: BadRequest, 405: BadRequest, 413: TooLarge, 403: Forbidden, 401: Unauthorized, 404: NotFound,
              409: Conflict, 504: Timeout, 408: Timeout, 503: Unavailable}

# Refusals a node makes before it claims anything: the write was not applied, so it may go to
# another node (the retry rule, docs/client.md).
NOT_APPLIED_CODES = frozenset({"not_ready", "catching_up", "too_busy", "too_many_connections"})


def from_answer(status: int, body: Any, address: str | None = None) -> ReplogError:
    """The exception for a node's error answer ({"code", "message"} with an HTTP status)."""
    code, message = "error", f"HTTP {status}"
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            code = str(err.get("code", code))
            message = str(err.get("message", message))
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else BadRequest)
    return cls(message, status=status, code=code, address=address)
