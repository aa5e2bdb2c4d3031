"""Logging in text or JSON lines, to stderr; and the end of a log file, for reports."""
from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        d = {"ts": round(record.created, 6), "level": record.levelname.lower(), "logger": record.name,
             "msg": record.getMessage()}
        if record.exc_info:
            d["exc"] = self.formatException(record.exc_info)
        return json.dumps(d, ensure_ascii=False)


def setup(level: str = "info", fmt: str = "text") -> None:
    h = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        h.setFormatter(JsonFormatter())
    else:
        f = logging.Formatter("%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
        f.converter = time.gmtime
        h.setFormatter(f)
    root = logging.getLogger()
    root.handlers[:] = [h]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def file_tail(path: str, lines: int) -> str:
    """The last `lines` lines of a log file ("" if it cannot be read): what a report of a
    process that failed shows of its log."""
    try:
        with open(path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
    except OSError:
        return ""
