"""Mutants of one Python module, made on its AST: what the runner asks the tests to notice.

The operators are the ones issue 18 measured the core with: flip a comparison, negate or
drop a condition, swap two operands or ids, delete a statement, move a constant by one.
A mutant is named by (path, the stripped text of its line, its label): stable while other
lines of the file move, which is what the equivalent-mutant list (equivalent.txt) keys on.

Rules kept here:
- generation is deterministic: the same source gives the same mutants in the same order,
  so `index` names a mutant between the runner and the pytest plugin that loads it;
- a mutant is applied to a fresh parse and compiled from the AST with the real file name,
  so its tracebacks point at the real lines and nothing is written to disk;
- nothing inside docstrings, annotations, decorators, assert messages or log calls is
  mutated: changes there are invisible by design and would only pad the score."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable, Iterator

_CMP_SWAPS: dict[type, tuple[type, ...]] = {
    ast.Lt: (ast.GtE, ast.LtE), ast.LtE: (ast.Gt, ast.Lt),
    ast.Gt: (ast.LtE, ast.GtE), ast.GtE: (ast.Lt, ast.Gt),
    ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,),
    ast.Is: (ast.IsNot,), ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,), ast.NotIn: (ast.In,),
}
_BIN_SWAPS: dict[type, type] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult, ast.Mod: ast.FloorDiv, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd,
    ast.LShift: ast.RShift, ast.RShift: ast.LShift,
}
_NON_COMMUTATIVE = (ast.Sub, ast.FloorDiv, ast.Div, ast.Mod, ast.LShift, ast.RShift)
_SYMBOL = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
    ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in",
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Div: "/", ast.Mod: "%",
    ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<", ast.RShift: ">>",
    ast.And: "and", ast.Or: "or",
}
_LOGGERS = {"log", "logger", "_log", "LOG"}
_DELETABLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Assert, ast.Raise, ast.Return,
              ast.If, ast.For, ast.While, ast.With, ast.Delete, ast.Break, ast.Continue, ast.Try)


@dataclass(frozen=True, slots=True)
class Mutant:
    path: str          # as given to mutants_of (repo-relative in the runner)
    index: int         # position in generation order: the plugin regenerates and picks this one
    line: int
    end_line: int
    label: str         # what changed, e.g. "< -> >=", "delete statement", "negate condition"
    snippet: str       # the original line, stripped
    in_function: bool  # False: runs at import (module or class level)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.path, self.snippet, self.label)

    def describe(self) -> str:
        return f"{self.path}:{self.line}: {self.label}  | {self.snippet}"


# A site is (walk index of the node, label, edit): edit(node, parents) changes a fresh tree.
Edit = Callable[[ast.AST, dict], None]


def _skipped_subtrees(tree: ast.AST) -> set[int]:
    """ids of nodes whose subtree is never mutated."""
    skip: set[int] = set()

    def mark(n: ast.AST | None) -> None:
        if n is not None:
            skip.update(id(x) for x in ast.walk(n))

    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            for d in getattr(n, "decorator_list", ()):
                mark(d)
            if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant) \
                    and isinstance(n.body[0].value.value, str):
                mark(n.body[0])
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                mark(n.returns)
                for a in ast.walk(n.args):
                    if isinstance(a, ast.arg):
                        mark(a.annotation)
        elif isinstance(n, ast.AnnAssign):
            mark(n.annotation)
        elif isinstance(n, ast.Assert):
            mark(n.msg)
        elif isinstance(n, ast.JoinedStr):
            mark(n)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                and isinstance(n.func.value, ast.Name) and n.func.value.id in _LOGGERS:
            mark(n)
        elif isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING":
            mark(n)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            mark(n)
    return skip


def _functions(tree: ast.AST) -> set[int]:
    inside: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for b in (n.body if isinstance(n.body, list) else [n.body]):
                inside.update(id(x) for x in ast.walk(b))
    return inside


def _sites(node: ast.AST, parents: dict[int, ast.AST]) -> Iterator[tuple[str, Edit]]:
    """Every mutation of one node, as (label, edit)."""
    if isinstance(node, ast.Compare):
        for j, op in enumerate(node.ops):
            for new in _CMP_SWAPS.get(type(op), ()):
                yield (f"{_SYMBOL[type(op)]} -> {_SYMBOL[new]}",
                       lambda n, p, j=j, new=new: n.ops.__setitem__(j, new()))
    elif isinstance(node, ast.BoolOp):
        other = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield (f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[other]}", lambda n, p, other=other: setattr(n, "op", other()))
        for k in range(len(node.values)):
            yield (f"drop operand {k + 1} of {_SYMBOL[type(node.op)]}",
                   lambda n, p, k=k: _drop_operand(n, p, k))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.Invert)):
        yield ("remove unary " + type(node.op).__name__.lower(), lambda n, p: _replace(n, p, n.operand))
    elif isinstance(node, ast.BinOp) and type(node.op) in _BIN_SWAPS:
        new = _BIN_SWAPS[type(node.op)]
        yield (f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[new]}", lambda n, p, new=new: setattr(n, "op", new()))
        if isinstance(node.op, _NON_COMMUTATIVE):
            yield ("swap operands", lambda n, p: (setattr(n, "left", n.right), setattr(n, "right", n.left)) and None)
    elif isinstance(node, ast.AugAssign) and type(node.op) in _BIN_SWAPS:
        new = _BIN_SWAPS[type(node.op)]
        yield (f"{_SYMBOL[type(node.op)]}= -> {_SYMBOL[new]}=", lambda n, p, new=new: setattr(n, "op", new()))
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        yield (f"{node.value} -> {not node.value}", lambda n, p: setattr(n, "value", not n.value))
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        v = node.value
        yield (f"{v} -> {v + 1}", lambda n, p: setattr(n, "value", n.value + 1))
        yield (f"{v} -> {v - 1}", lambda n, p: setattr(n, "value", n.value - 1))
    elif isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            new_name = "max" if node.func.id == "min" else "min"
            yield (f"{node.func.id} -> {new_name}", lambda n, p, m=new_name: setattr(n.func, "id", m))
        args = node.args
        commutative = isinstance(node.func, ast.Name) and node.func.id in ("min", "max")
        for k in range(0 if commutative else len(args) - 1):
            if not isinstance(args[k], ast.Starred) and not isinstance(args[k + 1], ast.Starred) \
                    and ast.dump(args[k]) != ast.dump(args[k + 1]):
                yield (f"swap arguments {k + 1} and {k + 2}", lambda n, p, k=k: _swap(n.args, k))
    elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript) \
            and isinstance(node.targets[0].slice, ast.Name) and isinstance(node.value, ast.Name) \
            and node.targets[0].slice.id != node.value.id:
        yield ("swap key and value", lambda n, p: _swap_key_value(n))
    elif isinstance(node, ast.Break):
        yield ("break -> continue", lambda n, p: _replace(n, p, ast.Continue()))
    elif isinstance(node, ast.Continue):
        yield ("continue -> break", lambda n, p: _replace(n, p, ast.Break()))

    if isinstance(node, (ast.If, ast.While, ast.IfExp)):
        t = node.test
        simple_cmp = isinstance(t, ast.Compare) and len(t.ops) == 1
        if not simple_cmp and not (isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not)):
            yield ("negate condition", lambda n, p: setattr(n, "test", ast.UnaryOp(ast.Not(), n.test)))
        if isinstance(node, ast.If):
            yield ("condition -> True", lambda n, p: setattr(n, "test", ast.Constant(True)))
    if isinstance(node, _DELETABLE):
        parent = parents.get(id(node))
        if parent is not None and not isinstance(parent, ast.Module) and not _is_docstring(node):
            yield ("delete statement", lambda n, p: _delete_stmt(n, p))


def _is_log_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
        and isinstance(node.value.func, ast.Attribute) and isinstance(node.value.func.value, ast.Name) \
        and node.value.func.value.id in _LOGGERS


def _is_docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _swap(seq: list, k: int) -> None:
    seq[k], seq[k + 1] = seq[k + 1], seq[k]


def _swap_key_value(n: ast.Assign) -> None:
    key = n.targets[0].slice
    n.targets[0].slice = ast.Name(n.value.id, ast.Load())
    n.value = ast.Name(key.id, ast.Load())


def _replace(node: ast.AST, parents: dict, new: ast.AST) -> None:
    parent = parents[id(node)]
    for field, value in ast.iter_fields(parent):
        if value is node:
            setattr(parent, field, new)
            return
        if isinstance(value, list):
            for i, v in enumerate(value):
                if v is node:
                    value[i] = new
                    return
    raise AssertionError("node not found under its parent")


def _drop_operand(node: ast.BoolOp, parents: dict, k: int) -> None:
    rest = node.values[:k] + node.values[k + 1:]
    if len(rest) == 1:
        _replace(node, parents, rest[0])
    else:
        node.values = rest


def _delete_stmt(node: ast.stmt, parents: dict) -> None:
    parent = parents[id(node)]
    for field, value in ast.iter_fields(parent):
        if isinstance(value, list) and any(v is node for v in value):
            rest = [v for v in value if v is not node]
            setattr(parent, field, rest or [ast.Pass()])
            return
    raise AssertionError("statement not found under its parent")


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(c): n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}


def _plan(tree: ast.AST) -> list[tuple[int, str, Edit, ast.AST]]:
    skip = _skipped_subtrees(tree)
    parents = _parents(tree)
    plan = []
    for i, node in enumerate(ast.walk(tree)):
        if id(node) in skip or not hasattr(node, "lineno"):
            continue
        for label, edit in _sites(node, parents):
            plan.append((i, label, edit, node))
    return plan


def mutants_of(path: str, source: str) -> list[Mutant]:
    tree = ast.parse(source, filename=path)
    lines = source.splitlines()
    inside = _functions(tree)
    out = []
    for index, (_, label, _, node) in enumerate(_plan(tree)):
        if label == "delete statement" and _is_log_call(node):
            continue        # a log line is not behaviour; the index stays the plan's (mutated_code)
        out.append(Mutant(path, index, node.lineno, getattr(node, "end_lineno", node.lineno) or node.lineno,
                          label, lines[node.lineno - 1].strip(), id(node) in inside))
    return out


def mutated_code(path: str, source: str, index: int, filename: str | None = None):
    """The code object of mutant `index` of this source, compiled under `filename`."""
    tree = ast.parse(source, filename=path)
    plan = _plan(tree)
    _, _, edit, node = plan[index]
    edit(node, _parents(tree))
    ast.fix_missing_locations(tree)
    return compile(tree, filename or path, "exec", dont_inherit=True)
