#!/usr/bin/env bash
# Set up the venv, then run the default test suite. pytest's exit code 5 (no tests
# collected) is a failure here, not a pass.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: failing" >&2
    exit 1
fi
exit "$rc"
