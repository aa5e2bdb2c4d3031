"""spark.jvmstart: a class-data-sharing archive is used only once java has accepted it."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from spark import jvmstart


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_run_writes_an_archive_and_a_later_run_uses_it_only_if_java_accepts_it(tmp_path, monkeypatch):
    java = jvmstart._java()
    if java is None:
        pytest.skip("no java")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    opts = jvmstart.driver_java_options()
    assert "-XX:TieredStopAtLevel=1" in opts
    pending = re.search(r"-XX:ArchiveClassesAtExit=(\S+)", opts).group(1)
    assert pending.endswith(f".{os.getpid()}.tmp")

    # A run that was killed while its JVM wrote the archive: refused and removed.
    good_dump = str(tmp_path / "dump.jsa")
    subprocess.run([java, f"-XX:ArchiveClassesAtExit={good_dump}", "-version"], check=True, capture_output=True)
    with open(good_dump, "rb") as f:
        data = f.read()
    torn = pending.replace(f".{os.getpid()}.", f".{_dead_pid()}.")
    with open(torn, "wb") as f:
        f.write(data[: len(data) // 3])
    assert "ArchiveClassesAtExit" in jvmstart.driver_java_options()
    assert not os.path.exists(torn)

    # A run that finished: its archive is promoted and used from then on.
    os.replace(good_dump, pending.replace(f".{os.getpid()}.", f".{_dead_pid()}."))
    opts = jvmstart.driver_java_options()
    archive = re.search(r"-XX:SharedArchiveFile=(\S+)", opts).group(1)
    assert os.path.exists(archive) and not archive.endswith(".tmp")
    assert [n for n in os.listdir(os.path.dirname(archive)) if n.endswith(".tmp")] == []
