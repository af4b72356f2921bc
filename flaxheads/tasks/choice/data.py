"""Multiple-choice data (SWAG, CommonsenseQA, ...): per example a context, N choices, and the
index of the right one, read into the `TaskData` a `MultipleChoice` trains on.

| shape             | columns                                                                          |
|-------------------|----------------------------------------------------------------------------------|
| SWAG-like         | a context (`sent1`), optionally the start every ending continues (`sent2`),      |
|                   | N choice columns (`ending0` ... `ending3`), the right choice's index (`label`)   |
| a list of choices | a context, one column holding the list of choices (`choices`), `label`          |

Files are CSV, TSV, JSON (an array or JSON Lines), JSON Lines or Parquet, read as
`files.load_local_files` reads them; a CSV cell of a list column holds a JSON or Python list.
Every example is read as transformers' examples/pytorch/multiple-choice/run_swag.py reads it:
the context is the first text of every choice, and the second is the start and the ending joined
by a space (`f"{sent2} {ending}"`; the ending alone without a start column); tokenisation
truncates each pair longest first to max_seq_length, and batches are (batch, num_choices, seq).

Columns not given are detected (`find_choice_columns`): the context is the first of
`CONTEXT_COLUMNS` present, the start `sent2` beside `sent1`, the choices numbered columns
(`ending0`, `choice1`, `option2`, ...: one prefix, numbers from 0 or 1 without a gap) or the
first of `LIST_COLUMNS`. `TaskData.problem_type_reason` says which were read.

Errors name the file, the row (its line, or its record in a JSON array or Parquet file, or its
index in data held in Python: `flaxheads.data.places`) and the columns found, and say what to
change: a missing column, a row with a missing or empty context or choice, a row with another
number of choices than most rows (every split has the train split's number), a label that is
missing, not an integer, or outside 0..N-1. Nothing is left out to make a row fit: a choice that
is empty is refused, never dropped (dropped, the choices after it would move and the label point
at another).
"""

from __future__ import annotations

import ast
import collections
import csv
import dataclasses
import json
import pathlib
import re
from collections.abc import Mapping, Sequence

import datasets

from flaxheads.conversion.table import MULTIPLE_CHOICE
from flaxheads.data.batching import ExampleFormat
from flaxheads.data.files import file_places, read_split
from flaxheads.data.in_memory import SplitData, as_dataset
from flaxheads.data.labels import is_missing
from flaxheads.data.places import RowPlaces, in_python
from flaxheads.data.task import LABEL, TEXT, TaskData
from flaxheads.data.tokenization import encode_groups, tokenize_with

CHOICES = "choices"
"""Each example's choices, the second text of each, in a canonical split."""
PROBLEM = "multiple_choice"
"""How messages name what multiple-choice labels are (the right choice's index)."""

CONTEXT_COLUMNS = ("sent1", "context", "question", "premise", "startphrase")
"""The context column when none is given: the first of these a file has (SWAG's first)."""
QUESTION_COLUMNS = {"sent1": "sent2"}
"""The column every choice continues, beside a detected context column (SWAG's)."""
NUMBERED_CHOICES = re.compile(r"^(ending|choice|option)(\d+)$")
"""Choice columns when none are given: one prefix, numbered from 0 or 1 without a gap."""
LIST_COLUMNS = ("choices", "endings", "options")
"""A column holding each row's list of choices, when none is given."""


