"""Node configuration: loaded once, validated, frozen.

Precedence: command-line flag > TOML file > REPLOG_<OPTION> environment variable >
built-in default. Every problem raises ConfigError(option, reason) before anything
starts; the CLI prints it as one line and exits 2."""
from __future__ import annotations

import ipaddress
import math
import os
import tomllib
from dataclasses import dataclass, field, fields
from typing import Any

from node import limits, tls
from node.core.validate import address_error
from node.errors import ConfigError

WAL_MODES = ("none", "write", "fsync")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class Config:
    data_dir: str = "./replog-data"
    listen: str = "127.0.0.1:7301"
    advertise: str = ""
    client_listen: str = ""          # the binary client protocol's host:port; "" derives it, "off" has none
    peers: tuple[str, ...] = ()
    cluster_name: str = "replog"
    cluster_wait_for: int = 0
    anon: bool = False
    read_only: bool = False
    wal_mode: str = "write"
    secret_file: str = ""
    token_file: str = ""
    identity: str = "local"
    lease_store: str = ""
    cluster_size: int = 0
    lease_duration_s: float = 15.0
    task_id: str = ""
    transient: bool = False
    force_recovery: bool = False
    insecure: bool = False
    log_level: str = "info"
    log_format: str = "text"
    event_loop: str = "auto"         # uvloop | asyncio | auto (uvloop where it is installed)
    segment_bytes_max: int = 64 * 1024 * 1024
    checkpoint_interval_s: float = 60.0
    anon_ttl_s: float = 3600.0
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    tls_client_auth: bool = False

    # derived, filled by load()
    secret: bytes = field(default=b"", repr=False)
    token: str = field(default="", repr=False)
    server_ssl: Any = field(default=None, repr=False, compare=False)   # ssl.SSLContext (node/tls.py)
    client_ssl: Any = field(default=None, repr=False, compare=False)

    @property
    def tls(self) -> bool:
        return self.server_ssl is not None

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    @property
    def address(self) -> str:
        return self.advertise or self.listen

    @property
    def client_address(self) -> tuple[str, int] | None:
        """(host, port) of the binary client protocol, or None when it is off. Unset, it is the
        HTTP host and the HTTP port + limits.client_port_offset (- it when that passes 65535)."""
        if self.client_listen == "off":
            return None
        if self.client_listen:
            host, port = self.client_listen.rsplit(":", 1)
            return host.strip("[]"), int(port)
        p = self.port + limits.client_port_offset
        return self.host, p if p <= 65535 else self.port - limits.client_port_offset

    def must_match(self) -> dict[str, Any]:
        """Options that must be identical on every member (compared at handshake)."""
        return {"identity": self.identity, "cluster_size": self.cluster_size if self.identity == "lease" else 0}


DERIVED = ("secret", "token", "server_ssl", "client_ssl")
OPTION_TYPES = {f.name: f.type for f in fields(Config) if f.name not in DERIVED}


def _coerce(name: str, value: Any) -> Any:
    t = OPTION_TYPES[name]
    try:
        if t in ("bool", bool):
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(f"not a boolean: {value!r}")
        if t in ("int", int):
            if isinstance(value, bool):
                raise ValueError("not an integer")
            return int(value)
        if t in ("float", float):
            return float(value)
        if t.startswith("tuple"):
            if isinstance(value, str):
                return tuple(p.strip() for p in value.split(",") if p.strip())
            if isinstance(value, (list, tuple)) and all(isinstance(p, str) for p in value):
                return tuple(value)
            raise ValueError("expected a list of host:port strings")
        if not isinstance(value, (str, int, float)):
            raise ValueError("expected a string")
        return str(value)
    except ValueError as e:
        raise ConfigError(name, str(e)) from None


