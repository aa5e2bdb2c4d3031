"""The native row scanner on mutated input, for a few seconds of every run (bench/fuzz_rowscan.py
runs the same loop longer, under ASan and UBSan): it never crashes, and what it takes the
reference takes with the same answers."""
import random

from bench.fuzz_rowscan import fuzz
from node.core import rowscan

SECONDS = 3.0


def test_the_native_scanner_survives_mutated_messages_and_wal_buffers_and_agrees_with_the_reference():
    seed = random.SystemRandom().randrange(1 << 32)
    stats = fuzz(rowscan.native, SECONDS, seed)
    assert stats["messages"] > 200 and stats["wal_buffers"] > 200, stats
    assert stats["taken"] > 10, stats         # the corpus still reaches the accepting paths