@dataclasses.dataclass(frozen=True)
class ChoiceColumns:
    """Where a multiple-choice file keeps its parts."""

    context: str
    choices: tuple[str, ...]
    """The N choice columns in order, or one column holding each row's list of choices."""
    question: str | None = None
    """The start every choice continues (SWAG's sent2), put before each with a space; None: none."""
    label: str = "label"

    @property
    def names(self) -> tuple[str, ...]:
        """Every column read, the label's included."""
        return (self.context, *([self.question] if self.question else []), *self.choices, self.label)

    @property
    def holds_lists(self) -> bool:
        return len(self.choices) == 1

    def describe(self, num_choices: int) -> str:
        """"context 'sent1', choices 'sent2' + 'ending0'..'ending3' (4), label 'label'"."""
        listed = (f"the list in {self.choices[0]!r}" if self.holds_lists
                  else f"{self.choices[0]!r}..{self.choices[-1]!r}")
        start = f"{self.question!r} + " if self.question else ""
        return f"context {self.context!r}, choices {start}{listed} ({num_choices}), label {self.label!r}"

    def choice_names(self, num_choices: int) -> dict[int, str]:
        """The name of each choice position: its column, or "choices[i]" for a list."""
        if self.holds_lists:
            return {i: f"{self.choices[0]}[{i}]" for i in range(num_choices)}
        return dict(enumerate(self.choices))


def find_choice_columns(column_names: Sequence[str], *, where: str, context_column: str | None = None,
                        question_column: str | None = None, choice_columns: Sequence[str] | None = None,
                        label_column: str = "label", labelled: bool = True) -> ChoiceColumns:
    """The columns of a multiple-choice split with `column_names` (`where` names it in errors):
    those given, the others detected as the module docstring says. ValueError naming the columns
    found and the parameter to set, for a given column the split lacks, choices that cannot be
    told (none, or numbered ones and a list column both), and no context; with `labelled`, for no
    `label_column`."""
    names = list(column_names)
    found = f"its columns are {names}"

    def require(column: str, parameter: str) -> str:
        if column not in names:
            raise ValueError(f"{where} has no column {column!r} (set by {parameter}); {found}. Pass {parameter} with "
                             "the one that holds it")
        return column

    if choice_columns:
        choices = tuple(require(column, "choice_columns=") for column in choice_columns)
    else:
        choices = _detected_choices(names, where, found)
    if context_column is None:
        context_column = next((c for c in CONTEXT_COLUMNS if c in names and c not in choices), None)
        if context_column is None:
            raise ValueError(f"{where} has none of the context columns {CONTEXT_COLUMNS}; {found}. Pass "
                             "context_column= with the one every choice is read after")
        if question_column is None:
            question_column = QUESTION_COLUMNS.get(context_column) if QUESTION_COLUMNS.get(context_column) in names \
                else None
    require(context_column, "context_column=")
    if question_column is not None:
        require(question_column, "question_column=")
    if labelled:
        require(label_column, "label_column=")
    return ChoiceColumns(context_column, choices, question_column, label_column)


def _detected_choices(names: list[str], where: str, found: str) -> tuple[str, ...]:
    numbered: dict[str, dict[int, str]] = {}
    for name in names:
        match = NUMBERED_CHOICES.match(name)
        if match:
            numbered.setdefault(match.group(1), {})[int(match.group(2))] = name
    runs = {prefix: [by_number[n] for n in sorted(by_number)] for prefix, by_number in numbered.items()
            if len(by_number) >= 2 and sorted(by_number) == list(range(min(by_number), min(by_number) + len(by_number)))
            and min(by_number) in (0, 1)}
    lists = [name for name in LIST_COLUMNS if name in names]
    candidates = [tuple(columns) for columns in runs.values()] + [(name,) for name in lists]
    if len(candidates) == 1:
        return candidates[0]
    fix = ("Pass choice_columns= with the choice columns in order, or with the one column that holds each row's "
           "list of choices")
    if not candidates:
        raise ValueError(f"{where} has no choice columns (numbered ones such as ending0, ending1, ..., or a list "
                         f"column: one of {LIST_COLUMNS}); {found}. {fix}")
    shown = ", ".join(f"{c[0]!r}..{c[-1]!r}" if len(c) > 1 else f"the list {c[0]!r}" for c in candidates)
    raise ValueError(f"{where} has several sets of choice columns ({shown}); {found}. {fix}")


