"""An install on a machine without a C compiler: a fresh venv, `CC=false pip install` of this
tree, no native module, the core unit tests passing on the pure-Python path, a node of that
install and a node with the native scanner replicating both ways to the same data, and the
hints for the extras it lacks (spark, s3).

About 45 s (the venv and its dependencies come from pip's cache after the first run); it
needs the package index the project's setup uses, like scripts/setup.sh."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import venv

import pytest

from tests.integration.harness import ReplogProcess, mesh, wait_for

REPO = pathlib.Path(__file__).resolve().parents[2]
# The unit tests whose code takes the native scanner when it is there (node/core/rowscan.py's users:
# validation, the WAL and recovery, receive_run, the relay's tail, client sessions and admission,
# the journal): here they run on the pure-Python path. Tests of code with no native path are left out.
CORE_TESTS = ["test_validate.py", "test_row_rule_copies.py", "test_wal.py", "test_recovery.py", "test_receive_run.py",
              "test_relay_tail.py", "test_session.py", "test_admission.py", "test_journal_fsync.py"]
PYTEST_INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
markers =
    slow: long-running tests
addopts = -m "not slow"
"""


def _copy_tracked(dest: pathlib.Path) -> None:
    """The tree as git tracks it (working copy): no build/, no .so built in place by the dev install."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in files.decode().split("\0"):
        if rel and (REPO / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest / rel)


@pytest.fixture(scope="module")
def nocc(tmp_path_factory) -> pathlib.Path:
    """A venv holding replog installed with CC=false; returns its bin/ directory."""
    root = tmp_path_factory.mktemp("nocc")
    src = root / "src"
    _copy_tracked(src)
    # No pip of its own (ensurepip costs ~8 s): this run's pip installs into it (`pip --python`),
    # this tree and the test tools in one resolve.
    venv.create(root / "venv", with_pip=False)
    bin_dir = root / "venv" / "bin"
    env = dict(os.environ, CC="false", CXX="false", PIP_DISABLE_PIP_VERSION_CHECK="1")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", str(src),
                        "pytest>=8", "pytest-asyncio>=1.0", "hypothesis>=6"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return bin_dir


def _py(nocc: pathlib.Path, code: str) -> str:
    r = subprocess.run([str(nocc / "python"), "-c", code], capture_output=True, text=True, cwd="/", timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_the_install_without_a_compiler_has_no_native_module_and_passes_the_core_unit_tests(nocc, tmp_path):
    assert _py(nocc, "from node.core import rowscan; print(rowscan.native is None)") == "True"
    assert _py(nocc, "import node, os; print(os.path.dirname(node.__file__))").startswith(str(nocc.parent))
    # the version the build wrote into the install's metadata is node/version.py's, the one replog reports
    installed, reported = _py(nocc, "import importlib.metadata as m, node.version as v; "
                                    "print(m.version('replog'), v.version())").split()
    assert installed == reported and reported[0].isdigit(), (installed, reported)
    tests = tmp_path / "t"
    shutil.copytree(REPO / "tests", tests / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    (tests / "pytest.ini").write_text(PYTEST_INI)
    r = subprocess.run([str(nocc / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not native",
                        *[f"tests/unit/{t}" for t in CORE_TESTS]],
                       capture_output=True, text=True, cwd=tests, timeout=900)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    assert " passed" in r.stdout.splitlines()[-1] and " failed" not in r.stdout.splitlines()[-1]


class PureNode(ReplogProcess):
    """A node run by the no-compiler install's console script (its own node package, pure Python)."""
    bin_dir: pathlib.Path

    def argv(self) -> list[str]:
        return [str(self.bin_dir / "replog")] + super().argv()[3:]


def test_a_pure_python_node_and_a_native_node_replicate_to_the_same_data(nocc, tmp_path, procs):
    from node.core import rowscan
    assert rowscan.native is not None, "this side of the comparison needs the native scanner (pip install -e .)"
    [native] = mesh(tmp_path, 1)
    procs.append(native)
    PureNode.bin_dir = nocc
    pure = PureNode(tmp_path, "pure", peers=[native]).start(timeout=60)
    procs.append(pure)
    native.set_peers([pure])
    native.create_space("kv")
    wait_for(lambda: pure.get("/v1/spaces")[1]["spaces"], 20, "the space on the pure node")
    for i in range(200):                      # single rows and many-row transactions, from both sides
        (native if i % 2 else pure).kv_put("kv", f"k{i:03d}", {"i": i, "s": "x" * (i % 50)})
    for side in (native, pure):
        s, d = side.post("/v1/txn", {"ops": [{"op": "put", "space": "kv", "key": f"t-{side.name}-{j}", "value": j}
                                             for j in range(100)]})
        assert s == 200, d
    wait_for(lambda: native.info()["vclock_uuid"] == pure.info()["vclock_uuid"], 30, "both hold every row")
    a = native.get("/v1/spaces/kv/keys?limit=1000")[1]["items"]
    b = pure.get("/v1/spaces/kv/keys?limit=1000")[1]["items"]
    assert len(a) == 400 and a == b


def test_the_missing_extras_are_named_in_one_line(nocc, tmp_path):
    r = subprocess.run([str(nocc / "replog"), "analyze", str(tmp_path)], capture_output=True, text=True,
                       cwd="/", timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "replog: error: replog analyze needs pyspark: install the spark extra (pip install 'replog[spark]'; "
        "Java 17 too)"]
    r = subprocess.run([str(nocc / "replog"), "serve", "--data-dir", str(tmp_path / "d"), "--identity", "lease",
                        "--lease-store", "s3://bucket/p", "--cluster-size", "3"], capture_output=True, text=True,
                       cwd="/", timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "replog: error: lease_store: s3:// lease stores need boto3: pip install 'replog[s3]'"]
    assert json.loads(_py(nocc, "import json, importlib.util as u; print(json.dumps("
                               "[u.find_spec(m) is None for m in ('pyspark', 'boto3')]))")) == [True, True]
