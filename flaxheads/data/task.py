"""`TaskData`: the splits of a labelled text data set plus what a classifier head needs to know.

Every loader in `flaxheads.data` (built-in data sets, local files) returns one, so the rest of
the pipeline (tokenisation, batching) and the trainer never depend on where the text came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

import datasets
import numpy as np
import pyarrow as pa

from flaxheads import problem

# Hugging Face's `config.problem_type` strings, defined once in `flaxheads.problem`.
from flaxheads.problem import (  # noqa: F401 (re-exported)
    MULTI_LABEL, MULTIPLE_CHOICE, PROBLEM_TYPES, REGRESSION, SINGLE_LABEL, TOKEN_CLASSIFICATION,
)

if TYPE_CHECKING:
    from flaxheads.data.word_task import WordLabelling

TEXT = "text"
TEXT_PAIR = "text_pair"
LABEL = "label"
CHOSEN = "chosen"
REJECTED = "rejected"
"""The two texts of a preference pair (`pairwise_reward`), TRL's column names."""
CHOICES = "choices"
"""Multiple choice: each example's choices, the second text of each (`data.choices`)."""


def default_id2label(num_labels: int) -> dict[int, str]:
    """Hugging Face's default names, `LABEL_0 ... LABEL_{n-1}`, for labels that have no names."""
    return {i: f"LABEL_{i}" for i in range(num_labels)}


@dataclasses.dataclass(frozen=True)
class TaskData:
    """Labelled text splits in the canonical column layout, with their label metadata.

    Every split has a `text` column (str), an optional `text_pair` column (str) and a `label`
    column whose type follows `problem_type`:

    - single_label_classification: int class id in `[0, num_labels)`;
    - regression: float score (`num_labels` is 1);
    - multi_label_classification: multi-hot list of `num_labels` floats.

    Preference pairs (`pairwise_reward`, `num_labels` 1) have `chosen` and `rejected` text
    columns instead of `text`, and a float `label` holding each pair's margin (0.0: none).

    Token classification (`token_classification`) has a `tokens` column (the sentence's words)
    and a `label` column of tag ids, one per word; `words` holds the word-level task (tag scheme,
    where each sentence came from) and how its tags go onto subwords (`word_task.token_task_data`).

    Multiple choice (`multiple_choice`) has a `text` column (the context, read first with every
    choice), a `choices` column (per example the same number of texts, `num_labels`, each read
    second) and a `label` column holding the index of the right choice (`data.choices`).
    """

    splits: datasets.DatasetDict
    """Has a `train` split; `validation` and `test` when the source provides them."""
    problem_type: str
    num_labels: int
    id2label: Mapping[int, str]
    """Exactly `num_labels` entries, ready for a Hugging Face config's `id2label`."""
    problem_type_reason: str = ""
    """One sentence, `"<problem_type>: <why>"`, saying why the problem type is what it is: what the
    label column holds (e.g. `"regression: the label column holds non-integer floats (e.g. 0.5
    at train row 3)"`), `"<problem_type>: set by problem_type"` when the caller chose it, or what
    a built-in data set's label is. Empty only for a `TaskData` built by hand without one."""
    words: WordLabelling | None = None
    """Token classification only: the word-level task and its subword labelling options."""

    def __post_init__(self):
        problem.require_known_data(self.problem_type)
        if "train" not in self.splits:
            raise ValueError(f"TaskData needs a 'train' split, got {sorted(self.splits)}")
        if (self.words is None) != (self.problem_type != TOKEN_CLASSIFICATION):
            raise ValueError(f"TaskData(words=...) goes with problem_type={TOKEN_CLASSIFICATION!r}, and only with it")
        if len(self.id2label) != self.num_labels:
            raise ValueError(
                f"id2label has {len(self.id2label)} entries but num_labels={self.num_labels}"
            )

    @property
    def label2id(self) -> dict[str, int]:
        return {name: label_id for label_id, name in self.id2label.items()}

    @property
    def is_pairs(self) -> bool:
        return self.problem_type == problem.PAIRWISE_REWARD

    @property
    def is_choices(self) -> bool:
        return self.problem_type == problem.MULTIPLE_CHOICE

    @property
    def has_text_pair(self) -> bool:
        return TEXT_PAIR in self.splits["train"].column_names


def column_array(dataset: datasets.Dataset, name: str) -> np.ndarray:
    """`np.asarray(dataset[name])`, read through Arrow: datasets 4+ hands out a lazy `Column`,
    which numpy reads one element at a time (0.25-0.5 s for the 8,452 labels of the default job).
    Other columns (floats, lists: multi-hot labels) and missing values are read as numpy would."""
    column = dataset.with_format("arrow", columns=[name])[:][name]
    if column.null_count or not (pa.types.is_integer(column.type) or pa.types.is_boolean(column.type)):
        return np.asarray(column.to_pylist())
    return column.to_numpy()
