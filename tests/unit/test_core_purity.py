"""The protocol core imports no IO: no asyncio, aiohttp, lmdb, sockets or clocks."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORE = sorted([*ROOT.glob("node/core/*.py"), *ROOT.glob("node/cluster_space/*.py"),
               *ROOT.glob("node/core/link/*.py"), ROOT / "node/identity/lease.py", ROOT / "node/identity/signature.py",
               ROOT / "node/clientproto/wire.py"])
FORBIDDEN = {"asyncio", "aiohttp", "lmdb", "socket", "time", "os", "subprocess", "threading", "random", "boto3"}


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_core_module_imports_no_io(path):
    tree = ast.parse(path.read_text())
    bad = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad |= {a.name.split(".")[0] for a in node.names} & FORBIDDEN
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in FORBIDDEN:
                bad.add(node.module)
    assert not bad, f"{path.name} imports {sorted(bad)}"
