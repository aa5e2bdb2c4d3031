"""Fuzz the native row scanner (node/core/_rowscan.c) on mutated input: it must never crash, and
whatever it takes the reference (node.core.rowscan.scan_rows_py) takes identically.

The default test suite runs `fuzz()` for a few seconds (tests/unit/test_rowscan_fuzz.py). Run it
longer, with the extension built under AddressSanitizer and UndefinedBehaviorSanitizer, from the
repository root (gcc with libasan; ~1 min to build, then as long as asked):

    .venv/bin/python -m bench.fuzz_rowscan --asan --seconds 600

Without --asan it fuzzes the installed build. It prints how many inputs each path saw; any crash,
sanitizer report or disagreement ends it with a non-zero exit and the seed that reproduces it.

Inputs: ROWS messages and WAL frame buffers built by the project's encoders (plain txns with values
at every bound: deepest, largest, longest key, lsn and timestamp at their maximum, and one past),
then mutated: bytes flipped or replaced by msgpack's edge markers, huge container and string
headers spliced in, deep nesting spliced in, cut short, parts doubled."""
from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
import time

from node import limits
from node.core import codec, rowscan
from node.core import messages as m
from node.core.rows import GROUP_DEFAULT, OP_DELETE, OP_NOP, OP_PUT, Op, Txn
from node.wal import format as walfmt

EDGE_BYTES = (0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc7, 0xca, 0xcb,
              0xcc, 0xcf, 0xd0, 0xd3, 0xd4, 0xd8, 0xd9, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff)
SPLICES = (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff",
           b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff", b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00", b"\xd3\x80" + b"\x00" * 7,
           b"\x91" * 200, b"\x81\xa1k" * 80, b"\xc0")


def _nested(depth: int):
    v: list = []
    for _ in range(depth - 1):
        v = [v]
    return v


def _value(rng: random.Random):
    return rng.choice([
        None, True, 0, -1, 2**64 - 1, -(2**63), 1.5, -0.0, "", "é" * 3, "v" * rng.randint(0, 300),
        [1, [2, {"a": None}]], {"k": "v", "x": [1.5, "y"]}, _nested(limits.value_depth_max),
        _nested(limits.value_depth_max + 1), {"a" * 40: {"b": [True] * 20}},
    ])


def corpus_txns(rng: random.Random) -> list[Txn]:
    out: list[Txn] = []
    nxt: dict[int, int] = {}
    for _ in range(rng.randint(1, 6)):
        rid = rng.choice((1, 2, 7, 300, limits.replica_id_max))
        if rid not in nxt:
            nxt[rid] = rng.choice((1, 5, 2**40, limits.lsn_max - 3))
        ops = []
        for _ in range(rng.randint(1, 4)):
            kind = rng.choice((OP_PUT, OP_PUT, OP_DELETE, OP_NOP))
            key = rng.choice(("a", "k" * limits.key_bytes_max, "ключ", "x" * rng.randint(1, 40)))
            ops.append(Op(kind, rng.choice(("kv", "_s", "x" * 64)), "" if kind == OP_NOP else key,
                          _value(rng) if kind == OP_PUT else None))
        ts = rng.choice((0, 1_700_000_000_000_000, limits.timestamp_us_max))
        out.append(Txn(rid, nxt[rid], GROUP_DEFAULT, ts, tuple(ops)))
        nxt[rid] += len(ops)
    return out


def corpus_message(rng: random.Random) -> bytes:
    txns = corpus_txns(rng)
    cut = rng.randint(0, len(txns))
    frames = [f for f in (txns[:cut], txns[cut:]) if f]
    return m.encode_rows([codec.pack([1_700_000_000_000_000 + i, [t.to_wire() for t in f]])
                          for i, f in enumerate(frames)])


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(b) + 1)
        how = rng.randrange(7)
        if how == 0 and i < len(b):
            b[i] ^= 1 << rng.randrange(8)
        elif how == 1 and i < len(b):
            b[i] = rng.choice(EDGE_BYTES)
        elif how == 2:
            b[i:i] = rng.choice(SPLICES)
        elif how == 3:
            del b[i:i + rng.randint(1, 16)]
        elif how == 4:
            b = b[:i]
        elif how == 5 and len(b) > 2:
            j = rng.randrange(len(b))
            b[i:i] = b[min(i, j):max(i, j)][:4096]
        elif i < len(b):
            b[i] = rng.randrange(256)
    return bytes(b)


