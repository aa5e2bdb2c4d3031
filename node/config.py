"""Node configuration: loaded once, validated, frozen.

Precedence: command-line flag > TOML file > REPLOG_<OPTION> environment variable >
built-in default. Every problem raises ConfigError(option, reason) before anything
starts; the CLI prints it as one line and exits 2."""
from __future__ import annotations

import importlib.util
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


def opt(default: Any, help: str, *, reload: bool = False, metavar: str | None = None) -> Any:
    """One row of the option table: its default, the help line `replog serve --help` prints
    (with the default appended), and whether SIGHUP may change it in a running node."""
    return field(default=default, metadata={"help": help, "reload": reload, "metavar": metavar})


@dataclass(frozen=True)
class Config:
    """The option table: every option of `replog serve`, its TOML key, its flag
    (`--data-dir` for `data_dir`), its REPLOG_ variable, its default and its help."""
    data_dir: str = opt("./replog-data", "store (store/, LMDB) and WAL (wal/) of this node", metavar="DIR")
    listen: str = opt("127.0.0.1:7301", "host:port of the HTTP API and replication endpoint", metavar="HOST:PORT")
    advertise: str = opt("", "the address other members reach this node at (default: listen)", metavar="HOST:PORT")
    client_listen: str = opt("", "host:port of the binary client protocol (docs/client.md); empty: the HTTP "
                                 "port + 1000 on the listen host (a free port if that one is taken); off: none",
                             metavar="HOST:PORT")
    peers: tuple[str, ...] = opt((), "comma-separated host:port list of replication sources (full mesh: "
                                     "each node lists the others); SIGHUP reloads it", reload=True,
                                 metavar="HOST:PORT,...")
    cluster_name: str = opt("replog", "must match on every member", metavar="NAME")
    cluster_wait_for: int = opt(0, "hold a forming cluster until N initial members have exchanged status "
                                   "(Qpid's join protocol; 0: off)", metavar="N")
    anon: bool = opt(False, "anonymous replica: not registered in the masters' _cluster, read-only for "
                            "replicated spaces")
    read_only: bool = opt(False, "refuse client writes to replicated spaces")
    wal_mode: str = opt("write", "none (no WAL, cannot serve replicas) | write (survives a process crash; "
                                 "fsync'd every second) | fsync (survives power loss)", metavar="MODE")
    secret_file: str = opt("", "file holding the cluster secret (authenticates replication links)", metavar="FILE")
    token_file: str = opt("", "file holding the bearer token the client API requires", metavar="FILE")
    identity: str = opt("local", "local (identity files in data_dir) | lease (a slot from lease_store)",
                        metavar="KIND")
    lease_store: str = opt("", "file:///dir or s3://bucket/prefix (identity = lease; s3 needs the s3 extra)",
                           metavar="URL")
    cluster_size: int = opt(0, "number of lease slots (identity = lease)", metavar="N")
    lease_duration_s: float = opt(15.0, "lease duration in seconds (identity = lease)", metavar="SECONDS")
    task_id: str = opt("", "who holds a lease slot, in logs and lease objects (default host:pid:random)",
                       metavar="ID")
    transient: bool = opt(False, "report a fresh node as transient in the join protocol")
    force_recovery: bool = opt(False, "skip damaged WAL frames (loudly) instead of refusing to start")
    insecure: bool = opt(False, "allow a non-loopback listen address without secret_file and token_file")
    log_level: str = opt("info", "debug | info | warning | error; SIGHUP reloads it", reload=True, metavar="LEVEL")
    log_format: str = opt("text", "text | json (one JSON object per line)", metavar="FORMAT")
    log_file: str = opt("", "append logs to this file instead of stderr; SIGHUP reopens it (log rotation)",
                        metavar="FILE")
    event_loop: str = opt("auto", "uvloop | asyncio | auto (uvloop where it is installed, asyncio with TLS)",
                          metavar="LOOP")
    segment_bytes_max: int = opt(64 * 1024 * 1024, "WAL segment size before rotation, bytes", metavar="BYTES")
    checkpoint_interval_s: float = opt(60.0, "seconds between store syncs and WAL collection", metavar="SECONDS")
    anon_ttl_s: float = opt(3600.0, "how long a silent anonymous replica still holds the WAL, seconds",
                            metavar="SECONDS")
    ready_lag_max_s: float = opt(5.0, "/readyz: the largest upstream lag that is still caught up, seconds; "
                                      "SIGHUP reloads it", reload=True, metavar="SECONDS")
    ready_upstreams_down_max: int = opt(0, "/readyz: how many configured upstreams may be down while the node "
                                           "is ready (0: every one must follow); SIGHUP reloads it",
                                        reload=True, metavar="N")
    live_loop_lag_max_s: float = opt(5.0, "/livez: the longest the event loop may be late before the node "
                                          "is not live, seconds; SIGHUP reloads it", reload=True,
                                     metavar="SECONDS")
    tls_cert_file: str = opt("", "this node's certificate chain (PEM): the port serves TLS only", metavar="FILE")
    tls_key_file: str = opt("", "the certificate's private key (PEM, unencrypted)", metavar="FILE")
    tls_ca_file: str = opt("", "CA that peers' certificates must be signed by (default: the system's)",
                           metavar="FILE")
    tls_client_auth: bool = opt(False, "replication links must present a certificate of tls_ca_file (mutual TLS)")
    map_size: int = opt(limits.store_map_bytes_default, "the store's LMDB map size, bytes: the most the store "
                                                        "can hold (writes answer 507 no_space when it is full)",
                        metavar="BYTES")
    disk_reserve_bytes: int = opt(limits.disk_reserve_bytes_default, "free disk space kept back: below it writes "
                                                                      "answer 507 no_space (the NOSPACE alarm)",
                                  metavar="BYTES")

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
OPTIONS = tuple(f for f in fields(Config) if f.name not in DERIVED)   # the table, in its order
OPTION_TYPES = {f.name: f.type for f in OPTIONS}
RELOADABLE = tuple(f.name for f in OPTIONS if f.metadata["reload"])


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
            if isinstance(value, (bool, float)):      # (TOML's 1e9 is a float: int() would take it, and 1.5)
                raise ValueError(f"not an integer: {value!r}")
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
    if cfg.event_loop == "uvloop" and cfg.tls_cert_file:
        raise ConfigError("event_loop", "uvloop with TLS can leave a closed descriptor registered when a peer resets "
                                        "a TLS connect (docs/operations.md, TLS): use asyncio or auto")
    if cfg.identity not in ("local", "lease"):
        raise ConfigError("identity", "must be local or lease")
    if cfg.identity == "lease":
        if not cfg.lease_store.startswith(("file://", "s3://")):
            raise ConfigError("lease_store", "identity = lease needs lease_store = file:///dir or s3://bucket/prefix")
        if cfg.cluster_size < 1:
            raise ConfigError("cluster_size", "identity = lease needs cluster_size >= 1")
        if cfg.anon:   # it would take one of the members' slots as if it were one of them
            raise ConfigError("anon", "an anonymous replica cannot use identity = lease: it would take one of the "
                                      "cluster_size member slots (anonymous replicas of a lease cluster are not "
                                      "supported)")
    if not (0 < cfg.lease_duration_s < math.inf):   # also refuses nan, which compares false
        raise ConfigError("lease_duration_s", "must be a positive number of seconds")
    if cfg.cluster_wait_for < 0:
        raise ConfigError("cluster_wait_for", "must be >= 0")
    if not cfg.cluster_name or len(cfg.cluster_name) > 64:
        raise ConfigError("cluster_name", "must be 1..64 characters")
    for name in ("checkpoint_interval_s", "anon_ttl_s", "ready_lag_max_s", "live_loop_lag_max_s"):
        if not (0 < getattr(cfg, name) < math.inf):   # also refuses nan
            raise ConfigError(name, "must be a positive number of seconds")
    if cfg.ready_upstreams_down_max < 0:
        raise ConfigError("ready_upstreams_down_max", "must be >= 0")
    if cfg.lease_store.startswith("s3://") and importlib.util.find_spec("boto3") is None:
        raise ConfigError("lease_store", "s3:// lease stores need boto3: pip install 'replog[s3]'")
    if not 4096 <= cfg.segment_bytes_max <= limits.segment_bytes_max_max:
        raise ConfigError("segment_bytes_max", f"must be 4096..{limits.segment_bytes_max_max} bytes (a segment is "
                          f"collected whole: one that never fills is never collected), got {cfg.segment_bytes_max}")
    if not limits.store_map_bytes_min <= cfg.map_size <= limits.store_map_bytes_max:
        raise ConfigError("map_size", f"must be {limits.store_map_bytes_min}..{limits.store_map_bytes_max} bytes, "
                          f"got {cfg.map_size}")
    if cfg.disk_reserve_bytes < 0:
        raise ConfigError("disk_reserve_bytes", "must be >= 0 bytes")
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


def loop_module(cfg: "Config"):
    """The event loop `replog serve` runs on: uvloop (the module) or None for asyncio's. `auto`
    takes uvloop where it is installed, except with TLS. uvloop 0.23 leaves a TLS connect that
    the peer resets during its handshake as a transport still registered on a descriptor that
    was closed: every socket the node opens after it on that descriptor number is refused
    ("File descriptor N is used by transport"), so the node dials nobody more, and the stale
    transport's close would close whatever holds that number then (a socket, a WAL segment).
    Peers reset TLS connects whenever one is killed or restarted (bench/uvloop_tls.py shows it;
    the secure nemesis, seed 48, met it)."""
    if cfg.event_loop == "asyncio" or cfg.tls_cert_file:
        return None
    return uvloop_module()


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
