"""`replog` command line: serve, status, put/get/delete, space, scan, wal, demo, admin, analyze.

Rules kept here:
- `replog serve`'s flags and their help are generated from the option table (node/config.py
  `Config`), so a flag, its default and its TOML key never drift apart.
- User errors end with one line on stderr (`replog: error: ...`); a bad option or usage is exit
  code 2, a node that answered with an error or could not be reached is exit 1. Never a traceback,
  also not when the reader of stdout goes away (`replog scan ... | head`).
- Results go to stdout, everything else to stderr.
- Requests to a node go through the small functions under "requests" (`http`, `call`), so the
  transport can change without touching the commands."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import urllib.error
import urllib.parse
from typing import Any

from node import config as config_mod
from node.cli_http import base_url, http, sdk_client
from node.errors import ConfigError, ReplogError, StorageError
from node.version import version

log = logging.getLogger("replog")


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, and where to look
        self.exit(2, f"replog: error: {message} (see '{self.prog} --help')\n")


def fail(message: str, code: int = 2) -> None:
    sys.stderr.write(f"replog: error: {message}\n")
    raise SystemExit(code)


# --- serve ------------------------------------------------------------------------------
def _flag_help(f) -> str:
    default = f.default
    if isinstance(default, bool):
        shown = "on" if default else "off"
    elif isinstance(default, tuple):
        shown = ",".join(default) or "none"
    else:
        shown = str(default) if default != "" else "none"
    return f"{f.metadata['help']} (default: {shown}; TOML {f.name}, env REPLOG_{f.name.upper()})"


def serve_flags() -> list[tuple[str, dict]]:
    """(flag, argparse keywords) for every option of the table, in its order."""
    out = []
    for f in config_mod.OPTIONS:
        kw: dict[str, Any] = {"dest": f.name, "default": None, "help": _flag_help(f)}
        if f.type in ("bool", bool):
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["metavar"] = f.metadata["metavar"] or f.name.upper()
        out.append(("--" + f.name.replace("_", "-"), kw))
    return out


SERVE_FLAGS = serve_flags()


def cmd_serve(args: argparse.Namespace) -> int:
    flags = {k: getattr(args, k, None) for k in config_mod.OPTION_TYPES}
    try:
        cfg = config_mod.load(flags, args.config)
        from node.logsetup import setup
        setup(cfg.log_level, cfg.log_format, cfg.log_file)
    except ConfigError as e:
        fail(str(e))
    from node.process.run import serve
    uvloop = config_mod.loop_module(cfg)
    if uvloop is not None:
        return uvloop.run(serve(cfg, flags, args.config))
    return asyncio.run(serve(cfg, flags, args.config))


# --- requests: the only code here that talks to a node (node/cli_http.py) ----------------------
def call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    """One request for a client command: the answer's document, or exit 1 with the node's
    error (or the reason it could not be reached) on stderr."""
    try:
        status, doc = http(method, base_url(args.url, args.ca_file) + path, body, args.token, ca_file=args.ca_file)
    except (urllib.error.URLError, OSError) as e:
        fail(f"cannot reach {args.url}: {getattr(e, 'reason', e)}", 1)
    if status >= 400:
        err = doc.get("error") if isinstance(doc, dict) else None
        err = err if isinstance(err, dict) else {"code": "http", "message": f"HTTP {status}"}
        fail(f"{err.get('code')}: {err.get('message')} (HTTP {status})", 1)
    return doc


def key_path(space: str, key: str | None = None) -> str:
    q = urllib.parse.quote
    return f"/v1/spaces/{q(space, safe='')}" + ("" if key is None else f"/keys/{q(key, safe='')}")


# --- client commands ----------------------------------------------------------------------
def out(doc: Any) -> None:
    print(json.dumps(doc, indent=2, ensure_ascii=False))


def sdk_call(args: argparse.Namespace, call) -> Any:
    """One call through the SDK (replog.Client) against the node at args.url: the answer, or exit
    1 with the node's error (or the reason it could not be reached) as one line on stderr."""
    import replog
    try:
        with sdk_client(args.url, args.token, args.ca_file) as c:
            return call(c)
    except replog.Unavailable as e:
        fail(f"cannot reach {args.url}: {e.message}", 1)
    except replog.ReplogError as e:
        fail(f"{e.code}: {e.message}" + (f" (HTTP {e.status})" if e.status else ""), 1)
    except ValueError as e:             # a malformed address
        fail(str(e))


