"""Configuration (node/config.py) and how the CLI reports it (node/cli.py).

Precedence is flag > TOML > REPLOG_* environment > default; every bad option raises
ConfigError naming the option before anything starts; through the real `replog serve`
a bad option is exit code 2 and one line on stderr, never a traceback."""

import os
import pathlib
import subprocess
import sys

import pytest

from node import config
from node.config import Config, load
from node.errors import ConfigError

REPO = pathlib.Path(__file__).resolve().parents[2]
REPLOG = REPO / ".venv" / "bin" / "replog"


def toml(tmp_path, text: str, name: str = "node.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def secret(tmp_path, name: str, text: str = "s3cret\n") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# --- precedence ------------------------------------------------------------------------------

def test_defaults_with_nothing_set():
    cfg = load({}, None, env={})
    assert cfg.wal_mode == "write" and cfg.listen == "127.0.0.1:7301"
    assert cfg.peers == () and cfg.identity == "local" and cfg.insecure is False
    assert cfg.secret == b"" and cfg.token == ""


@pytest.mark.parametrize("option,env_value,toml_line,flag,default,from_env,from_toml,from_flag", [
    ("wal_mode", "fsync", 'wal_mode = "none"', "write", "write", "fsync", "none", "write"),
    ("listen", "127.0.0.1:1111", 'listen = "127.0.0.1:2222"', "127.0.0.1:3333",
     "127.0.0.1:7301", "127.0.0.1:1111", "127.0.0.1:2222", "127.0.0.1:3333"),
    ("peers", "a:1, b:2", 'peers = ["c:3"]', "d:4,e:5", (), ("a:1", "b:2"), ("c:3",), ("d:4", "e:5")),
    ("cluster_wait_for", "2", "cluster_wait_for = 3", "4", 0, 2, 3, 4),
    ("read_only", "true", "read_only = false", True, False, True, False, True),
    ("lease_duration_s", "9.5", "lease_duration_s = 20", "30", 15.0, 9.5, 20.0, 30.0),
])
def test_precedence_is_flag_then_toml_then_env_then_default(
        tmp_path, option, env_value, toml_line, flag, default, from_env, from_toml, from_flag):
    env = {"REPLOG_" + option.upper(): env_value}
    path = toml(tmp_path, toml_line + "\n")
    assert getattr(load({}, None, env={}), option) == default
    assert getattr(load({}, None, env=env), option) == from_env
    assert getattr(load({}, path, env=env), option) == from_toml
    assert getattr(load({option: flag}, path, env=env), option) == from_flag
    # an unset flag (None, argparse's default) does not override
    assert getattr(load({option: None}, path, env=env), option) == from_toml
    assert getattr(load({option: flag}, None, env={}), option) == from_flag


def test_options_from_different_sources_combine(tmp_path):
    path = toml(tmp_path, 'cluster_name = "blue"\nwal_mode = "fsync"\n')
    cfg = load({"data_dir": "/tmp/x"}, path, env={"REPLOG_LOG_LEVEL": "debug", "REPLOG_WAL_MODE": "none"})
    assert (cfg.data_dir, cfg.cluster_name, cfg.wal_mode, cfg.log_level) == ("/tmp/x", "blue", "fsync", "debug")


def test_the_loaded_config_is_frozen():
    cfg = load({}, None, env={})
    with pytest.raises(Exception):
        cfg.wal_mode = "none"  # type: ignore[misc]


def test_secret_and_token_are_read_from_their_files(tmp_path):
    cfg = load({"secret_file": secret(tmp_path, "s", "S3CR3T-VALUE\n"),
                "token_file": secret(tmp_path, "t", " T0KEN-VALUE \n")}, None, env={})
    assert cfg.secret == b"S3CR3T-VALUE" and cfg.token == "T0KEN-VALUE"
    assert "S3CR3T-VALUE" not in repr(cfg) and "T0KEN-VALUE" not in repr(cfg)


# --- bad options ----------------------------------------------------------------------------------

BAD_FLAGS = [
    ({"wal_mode": "bogus"}, "wal_mode"),
    ({"listen": "nohost"}, "listen"),
    ({"listen": ":7301"}, "listen"),
    ({"listen": "127.0.0.1:0"}, "listen"),
    ({"listen": "127.0.0.1:65536"}, "listen"),
    ({"listen": "127.0.0.1:http"}, "listen"),
    ({"advertise": "host-without-port"}, "advertise"),
    ({"peers": "a:1,b"}, "peers"),
    ({"log_level": "loud"}, "log_level"),
    ({"log_format": "xml"}, "log_format"),
    ({"identity": "dns"}, "identity"),
    ({"identity": "lease", "cluster_size": 3}, "lease_store"),
    ({"identity": "lease", "cluster_size": 3, "lease_store": "http://x"}, "lease_store"),
    ({"identity": "lease", "lease_store": "file:///tmp/l"}, "cluster_size"),
    ({"identity": "lease", "lease_store": "file:///tmp/l", "cluster_size": 3, "anon": "true"}, "anon"),
    ({"lease_duration_s": "0"}, "lease_duration_s"),
    ({"lease_duration_s": "-1"}, "lease_duration_s"),
    ({"lease_duration_s": "nan"}, "lease_duration_s"),
    ({"lease_duration_s": "inf"}, "lease_duration_s"),
    ({"lease_duration_s": "soon"}, "lease_duration_s"),
    ({"cluster_wait_for": "-1"}, "cluster_wait_for"),
    ({"cluster_wait_for": "two"}, "cluster_wait_for"),
    ({"cluster_size": "3.5"}, "cluster_size"),
    ({"cluster_name": ""}, "cluster_name"),
    ({"cluster_name": "x" * 65}, "cluster_name"),
    ({"segment_bytes_max": "100"}, "segment_bytes_max"),
    ({"segment_bytes_max": str((4 << 30) + 1)}, "segment_bytes_max"),    # one past the largest: never collected
    ({"anon": "maybe"}, "anon"),
    ({"secret_file": "/nonexistent/secret"}, "secret_file"),
    ({"token_file": "/nonexistent/token"}, "token_file"),
    ({"listen": "0.0.0.0:7301"}, "secret_file"),
    ({"listen": "192.0.2.1:7301"}, "secret_file"),
    ({"no_such_option": "1"}, "no_such_option"),
]


@pytest.mark.parametrize("flags,option", BAD_FLAGS, ids=[f"{o}-{i}" for i, (_, o) in enumerate(BAD_FLAGS)])
def test_each_bad_option_is_a_config_error_naming_it(flags, option):
    with pytest.raises(ConfigError) as e:
        load(flags, None, env={})
    assert e.value.option == option
    assert str(e.value).startswith(option + ": ")


def test_an_empty_or_unreadable_secret_file_is_refused(tmp_path):
    empty = secret(tmp_path, "empty", "\n")
    with pytest.raises(ConfigError) as e:
        load({"secret_file": empty}, None, env={})
    assert e.value.option == "secret_file" and "empty" in e.value.reason
    unreadable = tmp_path / "a-directory"
    unreadable.mkdir()
    with pytest.raises(ConfigError) as e:
        load({"token_file": str(unreadable)}, None, env={})
    assert e.value.option == "token_file" and str(unreadable) in e.value.reason


def test_non_loopback_listen_needs_both_secret_and_token(tmp_path):
    s, t = secret(tmp_path, "s"), secret(tmp_path, "t")
    with pytest.raises(ConfigError) as e:
        load({"listen": "0.0.0.0:7301", "secret_file": s}, None, env={})
    assert e.value.option == "token_file"
    with pytest.raises(ConfigError) as e:
        load({"listen": "0.0.0.0:7301", "token_file": t}, None, env={})
    assert e.value.option == "secret_file"
    cfg = load({"listen": "0.0.0.0:7301", "secret_file": s, "token_file": t}, None, env={})
    assert cfg.host == "0.0.0.0" and cfg.port == 7301


@pytest.mark.parametrize("listen", ["127.0.0.1:7301", "127.8.9.10:7301", "localhost:7301", "[::1]:7301"])
def test_loopback_listen_needs_no_secret(listen):
    assert load({"listen": listen}, None, env={}).listen == listen


@pytest.mark.parametrize("source", ["flag", "toml", "env"])
def test_insecure_lifts_the_non_loopback_refusal(tmp_path, source):
    flags, path, env = {"listen": "0.0.0.0:7301"}, None, {}
    if source == "flag":
        flags["insecure"] = True
    elif source == "toml":
        path = toml(tmp_path, "insecure = true\n")
    else:
        env["REPLOG_INSECURE"] = "1"
    cfg = load(flags, path, env=env)
    assert cfg.insecure is True and cfg.host == "0.0.0.0"
    assert cfg.secret == b"" and cfg.token == ""


@pytest.mark.parametrize("text,option", [
    ('wal_mode = "bogus"\n', "wal_mode"),
    ('walmode = "fsync"\n', "walmode"),
    ("listen = 7301\n", "listen"),
    ('peers = "a:1,b"\n', "peers"),        # a string is split like the flag, then checked
    ("peers = [1, 2]\n", "peers"),
    ("data_dir = {a = 1}\n", "data_dir"),
    ('anon = "perhaps"\n', "anon"),
    ("[section]\nlisten = \"127.0.0.1:1\"\n", "section"),
    ("wal_mode = \n", "config"),
    ("this is not toml\n", "config"),
    ("segment_bytes_max = 1e20\n", "segment_bytes_max"),   # a TOML float for a byte count: int() took it
    ("segment_bytes_max = 65536.5\n", "segment_bytes_max"),
    ("map_size = 1e9\n", "map_size"),
])
def test_bad_toml_is_a_config_error_naming_the_option(tmp_path, text, option):
    path = toml(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load({}, path, env={})
    assert e.value.option == option


def test_an_unreadable_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as e:
        load({}, str(tmp_path / "missing.toml"), env={})
    assert e.value.option == "config" and "missing.toml" in e.value.reason


@pytest.mark.parametrize("name,value", [("REPLOG_WAL_MODE", "bogus"), ("REPLOG_CLUSTER_SIZE", "many"),
                                        ("REPLOG_LISTEN", "0.0.0.0:1")])
def test_a_bad_environment_variable_names_its_option(name, value):
    with pytest.raises(ConfigError) as e:
        load({}, None, env={name: value})
    expected = name[len("REPLOG_"):].lower() if "LISTEN" not in name else "secret_file"
    assert e.value.option == expected


def test_every_option_has_a_flag_and_a_default():
    from node.cli import SERVE_FLAGS
    flag_dests = {kw.get("dest", f.lstrip("-").replace("-", "_")) for f, kw in SERVE_FLAGS}
    assert set(config.OPTION_TYPES) == flag_dests
    assert config.validate(Config()) == load({}, None, env={})


# --- through the real CLI ------------------------------------------------------------------------

def run_serve(tmp_path, *args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLOG_")}
    env.update(env_extra or {})
    exe = [str(REPLOG)] if REPLOG.exists() else [sys.executable, "-m", "node.cli"]
    return subprocess.run([*exe, "serve", "--data-dir", str(tmp_path / "data"), *args],
                          capture_output=True, text=True, timeout=60, env=env, cwd=str(tmp_path))


CLI_CASES = [
    (["--wal-mode", "bogus"], {}, "wal_mode"),
    (["--listen", "nohost"], {}, "listen"),
    (["--listen", "0.0.0.0:7399"], {}, "secret_file"),
    (["--secret-file", "/nonexistent/secret"], {}, "secret_file"),
    (["--cluster-size", "many"], {}, "cluster_size"),
    (["--identity", "lease", "--cluster-size", "3"], {}, "lease_store"),
    (["--identity", "lease", "--cluster-size", "3", "--lease-store", "file:///tmp/l", "--anon"], {}, "anon"),
    (["--config", "missing.toml"], {}, "config"),
    (["--config", "bad.toml"], {}, "config"),
    (["--config", "unknown.toml"], {}, "walmode"),
    ([], {"REPLOG_WAL_MODE": "bogus"}, "wal_mode"),
]


@pytest.mark.parametrize("args,env,option", CLI_CASES, ids=[c[2] + "-" + "_".join(c[0] or c[1]) for c in CLI_CASES])
def test_replog_serve_with_a_bad_option_exits_2_with_one_line(tmp_path, args, env, option):
    (tmp_path / "bad.toml").write_text("wal_mode = = 1\n")
    (tmp_path / "unknown.toml").write_text('walmode = "fsync"\n')
    r = run_serve(tmp_path, *args, env_extra=env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"replog: error: {option}: "), lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not (tmp_path / "data").exists()          # refused before anything started


def test_replog_serve_with_an_unknown_flag_exits_2_with_one_line(tmp_path):
    r = run_serve(tmp_path, "--wal_mode", "fsync")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("value", [4096, 4 << 30])
def test_segment_bytes_max_takes_its_bounds(tmp_path, value):
    assert load({}, toml(tmp_path, f"segment_bytes_max = {value}\n"), env={}).segment_bytes_max == value
