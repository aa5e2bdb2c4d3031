"""Test files in order of their last measured length, longest first (tests/durations.json, written
by `python -m tools.test_durations JUNIT_XML`): scripts/test.sh gives each of its two workers a
file at a time in this order (`--dist loadfile --no-loadscope-reorder`), so the run ends on short
files on both. xdist's own order, most tests first, left the longest files (a nemesis, one test
of a minute) for last, one worker running them while the other had finished. A file not measured
yet counts as a minute: put early, it cannot make the tail. The order of tests within a file is
kept."""
from __future__ import annotations

import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
UNMEASURED_S = 60.0


def _durations() -> dict[str, float]:
    try:
        return json.loads((ROOT / "tests" / "durations.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    seconds = _durations()

    def length(item: pytest.Item) -> float:
        try:
            return seconds.get(pathlib.Path(item.path).relative_to(ROOT).as_posix(), UNMEASURED_S)
        except ValueError:                 # collected from outside this tree
            return UNMEASURED_S

    items.sort(key=length, reverse=True)   # stable: a file's tests stay together and in order
