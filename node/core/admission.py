"""What an unauthenticated peer may cost a node: how many handshakes it may hold open, and how
many log lines its failures may write.

Anyone who can reach the port can open replication links and fail their handshakes. Each link
in its handshake holds a socket and a task until `handshake_timeout_s`; each failure used to
write a WARNING. Both are bounded here, per remote address and in total.

Rules kept here:
- Pure: time arrives as an argument (monotonic seconds); the shell calls `admit` before it
  upgrades a request to a WebSocket and `release` exactly once for each admitted one.
- `HandshakeGate.admit` says why a handshake is refused (or None): first the total, then the
  remote address's share. Counts never go negative (a release without an admit is a bug).
- `FailureLog.note` lets one line per address per interval through, carrying the count of
  failures it did not log since the last line; addresses beyond `addresses_max` share one
  line (their own counters would be a memory an attacker could grow).
"""
from __future__ import annotations

from dataclasses import dataclass

OTHERS = "(other addresses)"        # the shared key of addresses past FailureLog.addresses_max


class HandshakeGate:
    def __init__(self, total_max: int, per_address_max: int):
        assert total_max > 0 and per_address_max > 0
        self.total_max = total_max
        self.per_address_max = per_address_max
        self.total = 0
        self.by_address: dict[str, int] = {}
        self.refused = 0                     # handshakes refused since start (for /metrics)

    def admit(self, address: str) -> str | None:
        """None if this handshake may start (it is counted), else why not."""
        if self.total >= self.total_max:
            self.refused += 1
            return f"{self.total} handshakes in progress, the most this node takes at once"
        n = self.by_address.get(address, 0)
        if n >= self.per_address_max:
            self.refused += 1
            return f"{n} handshakes in progress from {address}, the most one address may hold"
        self.total += 1
        self.by_address[address] = n + 1
        return None

    def release(self, address: str) -> None:
        n = self.by_address.get(address, 0)
        assert n > 0 and self.total > 0, f"release without admit for {address}"
        self.total -= 1
        if n == 1:
            del self.by_address[address]
        else:
            self.by_address[address] = n - 1


@dataclass
class _Window:
    opened_s: float
    suppressed: int = 0


class FailureLog:
    def __init__(self, interval_s: float, addresses_max: int):
        assert interval_s > 0 and addresses_max > 0
        self.interval_s = interval_s
        self.addresses_max = addresses_max
        self._windows: dict[str, _Window] = {}
        self.failures = 0                    # every failure noted (for /metrics)

    def note(self, address: str, now_s: float) -> tuple[bool, int]:
        """(log this one?, failures from this address not logged since its last line)."""
        self.failures += 1
        key = address
        if key not in self._windows and len(self._windows) >= self.addresses_max:
            self._expire(now_s)
            if len(self._windows) >= self.addresses_max:
                key = OTHERS
        w = self._windows.get(key)
        if w is None or now_s - w.opened_s >= self.interval_s:
            suppressed = w.suppressed if w is not None else 0
            self._windows[key] = _Window(now_s)
            return True, suppressed
        w.suppressed += 1
        return False, w.suppressed

    def _expire(self, now_s: float) -> None:
        # Windows past their interval (a count they never reported is dropped with them).
        old = [k for k, w in self._windows.items() if now_s - w.opened_s >= self.interval_s]
        for k in old:
            del self._windows[k]
