"""The mutation runner (tools/mutate) on a tiny tree whose mutants' fates are known: it must
call a mutant killed only when a test fails, list a survivor by file:line, leave out a listed
equivalent, put a mutant of import-time code in place before import, and leave out a test
that starts a process."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tools.mutate.operators import mutants_of, mutated_code

REPO = Path(__file__).resolve().parents[2]

TINY = '''\
"""A tiny module with known mutants."""
LIMIT = 10


def clamp(x, lo):
    if x < lo:
        return lo
    return min(x, LIMIT)


def spawned(a):
    return -a
'''

TESTS = '''\
import subprocess
import sys

from pkg.tiny import clamp, spawned


def test_clamp_raises_to_the_floor_and_caps_at_the_limit():
    assert clamp(-3, 0) == 0
    assert clamp(4, 0) == 4
    assert clamp(12, 0) == 10


def test_a_test_that_starts_a_process_is_left_out():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert spawned(3) == -3
'''


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "tiny.py").write_text(TINY)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_tiny.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\npythonpath = .\n"
                                           # the tiny tree has no property or asyncio tests: start fast
                                           "addopts = -p no:hypothesispytest -p no:asyncio\n")
    (tmp_path / "equivalent.txt").write_text(
        "pkg/tiny.py:6: < -> <=  | if x < lo:  # at x == lo both branches return lo\n")
    return tmp_path


def test_mutants_are_made_deterministically_and_compile_under_the_real_file_name():
    a, b = mutants_of("pkg/tiny.py", TINY), mutants_of("pkg/tiny.py", TINY)
    assert a == b
    labels = {(m.line, m.label) for m in a}
    assert {(6, "< -> >="), (6, "< -> <="), (8, "min -> max"), (7, "delete statement"), (2, "10 -> 11"),
            (12, "remove unary usub")} <= labels
    assert (8, "swap arguments 1 and 2") not in labels, "min and max are symmetric: no swap"
    assert not any(m.line == 1 for m in a), "the docstring is not mutated"
    code = mutated_code("pkg/tiny.py", TINY, next(m.index for m in a if m.label == "min -> max"), "/x/pkg/tiny.py")
    namespace: dict = {}
    exec(code, namespace)
    assert namespace["clamp"](4, 0) == 10 and code.co_filename == "/x/pkg/tiny.py"


def test_the_runner_scores_a_tiny_module_and_names_its_survivors(tmp_path):
    root = _tree(tmp_path)
    r = subprocess.run([sys.executable, "-m", "tools.mutate", "--root", str(root), "--tests", "tests",
                        "--equivalents", str(root / "equivalent.txt"), "--json", str(root / "out.json"),
                        "pkg/tiny.py"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import json
    by = {(o["line"], o["label"]): o["status"] for o in json.loads((root / "out.json").read_text())}
    assert by[(6, "< -> >=")] == "killed"
    assert by[(8, "min -> max")] == "killed"
    assert by[(6, "< -> <=")] == "equivalent"
    # import-time code: the limit moved by one is seen by the cap test
    assert by[(2, "10 -> 11")] == "killed"
    assert by[(2, "10 -> 9")] == "killed"
    assert by[(7, "delete statement")] == "killed"
    # only a test that starts a process runs spawned(): it is left out, so nothing covers it
    assert by[(12, "remove unary usub")] == "no test runs it"
    assert "pkg/tiny.py:12: remove unary usub  | return -a" in r.stdout
    killed = sum(1 for s in by.values() if s == "killed")
    counted = sum(1 for s in by.values() if s != "equivalent")
    assert f"{killed:7d} {counted:5d}" in r.stdout, r.stdout


def test_a_module_of_constants_only_is_tested_through_the_targets_that_import_it(tmp_path, monkeypatch):
    """No test runs a line of a module of constants (its lines run at import, before any test):
    its mutants take the tests of the targets that import it, not "no test runs it"."""
    import tools.mutate.__main__ as runner
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "consts.py").write_text("A = 1\n")
    (tmp_path / "pkg" / "user.py").write_text("from pkg.consts import A\n\n\ndef f():\n    return A\n")
    (tmp_path / "pkg" / "other.py").write_text("import pkg.user\n")
    monkeypatch.setattr(runner, "ROOT", tmp_path)
    users = runner.importers(["pkg/consts.py", "pkg/user.py", "pkg/other.py"])
    assert users == {"pkg/consts.py": ["pkg/user.py"], "pkg/user.py": ["pkg/other.py"], "pkg/other.py": []}
    [m] = [m for m in mutants_of("pkg/consts.py", "A = 1\n") if m.label == "1 -> 2"]
    tests = {"t::uses_f": {"seconds": 1.0, "lines": {"pkg/user.py": [5]}}, "t::other": {"seconds": 1.0, "lines": {}}}
    assert runner._select(m, tests, 4) == []
    assert runner._select(m, tests, 4, users) == ["t::uses_f"]


LOOPS = '''\
"""Two mutants that loop forever: one of a function body, one of a default value (import time)."""


def countdown(n, step=1):
    while n > 0:
        n -= step
    return n
'''

LOOPS_TESTS = '''\
from pkg.loops import countdown


def test_countdown_ends_at_zero():
    assert countdown(3) == 0
'''


def test_a_mutant_that_loops_forever_is_stopped_at_its_tests_deadline_and_listed_apart(tmp_path):
    """`n -= step` deleted or made `+=` (run in a forked worker) and `step=1` made 0 (import-time
    code: a fresh pytest) loop for ever. The unmutated test takes milliseconds, so each mutant's deadline is
    the minimum given (2 s): each must be killed as "timeout" within seconds, counted killed, and
    listed apart from the tests' kills."""
    root = _tree(tmp_path)
    (root / "pkg" / "loops.py").write_text(LOOPS)
    (root / "tests" / "test_tiny.py").unlink()
    (root / "tests" / "test_loops.py").write_text(LOOPS_TESTS)
    r = subprocess.run([sys.executable, "-m", "tools.mutate", "--root", str(root), "--tests", "tests",
                        "--equivalents", str(root / "equivalent.txt"), "--json", str(root / "out.json"),
                        "--deadline-min", "2", "pkg/loops.py", "--line", "4,6"],
                       cwd=REPO, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    import json
    by = {(o["line"], o["label"]): o for o in json.loads((root / "out.json").read_text())}
    for key in ((6, "delete statement"), (6, "-= -> +="), (4, "1 -> 0")):
        assert (by[key]["status"], by[key]["how"]) == ("killed", "timeout"), by[key]
        # 2 s of test, plus a fresh pytest's start for the default's mutant (seconds, more on a
        # loaded machine): stopped by its own deadline, so before the parent's backstop (30 s past
        # the deadlines, 32 s here) would have stopped it
        assert by[key]["seconds"] < 30, by[key]
    assert (by[(4, "1 -> 2")]["status"], by[(4, "1 -> 2")]["how"]) == ("killed", "a test failed")
    late = r.stdout.split("killed by their deadline, counted killed (3):\n", 1)
    assert len(late) == 2, r.stdout
    assert "pkg/loops.py:4: 1 -> 0  | def countdown(n, step=1):" in late[1]
    assert "pkg/loops.py:6: delete statement  | n -= step" in late[1]
    assert "pkg/loops.py:6: -= -> +=  | n -= step" in late[1]
    # the module's row: every mutant run killed (no survivor), three of them by the clock
    row = next(line for line in r.stdout.splitlines() if line.startswith("pkg/loops.py "))
    assert row.split()[4] == "0" and row.split()[-1] == "3", row


def test_a_tests_deadline_is_the_factor_times_its_unmutated_time_but_never_below_the_minimum(monkeypatch):
    import tools.mutate.__main__ as runner
    monkeypatch.setattr(runner, "DEADLINE_FACTOR", 10.0)
    monkeypatch.setattr(runner, "DEADLINE_MIN_S", 30.0)
    tests = {"a::fast": {"seconds": 0.2}, "b::slow": {"seconds": 4.5}, "c::edge": {"seconds": 3.0}}
    got = runner.deadlines_s(["b::slow", "a::fast", "c::edge"], tests)
    assert got == {"b::slow": 45.0, "a::fast": 30.0, "c::edge": 30.0}
    assert list(got) == ["b::slow", "a::fast", "c::edge"], "the tests keep the order they run in"


def test_a_deadline_option_that_is_not_a_positive_number_is_refused_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tools.mutate", "--root", str(tmp_path), "--deadline-min", "0",
                        "x.py"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "expected a number above 0, got '0'" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_fresh_mutant_first_runs_the_test_files_that_reach_most_of_its_module():
    """A mutant of import-time code runs in a fresh pytest that collects every file it is given:
    the files whose tests run the most lines of the module come first, the rest only if it survives."""
    import tools.mutate.__main__ as runner
    tests = {"t_other.py::fast": {"seconds": 0.01, "lines": {"m.py": [3]}},
             "t_own.py::a": {"seconds": 0.2, "lines": {"m.py": [3, 4, 5, 6]}},
             "t_own.py::b": {"seconds": 0.3, "lines": {"m.py": [7]}},
             "t_near.py::c": {"seconds": 0.1, "lines": {"m.py": [3, 4]}},
             "t_far.py::d": {"seconds": 0.05, "lines": {"m.py": [3]}}}
    selected = sorted(tests, key=lambda n: tests[n]["seconds"])
    assert runner._fresh_stages(selected, tests, "m.py") == [
        ["t_near.py::c", "t_own.py::a", "t_own.py::b"], ["t_other.py::fast", "t_far.py::d"]]


def test_a_run_with_again_takes_the_earlier_kills_and_runs_none_of_them_again(tmp_path):
    root = _tree(tmp_path)
    base = [sys.executable, "-m", "tools.mutate", "--root", str(root), "--tests", "tests",
            "--equivalents", str(root / "equivalent.txt"), "pkg/tiny.py"]
    first = subprocess.run(base + ["--json", str(root / "one.json")], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
    assert first.returncode == 0, first.stderr
    again = subprocess.run(base + ["--again", str(root / "one.json"), "--json", str(root / "two.json")], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    import json
    one = json.loads((root / "one.json").read_text())
    two = json.loads((root / "two.json").read_text())
    assert len(one) == len(two)
    for a, b in zip(one, two):
        if a["status"] == "killed":
            assert (b["status"], b["how"]) == ("killed", a["how"] + " (earlier run)"), b
        else:
            assert b["status"] == a["status"], b
    assert "0 mutants to run" in again.stderr, again.stderr
