"""The test run's own ordering: tools/test_durations.py reads a run's JUnit XML into seconds per
file, and tests/conftest.py hands files out longest first, each file's tests together and in order."""
from __future__ import annotations

import json
import pathlib
from types import SimpleNamespace

import tests.conftest as order
from tools.test_durations import file_seconds

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.unit.test_a" name="test_one" time="1.25"/>
<testcase classname="tests.unit.test_a" name="test_two" time="0.5"/>
<testcase classname="tests.integration.test_b.TestGroup" name="test_three" time="3.0"/>
<testcase classname="tests.integration.test_b" name="test_four" time="2.0"/>
</testsuite></testsuites>"""


def test_seconds_are_summed_per_file_whether_a_test_is_in_a_class_or_not(tmp_path):
    (tmp_path / "j.xml").write_text(JUNIT)
    assert file_seconds(str(tmp_path / "j.xml")) == {"tests/integration/test_b.py": 5.0,
                                                      "tests/unit/test_a.py": 1.8}


def test_files_go_longest_first_unmeasured_ones_as_a_minute_each_files_tests_together_in_order(monkeypatch):
    monkeypatch.setattr(order, "_durations", lambda: {"tests/unit/test_short.py": 1.0, "tests/unit/test_long.py": 90.0})
    def item(name: str, n: int):
        return SimpleNamespace(path=order.ROOT / "tests" / "unit" / name, n=n)
    items = [item("test_short.py", 1), item("test_short.py", 2), item("test_new.py", 3), item("test_long.py", 4),
             item("test_long.py", 5), SimpleNamespace(path=pathlib.Path("/elsewhere/test_x.py"), n=6)]
    order.pytest_collection_modifyitems(items)
    assert [i.n for i in items] == [4, 5, 3, 6, 1, 2]


def test_the_checked_in_durations_name_files_that_exist():
    durations = json.loads((order.ROOT / "tests" / "durations.json").read_text())
    assert len(durations) > 100
    missing = [f for f in durations if not (order.ROOT / f).is_file()]
    assert not missing, f"tests/durations.json names files that are gone (python -m tools.test_durations): {missing}"
