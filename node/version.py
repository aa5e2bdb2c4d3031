"""replog's version (`replog --version`, replog_build_info): written here once, and read from
here by the package's build (pyproject.toml, `dynamic = ["version"]`). Not looked up in the
installed distribution's metadata: importing importlib.metadata and scanning the environment for
it cost every `replog` command and node start ~25 ms."""
from __future__ import annotations

__version__ = "0.1.0"


def version() -> str:
    return __version__
