"""Writes tests/file_seconds.json, the seconds each test file took, from the JUnit XML of a full
run (`bash scripts/test.sh --junitxml=/tmp/junit.xml`); tests/conftest.py runs the longest files
first so that no worker is left with a long file at the end.

    python scripts/file_seconds.py /tmp/junit.xml
"""

from __future__ import annotations

import collections
import json
import pathlib
import sys
import xml.etree.ElementTree as ElementTree

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "file_seconds.json"


def file_seconds(junit_xml: str) -> dict[str, float]:
    seconds: collections.Counter[str] = collections.Counter()
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = next((part for part in module if part.startswith("test_")), None)
        if name:
            seconds[f"{name}.py"] += float(case.get("time") or 0.0)
    return {name: round(value, 1) for name, value in seconds.most_common()}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    seconds = file_seconds(argv[0])
    OUT.write_text(json.dumps(seconds, indent=1) + "\n")
    print(f"{OUT}: {len(seconds)} files, {sum(seconds.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
