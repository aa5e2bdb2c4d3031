"""The pytest side of the mutation runner (tools/mutate/__main__.py), loaded with `-p tools.mutate.plugin`.

Three modes, chosen by the environment the runner sets (MUTATE_MODE):
- map: run the tests once, unmutated, and record per test the lines of the target files it
  executes, whether it passed, how long it took, and whether it started a process (those
  tests are left out of the mutation run: it is about the unit tests and the simulation);
- serve: collect once, then for each mutant of a job list fork a child that swaps the
  mutated functions' code into the already imported module and runs that mutant's tests
  in order, stopping at the first failure, each test under its own deadline (an alarm whose
  default action ends the child); the parent kills a child that outlives them all;
- fresh: one mutant that must be in place before import (module or class level, a changed
  default or closure): an import hook compiles the mutated module, then the listed tests run,
  each under its own deadline as in serve.

Rules kept here: a mutant is killed only by a failing test or by a timeout, never by a
child that could not apply it (that is reported as an error and retried fresh); nothing
is ever written to the source tree."""
from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import signal
import sys
import time
import types

import pytest

from tools.mutate.operators import mutated_code

MODE = os.environ.get("MUTATE_MODE", "")
EXIT_CANNOT_PATCH = 77


def _module_name(path: str) -> str:
    return path[:-3].replace("/", ".").removesuffix(".__init__")


def _hypothesis_profile() -> None:
    # Same examples on every run: a mutant's fate must not depend on a random draw.
    if "hypothesis" not in sys.modules:       # its pytest plugin is off: no property tests here
        return
    from hypothesis import settings
    settings.register_profile("mutate", derandomize=True, deadline=None, database=None,
                              max_examples=int(os.environ.get("MUTATE_HYPOTHESIS_EXAMPLES", "50")))
    settings.load_profile("mutate")


def _selected(items: list, wanted: list[str]) -> list:
    by_id = {it.nodeid: it for it in items}
    return [by_id[n] for n in wanted if n in by_id]


# --- map ---------------------------------------------------------------------------------
class _Mapper:
    """Per-test line coverage of the targets, by coverage.py's C tracer with one context per
    test (a Python trace function made the traced run ten times slower than this)."""

    def __init__(self, targets: list[str]):
        import coverage
        root = os.getcwd()
        self.files = {os.path.join(root, t): t for t in targets}
        self.cov = coverage.Coverage(data_file=None, include=list(self.files), config_file=False,
                                     branch=False)
        self.tests: dict[str, dict] = {}
        self.spawned: set[str] = set()
        self.nodeid = ""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.nodeid = item.nodeid
        self.tests[item.nodeid] = {"passed": True, "seconds": 0.0}
        self.cov.switch_context(item.nodeid)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.tests[item.nodeid]["seconds"] = time.perf_counter() - start
            self.cov.switch_context("")

    def pytest_runtest_logreport(self, report):
        if report.failed or (report.when == "call" and report.skipped):
            self.tests.setdefault(report.nodeid, {})["passed"] = False

    def note_spawn(self) -> None:
        if self.nodeid:
            self.spawned.add(self.nodeid)

    def pytest_sessionfinish(self, session):
        self.cov.stop()
        data = self.cov.get_data()
        for abs_path in data.measured_files():
            rel = self.files.get(abs_path)
            if rel is None:
                continue
            for line, contexts in data.contexts_by_lineno(abs_path).items():
                for ctx in contexts:
                    if ctx in self.tests:
                        self.tests[ctx].setdefault("lines", {}).setdefault(rel, []).append(line)
        for n in self.spawned:
            self.tests.setdefault(n, {})["spawns"] = True
        with open(os.environ["MUTATE_OUT"], "w") as f:
            json.dump(self.tests, f)


def _install_spawn_watch(mapper: _Mapper) -> None:
    import subprocess
    original = subprocess.Popen.__init__

    def watched(self, *a, **kw):
        mapper.note_spawn()
        return original(self, *a, **kw)
    subprocess.Popen.__init__ = watched
    real_fork = os.fork

    def fork():
        mapper.note_spawn()
        return real_fork()
    os.fork = fork


# --- applying a mutant ----------------------------------------------------------------------
def _code_by_qualname(code: types.CodeType, out: dict) -> dict:
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out[c.co_qualname] = c
            _code_by_qualname(c, out)
    return out


def _shallow(code: types.CodeType) -> types.CodeType:
    """The code with its nested code objects replaced by their names: a class body or function
    is not itself changed when only a method or lambda inside it is."""
    return code.replace(co_consts=tuple(f"<code {c.co_qualname}>" if isinstance(c, types.CodeType) else c
                                        for c in code.co_consts))


def _live_functions(module: types.ModuleType) -> dict[str, types.FunctionType]:
    found: dict[str, types.FunctionType] = {}

    def take(obj, depth=0):
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                if f is not None:
                    take(f, depth)
            return
        while hasattr(obj, "__wrapped__") and isinstance(obj, types.FunctionType) is False:
            obj = obj.__wrapped__
        if isinstance(obj, types.FunctionType) and obj.__module__ == module.__name__:
            found.setdefault(obj.__code__.co_qualname, obj)
        elif isinstance(obj, type) and obj.__module__ == module.__name__ and depth < 3:
            for v in vars(obj).values():
                take(v, depth + 1)

    for v in list(vars(module).values()):
        take(v)
    return found


