"""Write tests/durations.json, each test file's seconds in a run, from that run's JUnit XML
(`./scripts/test.sh --junitxml=FILE`). tests/conftest.py hands the files to the two workers
longest first from it.

    python -m tools.test_durations FILE"""
from __future__ import annotations

import collections
import json
import pathlib
import sys
import xml.etree.ElementTree as ET

OUT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "durations.json"


def file_seconds(junit: str) -> dict[str, float]:
    """Seconds per test file (setup, call and teardown of its tests), by its path from the root."""
    seconds: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).iter("testcase"):
        parts = case.get("classname", "").split(".")
        while parts and not parts[-1].startswith("test_"):   # a class inside the file
            parts.pop()
        if parts:
            seconds["/".join(parts) + ".py"] += float(case.get("time", 0))
    return {f: round(s, 1) for f, s in sorted(seconds.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    OUT.write_text(json.dumps(file_seconds(argv[0]), indent=0, sort_keys=True) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
