"""Fault points: where a test makes a node crash or misbehave on purpose, set by the
environment (REPLOG_FAULT_POINT) when the node starts.

REPLOG_FAULT_POINT=NAME[:N]. A registration crash point (identity_file.FAULT_POINTS) makes the
process os._exit(137) the N-th time it is reached (default 1), as kill -9 would; a server point
acts the first N times: lose_apply_answer = the donor applies a JOIN/REGISTER, then closes the
link without answering (the "lost ApplyResult" of the reference); applier_bug and checkpoint_bug
raise an AssertionError there (a bug of ours), to show it is logged, shown and survived;
stall_write[:N[:SECONDS]] blocks the event loop (`limits.fault_stall_s` unless SECONDS) as an
HTTP write begins, before any check (a frozen VM, or a disk stall on the loop's thread: what
was waiting runs before any timer)."""
from __future__ import annotations

import os
import sys
import time

from node import limits
from node.errors import ConfigError
from node.identity import identity_file as idf

FAULT_ENV = "REPLOG_FAULT_POINT"
SERVER_FAULT_POINTS = ("lose_apply_answer", "applier_bug", "checkpoint_bug", "stall_write")
_server_fault: dict[str, int] = {}
_stall_s: list[float] = []          # stall_write:N:SECONDS, else limits.fault_stall_s


def install_fault_points(env: dict | None = None) -> None:
    spec = (os.environ if env is None else env).get(FAULT_ENV, "").strip()
    if not spec:
        return
    name, _, count = spec.partition(":")
    count, _, seconds = count.partition(":")
    if name not in idf.FAULT_POINTS + SERVER_FAULT_POINTS:
        raise ConfigError(FAULT_ENV, f"unknown fault point {name!r}; known: "
                          f"{', '.join(idf.FAULT_POINTS + SERVER_FAULT_POINTS)}")
    try:
        n = int(count) if count else 1
    except ValueError:
        raise ConfigError(FAULT_ENV, f"count must be an integer, got {count!r}") from None
    if seconds:
        try:
            stall_s = float(seconds)
        except ValueError:
            stall_s = -1.0
        if name != "stall_write" or not 0 < stall_s <= 60:
            raise ConfigError(FAULT_ENV, f"only stall_write takes seconds (0 to 60) after its count, got {spec!r}")
        _stall_s[:] = [stall_s]
    if name in SERVER_FAULT_POINTS:
        _server_fault[name] = n
        return
    hits = 0

    def hook(point: str) -> None:
        nonlocal hits
        if point != name:
            return
        hits += 1
        if hits == n:
            sys.stderr.write(f"replog: fault point {point}: exiting with 137\n")
            sys.stderr.flush()
            os._exit(137)

    idf.FAULT_POINT = hook


def fault(name: str) -> bool:
    """A server-side fault point: True while it still has hits left."""
    assert name in SERVER_FAULT_POINTS, name
    left = _server_fault.get(name, 0)
    if left <= 0:
        return False
    _server_fault[name] = left - 1
    return True


def stall(name: str) -> None:
    """A fault point that blocks the event loop (limits.fault_stall_s, or the seconds its spec
    gave) while it has hits left."""
    if fault(name):
        seconds = _stall_s[0] if _stall_s else limits.fault_stall_s
        sys.stderr.write(f"replog: fault point {name}: the event loop stalls for {seconds:g} s\n")
        time.sleep(seconds)