def _source(path: str) -> str:
    """The target's text as it was when the run began (the runner's copy): a file edited during
    a run must not shift which mutant an index names."""
    snapshot = os.environ.get("MUTATE_SOURCES")
    with open(os.path.join(snapshot, path) if snapshot else path) as f:
        return f.read()


def patch_in_place(path: str, index: int) -> int:
    """Swap the mutated functions' code into the imported module; returns how many changed.
    Raises LookupError when the mutant cannot be applied this way."""
    module = sys.modules.get(_module_name(path))
    if module is None:
        raise LookupError("module not imported")
    source = _source(path)
    new = _code_by_qualname(mutated_code(path, source, index, os.path.abspath(path)), {})
    old = _code_by_qualname(compile(source, os.path.abspath(path), "exec", dont_inherit=True), {})
    changed = [q for q, c in new.items() if q not in old or _shallow(old[q]) != _shallow(c)]
    if not changed or set(new) != set(old):
        raise LookupError("the mutant changes code outside functions")
    live = _live_functions(module)
    # a changed nested function or lambda is a constant of its enclosing function: patch the
    # outermost function that is reachable from the module, which carries it
    targets = set()
    for q in changed:
        parts = q.split(".")
        for k in range(1, len(parts) + 1):
            head = ".".join(parts[:k])
            if head in live:
                targets.add(head)
                break
        else:
            raise LookupError(f"{q} is not reachable from the module")
    for q in targets:
        fn = live[q]
        if len(fn.__code__.co_freevars) != len(new[q].co_freevars):
            raise LookupError(f"{q} changes its closure")
        fn.__code__ = new[q]
    return len(targets)


class _MutantFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, path: str, index: int):
        self.path, self.index, self.name = path, index, _module_name(path)
        self.loaded = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        return importlib.util.spec_from_file_location(fullname, os.path.abspath(self.path), loader=self,
                                                      submodule_search_locations=None)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        code = mutated_code(self.path, _source(self.path), self.index, os.path.abspath(self.path))
        try:
            exec(code, module.__dict__)
        except BaseException:
            # the mutant breaks the module's import (a conftest may be the importer, and pytest
            # then exits with a usage error): the runner counts it killed by this mark
            open(os.environ["MUTATE_IMPORT_FAILED"], "w").close()
            raise
        self.loaded = True


# --- running ---------------------------------------------------------------------------------
def _alarm(seconds: float) -> None:
    """From now, the process ends by SIGALRM's default action after `seconds` (0: never): the
    kernel's, so even a loop that never returns to the interpreter (in C) is stopped."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _run_items(items: list, deadlines: dict[str, float]) -> bool:
    """True when every item passed; each item runs under its own deadline."""
    from _pytest.runner import runtestprotocol
    for i, item in enumerate(items):
        nxt = items[i + 1] if i + 1 < len(items) else None
        _alarm(deadlines[item.nodeid])
        reports = runtestprotocol(item, nextitem=nxt, log=False)
        _alarm(0)
        if any(rep.failed for rep in reports):
            return False    # the child exits now: nothing left to tear down for
    return True


def _serve(session) -> None:
    with open(os.environ["MUTATE_JOBS"]) as f:
        jobs = json.load(f)
    out = open(os.environ["MUTATE_OUT"], "a")
    for job in jobs:
        items = _selected(session.items, list(job["deadlines"]))
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                try:
                    patch_in_place(job["path"], job["index"])
                except LookupError:
                    os._exit(EXIT_CANNOT_PATCH)
                code = 0 if _run_items(items, job["deadlines"]) else 1
            finally:
                os._exit(code)
        deadline = start + sum(job["deadlines"].values()) + job["backstop_s"]
        status = None
        while status is None:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(raw)
            elif time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = "timeout"
            else:
                time.sleep(0.01)
        out.write(json.dumps({"id": job["id"], "status": status,
                              "seconds": round(time.monotonic() - start, 3)}) + "\n")
        out.flush()


def _install_fresh() -> _MutantFinder | None:
    """In fresh mode the import hook goes in when this plugin is imported (`-p`), before any
    conftest (the simulation's imports the whole core) can import the target unmutated."""
    path, index = os.environ["MUTATE_PATH"], int(os.environ["MUTATE_INDEX"])
    if _module_name(path) in sys.modules:
        return None
    finder = _MutantFinder(path, index)
    sys.meta_path.insert(0, finder)
    return finder


_FRESH = _install_fresh() if MODE == "fresh" else None


def pytest_configure(config):
    _hypothesis_profile()
    if MODE == "map":
        mapper = _Mapper(os.environ["MUTATE_TARGETS"].split(","))
        _install_spawn_watch(mapper)
        config.pluginmanager.register(mapper, "mutate-mapper")
        mapper.cov.start()
    elif MODE == "fresh":
        if _FRESH is None:
            raise pytest.UsageError(f"{os.environ['MUTATE_PATH']} was imported before the mutant could be put in place")
        config._mutate_finder = _FRESH


def pytest_collection_modifyitems(session, config, items):
    if MODE == "fresh":
        with open(os.environ["MUTATE_TESTS"]) as f:
            config._mutate_deadlines = json.load(f)      # {nodeid: seconds}, in order
        keep = _selected(items, list(config._mutate_deadlines))
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if MODE != "fresh":
        yield
        return
    _alarm(item.config._mutate_deadlines[item.nodeid])
    try:
        yield
    finally:
        _alarm(0)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    if MODE == "serve":
        _serve(session)
        return True
    if MODE == "fresh" and not session.config._mutate_finder.loaded:
        raise pytest.UsageError("the mutated module was never imported by the selected tests")
    return None
