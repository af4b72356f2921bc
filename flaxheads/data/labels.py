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
raises ValueError naming the value, where it is (`flaxheads.data.places`: the line of a file,
the index of data in Python), and the flag that changes the interpretation.
`TaskData.problem_type_reason` says which row of the table applied, or that `problem_type` was
given.

A decision about the whole column (names or class ids, multi-hot rows or lists of class ids) is
the one most labels ask for, never one row's: a label that contradicts it (a name among class
ids, a multi-hot row of another length) is refused where it is, and a missing label (None, NaN)
is refused rather than read as a class.
"""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Iterable, Mapping, Sequence

import datasets
import numpy as np

from flaxheads import problem
from flaxheads.data.places import RowPlaces, in_python
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

# (where it is, as `RowPlaces.at` names it; label) of one label, to point at it in messages.
_Where = tuple[str, float]
_INTEGER = re.compile(r"\s*[+-]?\d+\s*")


def encode_labels(
    splits: datasets.DatasetDict, *, problem_type: str | None = None, num_labels: int | None = None,
    class_names: Sequence[str] | None = None, places: Mapping[str, RowPlaces] | None = None,
) -> TaskData:
    """Replaces every split's `label` column by its encoding (see the module table).

    Names and the inferred `num_labels` come from the `train` split only: the classes a model
    learns are the ones it trains on. `class_names` (a trained model's classes in id order, to
    score splits without a train split) replaces them: names must be among them, class ids index
    them. The result's `problem_type_reason` says why the problem type is what it is. Raises
    ValueError for missing labels, labels unknown to the train split (or not in `class_names`),
    class ids outside `[0, num_labels)`, non-numeric regression labels, float labels mixing
    whole numbers with other values when `problem_type` is None, string labels mixing class ids
    and names, multi-hot rows of another length than most, and problem types the labels cannot
    express. `places`: how messages name each split's rows (default: by index, as data held in
    Python; `flaxheads.data.places`).
    """
    problem.check_problem_type(problem_type)
    if "train" not in splits and class_names is None:
        raise ValueError(f"the labels' classes come from the train split, and there is none (splits: {sorted(splits)})"
                         ": give a train split, or the trained model's class names")
    places = {name: (places or {}).get(name) or in_python(f"the {name} split") for name in splits}
    values = {name: list(split[LABEL]) for name, split in splits.items()}
    for name, split_values in values.items():
        _check_no_missing(split_values, places[name])
    known = None if class_names is None else _Known(dict(enumerate(class_names)), num_labels)
    feature = splits["train" if "train" in splits else next(iter(splits))].features[LABEL]
    kind = _label_kind(feature)
    whole, fractional, whole_share = (_first_whole_and_fractional(values, places) if kind == "float"
                                      else (None, None, 0.0))
    given = problem_type is not None
    if not given and kind == "float":
        problem_type = _float_problem_type(whole, fractional, whole_share)
    elif not given:
        problem_type = _DEFAULT_PROBLEM_TYPE[kind]
    _check_kind_fits(kind, problem_type)
    if problem_type == REGRESSION:
        _agreeing_num_labels(num_labels, 1, "score per example that regression labels hold")
        encoded, id2label = _regression(values, places), default_id2label(1)
        why = f"the label column holds non-integer floats (e.g. {_at(fractional)})" if fractional else ""
        if fractional and whole:
            why += f"; {whole_share:.0%} are whole numbers, read as scores too"
    elif problem_type == SINGLE_LABEL:
        encoded, id2label = _single_label(values, kind, feature, num_labels, places, known)
        why = _single_label_why(kind, feature, id2label, whole)
    else:
        encoded, id2label, why = _multi_label(values, feature.feature.dtype, num_labels, places, known)
    reason = f"{problem_type}: {'set by problem_type' if given else why}"
    encoded_feature = _encoded_feature(problem_type, len(id2label))
    new_splits = datasets.DatasetDict(
        {
            name: split.remove_columns(LABEL).add_column(LABEL, encoded[name], feature=encoded_feature)
            for name, split in splits.items()
        }
    )
    return TaskData(new_splits, problem_type, len(id2label), id2label, problem_type_reason=reason)


def _first_whole_and_fractional(values: dict[str, list[float]], places: Mapping[str, RowPlaces]
                                ) -> tuple[_Where | None, _Where | None, float]:
    """The first whole-number label, the first other label, train split first, and the share of
    whole numbers among all labels (missing ones are refused before)."""
    whole = fractional = None
    count = total = 0
    for name in sorted(values, key=lambda name: name != "train"):
        for row, value in enumerate(values[name]):
            total += 1
            if float(value).is_integer():
                count += 1
                whole = whole or (places[name].at(row), value)
            else:
                fractional = fractional or (places[name].at(row), value)
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
        f"fix the label {fractional[1]!r} at {fractional[0]}"
    )


def _at(where: _Where) -> str:
    place, value = where
    return f"{value!r} at {place}"


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


def is_missing(value) -> bool:
    """None, or NaN (how pandas and numpy mark a missing value)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _check_no_missing(values: Sequence, place: RowPlaces) -> None:
    for row, value in enumerate(values):
        if is_missing(value):
            raise ValueError(f"the label is missing at {place.at(row)} ({value!r}); give every row its label, or "
                             "remove the row")


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


