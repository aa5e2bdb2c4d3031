#!/usr/bin/env bash
# Set up the venv, then run the default test suite. pytest's exit code 5 (no tests
# collected) is a failure here, not a pass.
set -euo pipefail
cd "$(dirname "$0")/.."
# The browser tests (tests/browser) drive Debian's chromium with its chromedriver; install them
# where we can (root with apt), quietly go on without them elsewhere (those tests then skip).
# apt runs beside the venv's set-up (on a fresh machine both take a minute or more, mostly
# waiting on downloads), and the tests start once both are done.
browser=""
if ! command -v chromedriver >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing chromium and chromium-driver for the browser tests" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) \
        >/dev/null 2>&1 &
    browser=$!
fi
./scripts/setup.sh
if [ -n "$browser" ] && ! wait "$browser"; then
    echo "test.sh: could not install chromium; the browser tests will skip" >&2
fi
set +e
# Every test starts node processes (a few hundred in all), and each imports the whole tree: keep
# their compiled bytecode (in __pycache__/ beside the sources, which git ignores) even where the
# environment turns writing it off; compiling ~200 modules again cost each start about a quarter
# of a second. (Not PYTHONPYCACHEPREFIX: one cache for every path grows by each run's temporary
# directories, ~50 MB a run.)
unset PYTHONDONTWRITEBYTECODE
# Two workers, a test file to each at a time: most tests wait on real processes, so one core sits
# idle with one worker. REPLOG_TEST_WORKERS=0 runs in this process (as `pytest` alone does).
workers="${REPLOG_TEST_WORKERS:-2}"
if [ "$workers" -gt 0 ]; then
    .venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" --dist loadfile "$@"
else
    .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
fi
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: failing" >&2
    exit 1
fi
exit "$rc"
