"""Where a run's data comes from: local files, a hub data set, or a built-in one. `load_task` is
the one entry point `flaxheads train | evaluate`, the study and the benchmarks use."""

from __future__ import annotations

import os
from collections.abc import Sequence

from flaxheads.data.builtin import load_builtin
from flaxheads.data.choices import load_choice_files, looks_like_choice_file
from flaxheads.data.files import MissingColumn, load_local_files, load_named_dataset
from flaxheads.data.task import TaskData
from flaxheads.data.word_task import load_word_files, looks_like_word_file, token_task_data

TEXT_CLASSIFICATION = "text-classification"
TOKEN_CLASSIFICATION = "token-classification"
MULTIPLE_CHOICE = "multiple-choice"
TASKS = (TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION, MULTIPLE_CHOICE)
"""What `load_task(task=...)` reads the data as (transformers' pipeline names)."""


_FILES = {
    TOKEN_CLASSIFICATION: "word files (CoNLL, CoNLL-U, or JSON / JSON Lines / CSV with a tokens and a tags column)",
    MULTIPLE_CHOICE: "choice files (CSV, JSON or JSON Lines with a context column, choice columns and a label column)",
}
"""What the tasks that only read local files read."""


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
    `context_column`, `question_column`, `choice_columns` and `label_column`, detected where None."""
    if task not in (None, *TASKS):
        raise ValueError(f"task={task!r}: choose one of {', '.join(TASKS)}")
    if task is None and (_reads_as_words(train_file, (validation_file, test_file), text_column) if train_file
                         else label_names is not None):
        task = TOKEN_CLASSIFICATION
    if task is None and (choice_columns or (train_file and looks_like_choice_file(train_file, text_column))):
        task = MULTIPLE_CHOICE
    if task in _FILES and not train_file and not (task == TOKEN_CLASSIFICATION and label_names is not None):
        raise ValueError(f"task={task!r} reads {_FILES[task]}: give a train_file")
    _refuse_settings_of_other_tasks(task or TEXT_CLASSIFICATION, {
        TOKEN_CLASSIFICATION: [name for name, on in (("label_all_tokens=True", label_all_tokens),
                                                     (f"stride={stride}", stride is not None),
                                                     (f"tag_scheme={tag_scheme!r}", tag_scheme is not None),
                                                     ("label_names (a token classifier's tags)",
                                                      label_names is not None)) if on],
        MULTIPLE_CHOICE: [f"{name}={value!r}" for name, value in (("context_column", context_column),
                                                                  ("question_column", question_column),
                                                                  ("choice_columns", choice_columns)) if value],
    })
    if task == MULTIPLE_CHOICE:
        return load_choice_files(train_file=train_file, validation_file=validation_file, test_file=test_file,
                                 label_column=label_column, context_column=context_column,
                                 question_column=question_column, choice_columns=choice_columns)
    if task == TOKEN_CLASSIFICATION:
        if not train_file and (label_names is None or not (validation_file or test_file)):
            raise ValueError("task='token-classification' reads word files: give a train_file (CoNLL, CoNLL-U, or "
                             "JSON / JSON Lines / CSV with a tokens and a tags column), or, to score a trained "
                             "model, a validation_file or test_file and the model's tags as label_names")
        words = load_word_files(train_file=train_file, validation_file=validation_file, test_file=test_file,
                                label_names=label_names, scheme=tag_scheme)
        return token_task_data(words, label_all_tokens=label_all_tokens, stride=stride)
    columns = dict(text_column=text_column, text_pair_column=text_pair_column, label_column=label_column,
                   problem_type=problem_type, num_labels=num_labels, chosen_column=chosen_column,
                   rejected_column=rejected_column)
    if train_file or (class_names is not None and (validation_file or test_file)):
        try:
            return load_local_files(train_file=train_file, validation_file=validation_file, test_file=test_file,
                                    class_names=None if train_file else class_names, **columns)
        except MissingColumn as error:
            if task is None and train_file and _is_tsv(train_file):
                # A .tsv is a table of texts or CoNLL columns; looks_like_word_file read it as a table.
                raise ValueError(f"{error} ({train_file} was read as a table of texts and labels; if it holds words "
                                 f"and their tags in CoNLL columns, pass task='{TOKEN_CLASSIFICATION}')") from error
            raise
    if validation_file or test_file:
        # Without this, the built-in or hub data set below would be scored instead of the user's file.
        named = " and ".join(f"{flag}={path}" for flag, path in (("validation_file", validation_file),
                                                                  ("test_file", test_file)) if path)
        raise ValueError(f"{named} without a train_file: text classification reads its classes from the train "
                         "file, or from a trained classifier's config.json (and this model is none). Give the "
                         "train_file (--train_file) as well, or a trained sequence classifier")
    if dataset_name:
        return load_named_dataset(dataset_name, **columns)
    if dataset:
        return load_builtin(dataset, seed=seed)
    raise ValueError("no data: give a train_file, a dataset_name (a hub data set) or a dataset (a built-in one)")


def _is_tsv(path) -> bool:
    return os.fspath(path).lower().endswith(".tsv")


def _reads_as_words(train_file, others, text_column: str) -> bool:
    """Whether the train file holds words and tags (`looks_like_word_file`), or is a .tsv (a
    table, or CoNLL columns) beside a validation or test file that does."""
    if looks_like_word_file(train_file, text_column):
        return True
    return _is_tsv(train_file) and any(path and not _is_tsv(path) and looks_like_word_file(path, text_column)
                                       for path in others)


def _refuse_settings_of_other_tasks(task: str, settings: dict[str, list[str]]) -> None:
    """ValueError naming the settings (per task, those given) that only another task reads."""
    for other, named in settings.items():
        if named and other != task:
            raise ValueError(f"{' and '.join(named)} {_LABEL[other]}, and the data reads as {task}: give "
                             f"{_FILES[other]}, pass task={other!r}, or leave them out")


_LABEL = {TOKEN_CLASSIFICATION: "label token classification data", MULTIPLE_CHOICE: "name multiple-choice columns"}


__all__ = ["MULTIPLE_CHOICE", "TASKS", "TEXT_CLASSIFICATION", "TOKEN_CLASSIFICATION", "load_task"]
