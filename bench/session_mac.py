"""The per-message MAC of replication links (node/core/session.py): HMAC-SHA256 truncated to 16
bytes (what the node uses) beside keyed BLAKE2b with digest_size 16 (the alternative), on a 1 MiB
ROWS message and on a 100-byte ACK, plus what a whole seal + unseal of a 1 MiB message costs
(the MAC on both ends, and the slice the receiver takes).

    python -m bench.session_mac

Figures only: nothing here asserts on timing."""
from __future__ import annotations

import hashlib
import hmac
import os
import sys
import time

from bench.common import machine, print_machine, print_table
from node.core import session as sess

ROWS_BYTES = 1 << 20                 # a relay batch (limits.relay_batch_bytes_max)
ACK_BYTES = 100
REPEAT_S = 1.0                       # each figure: as many calls as fit in this


def per_call_us(fn) -> float:
    for _ in range(3):
        fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < REPEAT_S:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    key, seq = os.urandom(32), (7).to_bytes(8, "big")
    base = hmac.new(key, digestmod=hashlib.sha256)

    def hmac_sha256(data: bytes) -> bytes:
        h = base.copy()
        h.update(seq)
        h.update(data)
        return h.digest()[:16]

    def blake2b(data: bytes) -> bytes:
        h = hashlib.blake2b(key=key, digest_size=16)
        h.update(seq)
        h.update(data)
        return h.digest()

    rows, ack = os.urandom(ROWS_BYTES), os.urandom(ACK_BYTES)
    table = []
    for name, fn in (("HMAC-SHA256/128 (used)", hmac_sha256), ("BLAKE2b-128 keyed", blake2b)):
        big, small = per_call_us(lambda: fn(rows)), per_call_us(lambda: fn(ack))
        table.append([name, big, ROWS_BYTES / big, small])
    t = sess.transcript(2, os.urandom(32), "s", os.urandom(32), "c")
    client, server = sess.Session(b"secret", t, sess.CLIENT, "s"), sess.Session(b"secret", t, sess.SERVER, "c")
    parts = [rows]

    def round_trip() -> None:
        server.unseal(client.seal_parts(parts))
    rt = per_call_us(round_trip)
    table.append(["Session seal_parts + unseal", rt, ROWS_BYTES / rt, float("nan")])
    print_machine(machine("/tmp"))
    print_table(["MAC", "us per 1 MiB", "MB/s", "us per 100 B"], table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