def canonical_choices(split: datasets.Dataset, columns: ChoiceColumns, *, where: str,
                      num_choices: int | None = None, labelled: bool = True,
                      places: RowPlaces | None = None) -> datasets.Dataset:
    """`split` as the canonical columns (`TaskData`): `text` the context, `choices` the second
    text of every choice (start and ending joined by a space), `label` the right choice's index
    (with `labelled`; else none). `num_choices`: how many every row must have (None: the number
    of choice columns, or for a list column the number most rows have). `places` names the rows
    (default: by index in `where`). Raises ValueError as the module docstring says, naming the
    row."""
    places = places or in_python(where)
    records = list(split)
    if not records:
        raise ValueError(f"{places.source} has no rows: give it examples, or leave it out")
    endings = [_endings(record, columns, places.at(index)) for index, record in enumerate(records)]
    expected, reference = num_choices, "the train split has"
    if expected is None and not columns.holds_lists:
        expected, reference = len(columns.choices), "the data has"
    elif expected is None and endings:
        counts = collections.Counter(len(row_endings) for row_endings in endings)
        expected, reference = counts.most_common(1)[0][0], "most rows have"
        if expected < 2:
            raise ValueError(f"most rows of {places.source} have {expected} choice ({columns.describe(expected)}); a "
                             "multiple-choice example needs two choices or more")
    contexts, rows, labels = [], [], []
    for index, (record, row_endings) in enumerate(zip(records, endings)):
        row = places.at(index)
        contexts.append(_text(record[columns.context], row, columns.context, "context_column="))
        start = None if columns.question is None else _text(record[columns.question], row, columns.question,
                                                           "question_column=")
        if len(row_endings) != expected:
            raise ValueError(f"{row} has {len(row_endings)} choices and {reference} {expected} "
                             f"({columns.describe(expected)}); every row needs the same number of choices: give it "
                             f"{expected}, or remove the row")
        names = columns.choice_names(expected)
        empty = next((i for i, ending in enumerate(row_endings) if ending is None), None)
        if empty is not None:
            raise ValueError(f"{row}: the choice {names[empty]!r} is empty; give every choice its text, or remove "
                             f"the row (an empty choice is not left out: the choices after it would move, and the "
                             "label point at another)")
        rows.append([ending if start is None else f"{start} {ending}" for ending in row_endings])
        if labelled:
            labels.append(_label(record[columns.label], expected, row, columns))
    canonical = {TEXT: contexts, CHOICES: rows}
    features = {TEXT: datasets.Value("string"), CHOICES: datasets.List(datasets.Value("string"))}
    if labelled:
        canonical[LABEL], features[LABEL] = labels, datasets.Value("int64")
    return datasets.Dataset.from_dict(canonical, features=datasets.Features(features))


def _text(value, row: str, column: str, parameter: str) -> str:
    if is_missing(value) or not str(value).strip():
        raise ValueError(f"{row}: the {column!r} column ({parameter}) is empty; give every row one, or remove the row")
    return str(value)


def _endings(record: dict, columns: ChoiceColumns, row: str) -> list[str | None]:
    """The row's choices, all of them in order: None for one that is empty or missing (refused
    after the count of choices is checked, never left out)."""
    if columns.holds_lists:
        values = _as_list(record[columns.choices[0]], row, columns.choices[0])
    else:
        values = [record[column] for column in columns.choices]
    return [None if is_missing(value) or not str(value).strip() else str(value) for value in values]


def _as_list(value, row: str, column: str) -> list:
    if isinstance(value, str) and value.strip().startswith("["):
        for parse in (json.loads, ast.literal_eval):  # CSV: a JSON list, or a Python one as pandas writes it
            try:
                value = parse(value)
                break
            except (ValueError, SyntaxError):
                continue
    if not isinstance(value, list):
        raise ValueError(f"{row}: the {column!r} column (choice_columns=) holds {type(value).__name__} "
                         f"{_short(value)}, not a list of choices; a CSV cell holds a JSON list, e.g. "
                         '["walks away.", "sits down."]')
    return value


