"""Turning a `label` column of any common type into what a classifier head trains on.

| label column holds        | default problem_type        | encoded label                              |
|---------------------------|-----------------------------|--------------------------------------------|
| strings                   | single_label_classification | index among the sorted distinct train names |
| ints / bools / ClassLabel | single_label_classification | the int, checked in `[0, num_labels)`      |
| floats, all whole numbers | single_label_classification | the int (integral floats: 1.0 -> 1)        |
| floats, mostly not whole  | regression                  | float32 score                              |
| floats, mostly whole      | refused: set problem_type   |                                            |
| lists of strings          | multi_label_classification  | multi-hot over the sorted train names      |
| lists of floats           | multi_label_classification  | kept as multi-hot rows (soft targets too)  |
| lists of ints             | multi_label_classification  | multi-hot; see `_int_lists_are_multi_hot`  |

Float columns are what CSV readers make of integer labels with a blank and what JSON makes of
`1` mixed with `1.0`, so whole-number floats are class ids; a column of mostly whole numbers with
a few other floats (0, 1, 2, 0.5) could be either and is refused rather than silently made
regression, while mostly fractional scores stay regression even where one is whole (-3.0).
An explicit `problem_type` overrides the default where the labels allow it: integer or numeric
string labels may be regression targets, integral floats may be class ids. Every rejected label
raises ValueError naming the value, its split and row (0-based, header excluded), and the flag
that changes the interpretation. `TaskData.problem_type_reason` says which row of the table
applied, or that `problem_type` was given.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import datasets
import numpy as np

from flaxheads import problem
from flaxheads.data.task import (
    LABEL,
    MULTI_LABEL,
    REGRESSION,
    SINGLE_LABEL,
    TaskData,
    column_array,
    default_id2label,
)

_DEFAULT_PROBLEM_TYPE = {
    "string": SINGLE_LABEL,
    "int": SINGLE_LABEL,
    "class": SINGLE_LABEL,
    "list": MULTI_LABEL,
}  # floats: see _float_problem_type

# (split name, row, label) of one label, to point at it in messages.
_Where = tuple[str, int, float]


def encode_labels(
    splits: datasets.DatasetDict, *, problem_type: str | None = None, num_labels: int | None = None,
    class_names: Sequence[str] | None = None,
) -> TaskData:
    """Replaces every split's `label` column by its encoding (see the module table).

    Names and the inferred `num_labels` come from the `train` split only: the classes a model
    learns are the ones it trains on. `class_names` (a trained model's classes in id order, to
    score splits without a train split) replaces them: names must be among them, class ids index
    them. The result's `problem_type_reason` says why the problem type is what it is. Raises
    ValueError for missing labels, labels unknown to the train split (or not in `class_names`),
    class ids outside `[0, num_labels)`, non-numeric regression labels, float labels mixing
    whole numbers with other values when `problem_type` is None, and problem types the labels
    cannot express.
    """
    problem.check_problem_type(problem_type)
    if "train" not in splits and class_names is None:
        raise ValueError(f"the labels' classes come from the train split, and there is none (splits: {sorted(splits)})"
                         ": give a train split, or the trained model's class names")
    values = {name: list(split[LABEL]) for name, split in splits.items()}
    for name, split_values in values.items():
        _check_no_missing(split_values, name)
    known = None if class_names is None else _Known(dict(enumerate(class_names)), num_labels)
    feature = splits["train" if "train" in splits else next(iter(splits))].features[LABEL]
    kind = _label_kind(feature)
    whole, fractional, whole_share = _first_whole_and_fractional(values) if kind == "float" else (None, None, 0.0)
    given = problem_type is not None
    if not given and kind == "float":
        problem_type = _float_problem_type(whole, fractional, whole_share)
    elif not given:
        problem_type = _DEFAULT_PROBLEM_TYPE[kind]
    _check_kind_fits(kind, problem_type)
    if problem_type == REGRESSION:
        _agreeing_num_labels(num_labels, 1, "score per example that regression labels hold")
        encoded, id2label = _regression(values), default_id2label(1)
        why = f"the label column holds non-integer floats (e.g. {_at(fractional)})" if fractional else ""
        if fractional and whole:
            why += f"; {whole_share:.0%} are whole numbers, read as scores too"
    elif problem_type == SINGLE_LABEL:
        encoded, id2label = _single_label(values, kind, feature, num_labels, known)
        why = _single_label_why(kind, feature, id2label, whole)
    else:
        encoded, id2label, why = _multi_label(values, feature.feature.dtype, num_labels, known)
    reason = f"{problem_type}: {'set by problem_type' if given else why}"
    encoded_feature = _encoded_feature(problem_type, len(id2label))
    new_splits = datasets.DatasetDict(
        {
            name: split.remove_columns(LABEL).add_column(LABEL, encoded[name], feature=encoded_feature)
            for name, split in splits.items()
        }
    )
    return TaskData(new_splits, problem_type, len(id2label), id2label, problem_type_reason=reason)


def _first_whole_and_fractional(values: dict[str, list[float]]) -> tuple[_Where | None, _Where | None, float]:
    """The first whole-number label, the first other label (NaN included), train split first,
    and the share of whole numbers among all labels."""
    whole = fractional = None
    count = total = 0
    for name in sorted(values, key=lambda name: name != "train"):
        for row, value in enumerate(values[name]):
            total += 1
            if float(value).is_integer():
                count += 1
                whole = whole or (name, row, value)
            else:
                fractional = fractional or (name, row, value)
    return whole, fractional, count / max(total, 1)


def _float_problem_type(whole: _Where | None, fractional: _Where | None, whole_share: float) -> str:
    """Whole numbers only: class ids. Mostly other values: scores (a score of -3.0 is still a
    score). Mostly whole numbers with a few others (0, 1, 2, 0.5): unclear, refused."""
    if fractional is None:
        return SINGLE_LABEL
    if whole_share < 0.5:
        return REGRESSION
    raise ValueError(
        f"the float label column is mostly whole numbers ({whole_share:.0%}, e.g. {_at(whole)}) with some other "
        f"values (first: {_at(fractional)}), so it is unclear whether the labels are class ids or scores. Pass "
        f"problem_type='{REGRESSION}' to read every label as a score, or, if they are class ids, "
        f"fix the label {fractional[2]!r} in row {fractional[1]} of the {fractional[0]} split"
    )


def _at(where: _Where) -> str:
    split_name, row, value = where
    return f"{value!r} at {split_name} row {row}"


def _single_label_why(kind: str, feature, id2label: dict[int, str], whole: _Where | None) -> str:
    if kind == "string":
        return f"the label column holds strings ({_names(id2label)})"
    if kind == "class":
        return f"the label column is a ClassLabel ({_names(id2label)})"
    class_ids = f"class ids in [0, {len(id2label)})"
    if kind == "float":
        return (
            f"the label column holds floats that are all whole numbers (e.g. {_at(whole)}), read as "
            f"{class_ids}; problem_type='{REGRESSION}' reads them as scores instead"
        )
    if feature.dtype == "bool":
        return "the label column holds booleans, read as class ids 0 (false) and 1 (true)"
    return f"the label column holds integers, read as {class_ids}"


def _names(id2label: dict[int, str], shown: int = 5) -> str:
    names = list(id2label.values())
    listed = ", ".join(map(str, names[:shown])) + (", ..." if len(names) > shown else "")
    return f"{len(names)} names: {listed}"


def _label_kind(feature) -> str:
    if isinstance(feature, datasets.ClassLabel):
        return "class"
    if isinstance(feature, (datasets.List, datasets.LargeList)):
        return "list"
    dtype = getattr(feature, "dtype", None)
    if dtype in ("string", "large_string"):
        return "string"
    if dtype == "bool" or (dtype or "").startswith(("int", "uint")):
        return "int"
    if (dtype or "").startswith("float"):
        return "float"
    raise ValueError(f"unsupported label column type {feature}; expected strings, numbers or lists")


def _check_no_missing(values: Sequence, split_name: str) -> None:
    for row, value in enumerate(values):
        if value is None:
            raise ValueError(f"the label is missing in row {row} of the {split_name} split")


def _check_kind_fits(kind: str, problem_type: str) -> None:
    if kind == "list" and problem_type != MULTI_LABEL:
        raise ValueError(
            f"list-valued labels need problem_type='{MULTI_LABEL}', got problem_type='{problem_type}'"
        )
    if kind != "list" and problem_type == MULTI_LABEL:
        raise ValueError(
            f"problem_type='{MULTI_LABEL}' needs list-valued labels (multi-hot lists, or lists of "
            f"label ids or names), but the label column holds {kind} values"
        )


def _regression(values: dict[str, list]) -> dict[str, list[float]]:
    return {name: [_score(v, name, row) for row, v in enumerate(vs)] for name, vs in values.items()}


def _score(value, split_name: str, row: int) -> float:
    try:
        score = float(value)
    except (TypeError, ValueError):
        score = math.nan  # reported below, like infinities and NaN
    if not math.isfinite(score):
        raise ValueError(
            f"problem_type='{REGRESSION}' needs finite numeric labels, but row {row} of the {split_name} "
            f"split has the label {value!r}; convert the labels to numbers or choose another problem_type"
        )
    return score


class _Known:
    """A trained model's classes, standing in for the train split's (`encode_labels(class_names=)`)."""

    def __init__(self, id2label: dict[int, str], num_labels: int | None):
        _agreeing_num_labels(num_labels, len(id2label), f"class names {list(id2label.values())}")
        self.id2label = id2label


def _single_label(values, kind, feature, num_labels, known: _Known | None = None):
    if kind == "string":
        id2label = known.id2label if known else _names_from_train(values["train"], num_labels)
        label2id = {name: i for i, name in id2label.items()}
        for name, vs in values.items():
            _check_names_known(enumerate(vs), label2id, name, known)
        return {name: [label2id[v] for v in vs] for name, vs in values.items()}, id2label
    class_ids = {name: [_class_id(v, name, row) for row, v in enumerate(vs)] for name, vs in values.items()}
    if kind == "class":
        id2label = dict(enumerate(feature.names))
        _agreeing_num_labels(num_labels, len(id2label), "ClassLabel names")
    else:
        id2label = known.id2label if known else default_id2label(num_labels or max(class_ids["train"]) + 1)
    for name, ids in class_ids.items():
        _check_ids_in_range(enumerate(ids), len(id2label), name)
    return class_ids, id2label


def _class_id(value, split_name: str, row: int) -> int:
    if not float(value).is_integer():
        raise ValueError(
            f"problem_type='{SINGLE_LABEL}' needs integer class ids, but row {row} of the "
            f"{split_name} split has the label {value!r}; use problem_type='{REGRESSION}' for scores"
        )
    return int(value)


def _names_from_train(train_labels: Sequence[str], num_labels: int | None) -> dict[int, str]:
    names = sorted(set(train_labels))
    _agreeing_num_labels(num_labels, len(names), f"distinct train labels {names}")
    return dict(enumerate(names))


def _agreeing_num_labels(requested: int | None, found: int, what: str) -> int:
    if requested is not None and requested != found:
        raise ValueError(f"num_labels={requested} disagrees with the {found} {what}")
    return found


def _check_names_known(rows_and_names: Iterable[tuple[int, str]], label2id, split_name: str,
                       known: _Known | None = None) -> None:
    for row, name in rows_and_names:
        if name not in label2id and known is not None:
            raise ValueError(f"label {name!r} in row {row} of the {split_name} split is not one of the model's "
                             f"classes {list(label2id)}: score the model on data labelled with its own classes")
        if name not in label2id:
            raise ValueError(
                f"label {name!r} in row {row} of the {split_name} split does not occur in the "
                f"train split, whose labels are {sorted(label2id)}"
            )


def _check_ids_in_range(rows_and_ids: Iterable[tuple[int, int]], num_labels: int, split_name: str) -> None:
    for row, class_id in rows_and_ids:
        if not 0 <= class_id < num_labels:
            raise ValueError(
                f"label {class_id} in row {row} of the {split_name} split is outside "
                f"[0, {num_labels}); pass a num_labels larger than the largest class id, or fix the label"
            )


def _entries_with_rows(rows: Sequence[Sequence]) -> list[tuple[int, object]]:
    return [(row_index, entry) for row_index, row in enumerate(rows) for entry in row]


def _multi_label(values, element_type: str, num_labels, known: _Known | None = None):
    """(encoded labels, id2label, how the lists were read)."""
    if known is not None:
        num_labels = len(known.id2label)
    if element_type in ("string", "large_string"):
        id2label = known.id2label if known else _names_from_train([n for names in values["train"] for n in names],
                                                                  num_labels)
        label2id = {name: i for i, name in id2label.items()}
        for name, rows in values.items():
            _check_names_known(_entries_with_rows(rows), label2id, name, known)
        ids = {name: [[label2id[n] for n in row] for row in rows] for name, rows in values.items()}
        why = f"the label column holds lists of strings ({_names(id2label)})"
        return _multi_hot_from_ids(ids, len(id2label)), id2label, why
    if element_type.startswith("float") or _int_lists_are_multi_hot(values, num_labels):
        width = num_labels if known else len(values["train"][0])
        _agreeing_num_labels(num_labels, width, "entries of the multi-hot label lists")
        reference = "the model's classes number" if known else "the train split's have"
        for name, rows in values.items():
            _check_multi_hot_width(rows, width, name, reference)
        entries = "floats" if element_type.startswith("float") else "0/1 integers"
        why = f"the label column holds lists of {width} {entries}, read as multi-hot rows"
        return values, known.id2label if known else default_id2label(width), why
    num_labels = num_labels or 1 + max((max(row) for row in values["train"] if row), default=0)
    for name, rows in values.items():
        _check_ids_in_range(_entries_with_rows(rows), num_labels, name)
    why = f"the label column holds lists of integers, read as class ids in [0, {num_labels})"
    return _multi_hot_from_ids(values, num_labels), known.id2label if known else default_id2label(num_labels), why


def _int_lists_are_multi_hot(values: dict[str, list], num_labels: int | None) -> bool:
    """Integer lists read as multi-hot rows when all have one length >= 2 (equal to num_labels
    if given) and hold only 0 and 1; otherwise they are lists of class ids. Only id lists drawn
    from {0, 1} in which every row holds exactly two ids are ambiguous, and they are rare."""
    rows = [row for split_rows in values.values() for row in split_rows]
    widths = {len(row) for row in rows}
    if len(widths) != 1 or min(widths) < 2 or (num_labels is not None and widths != {num_labels}):
        return False
    return all(v in (0, 1) for row in rows for v in row)


def _check_multi_hot_width(rows: Sequence[Sequence[float]], width: int, split_name: str,
                           reference: str = "the train split's have") -> None:
    for row_index, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(
                f"the multi-hot label in row {row_index} of the {split_name} split has "
                f"{len(row)} entries, but {reference} {width}"
            )


def _multi_hot_from_ids(ids: dict[str, list[list[int]]], num_labels: int) -> dict[str, list[list[float]]]:
    def multi_hot(label_ids):
        row = [0.0] * num_labels
        for label_id in label_ids:
            row[label_id] = 1.0
        return row

    return {name: [multi_hot(row) for row in rows] for name, rows in ids.items()}


def _encoded_feature(problem_type: str, num_labels: int):
    return problem.by_problem_type(
        problem_type,
        single_label=datasets.Value("int32"),
        regression=datasets.Value("float32"),
        multi_label=datasets.List(datasets.Value("float32"), length=num_labels),
    )


IMBALANCE_SHARE = 0.9
"""A training split with one class above this share gets a warning: accuracy then says little."""


def imbalance_warning(task: TaskData, split: str = "train") -> str | None:
    """A warning when one class holds more than `IMBALANCE_SHARE` of a single-label split, naming
    the class and its share; None otherwise (and for other problem types)."""
    if task.problem_type != SINGLE_LABEL or split not in task.splits or len(task.splits[split]) == 0:
        return None
    labels = column_array(task.splits[split], LABEL)
    counts = np.bincount(labels, minlength=task.num_labels)
    top = int(np.argmax(counts))
    share = counts[top] / counts.sum()
    if share <= IMBALANCE_SHARE:
        return None
    return (f"{share:.1%} of the {counts.sum()} {split} examples are {task.id2label[top]!r}: a model that always "
            "answers it scores that accuracy, so watch macro_f1 and mcc; if the rare classes matter, weight them "
            "(class_weights='balanced', on the command line --class_weights balanced) or resample the data")


def relabelled(task: TaskData, split: str, class_names: Sequence[str]) -> datasets.Dataset:
    """`task`'s `split` with its labels renumbered to the class ids of a model whose classes are
    `class_names` (in id order), matched by name: data whose classes sort in another order is
    scored against the model's classes, not its ids. Regression and pairs are returned as they are.

    Raises ValueError when the data's classes are not the model's, naming both."""
    rows = task.splits[split]
    if task.problem_type not in (SINGLE_LABEL, MULTI_LABEL):
        return rows
    data_names = [task.id2label[i] for i in range(task.num_labels)]
    model_names = list(class_names)
    if data_names == model_names:
        return rows
    if sorted(data_names) != sorted(model_names):
        raise ValueError(
            f"the data's classes {data_names} are not the model's {model_names}: score the model on data labelled "
            "with its own classes"
        )
    to_model = np.array([model_names.index(name) for name in data_names])
    labels = column_array(rows, LABEL)
    if task.problem_type == SINGLE_LABEL:
        moved = to_model[labels]
    else:  # multi-hot rows: column i of the data is column to_model[i] of the model
        moved = np.zeros_like(labels)
        moved[:, to_model] = labels
    return rows.remove_columns(LABEL).add_column(LABEL, moved.tolist(), feature=rows.features[LABEL])
