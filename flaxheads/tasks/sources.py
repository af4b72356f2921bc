"""Where a run's data comes from: local files, a hub data set, or a built-in one, read as the data
of the task that reads them. `load_task` is the one entry point `flaxheads train | evaluate`,
the study and the benchmarks use."""

from __future__ import annotations

import os
from collections.abc import Sequence

from flaxheads import tasks
from flaxheads.data.task import TaskData


def load_task(
    *,
    train_file: str | os.PathLike | None = None,
    validation_file: str | os.PathLike | None = None,
    test_file: str | os.PathLike | None = None,
    dataset_name: str | None = None,
    dataset: str | None = None,
    seed: int = 0,
    text_column: str = "text",
    text_pair_column: str | None = None,
    label_column: str = "label",
    problem_type: str | None = None,
    num_labels: int | None = None,
    chosen_column: str = "chosen",
    rejected_column: str = "rejected",
    task: str | None = None,
    label_all_tokens: bool = False,
    stride: int | None = None,
    tag_scheme: str | None = None,
    label_names: Sequence[str] | None = None,
    context_column: str | None = None,
    question_column: str | None = None,
    choice_columns: tuple[str, ...] | None = None,
    class_names: Sequence[str] | None = None,
    version_2_with_negative: bool = False,
    doc_stride: int | None = None,
    n_best_size: int | None = None,
    max_answer_length: int | None = None,
    null_score_diff_threshold: float | None = None,
) -> TaskData:
    """The data set named by the first of `train_file` (with `validation_file`, `test_file`),
    `dataset_name` (a Hugging Face data set in the local cache) or `dataset` (a built-in one, split
    with `seed`); the column and label arguments read files and hub data sets. ValueError when
    none is named, or as the loaders say.

    `task`: "text-classification", "token-classification" or "multiple-choice"; None: token classification when
    `train_file` holds words and tags (`looks_like_word_file`: CoNLL, CoNLL-U, or JSON / CSV with
    a tokens column), else text classification. Token classification reads the files with
    `load_word_files` (`tag_scheme`: the tags' scheme, None: detected) and labels subwords with
    `label_all_tokens` and `stride` (`word_task.WordLabelling`). `label_names`: the tags in id
    order (a trained model's, `TrainConfig.scoring_source`), for word files without a train_file;
    with it and no train_file the data is token classification. `class_names`: a trained sequence
    classifier's classes in id order (`TrainConfig.scoring_source`), for validation and test
    files without a train_file, whose labels are read against them (`encode_labels`).

    `task` "multiple-choice" (None: when `choice_columns` are given, or `train_file` has choice
    columns, `choices.looks_like_choice_file`) reads the files with `choices.load_choice_files`:
    `context_column`, `question_column`, `choice_columns` and `label_column`, detected where None.

    `task` "question-answering" (None: when `train_file` holds SQuAD data, nested or with
    question, context and answers columns) reads the files as SQuAD v1.1, or v2.0 with
    `version_2_with_negative`; `doc_stride`, `n_best_size`, `max_answer_length` and
    `null_score_diff_threshold` are run_qa.py's (`flaxheads.tasks.qa.rows.QASource`)."""
    source = {name: value for name, value in locals().items()}
    chosen = task_of_source(source)
    for other in tasks.TASKS.values():
        named = other.given(source)
        if named and other is not chosen:
            raise ValueError(f"{' and '.join(named)} {other.settings_are}, and the data reads as {chosen.name}: give "
                             f"{other.files}, pass task={other.name!r}, or leave them out")
    return chosen.load_data(source)


def task_of_source(source: dict) -> tasks.Task:
    """The task `source` (`load_task`'s arguments) names (`task=`), else the one task that reads
    its files or settings (`Task.reads`), else text classification. ValueError naming them when
    several tasks read the data: `task=` says which."""
    if source.get("task") is not None:
        return tasks.named(source["task"])
    readers = [task for name, task in tasks.TASKS.items() if name != tasks.DEFAULT and task.reads(source)]
    if len(readers) > 1:
        names = " and ".join(task.name for task in readers)
        raise ValueError(f"the data reads as {names} data alike: pass task= (--task) with the one it is, one of "
                         f"{', '.join(repr(task.name) for task in readers)}")
    return readers[0] if readers else tasks.TASKS[tasks.DEFAULT]


def task_names() -> tuple[str, ...]:
    """What `load_task(task=...)` may name: every task's name."""
    return tuple(tasks.TASKS)


__all__ = ["load_task", "task_of_source", "task_names"]