def _label(value, num_choices: int, row: str, columns: ChoiceColumns) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # a CSV label column with a blank cell is read as floats: 1.0 is choice 1
    if is_missing(value):
        raise ValueError(f"{row} has no label in {columns.label!r} (label_column=); give every row the index of its "
                         f"right choice, 0 to {num_choices - 1}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{row}: the label {_short(value)} in {columns.label!r} (label_column=) is not the index of a "
                         f"choice; labels are integers 0 to {num_choices - 1} ({columns.describe(num_choices)})")
    if not 0 <= value < num_choices:
        raise ValueError(f"{row}: the label {value} is outside 0..{num_choices - 1}, the indices of its "
                         f"{num_choices} choices ({columns.describe(num_choices)}); give the index of the right "
                         "choice, counted from 0")
    return value


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def choice_task(splits: Mapping[str, SplitData | None], *, context_column: str | None = None,
                question_column: str | None = None, choice_columns: Sequence[str] | None = None,
                label_column: str = "label", sources: Mapping[str, str] | None = None,
                places: Mapping[str, RowPlaces] | None = None) -> TaskData:
    """Multiple-choice splits ("train", and "validation", "test"; each a `datasets.Dataset`, a
    dict of columns or a list of row dicts) as the `TaskData` a `MultipleChoice` trains on:
    problem type multiple choice, `num_labels` the number of choices, `id2label` the choice
    columns. The columns are read from the train split (`find_choice_columns`) and every split
    must have them and as many choices. `sources`: how errors name each split (default "the
    <split> data"); `places`: how they name its rows (default: by index). Raises ValueError as
    the module docstring says."""
    where = {name: (sources or {}).get(name, f"the {name} data") for name, split in splits.items()}
    given = {name: as_dataset(split, label_column=label_column, where=where[name]) for name, split in splits.items()
             if split is not None}
    if "train" not in given:
        raise ValueError(f"multiple-choice data needs a 'train' split; got {sorted(given)}")
    places = {name: (places or {}).get(name) or in_python(where[name]) for name in given}
    columns = find_choice_columns(given["train"].column_names, where=where["train"], context_column=context_column,
                                  question_column=question_column, choice_columns=choice_columns,
                                  label_column=label_column)
    canonical = {"train": canonical_choices(given["train"], columns, where=where["train"], places=places["train"])}
    num_choices = len(canonical["train"][0][CHOICES])
    for name, split in given.items():
        if name != "train":
            missing = [column for column in columns.names if column not in split.column_names]
            if missing:
                raise ValueError(f"{where[name]} has no column {missing[0]!r}, which the train data has "
                                 f"({columns.describe(num_choices)}); its columns are {split.column_names}. Give "
                                 "every split the train data's columns")
            canonical[name] = canonical_choices(split, columns, where=where[name], num_choices=num_choices,
                                                places=places[name])
    return TaskData(datasets.DatasetDict(canonical), None, num_choices, columns.choice_names(num_choices),
                    problem_type_reason=f"{PROBLEM}: {columns.describe(num_choices)}", rows=CHOICE_ROWS,
                    task=MULTIPLE_CHOICE, example_format=CHOICE_EXAMPLES)


CHOICE_EXAMPLES = ExampleFormat(
    grouped=True,
    unpacked_because="multiple choice: each choice is a row of its own, scored beside its example's others")
"""An example is its choices, (B, C, T) in a batch, with the right choice's index as label."""


class ChoiceRows:
    """Multiple-choice rows (`TaskData.rows`): each choice tokenised as the pair (context,
    choice), truncated longest-first, as run_swag.py does: per example one sequence per choice,
    `length` the longest; cached as `tokenization.tokenize_split` caches."""

    whole_split = False
    origin_columns = ()

    def tokenize(self, task: TaskData, split: str, tokenizer, max_seq_length: int, *, cache_dir=None):
        rows = task.splits[split]
        return tokenize_with(rows, _encode_choices, tokenizer, max_seq_length,
                             per_example=len(rows[0][CHOICES]) if len(rows) else 1, cache_dir=cache_dir)


CHOICE_ROWS = ChoiceRows()


