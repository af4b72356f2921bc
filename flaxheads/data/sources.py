"""Where a run's data comes from: local files, a hub data set, or a built-in one. `load_task` is
the one entry point `flaxheads train | evaluate`, the study and the benchmarks use."""

from __future__ import annotations

import os

from flaxheads.data.builtin import load_builtin
from flaxheads.data.files import load_local_files, load_named_dataset
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
) -> TaskData:
    """The data set named by the first of `train_file` (with `validation_file`, `test_file`),
    `dataset_name` (a Hugging Face data set in the local cache) or `dataset` (a built-in one, split
    with `seed`); the column and label arguments read files and hub data sets. ValueError when
    none is named, or as the loaders say."""
    columns = dict(text_column=text_column, text_pair_column=text_pair_column, label_column=label_column,
                   problem_type=problem_type, num_labels=num_labels, chosen_column=chosen_column,
                   rejected_column=rejected_column)
    if train_file:
        return load_local_files(train_file=train_file, validation_file=validation_file, test_file=test_file,
                                **columns)
    if dataset_name:
        return load_named_dataset(dataset_name, **columns)
    if dataset:
        return load_builtin(dataset, seed=seed)
    raise ValueError("no data: give a train_file, a dataset_name (a hub data set) or a dataset (a built-in one)")


__all__ = ["load_task"]