def put_value(text: str, as_string: bool) -> Any:
    """VALUE as JSON, else the text itself; but text that opens like JSON (`{`, `[`, `"`) and
    does not parse is a typo, not a string to store."""
    if as_string:
        return text
    try:
        return json.loads(text)
    except ValueError as e:
        if text.lstrip()[:1] in ("{", "[", '"'):
            fail(f"VALUE is not valid JSON ({e}); --string stores it as text")
        return text


def cmd_put(args: argparse.Namespace) -> int:
    value = put_value(args.value, args.string)
    out(sdk_call(args, lambda c: c.put(args.space, args.key, value)._asdict()))
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    out(sdk_call(args, lambda c: c.get(args.space, args.key)._asdict()))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    out(sdk_call(args, lambda c: c.delete(args.space, args.key)._asdict()))
    return 0


def cmd_space(args: argparse.Namespace) -> int:
    if args.space_cmd == "create":
        doc = call(args, "PUT", key_path(args.name), {"local": args.local, "conflict": args.conflict})
        print(f"space {doc['space']} {'created' if doc.get('created') else 'exists'} "
              f"({'local' if doc.get('local') else 'replicated'}, conflict {doc.get('conflict')})")
        return 0
    doc = call(args, "GET", "/v1/spaces")
    for s in doc.get("spaces", []):
        print(f"{s['name']}\t{'local' if s.get('local') else 'replicated'}\tconflict={s.get('conflict')}")
    return 0


def cmd_scan(args: argparse.Namespace) -> int:
    """Keys in order as JSON lines, page after page, until --limit items or the end."""
    from node import limits
    after, left = args.after, args.limit
    while left is None or left > 0:
        page = limits.range_limit_max if left is None else min(left, limits.range_limit_max)
        q = {"limit": str(page)} | ({"after": after} if after is not None else {})
        doc = call(args, "GET", key_path(args.space) + "/keys?" + urllib.parse.urlencode(q))
        for item in doc["items"]:
            print(json.dumps(item, ensure_ascii=False))
        if left is not None:
            left -= len(doc["items"])
        after = doc.get("next")
        if after is None or not doc["items"]:
            break
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from node.status import collect, render_json, render_table
    report = collect([base_url(u, args.ca_file) for u in args.url], args.token, args.ca_file)
    if not report.nodes:
        why = [f"{u}: {e}" for u, e in report.unreachable.items()] + \
            [f"{u}: needs the client token (--token or $REPLOG_TOKEN)" for u in report.needs_token]
        fail(f"no node answered at {', '.join(args.url)} ({'; '.join(why)})", 1)
    print(render_json(report) if args.json else render_table(report))
    return 0 if report.healthy else 1


def cmd_wal(args: argparse.Namespace) -> int:
    from node.wal import dump
    if not os.path.isdir(args.dir):
        fail(f"{args.dir}: not a directory")
    try:
        if args.wal_cmd == "dump":
            flt = dump.RowFilter(origin=args.origin, lsn_from=args.lsn_from, lsn_to=args.lsn_to, space=args.space)
            if args.headers:
                return dump.dump_headers(args.dir)
            return dump.dump(args.dir, flt=flt, force_recovery=args.force_recovery)
        return dump.verify(args.dir)
    except ReplogError as e:                     # NoWal, a damaged WAL: one line, exit 1
        fail(str(e), 1)
    return 1


def cmd_demo(args: argparse.Namespace) -> int:
    from node.demo import run_demo
    return run_demo(args)


def cmd_analyze(rest: list[str]) -> int:
    import importlib.util
    if not {"-h", "--help"} & set(rest) and importlib.util.find_spec("pyspark") is None:
        fail("replog analyze needs pyspark: install the spark extra (pip install 'replog[spark]'; Java 17 too)")
    from spark.analyze import main as analyze_main
    return analyze_main(rest)


def cmd_backup(args: argparse.Namespace) -> int:
    """A hot backup of a data dir (its node may be running): node/ops/backup.py."""
    from node.ops.backup import BackupError, backup_dir
    if not os.path.isdir(args.dir):
        fail(f"{args.dir}: not a directory")
    try:
        man = backup_dir(args.dir, os.path.abspath(args.to), compact=args.compact)
    except BackupError as e:
        fail(e.message)
    except (StorageError, OSError) as e:
        fail(f"backup failed: {e}", 1)
    print(json.dumps({k: man[k] for k in ("uuid", "cluster_uuid", "vclock", "bytes", "seconds")}, indent=2))
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    """A data dir from a backup: node/ops/restore.py (the rules a restored node follows)."""
    from node.ops.backup import BackupError
    from node.ops.restore import restore
    try:
        out = restore(args.backup, args.data_dir, as_new_member=args.as_new_member)
    except BackupError as e:
        fail(e.message)
    except (StorageError, OSError) as e:
        fail(f"restore failed: {e}", 1)
    print(json.dumps({k: out[k] for k in ("uuid", "backup_uuid", "cluster_uuid", "vclock", "data_dir")}, indent=2))
    return 0


