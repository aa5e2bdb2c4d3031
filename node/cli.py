"""`replog` command line: serve, status, put/get/delete, wal dump|verify, demo, admin, analyze.

User errors end with one line on stderr and exit code 2; never a traceback."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import urllib.error
import urllib.request
from typing import Any

from node import config as config_mod
from node.errors import ConfigError, ReplogError, StorageError

log = logging.getLogger("replog")


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        self.exit(2, f"replog: error: {message}\n")


def fail(message: str, code: int = 2) -> None:
    sys.stderr.write(f"replog: error: {message}\n")
    raise SystemExit(code)


# --- serve ------------------------------------------------------------------------------
SERVE_FLAGS: list[tuple[str, dict]] = [
    ("--data-dir", {"dest": "data_dir"}),
    ("--listen", {}),
    ("--advertise", {}),
    ("--client-listen", {"dest": "client_listen", "help": "host:port of the binary client protocol "
                         "(default: the HTTP port + 1000; 'off' for none)"}),
    ("--peers", {"help": "comma-separated host:port list of replication sources"}),
    ("--cluster-name", {"dest": "cluster_name"}),
    ("--cluster-wait-for", {"dest": "cluster_wait_for"}),
    ("--anon", {"action": "store_const", "const": True}),
    ("--read-only", {"dest": "read_only", "action": "store_const", "const": True}),
    ("--wal-mode", {"dest": "wal_mode"}),
    ("--secret-file", {"dest": "secret_file"}),
    ("--token-file", {"dest": "token_file"}),
    ("--identity", {}),
    ("--lease-store", {"dest": "lease_store"}),
    ("--cluster-size", {"dest": "cluster_size"}),
    ("--lease-duration-s", {"dest": "lease_duration_s"}),
    ("--task-id", {"dest": "task_id"}),
    ("--transient", {"action": "store_const", "const": True}),
    ("--force-recovery", {"dest": "force_recovery", "action": "store_const", "const": True}),
    ("--insecure", {"action": "store_const", "const": True}),
    ("--log-level", {"dest": "log_level"}),
    ("--log-format", {"dest": "log_format"}),
    ("--event-loop", {"dest": "event_loop", "help": "auto (uvloop where installed), uvloop or asyncio"}),
    ("--segment-bytes-max", {"dest": "segment_bytes_max"}),
    ("--checkpoint-interval-s", {"dest": "checkpoint_interval_s"}),
    ("--anon-ttl-s", {"dest": "anon_ttl_s"}),
    ("--tls-cert-file", {"dest": "tls_cert_file"}),
    ("--tls-key-file", {"dest": "tls_key_file"}),
    ("--tls-ca-file", {"dest": "tls_ca_file"}),
    ("--tls-client-auth", {"dest": "tls_client_auth", "action": "store_const", "const": True}),
]


def cmd_serve(args: argparse.Namespace) -> int:
    flags = {k: getattr(args, k, None) for k in config_mod.OPTION_TYPES}
    try:
        cfg = config_mod.load(flags, args.config)
    except ConfigError as e:
        fail(str(e))
    from node.logsetup import setup
    setup(cfg.log_level, cfg.log_format)
    uvloop = config_mod.uvloop_module() if cfg.event_loop != "asyncio" else None
    if uvloop is not None:
        return uvloop.run(serve(cfg))
    return asyncio.run(serve(cfg))


async def serve(cfg) -> int:
    from node.server import Node
    node = Node(cfg)
    loop = asyncio.get_running_loop()
    interrupts = 0

    def on_signal() -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1:
            log.warning("second interrupt: exiting now")
            os._exit(130)
        node.stopped.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        await node.start()
    except ConfigError as e:
        sys.stderr.write(f"replog: error: {e}\n")
        await node.stop()
        return 2
    except OSError as e:
        sys.stderr.write(f"replog: error: listen: cannot listen on {cfg.listen}: {e.strerror}\n")
        await node.stop()
        return 2
    except StorageError as e:
        sys.stderr.write(f"replog: error: {e}\n")
        await node.stop()
        return 1
    await node.stopped.wait()
    errors = await node.stop()
    if node.fatal is not None:
        if isinstance(node.fatal, ConfigError):
            sys.stderr.write(f"replog: error: {node.fatal}\n")
            return 2
        if isinstance(node.fatal, StorageError):   # e.g. Cannot recover, no clean store; wrong store
            sys.stderr.write(f"replog: error: {node.fatal}\n")
        return 1
    return 1 if errors else 0


# --- client commands ----------------------------------------------------------------------
def http(method: str, url: str, body: Any = None, token: str | None = None, timeout: float = 10,
         ca_file: str | None = None) -> tuple[int, Any]:
    """One call to the node at `url`; `token` (else $REPLOG_TOKEN) goes to that URL only."""
    from node.client import request
    status, doc = request(method, url, body, token=token if token is not None else os.environ.get("REPLOG_TOKEN"),
                          timeout=timeout,
                          ca_file=ca_file or os.environ.get("REPLOG_CA_FILE") or None)
    if status >= 400 and not isinstance(doc, dict):
        doc = {"error": {"code": "http", "message": f"HTTP {status}"}}
    return status, doc


def base_url(u: str, ca_file: str | None = None) -> str:
    """host:port alone means http://, or https:// when a CA file is given."""
    if u.startswith(("http://", "https://")):
        return u.rstrip("/")
    tls = ca_file or os.environ.get("REPLOG_CA_FILE")
    return f"{'https' if tls else 'http'}://{u}".rstrip("/")


