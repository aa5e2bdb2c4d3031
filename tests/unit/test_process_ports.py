"""The parts of a node reach the process only through their ports (node/process/ports.py), and
node/ has no import cycle.

A part's function that takes `node: "SomePort"` (or a class whose __init__ does, through
`self.node`) may read on it only what that port declares; the check reads the source, so a
part that starts to reach further fails here before it fails in review."""
import ast
import pathlib
import typing

import pytest

from node.process import ports

ROOT = pathlib.Path(__file__).resolve().parents[2]
PARTS = ["node/applier/accept.py", "node/applier/applier.py", "node/applier/handshake.py",
         "node/applier/relay.py", "node/applier/stream.py", "node/applier/hosts.py", "node/applier/upstream.py",
         "node/http/api.py", "node/http/browser.py", "node/http/events.py", "node/http/health.py",
         "node/http/metrics.py", "node/identity/lease_node.py", "node/identity/lease_handover.py", "node/cluster_shutdown.py",
         "node/lifecycle.py", "node/join.py", "node/rejoin.py", "node/process/opening.py",
         "node/process/peering.py", "node/process/writes.py", "node/process/views.py",
         "node/clientrules.py", "node/clientproto/session.py", "node/clientproto/writes.py",
         "node/ops/backup_node.py"]


def port_members(name: str) -> set[str]:
    cls = getattr(ports, name)
    out: set[str] = set()
    for c in cls.__mro__:
        if c in (object, typing.Protocol, typing.Generic):
            continue
        out |= set(vars(c).get("__annotations__", {}))
        out |= {k for k in vars(c) if not k.startswith("_")}
    return out


def _port_of(annotation: ast.expr | None) -> str | None:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        name = annotation.value
    elif isinstance(annotation, ast.Name):
        name = annotation.id
    else:
        return None
    return name if hasattr(ports, name) else None


def _node_param(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    for a in fn.args.args + fn.args.kwonlyargs:
        if a.arg == "node":
            return _port_of(a.annotation)
    return None


def reads(path: pathlib.Path) -> list[tuple[str, str, int]]:
    """(port, attribute, line) for every attribute read on a port in `path`."""
    tree = ast.parse(path.read_text())
    getter = next((_port_of(f.returns) for f in tree.body
                   if isinstance(f, ast.FunctionDef) and f.name == "_node"), None)
    out = []

    def walk(fn, port: str | None, self_port: str | None) -> None:
        for n in ast.walk(fn):
            if not isinstance(n, ast.Attribute):
                continue
            v = n.value
            if isinstance(v, ast.Name) and v.id == "node" and port:
                out.append((port, n.attr, n.lineno))
            elif isinstance(v, ast.Attribute) and v.attr == "node" and isinstance(v.value, ast.Name) \
                    and v.value.id == "self" and self_port:
                out.append((self_port, n.attr, n.lineno))
            elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "_node" and getter:
                out.append((getter, n.attr, n.lineno))

    def bound_to_node(n: ast.Assign) -> ast.expr | None:
        """What `node` is set to by `node = x` or `node, y = x, z`, else None."""
        for t in n.targets:
            if isinstance(t, ast.Name) and t.id == "node":
                return n.value
            if isinstance(t, ast.Tuple) and isinstance(n.value, ast.Tuple) and len(t.elts) == len(n.value.elts):
                for name, value in zip(t.elts, n.value.elts):
                    if isinstance(name, ast.Name) and name.id == "node":
                        return value
        return None

    def fn_port(fn, self_port):
        port = _node_param(fn)
        if port is None:
            for n in ast.walk(fn):
                value = bound_to_node(n) if isinstance(n, ast.Assign) else None
                if value is None:
                    continue
                if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "_node":
                    port = getter
                elif isinstance(value, ast.Attribute) and value.attr == "node":
                    port = self_port
                elif isinstance(value, ast.Subscript):       # node = request.app[NODE]
                    port = getter
                else:
                    raise AssertionError(f"{path}:{n.lineno}: `node` bound to something this check cannot follow")
        return port

    for top in tree.body:
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)):
            walk(top, fn_port(top, None), None)
        elif isinstance(top, ast.ClassDef):
            init = next((f for f in top.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            self_port = _node_param(init) if init else None
            for f in top.body:
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    walk(f, fn_port(f, self_port), self_port)
    return out


@pytest.mark.parametrize("part", PARTS)
def test_a_part_reads_on_the_process_only_what_its_port_declares(part):
    path = ROOT / part
    found = reads(path)
    assert found, f"{part} names no port: it should take one instead of the process"
    wider = sorted({f"{port}.{attr} (line {line})" for port, attr, line in found if attr not in port_members(port)})
    assert not wider, f"{part} reaches past its port: {wider}"


@pytest.mark.parametrize("part", PARTS)
def test_no_part_imports_the_process(part):
    tree = ast.parse((ROOT / part).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & {"node.server", "node.process.node"}, f"{part} imports the process"


def _imports(root: pathlib.Path) -> dict[str, set[str]]:
    """node/ module -> the node/ modules it imports (at module level, in a function, or under
    TYPE_CHECKING alike: each is a dependency a reader must follow)."""
    mods = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
            for p in (root / "node").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, p in mods.items():
        pkg = name if p.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = pkg.split(".")[:len(pkg.split(".")) - n.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in n.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and mods[t].name != "__init__.py":
                    deps.add(t)
        graph[name] = deps
    return graph


def test_node_has_no_import_cycle():
    graph = _imports(ROOT)
    state: dict[str, int] = {}       # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_process_satisfies_every_port():
    """Node has every member each port declares (a port naming something the process lacks
    would be a promise nobody keeps)."""
    from node.config import Config
    from node.process.node import Node
    node = Node(Config())
    missing = {}
    for name in dir(ports):
        cls = getattr(ports, name)
        if isinstance(cls, type) and issubclass(cls, typing.Protocol) and cls is not typing.Protocol \
                and name.endswith(("Host", "View", "Handshake")):
            lacking = sorted(m for m in port_members(name) if not hasattr(node, m))
            if lacking:
                missing[name] = lacking
    assert not missing, missing
