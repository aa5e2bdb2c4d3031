"""replog's version, as installed (`replog --version`, replog_build_info)."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version as _dist_version


def version() -> str:
    try:
        return _dist_version("replog")
    except PackageNotFoundError:       # run from a source tree that was never installed
        return "unknown"