def _regression(values: dict[str, list], places: Mapping[str, RowPlaces]) -> dict[str, list[float]]:
    return {name: [_score(v, places[name], row) for row, v in enumerate(vs)] for name, vs in values.items()}


def _score(value, place: RowPlaces, row: int) -> float:
    try:
        score = float(value)
    except (TypeError, ValueError):
        score = math.nan  # reported below, like infinities and NaN
    if not math.isfinite(score):
        raise ValueError(
            f"problem_type='{REGRESSION}' needs finite numeric labels, but {place.at(row)} has the label {value!r}; "
            "convert the labels to numbers or choose another problem_type"
        )
    return score


class _Known:
    """A trained model's classes, standing in for the train split's (`encode_labels(class_names=)`)."""

    def __init__(self, id2label: dict[int, str], num_labels: int | None):
        _agreeing_num_labels(num_labels, len(id2label), f"class names {list(id2label.values())}")
        self.id2label = id2label


def _single_label(values, kind, feature, num_labels, places: Mapping[str, RowPlaces], known: _Known | None = None):
    if kind == "string":
        _check_ids_or_names(values, places)
        id2label = known.id2label if known else _names_from_train(values["train"], num_labels)
        label2id = {name: i for i, name in id2label.items()}
        for name, vs in values.items():
            _check_names_known(enumerate(vs), label2id, places[name], known)
        return {name: [label2id[v] for v in vs] for name, vs in values.items()}, id2label
    class_ids = {name: [_class_id(v, places[name], row) for row, v in enumerate(vs)] for name, vs in values.items()}
    if kind == "class":
        id2label = dict(enumerate(feature.names))
        _agreeing_num_labels(num_labels, len(id2label), "ClassLabel names")
    else:
        id2label = known.id2label if known else default_id2label(num_labels or max(class_ids["train"]) + 1)
    for name, ids in class_ids.items():
        _check_ids_in_range(enumerate(ids), len(id2label), places[name])
    return class_ids, id2label


def _check_ids_or_names(values: dict[str, list[str]], places: Mapping[str, RowPlaces]) -> None:
    """String labels are class names, or class ids written in digits (a CSV column of ids with a
    name among them is read as strings): labels of both kinds are read as most of them are, and
    the first of the other kind is refused, rather than every id becoming a name of its own."""
    first: dict[bool, tuple[RowPlaces, int, str]] = {}
    counts = {True: 0, False: 0}
    for name in sorted(values, key=lambda name: name != "train"):
        for row, value in enumerate(values[name]):
            is_id = bool(_INTEGER.fullmatch(value))
            counts[is_id] += 1
            first.setdefault(is_id, (places[name], row, value))
    if not (counts[True] and counts[False]):
        return
    ids = counts[True] > counts[False]
    (typical_places, typical_row, typical), (odd_places, odd_row, odd) = first[ids], first[not ids]
    odd_place = odd_places.row(odd_row) if odd_places is typical_places else odd_places.at(odd_row)
    most = (f"the labels of {typical_places.source} are mostly class {'ids' if ids else 'names'} "
            f"({counts[ids]} of {sum(counts.values())}, e.g. {typical!r} at {typical_places.row(typical_row)})")
    if ids:
        raise ValueError(f"{most}, but {odd_place} holds the name {odd!r}: give it the class id it means, or give "
                         "every row its class name (a column of ids and names mixed reads as neither)")
    raise ValueError(f"{most}, but {odd_place} holds the number {odd!r}: give it its class name, or give every row "
                     "its class id (a column of names and ids mixed reads as neither)")