def _check_addr(name: str, addr: str) -> None:
    err = address_error(addr)            # the one rule for a member's address (node.core.validate)
    if err is not None:
        raise ConfigError(name, err)


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read_secret(name: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read().strip()
    except OSError as e:
        raise ConfigError(name, f"cannot read {path}: {e.strerror}") from None
    if not data:
        raise ConfigError(name, f"{path} is empty")
    return data


def _read_token(path: str) -> str:
    """The client token: it travels in an HTTP header, so it is text."""
    try:
        return _read_secret("token_file", path).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("token_file", f"{path} is not UTF-8 text") from None


def load(flags: dict[str, Any], config_file: str | None = None, env: dict[str, str] | None = None) -> Config:
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for name in OPTION_TYPES:
        v = env.get("REPLOG_" + name.upper())
        if v is not None:
            values[name] = _coerce(name, v)
    if config_file:
        try:
            with open(config_file, "rb") as f:
                doc = tomllib.load(f)
        except OSError as e:
            raise ConfigError("config", f"cannot read {config_file}: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError("config", f"{config_file} is not valid TOML: {e}") from None
        for k, v in doc.items():
            if k not in OPTION_TYPES:
                raise ConfigError(k, f"unknown option in {config_file}")
            values[k] = _coerce(k, v)
    for k, v in flags.items():
        if v is None:
            continue
        if k not in OPTION_TYPES:
            raise ConfigError(k, "unknown option")
        values[k] = _coerce(k, v)
    cfg = Config(**values)
    return validate(cfg)


def validate(cfg: Config) -> Config:
    _check_addr("listen", cfg.listen)
    if cfg.advertise:
        _check_addr("advertise", cfg.advertise)
    if cfg.client_listen and cfg.client_listen != "off":
        _check_addr("client_listen", cfg.client_listen)
        if cfg.client_listen == cfg.listen:
            raise ConfigError("client_listen", "must differ from listen (the HTTP port)")
    for p in cfg.peers:
        _check_addr("peers", p)
    if cfg.wal_mode not in WAL_MODES:
        raise ConfigError("wal_mode", f"must be one of {', '.join(WAL_MODES)}, got {cfg.wal_mode!r}")
    if cfg.log_level not in LOG_LEVELS:
        raise ConfigError("log_level", f"must be one of {', '.join(LOG_LEVELS)}")
    if cfg.log_format not in ("text", "json"):
        raise ConfigError("log_format", "must be text or json")
    if cfg.event_loop not in ("auto", "uvloop", "asyncio"):
        raise ConfigError("event_loop", "must be auto, uvloop or asyncio")
    if cfg.event_loop == "uvloop" and uvloop_module() is None:
        raise ConfigError("event_loop", "uvloop is not installed (pip install uvloop), or use asyncio")
    if cfg.identity not in ("local", "lease"):
        raise ConfigError("identity", "must be local or lease")
    if cfg.identity == "lease":
        if not cfg.lease_store.startswith(("file://", "s3://")):
            raise ConfigError("lease_store", "identity = lease needs lease_store = file:///dir or s3://bucket/prefix")
        if cfg.cluster_size < 1:
            raise ConfigError("cluster_size", "identity = lease needs cluster_size >= 1")
    if not (0 < cfg.lease_duration_s < math.inf):   # also refuses nan, which compares false
        raise ConfigError("lease_duration_s", "must be a positive number of seconds")
    if cfg.cluster_wait_for < 0:
        raise ConfigError("cluster_wait_for", "must be >= 0")
    if not cfg.cluster_name or len(cfg.cluster_name) > 64:
        raise ConfigError("cluster_name", "must be 1..64 characters")
    for name in ("checkpoint_interval_s", "anon_ttl_s"):
        if not (0 < getattr(cfg, name) < math.inf):   # also refuses nan
            raise ConfigError(name, "must be a positive number of seconds")
    if cfg.segment_bytes_max < 4096:
        raise ConfigError("segment_bytes_max", "must be at least 4096")
    secret = _read_secret("secret_file", cfg.secret_file) if cfg.secret_file else b""
    token = _read_token(cfg.token_file) if cfg.token_file else ""
    if not is_loopback(cfg.host) and not cfg.insecure:
        if not secret:
            raise ConfigError("secret_file", f"listening on non-loopback {cfg.host} needs a cluster secret (or --insecure)")
        if not token:
            raise ConfigError("token_file", f"listening on non-loopback {cfg.host} needs a client token (or --insecure)")
    tls.check_options(cfg)
    return Config(**{**{f.name: getattr(cfg, f.name) for f in fields(cfg)}, "secret": secret, "token": token,
                     "server_ssl": tls.server_context(cfg), "client_ssl": tls.client_context(cfg)})


def uvloop_module():
    """uvloop, if installed: libuv's event loop, which cuts the CPU a client request costs the
    node by about a quarter (docs/client.md, bench/RESULTS.md); None where it is not (e.g. Windows)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def plaintext_exposure(cfg: Config) -> str | None:
    """What a node on a non-loopback address without TLS sends in the clear, or None."""
    if cfg.tls or is_loopback(cfg.host):
        return None
    return (f"listening on {cfg.listen} without TLS: the client API (bearer token, keys and values) and "
            "replication (rows, snapshots, the member table) travel in plaintext; anyone on the path reads "
            "them. Set tls_cert_file and tls_key_file (docs/operations.md)")