def cmd_admin(args: argparse.Namespace) -> int:
    from node import admin
    return admin.main(args)


# --- the parser ---------------------------------------------------------------------------
def _client_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("--token", help="bearer token for the node's client API (default: $REPLOG_TOKEN)")
    c.add_argument("--ca-file", dest="ca_file", help="PEM CA bundle that signed the node's TLS certificate "
                                                    "(https; also $REPLOG_CA_FILE)")


def build_parser() -> Parser:
    p = Parser(prog="replog", description="replog: multi-master replicated log and key-value store",
               epilog="'replog COMMAND --help' describes each command. Node addresses are host:port "
                      "(http; https with --ca-file) or full URLs.")
    p.add_argument("--version", action="version", version=f"replog {version()}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=Parser)

    s = sub.add_parser("serve", help="run one node",
                       description="Run one node. Options come from flags, then the --config TOML file "
                                   "(same names with underscores), then REPLOG_<OPTION> environment variables, "
                                   "then the defaults shown. SIGHUP reloads peers, log_level and the /readyz "
                                   "and /livez thresholds from the file and reopens log_file.")
    s.add_argument("--config", metavar="FILE", help="TOML file with options (default: none)")
    for flag, kw in SERVE_FLAGS:
        s.add_argument(flag, **kw)

    for name, fn, what in (("put", cmd_put, "replace one key"), ("get", cmd_get, "read one key"),
                           ("delete", cmd_delete, "delete one key")):
        c = sub.add_parser(name, help=what, description=f"{what[0].upper()}{what[1:]}; prints the node's answer "
                                                        "as JSON.")
        c.add_argument("url", help="node address")
        c.add_argument("space")
        c.add_argument("key")
        if name == "put":
            c.add_argument("value", help="a JSON value; text that is not JSON is stored as a string, unless it "
                                         "opens like JSON ({, [ or \") and is a typo: exit 2")
            c.add_argument("--string", action="store_true", help="store VALUE as a string as it is (no JSON)")
        _client_args(c)
        c.set_defaults(fn=fn)

    sp = sub.add_parser("space", help="create or list spaces")
    spsub = sp.add_subparsers(dest="space_cmd", metavar="create|list", required=True, parser_class=Parser)
    x = spsub.add_parser("create", help="create a space (idempotent)")
    x.add_argument("url", help="node address")
    x.add_argument("name", help="space name: [A-Za-z_][A-Za-z0-9_]{0,63}")
    x.add_argument("--local", action="store_true", help="never replicated (rows stay on this node)")
    x.add_argument("--conflict", choices=("lww", "apply"), default="lww",
                   help="concurrent writes: last writer wins, or apply in arrival order (default: lww)")
    _client_args(x)
    x = spsub.add_parser("list", help="list spaces: name, local or replicated, conflict rule")
    x.add_argument("url", help="node address")
    _client_args(x)
    sp.set_defaults(fn=cmd_space)

    sc = sub.add_parser("scan", help="keys of a space in order, as JSON lines",
                        description="Print the keys of SPACE in order, one JSON object per line "
                                    "({key, value, origin, lsn}), following pages to the end or --limit.")
    sc.add_argument("url", help="node address")
    sc.add_argument("space")
    sc.add_argument("--after", metavar="KEY", help="start after this key (default: the first key)")
    sc.add_argument("--limit", metavar="N", type=_positive_int, help="print at most N keys (default: all)")
    _client_args(sc)
    sc.set_defaults(fn=cmd_scan)

    st = sub.add_parser("status", help="every member: reachable, state, upstreams, lag, vclock by uuid",
                        description="Every member of the named nodes' _cluster: reachable or not, status, "
                                    "its upstreams and their lag, and vclocks by member uuid. Exit 0 when every "
                                    "member answers and is ready, 1 otherwise (or when nothing answers).")
    st.add_argument("url", nargs="+", help="node addresses to ask first; members they list are followed")
    st.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    st.add_argument("--token", help="sent only to the URLs given here, never to addresses learned from them")
    st.add_argument("--ca-file", dest="ca_file", help="PEM CA bundle for https nodes (also $REPLOG_CA_FILE)")

    w = sub.add_parser("wal", help="inspect WAL segments (dump, verify)")
    wsub = w.add_subparsers(dest="wal_cmd", metavar="dump|verify", required=True, parser_class=Parser)
    x = wsub.add_parser("dump", help="rows as JSON lines, origin uuids resolved",
                        description="Print the WAL's rows as JSON lines with the origin's uuid resolved "
                                    "through the node's own _cluster, or its segment headers (--headers). "
                                    "Filters combine.")
    x.add_argument("dir", help="a node's data dir or its wal/ dir")
    x.add_argument("--origin", metavar="UUID", help="only rows of this origin (a uuid, or a prefix of one)")
    x.add_argument("--lsn-from", dest="lsn_from", type=_positive_int, metavar="LSN", help="only lsn >= LSN")
    x.add_argument("--lsn-to", dest="lsn_to", type=_positive_int, metavar="LSN", help="only lsn <= LSN")
    x.add_argument("--space", metavar="NAME", help="only rows of this space")
    x.add_argument("--headers", action="store_true", help="print each segment's header instead of rows")
    x.add_argument("--force-recovery", dest="force_recovery", action="store_true",
                   help="skip damaged frames (each reported on stderr) instead of stopping at the first")
    x = wsub.add_parser("verify", help="check every frame of every segment")
    x.add_argument("dir", help="a node's data dir or its wal/ dir")

    d = sub.add_parser("demo", help="run a local multi-master cluster with a workload")
    d.add_argument("--dir", help="data directory (default: a temporary one)")
    d.add_argument("--masters", type=_positive_int, default=3, help="masters in full mesh (default: 3)")
    d.add_argument("--anon", type=int, default=1, help="anonymous replicas (default: 1)")
    d.add_argument("--base-port", type=int, default=7301, help="first port (0: any free ports; default: 7301)")
    d.add_argument("--rate", type=float, default=20.0, help="writes per second per master (default: 20)")
    d.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (default 0: until "
                                                               "Ctrl-C)")
    d.add_argument("--open", action="store_true", help="open the dashboard in a graphical browser, if there is one")

    a = sub.add_parser("admin", help="manual recovery tools (inspect, compare, mark-clean)")
    asub = a.add_subparsers(dest="admin_cmd", metavar="inspect|compare|mark-clean", required=True,
                            parser_class=Parser)
    x = asub.add_parser("inspect", help="status, signatures, vclock by uuid of one stopped data dir")
    x.add_argument("dir")
    x = asub.add_parser("compare", help="same cluster? which store is the latest?")
    x.add_argument("dirs", nargs="+")
    x = asub.add_parser("mark-clean", help="mark a stopped node's store clean")
    x.add_argument("dir")

    b = sub.add_parser("backup", help="hot backup of a data dir (its node may be running)")
    b.add_argument("dir", help="the node's data dir")
    b.add_argument("--to", required=True, help="a new directory for the backup")
    b.add_argument("--compact", action="store_true", help="copy only the store's live pages (slower, smaller)")
    b.set_defaults(fn=cmd_backup)
    r = sub.add_parser("restore", help="make a data dir from a backup")
    r.add_argument("backup", help="a directory written by replog backup")
    r.add_argument("--data-dir", dest="data_dir", required=True, help="the new data dir (must not exist, or be empty)")
    r.add_argument("--as-new-member", dest="as_new_member", action="store_true",
                   help="give the data a new uuid: the node joins as a new member (see docs/operations.md)")
    r.set_defaults(fn=cmd_restore)

    sub.add_parser("analyze", help="Spark analysis of WAL dumps (needs the spark extra; replog analyze --help)",
                   add_help=False)
    return p


def _positive_int(s: str) -> int:
    try:
        n = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


COMMANDS = {"serve": cmd_serve, "status": cmd_status, "wal": cmd_wal, "demo": cmd_demo, "admin": cmd_admin}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "analyze":
            return cmd_analyze(argv[1:])
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.cmd is None:
            parser.print_help(sys.stderr)
            return 2
        fn = COMMANDS.get(args.cmd) or args.fn
        return fn(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly; stdout is pointed at /dev/null so the
        # interpreter's final flush does not complain either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
