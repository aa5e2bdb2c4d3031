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
# --no-compile: pip would byte-compile every module of every package the dev extra brings
# (botocore, moto, pyspark, matplotlib, ...), ~40 s of a fresh machine's set-up, when a run
# imports a small part of them. What a node imports is compiled just below, so its starts do
# not compile it again where the environment turns writing bytecode off; the rest compiles
# on first import where writing is on (scripts/test.sh turns it on).
.venv/bin/python -m pip install -q --no-compile -e '.[dev]'
env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "import node.cli, node.logsetup, node.process.run, node.demo, node.status, replog"
