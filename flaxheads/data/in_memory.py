"""Labelled text held in Python: `datasets.Dataset`s, dicts of columns, lists of rows, or
(texts, labels) tuples, made into a `TaskData` by the same column and label rules as files.

The columns are found by the names `text_column`, `text_pair_column` and `label_column` (a
tuple is given those names by position), and labels are encoded by `flaxheads.data.labels`,
so in-memory data and files give the same classes, problem type and errors. Preference pairs
(`chosen_column`, `rejected_column`) are read as `flaxheads.data.pairs` says; a tuple of pairs is
`(chosen_texts, rejected_texts)`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Union

import datasets
import pyarrow as pa

from flaxheads.data.files import canonical_columns
from flaxheads.data.labels import check_label_kinds, encode_labels, is_missing
from flaxheads.data.pairs import MARGIN_COLUMN, pair_column_map, pair_task, reads_as_pairs
from flaxheads.data.places import RowPlaces, in_python
from flaxheads.data.task import LABEL, TEXT, TEXT_PAIR, TaskData

SplitData = Union[datasets.Dataset, Mapping[str, Sequence], Sequence[Mapping[str, Any]], tuple, Sequence[str]]
"""A `datasets.Dataset`; a dict of columns (or a pandas DataFrame); a list of row dicts; a tuple
`(texts, labels)` or `(texts, text_pairs, labels)`; or a list of texts alone (unlabelled: a test
split to predict). Messages name a row by its index (`flaxheads.data.places`)."""


class InMemoryTask(NamedTuple):
    task: TaskData
    unlabelled: frozenset[str]
    """Splits given without labels: their `label` column is a placeholder, to predict, not score."""
    given: tuple[str, ...]
    """The splits the caller gave. Without train data, the `train` split of `task` is the first
    given split, which only stands in for the label names (TaskData always has one)."""
    source_train: datasets.Dataset | None = None
    """The train split before its labels were encoded: other data encoded beside it gets the
    same classes (see `load_in_memory`'s `beside`)."""


def as_dataset(split: SplitData, *, text_column: str = "text", text_pair_column: str | None = None,
               label_column: str = "label", where: str = "the data") -> datasets.Dataset:
    """`split` as a `datasets.Dataset` (see `SplitData`; a pandas DataFrame is read as a dict of
    its columns); a tuple's items become the named columns.

    Data held in Python is checked before Arrow stores it, and refused with ValueError naming
    `where` and the index of the value (`flaxheads.data.places`) and what to give instead: a
    text (in `text_column` or `text_pair_column`) that is missing (None, NaN) or not a str; a
    label that is no label (a dict, say) or of another kind than most labels
    (`labels.check_label_kinds`); columns of different lengths; a row that is not a row dict
    among row dicts (or not a text among texts); and something that holds no rows at all."""
    if isinstance(split, datasets.Dataset):
        return split
    if isinstance(split, datasets.DatasetDict):
        raise ValueError(f"{where} is a DatasetDict of the splits {list(split)}: pass one split, e.g. "
                         f"dataset[{next(iter(split), 'train')!r}]")
    places = in_python(where)
    if _is_data_frame(split):
        columns = {name: split[name].tolist() for name in split.columns}
    elif isinstance(split, Mapping):
        columns = {name: _column(values, f"column {name!r} of {where}", "a dict of columns maps each name to a list "
                                 "of values, e.g. {'text': ['a fine film'], 'label': [1]}")
                   for name, values in split.items()}
    elif isinstance(split, tuple):
        names = [text_column, *([text_pair_column] if text_pair_column else []), label_column]
        if len(split) not in (len(names) - 1, len(names)):
            raise ValueError(
                f"a tuple of data holds the columns {tuple(names)} in that order (the label may be left out "
                f"for data to predict), got {len(split)} items"
            )
        columns = {name: _column(values, f"item {i} ({name}) of the tuple of {where}", f"a tuple of data holds one "
                                 f"list per column: {tuple(names)}, e.g. (['a fine film', 'dull'], [1, 0])")
                   for i, (name, values) in enumerate(zip(names, split))}
    else:
        columns = _columns_of_rows(split, text_column, where)
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        counts = ", ".join(f"{name!r}: {count}" for name, count in lengths.items())
        raise ValueError(f"the columns of {where} differ in length ({counts}): give every column one value per row")
    for name in (text_column, text_pair_column):
        if name in columns:
            check_texts(columns[name], places, f"in column {name!r}")
    if label_column in columns:
        check_label_kinds(columns[label_column], places, label_column, "label_column=")
    return _arrow(columns, where)


def check_texts(texts: Sequence, places: RowPlaces, what: str = "") -> None:
    """ValueError naming the first of `texts` that is missing (None, NaN) or not a str, where it
    is, and the fix."""
    for row, text in enumerate(texts):
        if isinstance(text, str):
            continue
        if is_missing(text):
            raise ValueError(f"the text {what + ' ' if what else ''}is missing at {places.at(row)} ({text!r}); give "
                             "every row its text, or remove the row")
        raise ValueError(f"the text {what + ' ' if what else ''}at {places.at(row)} is {_a_kind(text)} "
                         f"({_short(text)}), not a str: give each row one text (str(...) it if a number is the text)")


def _is_data_frame(split) -> bool:
    """A pandas DataFrame (pandas need not be installed: the type is recognised by its module)."""
    return type(split).__module__.startswith("pandas") and hasattr(split, "columns") and hasattr(split, "iloc")


def _column(values, what: str, fix: str) -> list:
    """`values` as a list (numpy arrays and pandas Series too), or ValueError saying `what` is no
    list of values."""
    if hasattr(values, "tolist") and not isinstance(values, (str, bytes)):
        values = values.tolist()
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        found = "None" if values is None else f"{_a_kind(values)} ({_short(values)})"
        raise ValueError(f"{what} is {found}, not a list of values: {fix}")
    return list(values)


def _columns_of_rows(split, text_column: str, where: str) -> dict[str, list]:
    """The columns of a list of row dicts (every key any row has; None where a row lacks it), or
    of a list of texts (the `text_column`)."""
    if isinstance(split, (str, bytes)) or not isinstance(split, Iterable):
        raise ValueError(f"{where} is {_a_kind(split)} ({_short(split)}): data is a datasets.Dataset, a dict of "
                         "columns, a list of row dicts, a (texts, labels) tuple or a list of texts")
    rows = list(split)
    if not rows:
        raise ValueError(f"{where} is an empty {type(split).__name__}: give it rows")
    kinds = ["row" if isinstance(row, Mapping) else "text" if isinstance(row, str) else "other" for row in rows]
    typical = max(("row", "text"), key=kinds.count)
    odd = next((i for i, kind in enumerate(kinds) if kind != typical), None)
    if odd is not None:
        expected = ("a row dict, as most rows are" if typical == "row" and typical in kinds
                    else "a text (str), as most items are" if typical in kinds
                    else "a row dict or a text (str), which a list of data holds")
        pairs = (" (a (text, label) pair? give the data as a tuple of lists: (texts, labels))"
                 if isinstance(rows[odd], (list, tuple)) else "")
        found = "None" if rows[odd] is None else f"{_short(rows[odd])} ({_a_kind(rows[odd])})"
        raise ValueError(f"index {odd} of {where} is {found}, not {expected}{pairs}")
    if typical == "text":
        return {text_column: rows}
    names = list(dict.fromkeys(name for row in rows for name in row))
    return {name: [row.get(name) for row in rows] for name in names}


def _arrow(columns: dict[str, list], where: str) -> datasets.Dataset:
    try:
        return datasets.Dataset.from_dict(columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as error:
        for name, values in columns.items():  # the column Arrow cannot store, for the message
            try:
                datasets.Dataset.from_dict({name: values})
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as cause:
                raise ValueError(f"the column {name!r} of {where} holds values that cannot be stored together "
                                 f"({cause}): give each of its values one kind") from None
        raise ValueError(f"{where} cannot be stored as a datasets.Dataset: {error}") from None


def _a_kind(value) -> str:
    name = type(value).__name__
    return ("an " if name[0] in "aeiou" else "a ") + name


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_in_memory(splits: Mapping[str, SplitData | None], *, text_column: str = "text",
                   text_pair_column: str | None = None, label_column: str = "label",
                   problem_type: str | None = None, num_labels: int | None = None,
                   beside: datasets.Dataset | None = None, chosen_column: str = "chosen",
                   rejected_column: str = "rejected") -> InMemoryTask:
    """The given splits ("train", "validation", "test"; None entries are left out) as a TaskData.

    `beside`: the `source_train` of an earlier result, whose classes the new splits then share
    (it is their train split; a given "train" is not allowed then). Only the test split may come
    without labels. Raises ValueError naming a missing column and
    the parameter that names it, and for bad labels (see `encode_labels`).
    """
    given = {name: split for name, split in splits.items() if split is not None}
    if not given:
        raise ValueError("no data: pass train_dataset (to train), eval_dataset or test_dataset")
    places = {name: in_python(f"the {name} data") for name in given}
    first_name, first = next(iter(given.items()))
    first_columns = (beside if beside is not None else first if isinstance(first, datasets.Dataset)
                     else as_dataset(first, text_column=text_column, text_pair_column=text_pair_column,
                                     label_column=label_column, where=places[first_name].source)).column_names
    if reads_as_pairs(first_columns, problem_type=problem_type, text_column=text_column,
                      chosen_column=chosen_column, rejected_column=rejected_column):
        return _pairs_in_memory(given, chosen_column, rejected_column, problem_type, num_labels, beside, places)
    columns = {TEXT: (text_column, "text_column="), LABEL: (label_column, "label_column=")}
    if text_pair_column:
        columns[TEXT_PAIR] = (text_pair_column, "text_pair_column=")
    canonical, unlabelled = {}, set()
    for name, split in given.items():
        dataset = as_dataset(split, text_column=text_column, text_pair_column=text_pair_column,
                             label_column=label_column, where=places[name].source)
        if name == "test" and label_column not in dataset.column_names:
            unlabelled.add(name)
            canonical[name] = canonical_columns(dataset, {k: v for k, v in columns.items() if k != LABEL},
                                                 f"{name} data", places[name])
        else:
            canonical[name] = canonical_columns(dataset, columns, f"{name} data", places[name])
    empty = next((name for name, split in canonical.items() if len(split) == 0), None)
    if empty is not None:
        raise ValueError(f"{places[empty].source} has no rows: give it rows, or leave it out")
    labelled = [name for name in canonical if name not in unlabelled]
    if not labelled and beside is None:
        raise ValueError("the data holds no labels: give a train_dataset or eval_dataset with a label column "
                         f"({label_column!r}, set by label_column=)")
    if beside is not None:
        canonical = {"train": beside, **canonical}
    elif "train" not in canonical:  # label names come from the train split; without one, the first given
        canonical = {"train": canonical[labelled[0]], **canonical}
    source_train = canonical["train"]
    placeholder = canonical["train"][LABEL][0]
    for name in unlabelled:
        canonical[name] = canonical[name].add_column(LABEL, [placeholder] * len(canonical[name]),
                                                     feature=canonical["train"].features[LABEL])
    places = {"train": places.get(labelled[0] if labelled else "train"), **places}  # the stand-in's, or beside's
    task = encode_labels(datasets.DatasetDict(canonical), problem_type=problem_type, num_labels=num_labels,
                         places={name: place for name, place in places.items() if place is not None})
    return InMemoryTask(task, frozenset(unlabelled), tuple(given), source_train)


def _pairs_in_memory(given: dict, chosen_column: str, rejected_column: str, problem_type: str | None,
                     num_labels: int | None, beside: datasets.Dataset | None,
                     places: dict[str, RowPlaces]) -> InMemoryTask:
    """Preference pairs: every given split needs both pair columns (no split goes unlabelled)."""
    canonical = {}
    for name, split in given.items():
        # A tuple is (chosen, rejected[, margins]): the pair columns stand where a tuple's texts go.
        dataset = as_dataset(split, text_column=chosen_column, text_pair_column=rejected_column,
                             label_column=MARGIN_COLUMN, where=places[name].source)
        columns = pair_column_map(chosen_column, rejected_column, flags=False, column_names=dataset.column_names)
        canonical[name] = canonical_columns(dataset, columns, f"{name} data", places[name])
        if len(canonical[name]) == 0:
            raise ValueError(f"{places[name].source} has no rows: give it rows, or leave it out")
    if beside is not None:
        canonical = {"train": beside, **canonical}
    elif "train" not in canonical:
        canonical = {"train": next(iter(canonical.values())), **canonical}
    places = {"train": places.get("train") or next(iter(places.values())), **places}
    task = pair_task(datasets.DatasetDict(canonical), num_labels=num_labels, given=problem_type is not None,
                     places=places)
    return InMemoryTask(task, frozenset(), tuple(given), task.splits["train"])