def _class_id(value, place: RowPlaces, row: int) -> int:
    if not float(value).is_integer():
        raise ValueError(
            f"problem_type='{SINGLE_LABEL}' needs integer class ids, but {place.at(row)} has the label {value!r}; "
            f"use problem_type='{REGRESSION}' for scores"
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


def _check_names_known(rows_and_names: Iterable[tuple[int, str]], label2id, place: RowPlaces,
                       known: _Known | None = None) -> None:
    for row, name in rows_and_names:
        if name not in label2id and known is not None:
            raise ValueError(f"label {name!r} at {place.at(row)} is not one of the model's classes {list(label2id)}: "
                             "score the model on data labelled with its own classes")
        if name not in label2id:
            raise ValueError(
                f"label {name!r} at {place.at(row)} does not occur in the train split, whose labels are "
                f"{sorted(label2id)}"
            )


def _check_ids_in_range(rows_and_ids: Iterable[tuple[int, int]], num_labels: int, place: RowPlaces) -> None:
    for row, class_id in rows_and_ids:
        if not 0 <= class_id < num_labels:
            raise ValueError(
                f"label {class_id} at {place.at(row)} is outside [0, {num_labels}); pass a num_labels larger than "
                "the largest class id, or fix the label"
            )


def _entries_with_rows(rows: Sequence[Sequence]) -> list[tuple[int, object]]:
    return [(row_index, entry) for row_index, row in enumerate(rows) for entry in row]


def _multi_label(values, element_type: str, num_labels, places: Mapping[str, RowPlaces], known: _Known | None = None):
    """(encoded labels, id2label, how the lists were read)."""
    if known is not None:
        num_labels = len(known.id2label)
    if element_type in ("string", "large_string"):
        id2label = known.id2label if known else _names_from_train([n for names in values["train"] for n in names],
                                                                  num_labels)
        label2id = {name: i for i, name in id2label.items()}
        for name, rows in values.items():
            _check_names_known(_entries_with_rows(rows), label2id, places[name], known)
        ids = {name: [[label2id[n] for n in row] for row in rows] for name, rows in values.items()}
        why = f"the label column holds lists of strings ({_names(id2label)})"
        return _multi_hot_from_ids(ids, len(id2label)), id2label, why
    floats = element_type.startswith("float")
    width = _multi_hot_width(values, num_labels, floats)
    if width is not None:
        _agreeing_num_labels(num_labels, width, "entries of the multi-hot label lists")
        reference = "the model's classes number" if known else "most rows have"
        for name, rows in values.items():
            _check_multi_hot_rows(rows, width, places[name], reference, zero_one=not floats)
        entries = "floats" if floats else "0/1 integers"
        why = f"the label column holds lists of {width} {entries}, read as multi-hot rows"
        return values, known.id2label if known else default_id2label(width), why
    num_labels = num_labels or 1 + max((max(row) for row in values["train"] if row), default=0)
    for name, rows in values.items():
        _check_ids_in_range(_entries_with_rows(rows), num_labels, places[name])
    why = f"the label column holds lists of integers, read as class ids in [0, {num_labels})"
    return _multi_hot_from_ids(values, num_labels), known.id2label if known else default_id2label(num_labels), why


def _multi_hot_width(values: dict[str, list], num_labels: int | None, floats: bool) -> int | None:
    """The length of the multi-hot rows, or None when integer lists are lists of class ids.

    Float lists are multi-hot rows (soft targets too) as long as most of them are. Integer
    lists are multi-hot when most rows (more than half) have one length of at least 2 (the
    commonest, or num_labels if given) and hold only 0 and 1; otherwise they are lists of class
    ids. Most rows, not all: one row of another length is refused where it is, not taken as a
    sign that every row is a list of class ids. Only id lists of which most are [0, 1] are
    ambiguous, and they are rare (a num_labels other than their length reads them as class ids)."""
    rows = [row for split_rows in values.values() for row in split_rows]
    lengths = collections.Counter(len(row) for row in rows)
    width = num_labels if num_labels is not None else lengths.most_common(1)[0][0]
    if floats:
        return width
    fitting = sum(1 for row in rows if len(row) == width and all(v in (0, 1) for v in row))
    return width if width >= 2 and 2 * fitting > len(rows) else None


def _check_multi_hot_rows(rows: Sequence[Sequence[float]], width: int, place: RowPlaces,
                          reference: str = "most rows have", *, zero_one: bool = False) -> None:
    for row_index, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(
                f"the multi-hot label at {place.at(row_index)} has {len(row)} entries, but {reference} {width}: "
                f"give it {width}, one per class"
            )
        if zero_one and any(v not in (0, 1) for v in row):
            raise ValueError(
                f"the multi-hot label at {place.at(row_index)} holds {_short([v for v in row if v not in (0, 1)][0])}, "
                "but multi-hot rows hold 0 and 1, as most rows here do: fix it"
            )


def _multi_hot_from_ids(ids: dict[str, list[list[int]]], num_labels: int) -> dict[str, list[list[float]]]:
    def multi_hot(label_ids):
        row = [0.0] * num_labels
        for label_id in label_ids:
            row[label_id] = 1.0
        return row

    return {name: [multi_hot(row) for row in rows] for name, rows in ids.items()}


def check_label_kinds(labels: Iterable, places: RowPlaces, column: str, parameter: str) -> None:
    """Raises ValueError naming the first label whose type (number, string, boolean, list of
    strings, ...) is not the type most labels have, and any label that is no label at all (a
    dict, say). Missing labels (None, NaN) are left to `encode_labels`, which names them.

    For labels whose types the reader keeps as they are (JSON, data held in Python): one odd
    label is refused where it is, never the kind every other label is read as."""
    kinds: dict[str, list] = {}  # kind -> [count, first row, first label]
    total = 0
    for row, label in enumerate(labels):
        if is_missing(label):
            continue
        kind = label_kind_of(label)
        if kind == "object":
            raise ValueError(f"the label column {column!r} ({parameter}) holds {_a(type(label).__name__)} at "
                             f"{places.at(row)} ({_short(label)}); a label is a class name, a class id, a score or "
                             "a list of them (multi-label)")
        total += 1
        kinds.setdefault(kind, [0, row, label])[0] += 1
    lists = [kind for kind in kinds if kind.startswith("list")]
    if "empty list" in kinds and lists != ["empty list"]:  # an empty list fits a column of any lists
        empty = kinds.pop("empty list")
        total -= empty[0]
    if len(kinds) < 2:
        return
    typical = max(kinds, key=lambda kind: (kinds[kind][0], -kinds[kind][1]))
    odd = min((kind for kind in kinds if kind != typical), key=lambda kind: kinds[kind][1])
    count, typical_row, typical_label = kinds[typical]
    _, odd_row, odd_label = kinds[odd]
    raise ValueError(
        f"the label column {column!r} ({parameter}) of {places.source} mixes types: most labels ({count} of {total}) "
        f"are {_plural(typical)} (e.g. {_short(typical_label)} at {places.row(typical_row)}), but "
        f"{places.row(odd_row)} holds {_a(odd)} ({_short(odd_label)}). Give every label one type: class names "
        "(all strings) or class ids (all integers) for classification, numbers with problem_type='regression' for "
        "scores, or lists for multi-label; e.g. quote numbers that are class names"
    )


def label_kind_of(value) -> str:
    """"number", "string", "boolean", "list of numbers", "empty list", ... ("object" for what is
    no label), as JSON would type `value`; numpy scalars and arrays as the numbers and lists
    they hold. Not for missing values (`is_missing`)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"  # 1 and 1.0 are one kind: encode_labels decides what numbers mean
    if isinstance(value, str):
        return "string"
    if not isinstance(value, (list, tuple)):
        return "object"
    if not value:
        return "empty list"
    entry_kinds = sorted({"null" if is_missing(entry) else label_kind_of(entry) for entry in value})
    return "list of " + " and ".join(_plural(kind) for kind in entry_kinds)


def _plural(kind: str) -> str:
    first, _, rest = kind.partition(" ")  # "list of numbers" -> "lists of numbers"
    return f"{first}s {rest}".rstrip()


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _short(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
