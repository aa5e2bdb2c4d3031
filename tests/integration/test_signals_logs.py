"""Signals and logs on real processes: SIGHUP reloads peers and log_level from the config file,
refuses other changes with a logged reason, survives a broken file and reopens the log file
(log rotation); every line has an ISO-8601 date; stopping is logged when it starts and ends."""
from __future__ import annotations

import json
import os
import re
import signal

from tests.integration.harness import ReplogProcess, wait_for

ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


class LevelFromFile(ReplogProcess):
    """The harness passes --log-level debug; this process takes log_level from its file."""

    def argv(self) -> list[str]:
        a = super().argv()
        i = a.index("--log-level")
        return a[:i] + a[i + 2:]


def write_config(path, **options) -> None:
    lines = []
    for k, v in options.items():
        lines.append(f"{k} = {json.dumps(v)}")
    path.write_text("\n".join(lines) + "\n")


def log_has(path, text: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return text in f.read()
    except FileNotFoundError:
        return False


def test_sighup_reloads_peers_and_log_level_refuses_the_rest_and_reopens_the_log_file(tmp_path, procs):
    b = ReplogProcess(tmp_path, "b").start()
    procs.append(b)
    b.create_space("kv")
    conf = tmp_path / "a.toml"
    log_file = tmp_path / "a.log"
    write_config(conf, peers=[b.address], log_level="info", wal_mode="write", log_file=str(log_file))
    a = LevelFromFile(tmp_path, "a", extra=["--config", str(conf)]).start()      # joins B's cluster
    procs.append(a)
    assert [u["address"] for u in a.info()["upstreams"]] == [b.address]
    assert log_has(log_file, "listening on") and not log_has(a.log_path, "listening on"), "logs go to the file only"

    # rotation: the file is moved away, SIGHUP opens a new one by the same name
    rotated = tmp_path / "a.log.1"
    os.rename(log_file, rotated)
    a.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: log_has(log_file, "no option that can change at run time changed; log file reopened"), 10,
             "a new log file after rotation")
    assert not log_has(rotated, "log file reopened") and log_has(rotated, "listening on")

    # peers and log_level change, wal_mode cannot: it is refused with a reason, the rest applies
    write_config(conf, peers=[], log_level="warning", wal_mode="fsync", log_file=str(log_file))
    a.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: a.info()["upstreams"] == [], 20, "A stops following B after SIGHUP")
    wait_for(lambda: log_has(log_file, "SIGHUP: refused wal_mode: changed from 'write' to 'fsync'"), 10, "refusal")
    assert a.info()["wal_mode"] == "write"
    assert not log_has(log_file, "log_level = 'warning'"), "at level warning the INFO summary is not written"
    b.kv_put("kv", "from-b", 1)
    assert a.kv_get("kv", "from-b")[0] == 404 and a.proc.poll() is None

    # a file that does not load changes nothing, and the node runs on
    conf.write_text("peers = [\n")
    a.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: log_has(log_file, "not reloaded, nothing changed"), 10, "the broken file is logged")
    assert a.proc.poll() is None and a.info()["upstreams"] == []

    # B again, at level info: A follows it and gets the row written meanwhile
    write_config(conf, peers=[b.address], log_level="info", wal_mode="write", log_file=str(log_file))
    a.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: a.kv_get("kv", "from-b")[0] == 200, 30, "B's row reaches A once A follows B again")
    assert log_has(log_file, f"peers = ('{b.address}',), log_level = 'info'")
    assert a.stop() == 0
    text = open(log_file, encoding="utf-8").read()
    assert "node: stopping on request" in text and re.search(r"node: stopped in \d+\.\d\d s\n", text), text[-2000:]


def test_sighup_without_a_config_file_only_reopens_logs_and_a_flag_wins_over_the_file(tmp_path, procs):
    n = ReplogProcess(tmp_path, "n").start()
    procs.append(n)
    n.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "no --config file, so no option is reloaded" in n.log_text(), 10, "the SIGHUP line")
    assert n.proc.poll() is None and n.get("/v1/health")[0] == 200

    conf = tmp_path / "m.toml"
    write_config(conf, log_level="info")
    m = ReplogProcess(tmp_path, "m", extra=["--config", str(conf)]).start()    # harness: --log-level debug
    procs.append(m)
    write_config(conf, log_level="error")
    m.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "log_level is set by --log-level, which wins over" in m.log_text(), 10, "flag wins")
    assert m.proc.poll() is None


def test_text_and_json_log_lines_carry_an_iso_8601_date(tmp_path, procs):
    t = ReplogProcess(tmp_path, "t").start()
    j = ReplogProcess(tmp_path, "j", extra=["--log-format", "json"]).start()
    procs.extend([t, j])
    assert t.stop() == 0 and j.stop() == 0
    text = [line for line in t.log_text().splitlines() if line and not line.startswith("=====")]
    assert text and all(re.match(ISO + " ", line) for line in text), text[:5]
    assert any("node: stopping on request" in line for line in text)
    assert any(re.search(r"node: stopped in \d+\.\d\d s$", line) for line in text), text[-5:]
    recs = [json.loads(line) for line in j.log_text().splitlines() if line.startswith("{")]
    assert recs and all(re.fullmatch(ISO, r["ts"]) for r in recs)


def test_an_unwritable_log_file_is_exit_2_with_one_line(tmp_path):
    import subprocess
    from tests.integration.harness import REPLOG
    r = subprocess.run(REPLOG + ["serve", "--data-dir", str(tmp_path / "d"), "--log-file",
                                 str(tmp_path / "no-such-dir" / "x.log")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("replog: error: log_file: cannot open "), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "d").exists()
