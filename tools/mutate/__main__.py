"""Mutation testing of replog's core: `python -m tools.mutate [TARGET ...]` (see README.md here).

Makes the mutants of each target (tools/mutate/operators.py), runs for each only the tests
that execute its lines (a map recorded once per change of the tests or targets, kept in
.mutate/), fastest first, stopping at the first failure, and prints the score per module
and per group with every survivor as file:line. Mutants listed in equivalent.txt (they
change no behaviour) are left out of the score and listed apart.

Rules kept here: only tests/unit and tests/sim run, and of those none that starts a
process; the work runs niced, on at most two workers (the machine is shared)."""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.mutate.operators import Mutant, mutants_of
from tools.mutate.outcomes import (EQUIVALENT, ERROR, KILLED, UNCOVERED, Outcome, earlier_kills, equivalent_reason,
                                   judge, load_equivalents, report)

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ROOT = REPO                   # the tree mutated and tested (--root: the runner's own test uses a tiny one)
STATE = ROOT / ".mutate"
TEST_DIRS: tuple[str, ...] = ("tests/unit", "tests/sim")
SELF_TEST = "tests/unit/test_mutation_runner.py"     # runs the runner: never part of a mutation run
GROUPS = {
    "core": sorted(str(p.relative_to(REPO)) for p in (REPO / "node/core").rglob("*.py")
                   if p.name != "__init__.py"),      # with node/core/link/
    "cluster_space": ["node/cluster_space/idmap.py", "node/cluster_space/resolver.py",
                      "node/cluster_space/table.py"],
    "wal_format": ["node/wal/format.py"],
}
SOURCES: Path | None = None   # this run's copy of the targets, as they were when it began


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the map: which tests run which lines -------------------------------------------------------
def _test_files() -> list[Path]:
    return sorted(p for d in TEST_DIRS for p in (ROOT / d).rglob("*.py") if str(p.relative_to(ROOT)) != SELF_TEST)


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _targets_key(targets: list[str], seeds: str, examples: str) -> str:
    """What every test's record depends on: the targets' text, the seeds, the examples, and the
    test tree's helpers (conftest, harnesses): a change there maps every test again."""
    h = hashlib.sha256(f"{seeds}|{examples}|{','.join(targets)}".encode())
    helpers = [p for p in _test_files() if not p.name.startswith("test_")]
    for p in helpers + [ROOT / t for t in targets]:
        h.update(str(p).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    if SOURCES is not None:
        env["MUTATE_SOURCES"] = str(SOURCES)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _pytest(*args: str) -> list[str]:
    return ["nice", "-n", "10", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-p", "tools.mutate.plugin", *args]


def _trace(test_paths: list[str], targets: list[str], seeds: str, examples: str) -> tuple[dict, int]:
    with tempfile.NamedTemporaryFile(dir=STATE, suffix=".json", delete=False) as tmp:
        out = tmp.name
    cmd = _pytest(*test_paths, "--ignore", SELF_TEST)
    with open(STATE / "map.log", "w") as log:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             env=_env(MUTATE_MODE="map", MUTATE_TARGETS=",".join(targets), MUTATE_OUT=out,
                                      REPLOG_SIM_SEEDS=seeds, MUTATE_HYPOTHESIS_EXAMPLES=examples))
    text = Path(out).read_text()
    os.unlink(out)
    return (json.loads(text) if text else {}), rc


def load_map(targets: list[str], seeds: str, examples: str, remap: bool) -> dict:
    """The map of which tests run which lines. A change to one test file maps only that file
    again; a change to a target or a test helper maps everything."""
    STATE.mkdir(exist_ok=True)
    key = _targets_key(targets, seeds, examples)
    path = STATE / "map.json"
    files = {str(p.relative_to(ROOT)): _digest(p) for p in _test_files() if p.name.startswith("test_")}
    cached = json.loads(path.read_text()) if path.exists() and not remap else {}
    if cached.get("key") == key and "files" in cached:
        stale = sorted(f for f, d in files.items() if cached["files"].get(f) != d)
        tests = {n: t for n, t in cached["tests"].items() if n.split("::", 1)[0] in files
                 and n.split("::", 1)[0] not in stale}
        if not stale:
            return tests
        run = stale
    else:
        tests, run = {}, list(TEST_DIRS)
    _say(f"mapping which tests of {len(run)} paths run which lines of {len(targets)} files "
         "(one unmutated run, traced) ...")
    start = time.monotonic()
    new, rc = _trace(run, targets, seeds, examples)
    tests.update(new)
    failing = [n for n, t in new.items() if not t.get("passed")]
    _say(f"mapped {len(new)} tests in {time.monotonic() - start:.0f} s (pytest exit {rc}; "
         f"{len(failing)} failing or skipped, left out; "
         f"{sum(1 for t in new.values() if t.get('spawns'))} start a process, left out)")
    path.write_text(json.dumps({"key": key, "files": files, "tests": tests}))
    return tests


def _usable(tests: dict) -> dict:
    return {n: t for n, t in tests.items() if t.get("passed") and not t.get("spawns")}


def importers(targets: list[str]) -> dict[str, list[str]]:
    """For each target, the other targets that import it (by their import statements)."""
    names = {t[:-3].replace("/", "."): t for t in targets}
    out: dict[str, list[str]] = {t: [] for t in targets}
    for t in targets:
        seen: set[str] = set()
        for node in ast.walk(ast.parse((ROOT / t).read_text())):
            if isinstance(node, ast.Import):
                seen.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                seen.add(node.module)
                seen.update(f"{node.module}.{a.name}" for a in node.names)
        for name in seen & set(names):
            if names[name] != t:
                out[names[name]].append(t)
    return out


def _select(m: Mutant, tests: dict, variants_max: int, users: dict[str, list[str]] | None = None) -> list[str]:
    lines = set(range(m.line, m.end_line + 1))
    if m.in_function:
        hit = [n for n, t in tests.items() if lines & set(t.get("lines", {}).get(m.path, ()))]
    else:   # runs at import: every test that uses the module at all
        hit = [n for n, t in tests.items() if t.get("lines", {}).get(m.path)]
        if not hit and users:
            # a module of constants only (no function a test could run): it is used through
            # the targets that import it
            hit = [n for n, t in tests.items() if any(t.get("lines", {}).get(u) for u in users.get(m.path, ()))]
    hit.sort(key=lambda n: (tests[n]["seconds"], n))
    # A seeded simulation test runs the whole core on every seed: a mutant its first few seeds
    # miss, the next ones almost never catch, and a survivor would run them all.
    seen: dict[str, int] = {}
    out = []
    for n in hit:
        fn = n.split("[", 1)[0]
        if n.startswith("tests/sim/") and "[" in n:
            seen[fn] = seen.get(fn, 0) + 1
            if seen[fn] > variants_max:
                continue
        out.append(n)
    return out


# A mutant's deadline is per test, relative to that test's unmutated run: a mutant that loops
# forever in one test then costs at most max(DEADLINE_MIN_S, DEADLINE_FACTOR x its time), not the
# whole selection's allowance (a validate.py mutant once waited out 9 minutes). The map's times
# are traced, so already slower than a mutant's run; the factor covers a loaded machine.
DEADLINE_FACTOR = 10.0
DEADLINE_MIN_S = 30.0
BACKSTOP_S = 30.0           # on top of the tests' deadlines: the parent's kill if the child's alarm fails
FRESH_COLLECT_S = 300.0     # a fresh pytest collects its files (40 to 90 s loaded) before any test


def deadlines_s(selected: list[str], tests: dict) -> dict[str, float]:
    """Each selected test's deadline, in its order."""
    return {n: round(max(DEADLINE_MIN_S, DEADLINE_FACTOR * tests[n]["seconds"]), 3) for n in selected}


# --- running ----------------------------------------------------------------------------------
def _files_of(nodeids: list[str]) -> list[str]:
    return sorted({n.split("::", 1)[0] for n in nodeids})


def run_served(outcomes: list[Outcome], tests: dict, workers: int, progress) -> list[Outcome]:
    """Runs in forked children of long-lived pytest processes; returns those that need a fresh one."""
    if not outcomes:
        return []
    by_id = {str(i): o for i, o in enumerate(outcomes)}
    shares = [list(by_id.items())[w::workers] for w in range(workers)]
    procs = []
    for w, share in enumerate(shares):
        if not share:
            continue
        jobs = [{"id": i, "path": o.mutant.path, "index": o.mutant.index,
                 "deadlines": deadlines_s(o.tests, tests), "backstop_s": BACKSTOP_S} for i, o in share]
        # named by this run's pid too: two runs (two modules) may share the state folder
        jobs_path, out_path = STATE / f"jobs-{os.getpid()}-{w}.json", STATE / f"out-{os.getpid()}-{w}.jsonl"
        jobs_path.write_text(json.dumps(jobs))
        out_path.write_text("")
        files = _files_of([n for _, o in share for n in o.tests])
        log = open(STATE / f"worker-{os.getpid()}-{w}.log", "w")
        procs.append((subprocess.Popen(_pytest(*files), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                       env=_env(MUTATE_MODE="serve", MUTATE_JOBS=str(jobs_path),
                                                MUTATE_OUT=str(out_path))), out_path))
    seen: set[str] = set()
    retry = []
    while True:
        alive = [p for p, _ in procs if p.poll() is None]
        for _, out_path in procs:
            for line in out_path.read_text().splitlines():
                r = json.loads(line)
                if r["id"] in seen:
                    continue
                seen.add(r["id"])
                o = by_id[r["id"]]
                o.seconds = r["seconds"]
                if r["status"] == 77:
                    retry.append(o)
                    continue
                o.status, o.how = judge(r["status"])
                progress(o)
        if not alive:
            break
        time.sleep(0.5)
    for o in by_id.values():
        if not o.status and o not in retry:
            o.status, o.how = ERROR, "its worker stopped before reporting it (see .mutate/worker-*.log)"
            progress(o)
    return retry


FRESH_FIRST_FILES = 2   # a fresh mutant first runs the tests of the files that reach its module most (below)


def _fresh_stages(selected: list[str], tests: dict, path: str) -> list[list[str]]:
    """The selected tests (fastest first) in two stages: those of the FRESH_FIRST_FILES test
    files whose tests run the most lines of the mutated module (its own tests, most often),
    then the rest. A fresh pytest collects every file it is given before it runs a test, and
    most mutants of import-time code fail in the module's own tests: the rest (often the whole
    unit suite) are collected only for a mutant that survives them."""
    reach: dict[str, set[int]] = {}
    for n in selected:
        reach.setdefault(n.split("::", 1)[0], set()).update(tests[n].get("lines", {}).get(path, ()))
    files = list(reach)         # in the order of their fastest test
    files.sort(key=lambda f: -len(reach[f]))     # stable: of files that reach as much, the fastest first
    first = set(files[:FRESH_FIRST_FILES])
    head = [n for n in selected if n.split("::", 1)[0] in first]
    rest = [n for n in selected if n.split("::", 1)[0] not in first]
    return [head, rest] if rest else [head]


def _run_fresh_tests(o: Outcome, selected: list[str], tests: dict):
    deadlines = deadlines_s(selected, tests)
    with tempfile.NamedTemporaryFile("w", dir=STATE, suffix=".json", delete=False) as f:
        json.dump(deadlines, f)
    failed_import = Path(f.name + ".import-failed")
    try:
        rc = subprocess.call(_pytest("-x", *_files_of(selected)), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL,
                             timeout=FRESH_COLLECT_S + sum(deadlines.values()) + BACKSTOP_S,
                             env=_env(MUTATE_MODE="fresh", MUTATE_PATH=o.mutant.path,
                                      MUTATE_INDEX=str(o.mutant.index), MUTATE_TESTS=f.name,
                                      MUTATE_IMPORT_FAILED=str(failed_import)))
    except subprocess.TimeoutExpired:
        rc = "timeout"
    if failed_import.exists():
        rc = 2                   # the mutated module no longer imports
        failed_import.unlink()
    os.unlink(f.name)
    return rc


def run_fresh(o: Outcome, tests: dict) -> None:
    start = time.monotonic()
    for selected in _fresh_stages(o.tests, tests, o.mutant.path):
        rc = _run_fresh_tests(o, selected, tests)
        if rc != 0:
            break
    o.seconds = time.monotonic() - start
    o.status, o.how = judge(rc)


def _lines(text: str) -> list[int]:
    """--line's value: one line number, or several separated by commas."""
    try:
        return [int(n) for n in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected line numbers such as 134 or 134,150, got {text!r}") from None


def _seconds(text: str) -> float:
    """--deadline-*'s value: a number above zero."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
    return value


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.mutate", description=__doc__.split("\n\n")[0])
    p.add_argument("targets", nargs="*", help="files (node/core/vclock.py) or groups: " + ", ".join(GROUPS)
                   + " (default: all groups)")
    p.add_argument("--jobs", type=int, default=1, choices=(1, 2), help="workers (the machine is shared; default 1)")
    p.add_argument("--sim-seeds", default="0-60", help="seeded simulation runs used (REPLOG_SIM_SEEDS; default 0-60)")
    p.add_argument("--sim-variants", type=int, default=12,
                   help="at most this many seeds of one seeded simulation test per mutant, the fastest (default 12)")
    p.add_argument("--examples", default="50", help="hypothesis examples per property test (default 50)")
    p.add_argument("--deadline-factor", type=_seconds, default=DEADLINE_FACTOR,
                   help=f"a test's deadline under a mutant: this many times its unmutated (traced) time "
                        f"(default {DEADLINE_FACTOR:g})")
    p.add_argument("--deadline-min", type=_seconds, default=DEADLINE_MIN_S,
                   help=f"and at least this many seconds (default {DEADLINE_MIN_S:g})")
    p.add_argument("--line", type=_lines, help="only mutants on this line, or these lines: 134,150 (with one file)")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--remap", action="store_true", help="record the test map again even if nothing changed")
    p.add_argument("--json", help="also write every outcome to this file")
    p.add_argument("--again", metavar="JSON",
                   help="take the killed mutants of an earlier --json run of the same source as killed and run only "
                        "the rest (after adding tests; a mutant is matched by file, line, mutation and text)")
    p.add_argument("--root", help="the tree to work in (default: this repository)")
    p.add_argument("--tests", nargs="+", help="test folders under the root (default: tests/unit tests/sim)")
    p.add_argument("--equivalents", help="the equivalent-mutant list (default: tools/mutate/equivalent.txt)")
    return p.parse_args()


def main() -> int:
    global ROOT, STATE, TEST_DIRS, SOURCES, DEADLINE_FACTOR, DEADLINE_MIN_S
    a = _parse()
    DEADLINE_FACTOR, DEADLINE_MIN_S = a.deadline_factor, a.deadline_min
    if a.root:
        ROOT = Path(a.root).resolve()
        STATE = ROOT / ".mutate"
    if a.tests:
        TEST_DIRS = tuple(a.tests)
    os.chdir(ROOT)
    groups: dict[str, list[str]] = {}
    for t in a.targets or list(GROUPS):
        if t in GROUPS and ROOT == REPO:
            groups[t] = GROUPS[t]
        elif (ROOT / t).is_file() and t.endswith(".py"):
            groups.setdefault(t, []).append(t)
        else:
            print(f"mutate: {t!r} is neither a .py file nor a group ({', '.join(GROUPS)})", file=sys.stderr)
            return 2
    files = [f for fs in groups.values() for f in fs]
    texts = {f: (ROOT / f).read_text() for f in files}
    mutants = [m for f in files for m in mutants_of(f, texts[f])]
    keys: dict[tuple, int] = {}       # per key, how many mutants of the whole file have it
    for m in mutants:
        keys[m.key] = keys.get(m.key, 0) + 1
    if a.line is not None:
        mutants = [m for m in mutants if any(m.line <= n <= m.end_line for n in a.line)]
    if a.list:
        print("\n".join(m.describe() for m in mutants))
        return 0
    os.nice(10)
    start = time.monotonic()
    STATE.mkdir(exist_ok=True)
    SOURCES = Path(tempfile.mkdtemp(prefix="src-", dir=STATE))
    for f, text in texts.items():
        (SOURCES / f).parent.mkdir(parents=True, exist_ok=True)
        (SOURCES / f).write_text(text)
    map_targets = sorted(set(files) | ({f for fs in GROUPS.values() for f in fs} if ROOT == REPO else set()))
    tests = _usable(load_map(map_targets, a.sim_seeds, a.examples, a.remap))
    users = importers(map_targets)
    equivalents = load_equivalents(Path(a.equivalents) if a.equivalents else HERE / "equivalent.txt")
    outcomes = [Outcome(m) for m in mutants]
    earlier = earlier_kills(Path(a.again)) if a.again else {}
    todo = []
    nth: dict[tuple, int] = {}
    for o in outcomes:
        m = o.mutant
        where = (m.path, m.line, m.label, m.snippet)
        nth[where] = nth.get(where, 0) + 1
        if (*where, nth[where]) in earlier:
            o.status, o.how = KILLED, earlier[(*where, nth[where])]
            continue
        why = equivalent_reason(o.mutant, equivalents, keys[o.mutant.key])
        if why is not None:
            o.status, o.how = EQUIVALENT, why
            continue
        o.tests = _select(o.mutant, tests, a.sim_variants, users)
        if not o.tests:
            o.status = UNCOVERED
        else:
            todo.append(o)
    done = [len(outcomes) - len(todo)]

    def progress(o: Outcome) -> None:
        done[0] += 1
        if done[0] % 25 == 0 or done[0] == len(outcomes):
            _say(f"  {done[0]}/{len(outcomes)} mutants, {time.monotonic() - start:.0f} s")

    _say(f"{len(todo)} mutants to run ({len(outcomes) - len(todo)} equivalent or untested), {a.jobs} worker(s)")
    served = [o for o in todo if o.mutant.in_function]
    fresh = [o for o in todo if not o.mutant.in_function]
    fresh += run_served(served, tests, a.jobs, progress)
    for o in fresh:
        run_fresh(o, tests)
        progress(o)
    shutil.rmtree(SOURCES, ignore_errors=True)
    text = report(outcomes, groups, time.monotonic() - start)
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps([{"path": o.mutant.path, "line": o.mutant.line, "label": o.mutant.label,
                                             "snippet": o.mutant.snippet, "status": o.status, "how": o.how,
                                             "seconds": round(o.seconds, 2)} for o in outcomes], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
