"""Logging: text or JSON lines, to stderr or to a file that SIGHUP reopens; and the end of a
log file, for reports.

Rules kept here:
- Every line carries an ISO-8601 UTC timestamp with date and milliseconds
  (`2024-05-01T12:00:00.123Z`), in text and JSON alike.
- With a log file, lines are appended to it and nothing goes to stderr; `reopen()` closes and
  opens it again by name, so logrotate's "move, then SIGHUP" starts a new file without losing a
  line (records wait on the handler's lock while it switches).
- An unwritable log file is the log_file option's error (ConfigError), raised before anything starts."""
from __future__ import annotations

import json
import logging
import sys
import time

from node.errors import ConfigError


def iso_utc(created: float) -> str:
    ms = int(created * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{ms:03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        d = {"ts": iso_utc(record.created), "level": record.levelname.lower(), "logger": record.name,
             "msg": record.getMessage()}
        if record.exc_info:
            d["exc"] = self.formatException(record.exc_info)
        return json.dumps(d, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return iso_utc(record.created)


class ReopenableFileHandler(logging.StreamHandler):
    """Appends to `path`; reopen() switches to a fresh open of the same name."""

    def __init__(self, path: str):
        self.path = path
        super().__init__(self._open())

    def _open(self):
        try:
            return open(self.path, "a", encoding="utf-8", buffering=1)
        except OSError as e:
            raise ConfigError("log_file", f"cannot open {self.path}: {e.strerror}") from None

    def reopen(self) -> None:
        new = self._open()
        self.acquire()
        try:
            old, self.stream = self.stream, new
        finally:
            self.release()
        old.close()

    def close(self) -> None:
        self.acquire()
        try:
            self.stream.close()
        finally:
            self.release()
        super().close()


def setup(level: str = "info", fmt: str = "text", log_file: str = "") -> None:
    h: logging.Handler = ReopenableFileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    h.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in root.handlers:
        if isinstance(old, ReopenableFileHandler):
            old.close()
    root.handlers[:] = [h]
    set_level(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


# Libraries whose DEBUG lines are theirs, not the node's: the AWS SDK (an S3 lease store) logs
# every request's headers there, the session token and signatures among them, and the tracebacks
# of errors it retries itself. They say INFO and above, whatever the node's level.
LIBRARY_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3")


def set_level(level: str) -> None:
    lvl = logging.getLevelName(level.upper())
    logging.getLogger().setLevel(lvl)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(max(lvl, logging.INFO))


def reopen() -> bool:
    """Reopen the log file, if logs go to one (SIGHUP). Raises ConfigError if it cannot be opened;
    the old file stays in use then."""
    done = False
    for h in logging.getLogger().handlers:
        if isinstance(h, ReopenableFileHandler):
            h.reopen()
            done = True
    return done


def file_tail(path: str, lines: int) -> str:
    """The last `lines` lines of a log file ("" if it cannot be read): what a report of a
    process that failed shows of its log."""
    try:
        with open(path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
    except OSError:
        return ""
