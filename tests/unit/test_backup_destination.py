"""A backup's destination the node cannot write in is the request's fault: 400
`bad_destination` with the reason (it was a 500 `backup_failed`), through the HTTP API and
`replog backup`, and nothing is left behind."""
from __future__ import annotations

import os
import subprocess
import sys

import aiohttp
import pytest

from node.ops.backup import BackupError, BackupJob
from tests.unit.test_dashboard_http import open_node as node  # noqa: F401 (a fixture: a node without a token)

UNWRITABLE = "/proc/replog-backup-here"       # procfs: nothing may be created in it, even by root


def test_a_job_into_an_unwritable_directory_is_a_bad_destination(tmp_path):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "data.mdb").write_bytes(b"")
    job = BackupJob(str(tmp_path), UNWRITABLE)
    with pytest.raises(BackupError) as e:
        job.begin()
    assert (e.value.status, e.value.code) == (400, "bad_destination")
    assert "cannot write in /proc" in str(e.value)
    job.abort()                                 # what the node does after any failure: nothing to undo


async def test_the_api_answers_400_for_an_unwritable_directory(node):  # noqa: F811
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://{node.cfg.address}/v1/admin/backup", json={"to": UNWRITABLE}) as r:
            assert r.status == 400, await r.text()
            assert (await r.json())["error"]["code"] == "bad_destination"
    assert node.backups == []


def test_the_cli_says_so_in_one_line(tmp_path):
    data = tmp_path / "d"
    (data / "store").mkdir(parents=True)
    (data / "store" / "data.mdb").write_bytes(b"")
    p = subprocess.run([sys.executable, "-m", "node", "backup", str(data), "--to", UNWRITABLE],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    assert "cannot write in /proc" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not os.path.exists(UNWRITABLE)
