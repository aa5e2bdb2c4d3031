"""Fixtures for the analysis tests: ONE SparkSession for the whole run (local[2]), and small
inputs, so the whole directory stays in the default CI run (a few thousand rows each)."""
from __future__ import annotations

import os

import pytest

from spark import generate

# Small enough for seconds of Spark per run, big enough for remapped ids, several segments
# and splits, joins, the anonymous replica's clash and a few concurrent writes.
NODES = 6
ROWS = 2500
SEED = 7
SEGMENT_BYTES = 24 * 1024
SPLIT_BYTES = 16 * 1024


@pytest.fixture(scope="session")
def spark():
    from spark import launch
    s = launch.session("local[2]", app_name="replog-analyze-tests", conf={
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.memory": "1g",
    })
    s.sparkContext.setLogLevel("ERROR")
    launch.ship_code(s)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def healthy(tmp_path_factory) -> tuple[str, dict]:
    out = str(tmp_path_factory.mktemp("healthy"))
    return out, generate.generate(out, nodes=NODES, rows=ROWS, seed=SEED, segment_bytes=SEGMENT_BYTES)


@pytest.fixture(scope="session")
def corrupted(tmp_path_factory) -> tuple[str, dict]:
    out = str(tmp_path_factory.mktemp("corrupted"))
    return out, generate.generate(out, nodes=NODES, rows=ROWS, seed=SEED, segment_bytes=SEGMENT_BYTES, corrupt=True)


def node_dirs(root: str, manifest: dict) -> list[str]:
    """Input dirs: data dirs for some nodes, WAL dirs for others (both forms are accepted)."""
    dirs = []
    for i, n in enumerate(manifest["nodes"]):
        d = os.path.join(root, n["dir"])
        dirs.append(os.path.join(d, "wal") if i % 2 else d)
    return dirs


def uuid_of(manifest: dict, name: str) -> str:
    return next(n["uuid"] for n in manifest["nodes"] if n["name"] == name)


def flip_a_middle_byte(path: str) -> None:
    """Damage a segment: one byte in its middle inverted (a frame's body or header)."""
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