def _encode_choices(batch: dict[str, list], *, tokenizer, max_seq_length: int) -> dict[str, list]:
    # run_swag.py's pairs: the context repeated before each of its choices
    contexts = [context for context, choices in zip(batch[TEXT], batch[CHOICES]) for _ in choices]
    choices = [choice for example in batch[CHOICES] for choice in example]
    columns = encode_groups(contexts, choices, len(batch[CHOICES][0]), tokenizer, max_seq_length)
    columns["labels"] = batch[LABEL]
    return columns


def load_choice_files(*, train_file: str | pathlib.Path, validation_file: str | pathlib.Path | None = None,
                      test_file: str | pathlib.Path | None = None, cache_dir: str | pathlib.Path | None = None,
                      **columns) -> TaskData:
    """Each given file read as one split (`files.read_split`: its errors for a missing,
    unreadable or empty file), then `choice_task` with `columns` (context_column,
    question_column, choice_columns, label_column), errors naming the file."""
    files = {"train": train_file, "validation": validation_file, "test": test_file}
    label_column = columns.get("label_column", "label")
    given = {name: pathlib.Path(path) for name, path in files.items() if path is not None}
    splits = {name: read_split(name, path, cache_dir, label_column) for name, path in given.items()}
    return choice_task(splits, sources={name: str(path) for name, path in given.items()},
                       places={name: file_places(path, str(path)) for name, path in given.items()}, **columns)


def read_choice_file(path: str | pathlib.Path, *, num_choices: int | None = None, cache_dir=None,
                     context_column: str | None = None, question_column: str | None = None,
                     choice_columns: Sequence[str] | None = None, label_column: str = "label"
                     ) -> tuple[datasets.Dataset, ChoiceColumns]:
    """The examples of one file to predict (labels read where it has `label_column`, else
    none): the canonical split and the columns read. `num_choices`: how many every row must have
    (a model's training data's; None: as many as most rows have)."""
    split = read_split("test", pathlib.Path(path), cache_dir, label_column)
    labelled = label_column in split.column_names
    columns = find_choice_columns(split.column_names, where=str(path), context_column=context_column,
                                  question_column=question_column, choice_columns=choice_columns,
                                  label_column=label_column, labelled=labelled)
    return canonical_choices(split, columns, where=str(path), num_choices=num_choices, labelled=labelled,
                             places=file_places(pathlib.Path(path), str(path))), columns


def looks_like_choice_file(path: str | pathlib.Path, text_column: str = "text") -> bool:
    """Whether `path` (CSV, TSV, JSON, JSON Lines) holds multiple-choice rows: its first record
    has choice columns `find_choice_columns` detects (ending0, ending1, ...; or a choices list)
    and no `text_column`. Other formats are not looked into (pass task='multiple-choice')."""
    names = _first_record_columns(pathlib.Path(path))
    if not names or text_column in names:
        return False
    try:
        _detected_choices(names, "", "")
    except ValueError:
        return False
    return True


def _first_record_columns(path: pathlib.Path) -> list[str] | None:
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".tsv", ".json", ".jsonl") or not path.is_file():
        return None
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        head = f.read(65536)
    if suffix in (".csv", ".tsv"):
        return next(csv.reader([head.split("\n", 1)[0]], delimiter="\t" if suffix == ".tsv" else ","), None)
    text = head.lstrip()
    start = 1 if text.startswith("[") else 0
    try:  # the first object, of an array or of JSON Lines
        record, _ = json.JSONDecoder().raw_decode(text[start:].lstrip())
    except ValueError:
        return None
    return list(record) if isinstance(record, dict) else None


__all__ = ["CHOICES", "CHOICE_EXAMPLES", "CHOICE_ROWS", "CONTEXT_COLUMNS", "LIST_COLUMNS", "NUMBERED_CHOICES", "QUESTION_COLUMNS", "ChoiceColumns",
           "canonical_choices", "choice_task", "find_choice_columns", "load_choice_files", "looks_like_choice_file",
           "read_choice_file"]
