"""Where a row is, in the words every data message uses: one way of counting for every reader.

| a row of                                              | is named        | counted                            |
|-------------------------------------------------------|-----------------|------------------------------------|
| a file with lines (CSV, TSV, JSON Lines, CoNLL, ...)  | `line N`        | from 1, as an editor shows lines:  |
|                                                       |                 | header, blank and comment lines    |
|                                                       |                 | count; a record spanning lines is  |
|                                                       |                 | named by its first                 |
| a file without lines (a JSON array, Parquet)          | `record N`      | from 1                             |
| data held in Python (lists, dicts of columns,         | `index i`       | from 0, as Python indexes it       |
| `datasets.Dataset`s, a hub data set's splits)         |                 | (`texts[i]`, `dataset[i]`)         |
| word data (CoNLL, JSON words and tags, ...)           | `sentence N`,   | from 1, and the line where the     |
|                                                       | `word N`        | file has lines                     |

So `line 7` is always what an editor shows as line 7, `index 6` always `data[6]`, and no message
counts a file's rows from 0 or leaves its header or blank lines out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

LINE = "line"
RECORD = "record"
INDEX = "index"


class RowPlaces:
    """Names the rows of one split, given by their 0-based position in it (`at`).

    `source`: the split as messages name it ("--train_file data/train.csv", "the train data").
    `kind`: `LINE`, `RECORD` or `INDEX` (the module table). `first_lines`: for `LINE`, called
    once, when a message first needs it, for the line each row starts on (reading a file again
    costs nothing until something is wrong); a row past its end is named by its record."""

    def __init__(self, source: str, kind: str = INDEX, first_lines: Callable[[], Sequence[int]] | None = None):
        if kind == LINE and first_lines is None:
            raise ValueError("LINE places need first_lines")
        self.source, self.kind = source, kind
        self._first_lines, self._lines = first_lines, None

    def row(self, row: int) -> str:
        """"line 7", "record 7" or "index 6" for the 0-based `row`."""
        if self.kind == LINE:
            if self._lines is None:
                try:
                    self._lines = list(self._first_lines())
                except (OSError, ValueError):  # a file that cannot be read again: its rows go by record
                    self._lines = []
            if row < len(self._lines):
                return f"line {self._lines[row]}"
            return f"record {row + 1}"
        if self.kind == RECORD:
            return f"record {row + 1}"
        return f"index {row}"

    def at(self, row: int) -> str:
        """"line 7 of --train_file data/train.csv", "index 6 of the train data"."""
        return f"{self.row(row)} of {self.source}"


def in_python(source: str) -> RowPlaces:
    """Places of data held in Python: `index i` of `source` ("the train data")."""
    return RowPlaces(source, INDEX)


__all__ = ["INDEX", "LINE", "RECORD", "RowPlaces", "in_python"]
