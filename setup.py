"""Native extensions; everything else about the package is in pyproject.toml.

One Extension per module, in this list: `pip install -e '.[dev]'` (scripts/setup.sh, CI) builds
them. Pure-Python fallbacks stay the reference, so a module that fails to build is a slowdown,
never a wrong answer."""
from setuptools import Extension, setup

EXTENSIONS = [
    # node.core.rowscan's hot paths: ROWS messages indexed for the applier, WAL frames filtered
    # for relays, without a Python object per row (node/core/_rowscan.c).
    Extension("node.core._rowscan", ["node/core/_rowscan.c"], depends=["node/core/crc.h"],
              extra_compile_args=["-O2"]),
    # spark.walread's hot path: a WAL split straight into column buffers (spark/walcols.py).
    Extension("spark._walcols", ["spark/_walcols.c"], include_dirs=["node/core"], depends=["node/core/crc.h"],
              extra_compile_args=["-O2"]),
]

setup(ext_modules=EXTENSIONS)
