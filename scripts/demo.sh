#!/usr/bin/env bash
# Set up the venv, then run the demo: 3 masters in full mesh + 1 anonymous replica.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/replog demo "$@"