def _methods(scan) -> tuple:
    n = scan.ntxn
    ranges = [(a, b, rid % 5000 + 1) for rid, a, b in scan.runs()]
    return (n, scan.nops, scan.runs(), scan.lasts(), [scan.lsn(i) for i in range(n)],
            [scan.txn_bytes(i) for i in range(n)], scan.ts_max(0, n) if n else None, scan.spaces(),
            scan.frame_txns(ranges), scan.records(ranges))


def _wal_buffer(rng: random.Random) -> bytes:
    frames = []
    for _ in range(rng.randint(1, 4)):
        body = codec.pack([1, [t.to_wire() for t in corpus_txns(rng)]])
        if rng.random() < 0.5:
            body = mutate(rng, body)           # damaged inside a frame whose checksum holds
        frames.append(walfmt.encode_frame_body(body) if len(body) <= limits.frame_bytes_max else b"")
    buf = b"".join(frames)
    return mutate(rng, buf) if rng.random() < 0.3 else buf


def fuzz(native, seconds: float, seed: int, reference_every: int = 4) -> dict:
    """Mutated messages through `native.scan_rows`, WAL buffers through `native.relay_scan`, for
    `seconds`. Raises AssertionError (naming the seed) when the scanner takes what the reference
    refuses, or answers differently."""
    rng = random.Random(seed)
    bounds = (limits.replica_id_max, limits.txn_ops_max, limits.space_name_chars_max, limits.key_bytes_max,
              limits.lsn_max, limits.timestamp_us_max, limits.value_depth_max, limits.value_bytes_max,
              limits.txn_bytes_max)
    stats = {"messages": 0, "taken": 0, "compared": 0, "wal_buffers": 0}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        data = corpus_message(rng)
        if rng.random() < 0.9:
            data = mutate(rng, data)
        scan = native.scan_rows(data, *bounds)
        stats["messages"] += 1
        if scan is not None:
            stats["taken"] += 1
            got = _methods(scan)
            if stats["messages"] % reference_every == 0:
                ref = rowscan.scan_rows_py(data)
                assert ref is not None, f"seed {seed}: the scanner took a message the reference refuses"
                assert got == _methods(ref), f"seed {seed}: the scanner and the reference disagree"
                stats["compared"] += 1
        buf = _wal_buffer(rng)
        sub = {rng.choice((1, 2, 7)): rng.choice((0, 3, 2**40, 2**63 - 1)) for _ in range(rng.randint(0, 3))}
        native.relay_scan(buf, 0, sub, rng.choice((1, 1 << 20)), limits.frame_bytes_max,
                          rng.choice((-1, 1, 7)), rng.choice((0, 5, 2**62)))
        stats["wal_buffers"] += 1
    return stats


# --- the sanitized build ---------------------------------------------------------------------
def build_sanitized(out_dir: str) -> str:
    """Compile node/core/_rowscan.c with ASan and UBSan; returns the extension's path."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    out = os.path.join(out_dir, "_rowscan" + suffix)
    cmd = ["gcc", "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
           "-fno-sanitize-recover=undefined", "-I", sysconfig.get_paths()["include"],
           "-I", os.path.join(root, "node", "core"), os.path.join(root, "node", "core", "_rowscan.c"), "-o", out]
    subprocess.run(cmd, check=True)
    return out


def load_native(path: str):
    loader = importlib.machinery.ExtensionFileLoader("node.core._rowscan", path)
    spec = importlib.util.spec_from_file_location("node.core._rowscan", path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--asan", action="store_true", help="build with ASan + UBSan and fuzz that build")
    p.add_argument("--native", help=argparse.SUPPRESS)       # the sanitized build, in the child process
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    if args.asan:
        tmp = tempfile.mkdtemp(prefix="rowscan-asan-")
        path = build_sanitized(tmp)
        libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
        env = dict(os.environ, LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
                   UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
        return subprocess.run([sys.executable, "-m", "bench.fuzz_rowscan", "--seconds", str(args.seconds),
                               "--seed", str(seed), "--native", path], env=env).returncode
    native = load_native(args.native) if args.native else rowscan.native
    if native is None:
        print("no native row scanner built", file=sys.stderr)
        return 2
    print(f"fuzzing {'the sanitized build' if args.native else 'the installed build'} for {args.seconds:g} s, "
          f"seed {seed}", flush=True)
    stats = fuzz(native, args.seconds, seed)
    print(" ".join(f"{k}={v}" for k, v in stats.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
