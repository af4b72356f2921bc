"""Preference pairs for reward models (`pairwise_reward`): which data reads as pairs, and the
`TaskData` they make.

A pair is a `chosen` and a `rejected` text (TRL's `RewardTrainer` format; the source columns are
named by `chosen_column` / `rejected_column`). Data is read as pairs when `problem_type` says
`pairwise_reward`, or, with no problem type given, when it has both pair columns and no text
column. There are no labels to encode: each pair's `label` is its margin, read from a `margin`
column where the data has one (TRL's optional column: the loss then asks the chosen reward to
lead by at least that much), else 0.0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import datasets

from flaxheads import problem
from flaxheads.data.places import RowPlaces, in_python
from flaxheads.data.task import CHOSEN, LABEL, REJECTED, TaskData, default_id2label

MARGIN_COLUMN = "margin"
NO_MARGIN = 0.0


def reads_as_pairs(column_names, *, problem_type: str | None, text_column: str, chosen_column: str,
                   rejected_column: str) -> bool:
    """Whether a split with `column_names` is preference pairs (see the module docstring)."""
    if problem_type is not None:
        return problem_type == problem.PAIRWISE_REWARD
    return text_column not in column_names and {chosen_column, rejected_column} <= set(column_names)


def pair_column_map(chosen_column: str, rejected_column: str, *, flags: bool,
                    column_names=()) -> dict[str, tuple[str, str]]:
    """canonical name -> (source column, what names it: a CLI flag, or a parameter when not
    `flags`); the margins too when `column_names` (the split's) include a `margin` column."""
    if flags:
        columns = {CHOSEN: (chosen_column, "--chosen_column"), REJECTED: (rejected_column, "--rejected_column")}
    else:
        columns = {CHOSEN: (chosen_column, "chosen_column="), REJECTED: (rejected_column, "rejected_column=")}
    if MARGIN_COLUMN in column_names:
        columns[LABEL] = (MARGIN_COLUMN, f"its name, {MARGIN_COLUMN!r}")
    return columns


def pair_task(splits: datasets.DatasetDict, *, num_labels: int | None, given: bool,
              places: Mapping[str, RowPlaces] | None = None) -> TaskData:
    """`splits` (canonical `chosen` and `rejected` columns, and `label` where a margin column was
    read) as a pairwise_reward TaskData whose labels are the margins (0.0 where none was given).
    `given`: whether the caller set the problem type; `places`: how messages name each split's
    rows (default: by index, as data held in Python).

    Raises ValueError when `num_labels` is not None or 1 (a reward model scores with one number),
    and for a margin that is missing or not a finite number."""
    problem.check_problem_type(problem.PAIRWISE_REWARD, num_labels)
    with_margins = datasets.DatasetDict({
        name: _with_margins(split, (places or {}).get(name) or in_python(f"the {name} split"))
        for name, split in splits.items()
    })
    why = "set by problem_type" if given else f"the data has {CHOSEN!r} and {REJECTED!r} text columns and no text column"
    return TaskData(with_margins, problem.PAIRWISE_REWARD, 1, default_id2label(1),
                    problem_type_reason=f"{problem.PAIRWISE_REWARD}: {why}")


def _with_margins(split: datasets.Dataset, places: RowPlaces) -> datasets.Dataset:
    if LABEL not in split.column_names:
        return split.add_column(LABEL, [NO_MARGIN] * len(split), feature=datasets.Value("float32"))
    for row, margin in enumerate(split[LABEL]):
        if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not math.isfinite(margin):
            raise ValueError(f"the {MARGIN_COLUMN!r} column holds {margin!r} at {places.at(row)}; margins are "
                             "finite numbers (leave the column out for none)")
    return split.cast_column(LABEL, datasets.Value("float32"))