def sdk_client(url: str, token: str | None = None, ca_file: str | None = None, timeout: float = 10.0,
               transport: str = "auto"):
    """The SDK's blocking client for one node named on the command line; the token (else
    $REPLOG_TOKEN) and CA file (else $REPLOG_CA_FILE) go to that node only."""
    import replog
    return replog.Client([url], token=token if token is not None else os.environ.get("REPLOG_TOKEN") or None,
                         ca_file=ca_file or os.environ.get("REPLOG_CA_FILE") or None, timeout=timeout,
                         transport=transport)


def _client(args: argparse.Namespace, call) -> int:
    """Run `call(client)` against the node at args.url and print its answer (or error) as JSON."""
    import replog
    try:
        with sdk_client(args.url, args.token, args.ca_file) as c:
            doc, code = call(c), 0
    except replog.Unavailable as e:
        fail(f"cannot reach {args.url}: {e.message}", 1)
    except replog.ReplogError as e:
        doc, code = {"error": {"code": e.code, "message": e.message}}, 1
    except ValueError as e:             # a malformed address
        fail(str(e))
    print(json.dumps(doc, indent=2, ensure_ascii=False))
    return code


def cmd_put(args: argparse.Namespace) -> int:
    try:
        value = json.loads(args.value)
    except ValueError:
        value = args.value
    return _client(args, lambda c: c.put(args.space, args.key, value)._asdict())


def cmd_get(args: argparse.Namespace) -> int:
    return _client(args, lambda c: c.get(args.space, args.key)._asdict())


def cmd_delete(args: argparse.Namespace) -> int:
    return _client(args, lambda c: c.delete(args.space, args.key)._asdict())


def cmd_status(args: argparse.Namespace) -> int:
    from node.status import status_table
    print(status_table([base_url(u, args.ca_file) for u in args.url], args.token, args.ca_file))
    return 0


def cmd_wal(args: argparse.Namespace) -> int:
    from node.wal import dump
    if not os.path.isdir(args.dir):
        fail(f"{args.dir}: not a directory")
    try:
        if args.wal_cmd == "dump":
            dump.dump(args.dir)
            return 0
        return dump.verify(args.dir)
    except BrokenPipeError:
        return 0
    except ReplogError as e:
        fail(str(e), 1)
    return 1


def cmd_demo(args: argparse.Namespace) -> int:
    from node.demo import run_demo
    return run_demo(args)


def cmd_analyze(args: argparse.Namespace, rest: list[str]) -> int:
    try:
        from spark.analyze import main as analyze_main
    except ImportError as e:
        fail(f"analyze needs pyspark: pip install 'replog[spark]' ({e})")
    return analyze_main(rest)


def cmd_admin(args: argparse.Namespace) -> int:
    from node import admin
    return admin.main(args)


def build_parser() -> Parser:
    p = Parser(prog="replog", description="replog: multi-master replicated log and key-value store")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)

    s = sub.add_parser("serve", help="run one node")
    s.add_argument("--config", help="TOML file with options")
    for flag, kw in SERVE_FLAGS:
        s.add_argument(flag, **kw)

    for name, fn in (("put", cmd_put), ("get", cmd_get), ("delete", cmd_delete)):
        c = sub.add_parser(name, help=f"{name} one key")
        c.add_argument("url")
        c.add_argument("space")
        c.add_argument("key")
        if name == "put":
            c.add_argument("value", help="JSON value (or a plain string)")
        c.add_argument("--token")
        c.add_argument("--ca-file", dest="ca_file", help="PEM CA bundle that signed the node's TLS certificate "
                                                        "(https; also $REPLOG_CA_FILE)")
        c.set_defaults(fn=fn)

    st = sub.add_parser("status", help="members, ids on each node, vclocks, lag")
    st.add_argument("url", nargs="+")
    st.add_argument("--token", help="sent only to the URLs given here, never to addresses learned from them")
    st.add_argument("--ca-file", dest="ca_file", help="PEM CA bundle for https nodes (also $REPLOG_CA_FILE)")

    w = sub.add_parser("wal", help="inspect WAL segments")
    wsub = w.add_subparsers(dest="wal_cmd", required=True, parser_class=Parser)
    for n in ("dump", "verify"):
        x = wsub.add_parser(n)
        x.add_argument("dir")

    d = sub.add_parser("demo", help="run a local multi-master cluster with a workload")
    d.add_argument("--dir", help="data directory (default: a temporary one)")
    d.add_argument("--masters", type=int, default=3)
    d.add_argument("--anon", type=int, default=1)
    d.add_argument("--base-port", type=int, default=7301, help="first port (0: any free ports)")
    d.add_argument("--rate", type=float, default=20.0, help="writes per second per master")
    d.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: until Ctrl-C)")
    d.add_argument("--open", action="store_true", help="open the dashboard in a graphical browser, if there is one")

    a = sub.add_parser("admin", help="manual recovery tools")
    asub = a.add_subparsers(dest="admin_cmd", required=True, parser_class=Parser)
    x = asub.add_parser("inspect")
    x.add_argument("dir")
    x = asub.add_parser("compare")
    x.add_argument("dirs", nargs="+")
    x = asub.add_parser("mark-clean")
    x.add_argument("dir")

    sub.add_parser("analyze", help="Spark analysis of WAL dumps (see replog analyze --help)", add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "analyze":
        return cmd_analyze(argparse.Namespace(), argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "serve":
            return cmd_serve(args)
        if args.cmd == "status":
            return cmd_status(args)
        if args.cmd == "wal":
            return cmd_wal(args)
        if args.cmd == "demo":
            return cmd_demo(args)
        if args.cmd == "admin":
            return cmd_admin(args)
        return args.fn(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
