#!/usr/bin/env bash
# Set up a venv with replog, then run the demo: 3 masters in full mesh + 1 anonymous replica.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'
exec .venv/bin/replog demo "$@"
