#!/usr/bin/env bash
# Create .venv (if missing) and install replog with its dev extra into it. Sourced by the
# README's two commands so a fresh machine needs nothing else.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'
