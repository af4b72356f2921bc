"""The study's results file: one JSON object per finished cell, one per line.

A line is appended whole and forced to disk (flush + fsync) before the next cell starts, so a
killed study leaves at most one half-written line, at the end: readers ignore it and say so, and
the runner cuts it off before appending. Every line carries its cell's `key`; the report merges
files from several machines by it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class ResultsFile:
    """The complete records of a results file, and what was wrong with the rest of it."""

    records: list[dict[str, Any]]
    truncated_tail: int = 0
    """Bytes of a half-written last line (a study killed while writing it); 0 when none."""
    bad_lines: list[int] = dataclasses.field(default_factory=list)
    """Line numbers (1-based) of other lines that are no study record."""

    def problems(self, path: str | os.PathLike) -> list[str]:
        """One sentence per problem found, for the user."""
        lines = []
        if self.truncated_tail:
            lines.append(f"{path}: ignored a half-written last line ({self.truncated_tail} bytes), left by a study "
                         "stopped while writing it; its cell runs again")
        if self.bad_lines:
            lines.append(f"{path}: ignored line(s) {self.bad_lines[:10]} that are no study record")
        return lines


def read_results(path: str | os.PathLike) -> ResultsFile:
    """The records of `path` ([] for a missing file). A last line without its newline is a
    half-written one; lines that are no JSON object with a "key" are skipped and listed."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return ResultsFile([])
    complete, _, tail = raw.rpartition(b"\n")
    result = ResultsFile([], truncated_tail=len(tail))
    for number, line in enumerate(complete.split(b"\n"), start=1):
        if not line.strip():
            continue
        record = _parse(line)
        if record is None:
            result.bad_lines.append(number)
        else:
            result.records.append(record)
    return result


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("key"), str) else None


def cut_half_written_tail(path: str | os.PathLike, results: ResultsFile) -> None:
    """Removes the half-written last line `results` found, so the next append starts a line."""
    if results.truncated_tail:
        size = Path(path).stat().st_size
        os.truncate(path, size - results.truncated_tail)


def append_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Appends `record` as one line, on disk when this returns (one write of the whole line)."""
    line = (json.dumps(_strict(record), sort_keys=True, allow_nan=False) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def _strict(value: Any) -> Any:
    """`value` as strict JSON values: numpy numbers as Python ones, NaN and infinities as None
    (a metric that is undefined, e.g. the correlation of constant predictions)."""
    if isinstance(value, dict):
        return {str(k): _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    if isinstance(value, (bool, str, type(None))):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value) if math.isfinite(value) else None
    return str(value)


def merge_records(files: Iterable[str | os.PathLike]) -> tuple[list[dict[str, Any]], list[str]]:
    """The records of all `files`, each cell once (the first line of a key wins: a cell run on two
    machines is one result, not two seeds), and the problems found, one sentence each."""
    seen: set[str] = set()
    merged, problems = [], []
    for path in files:
        results = read_results(path)
        if not results.records and not Path(path).exists():
            problems.append(f"{path}: no such results file")
        problems += results.problems(path)
        for record in results.records:
            if record["key"] not in seen:
                seen.add(record["key"])
                merged.append(record)
    return merged, problems
