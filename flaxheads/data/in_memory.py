"""Labelled text held in Python: `datasets.Dataset`s, dicts of columns, lists of rows, or
(texts, labels) tuples, made into a `TaskData` by the same column and label rules as files.

The columns are found by the names `text_column`, `text_pair_column` and `label_column` (a
tuple is given those names by position), and labels are encoded by `flaxheads.data.labels`,
so in-memory data and files give the same classes, problem type and errors. Preference pairs
(`chosen_column`, `rejected_column`) are read as `flaxheads.data.pairs` says; a tuple of pairs is
`(chosen_texts, rejected_texts)`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Union

import datasets

from flaxheads.data.files import canonical_columns
from flaxheads.data.labels import encode_labels
from flaxheads.data.pairs import MARGIN_COLUMN, pair_column_map, pair_task, reads_as_pairs
from flaxheads.data.task import LABEL, TEXT, TEXT_PAIR, TaskData

SplitData = Union[datasets.Dataset, Mapping[str, Sequence], Sequence[Mapping[str, Any]], tuple, Sequence[str]]
"""A `datasets.Dataset`; a dict of columns; a list of row dicts; a tuple `(texts, labels)` or
`(texts, text_pairs, labels)`; or a list of texts alone (unlabelled: a test split to predict)."""


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
               label_column: str = "label") -> datasets.Dataset:
    """`split` as a `datasets.Dataset` (see `SplitData`); a tuple's items become the named columns."""
    if isinstance(split, datasets.Dataset):
        return split
    if isinstance(split, Mapping):
        return datasets.Dataset.from_dict({name: list(values) for name, values in split.items()})
    if isinstance(split, tuple):
        names = [text_column, *([text_pair_column] if text_pair_column else []), label_column]
        if len(split) not in (len(names) - 1, len(names)):
            raise ValueError(
                f"a tuple of data holds the columns {tuple(names)} in that order (the label may be left out "
                f"for data to predict), got {len(split)} items"
            )
        return datasets.Dataset.from_dict({name: list(values) for name, values in zip(names, split)})
    rows = list(split)
    if rows and all(isinstance(row, str) for row in rows):
        return datasets.Dataset.from_dict({text_column: rows})
    if rows and all(isinstance(row, Mapping) for row in rows):
        return datasets.Dataset.from_list(rows)
    raise TypeError(
        "data must be a datasets.Dataset, a dict of columns, a list of row dicts, a (texts, labels) tuple or a "
        f"list of texts; got {type(split).__name__}" + (" (empty)" if not rows else "")
    )


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
    first = next(iter(given.values()))
    first_columns = (beside if beside is not None else first if isinstance(first, datasets.Dataset)
                     else as_dataset(first, text_column=text_column, text_pair_column=text_pair_column,
                                     label_column=label_column)).column_names
    if reads_as_pairs(first_columns, problem_type=problem_type, text_column=text_column,
                      chosen_column=chosen_column, rejected_column=rejected_column):
        return _pairs_in_memory(given, chosen_column, rejected_column, problem_type, num_labels, beside)
    columns = {TEXT: (text_column, "text_column="), LABEL: (label_column, "label_column=")}
    if text_pair_column:
        columns[TEXT_PAIR] = (text_pair_column, "text_pair_column=")
    canonical, unlabelled = {}, set()
    for name, split in given.items():
        dataset = as_dataset(split, text_column=text_column, text_pair_column=text_pair_column,
                             label_column=label_column)
        if name == "test" and label_column not in dataset.column_names:
            unlabelled.add(name)
            canonical[name] = canonical_columns(dataset, {k: v for k, v in columns.items() if k != LABEL},
                                                 f"{name} data")
        else:
            canonical[name] = canonical_columns(dataset, columns, f"{name} data")
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
    task = encode_labels(datasets.DatasetDict(canonical), problem_type=problem_type, num_labels=num_labels)
    return InMemoryTask(task, frozenset(unlabelled), tuple(given), source_train)


def _pairs_in_memory(given: dict, chosen_column: str, rejected_column: str, problem_type: str | None,
                     num_labels: int | None, beside: datasets.Dataset | None) -> InMemoryTask:
    """Preference pairs: every given split needs both pair columns (no split goes unlabelled)."""
    canonical = {}
    for name, split in given.items():
        # A tuple is (chosen, rejected[, margins]): the pair columns stand where a tuple's texts go.
        dataset = as_dataset(split, text_column=chosen_column, text_pair_column=rejected_column,
                             label_column=MARGIN_COLUMN)
        columns = pair_column_map(chosen_column, rejected_column, flags=False, column_names=dataset.column_names)
        canonical[name] = canonical_columns(dataset, columns, f"{name} data")
    if beside is not None:
        canonical = {"train": beside, **canonical}
    elif "train" not in canonical:
        canonical = {"train": next(iter(canonical.values())), **canonical}
    task = pair_task(datasets.DatasetDict(canonical), num_labels=num_labels, given=problem_type is not None)
    return InMemoryTask(task, frozenset(), tuple(given), task.splits["train"])
