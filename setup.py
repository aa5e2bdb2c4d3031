"""Native extensions; everything else about the package is in pyproject.toml.

One Extension per module, in this list: `pip install -e '.[dev]'` (scripts/setup.sh, CI) builds
them. Each is optional: where it cannot be built (no C compiler, no Python headers) the install
goes on with a warning and the pure-Python path is used, which is the reference the native code
is tested against (tests/unit/test_rowscan.py, tests/spark/test_walcols.py), so a module that
fails to build is a slowdown, never a wrong answer and never a failed install
(tests/packaging/test_no_compiler.py installs with CC=false)."""
from setuptools import Extension, setup

EXTENSIONS = [
    # node.core.rowscan's hot paths: ROWS messages indexed for the applier, WAL frames filtered
    # for relays, without a Python object per row (node/core/_rowscan.c).
    Extension("node.core._rowscan", ["node/core/_rowscan.c"], depends=["node/core/crc.h"],
              extra_compile_args=["-O2"], optional=True),
    # spark.walread's hot path: a WAL split straight into column buffers (spark/walcols.py).
    Extension("spark._walcols", ["spark/_walcols.c"], include_dirs=["node/core"], depends=["node/core/crc.h"],
              extra_compile_args=["-O2"], optional=True),
]

setup(ext_modules=EXTENSIONS)
