"""The model and the pipeline of each task, by transformers' names, and the two entry points that
dispatch on them: `flaxheads.from_pretrained` and `flaxheads.pipeline` (re-exported by the
package). A new task is one model module and one pipeline module plus their lines here."""

from __future__ import annotations

from collections.abc import Callable

from flaxheads.conversion.table import MULTIPLE_CHOICE, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION
from flaxheads.model import SequenceClassifier
from flaxheads.multiple_choice import MultipleChoice
from flaxheads.text_pipeline import text_classification_pipeline
from flaxheads.token_classifier import TokenClassifier
from flaxheads.token_pipeline import token_classification_pipeline

MODELS: dict[str, type] = {
    SEQUENCE_CLASSIFICATION: SequenceClassifier,
    TOKEN_CLASSIFICATION: TokenClassifier,
    MULTIPLE_CHOICE: MultipleChoice,
}
"""The model class of each task, by transformers' pipeline names (`*ForSequenceClassification`,
`*ForTokenClassification`, `*ForMultipleChoice`). A new task is one model module plus one line here."""


def from_pretrained(path, *, task: str = SEQUENCE_CLASSIFICATION, **options):
    """`MODELS[task].from_pretrained(path, **options)`: a `SequenceClassifier` by default, a
    `TokenClassifier` for task="token-classification", a `MultipleChoice` for
    task="multiple-choice" (options: `SequenceClassifier.from_pretrained`'s). ValueError naming
    the tasks for an unknown one; a checkpoint of another task's transformers class is refused
    with the task to pass."""
    if task not in MODELS:
        raise ValueError(f"unknown task {task!r}; choose one of {tuple(MODELS)}")
    return MODELS[task].from_pretrained(path, **options)


PIPELINES: dict[str, Callable] = {
    "text-classification": text_classification_pipeline,
    "sentiment-analysis": text_classification_pipeline,  # transformers' alias
    "token-classification": token_classification_pipeline,
    "ner": token_classification_pipeline,  # transformers' alias
}
"""The pipeline builder of each task, by transformers' pipeline names. A new task is one pipeline
module plus its lines here."""


def pipeline(task: str = "text-classification", model=None, tokenizer=None, **options):
    """`PIPELINES[task](model, tokenizer, **options)`: a pipeline answering as
    `transformers.pipeline(task, model=..., tokenizer=..., **options)`, over a flaxheads model in
    memory or the folder of a trained one.

    - "text-classification" ("sentiment-analysis"): `text_classification_pipeline`; options
      `max_seq_length`, `batch_size`.
    - "token-classification" ("ner"): `token_classification_pipeline`; options
      `aggregation_strategy`, `ignore_labels`, `stride`, `batch_size`.

    ValueError naming the tasks for an unknown one; a model of another task is refused naming the
    task that reads it.
    """
    if task not in PIPELINES:
        raise ValueError(f"flaxheads.pipeline answers task={' or '.join(map(repr, PIPELINES))}, not {task!r}")
    return PIPELINES[task](model, tokenizer, **options)
