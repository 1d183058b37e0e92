"""The fast lane's record: each test's seconds in a named full run, read from pytest's JUnit
XML (`make test` writes none; `make durations` runs the suite to write one). `make test-fast`
leaves out the tests recorded over SLOW_S (tests/conftest.py marks them `slow`); a test the
record does not know yet runs in the fast lane until the record is refreshed.

    python tests/durations.py JUNIT.xml [MORE.xml ...] > tests/durations.json
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

RECORD = Path(__file__).with_name("durations.json")


def nodeid(case: ET.Element) -> str:
    """pytest's node id from a JUnit testcase: classname 'tests.test_x' + name 'test_y[p]'."""
    path = case.get("classname", "").replace(".", "/")
    return f"{path}.py::{case.get('name')}"


def read(paths: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in paths:
        for case in ET.parse(p).getroot().iter("testcase"):
            if case.find("skipped") is None:
                out[nodeid(case)] = round(float(case.get("time", 0.0)), 3)
    return dict(sorted(out.items()))


def load() -> dict[str, float]:
    return json.loads(RECORD.read_text())["seconds"] if RECORD.exists() else {}


if __name__ == "__main__":
    seconds = read(sys.argv[1:])
    print(
        json.dumps({"note": "per-test seconds (setup+call+teardown)", "seconds": seconds}, indent=0)
    )
