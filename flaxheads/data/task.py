"""`TaskData`: the splits of a labelled data set plus what a model's head needs to know.

Every loader (built-in data sets, local files, each task's own readers) returns one, so the rest
of the pipeline (tokenisation, batching) and the trainer never depend on where the examples came
from, nor on which task they serve: a task's data says how its examples become rows
(`RowMaker`) and what an example is in a batch (`batching.ExampleFormat`), and the pipeline
follows that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import datasets
import numpy as np
import pyarrow as pa

from flaxheads import problem
from flaxheads.conversion.table import SEQUENCE_CLASSIFICATION

# Hugging Face's `config.problem_type` strings, defined once in `flaxheads.problem`.
from flaxheads.problem import (  # noqa: F401 (re-exported)
    MULTI_LABEL, PROBLEM_TYPES, REGRESSION, SINGLE_LABEL,
)

if TYPE_CHECKING:
    from flaxheads.data.batching import ExampleFormat

TEXT = "text"
TEXT_PAIR = "text_pair"
LABEL = "label"
CHOSEN = "chosen"
REJECTED = "rejected"
"""The two texts of a preference pair (`pairwise_reward`), TRL's column names."""


class RowMaker(Protocol):
    """How a task's examples become tokenised rows, for data that is not one text (or text pair,
    or preference pair) per example: multiple choice's (context, choice) pairs, token
    classification's windows over words. `TaskData.rows` holds one; tokenisation and the data
    shards call it without knowing the task."""

    whole_split: bool
    """The rows of a split are known only once all of it is tokenised (an example may become
    several rows, windows): every process then tokenises the whole split, uncached, and keeps
    its shards' rows of it."""
    origin_columns: tuple[str, ...]
    """Columns of the tokenised rows that say which example (and which part of it) each row
    holds; kept for every row of the split (`shards.OwnSplit.origins`) to merge predictions back."""

    def tokenize(self, task: TaskData, split: str, tokenizer, max_seq_length: int, *,
                 cache_dir=None) -> datasets.Dataset:
        """The tokenised rows of `task.splits[split]`: `input_ids`, `attention_mask` (and
        `token_type_ids`), `labels` where the split has labels, `length`, the origin columns."""


def default_id2label(num_labels: int) -> dict[int, str]:
    """Hugging Face's default names, `LABEL_0 ... LABEL_{n-1}`, for labels that have no names."""
    return {i: f"LABEL_{i}" for i in range(num_labels)}


@dataclasses.dataclass(frozen=True)
class TaskData:
    """Labelled splits in the canonical column layout, with their label metadata.

    Text classification (`task` "text-classification", the default): every split has a `text`
    column (str), an optional `text_pair` column (str) and a `label` column whose type follows
    `problem_type`:

    - single_label_classification: int class id in `[0, num_labels)`;
    - regression: float score (`num_labels` is 1);
    - multi_label_classification: multi-hot list of `num_labels` floats.

    Preference pairs (`pairwise_reward`, `num_labels` 1) have `chosen` and `rejected` text
    columns instead of `text`, and a float `label` holding each pair's margin (0.0: none).

    Another task's data (`flaxheads.tasks`) names its task, has no problem type (problem types
    are what a text classifier's labels mean), and says how its examples become rows (`rows`)
    and what an example is in a batch (`example_format`): token classification's `tokens` and
    per-word tag ids, multiple choice's context, choices and right index.
    """

    splits: datasets.DatasetDict
    """Has a `train` split; `validation` and `test` when the source provides them."""
    problem_type: str | None
    """What a text classifier's labels mean (`flaxheads.problem.PROBLEM_TYPES`); None for the data
    of another task."""
    num_labels: int
    id2label: Mapping[int, str]
    """Exactly `num_labels` entries, ready for a Hugging Face config's `id2label`."""
    problem_type_reason: str = ""
    """One sentence, `"<what the labels are>: <why>"`, saying why the data reads as it does: what
    the label column holds (e.g. `"regression: the label column holds non-integer floats (e.g. 0.5
    at train row 3)"`), `"<problem_type>: set by problem_type"` when the caller chose it, what a
    built-in data set's label is, or what another task's data is. Empty only for a `TaskData`
    built by hand without one."""
    rows: RowMaker | None = None
    """How examples become rows, when not as texts (None: `tokenization.tokenize_split`)."""
    task: str = SEQUENCE_CLASSIFICATION
    """The task the data serves, by its name in `flaxheads.tasks.TASKS`."""
    example_format: ExampleFormat | None = None
    """What an example is in a batch, when the task says so (None: the problem type's)."""
    source: Any = None
    """The task's own description of the examples, for the task's code alone (token
    classification: the word task and its subword labelling); the pipeline never reads it."""

    def __post_init__(self):
        if self.problem_type is not None:
            problem.require_known(self.problem_type)
        elif self.example_format is None:
            raise ValueError("TaskData needs a problem_type (text classification) or the example_format of its task")
        if "train" not in self.splits:
            raise ValueError(f"TaskData needs a 'train' split, got {sorted(self.splits)}")
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
    def has_text_pair(self) -> bool:
        return TEXT_PAIR in self.splits["train"].column_names

    @property
    def described(self) -> str:
        """What the data reads as, and why (`problem_type_reason`, else the problem type or task)."""
        return self.problem_type_reason or self.problem_type or self.task


def column_array(dataset: datasets.Dataset, name: str) -> np.ndarray:
    """`np.asarray(dataset[name])`, read through Arrow: datasets 4+ hands out a lazy `Column`,
    which numpy reads one element at a time (0.25-0.5 s for the 8,452 labels of the default job).
    Other columns (floats, lists: multi-hot labels) and missing values are read as numpy would."""
    column = dataset.with_format("arrow", columns=[name])[:][name]
    if column.null_count or not (pa.types.is_integer(column.type) or pa.types.is_boolean(column.type)):
        return np.asarray(column.to_pylist())
    return column.to_numpy()
