"""Preference pairs for reward models (`pairwise_reward`): which data reads as pairs, and the
`TaskData` they make.

A pair is a `chosen` and a `rejected` text (TRL's `RewardTrainer` format; the source columns are
named by `chosen_column` / `rejected_column`). Data is read as pairs when `problem_type` says
`pairwise_reward`, or, with no problem type given, when it has both pair columns and no text
column. There are no labels to encode: each pair's `label` is its margin, 0.0 (TRL's optional
`margin` column is not read).
"""

from __future__ import annotations

import datasets

from flaxheads import problem
from flaxheads.data.task import CHOSEN, LABEL, REJECTED, TaskData, default_id2label

MARGIN = 0.0


def reads_as_pairs(column_names, *, problem_type: str | None, text_column: str, chosen_column: str,
                   rejected_column: str) -> bool:
    """Whether a split with `column_names` is preference pairs (see the module docstring)."""
    if problem_type is not None:
        return problem_type == problem.PAIRWISE_REWARD
    return text_column not in column_names and {chosen_column, rejected_column} <= set(column_names)


def pair_column_map(chosen_column: str, rejected_column: str, *, flags: bool) -> dict[str, tuple[str, str]]:
    """canonical name -> (source column, what names it: a CLI flag, or a parameter when not `flags`)."""
    if flags:
        return {CHOSEN: (chosen_column, "--chosen_column"), REJECTED: (rejected_column, "--rejected_column")}
    return {CHOSEN: (chosen_column, "chosen_column="), REJECTED: (rejected_column, "rejected_column=")}


def pair_task(splits: datasets.DatasetDict, *, num_labels: int | None, given: bool) -> TaskData:
    """`splits` (canonical `chosen` and `rejected` columns) as a pairwise_reward TaskData, each
    pair with a 0.0 margin as its label. `given`: whether the caller set the problem type.

    Raises ValueError when `num_labels` is not None or 1 (a reward model scores with one number)."""
    problem.check_problem_type(problem.PAIRWISE_REWARD, num_labels)
    with_margins = datasets.DatasetDict({
        name: split.add_column(LABEL, [MARGIN] * len(split), feature=datasets.Value("float32"))
        for name, split in splits.items()
    })
    why = "set by problem_type" if given else f"the data has {CHOSEN!r} and {REJECTED!r} text columns and no text column"
    return TaskData(with_margins, problem.PAIRWISE_REWARD, 1, default_id2label(1),
                    problem_type_reason=f"{problem.PAIRWISE_REWARD}: {why}")
