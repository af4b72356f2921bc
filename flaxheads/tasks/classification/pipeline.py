"""`flaxheads.pipeline("text-classification", ...)`: transformers' text-classification pipeline
over a flaxheads classifier, in memory or saved, answering in the same shapes with the same
scores, but batched and bucketed through `flaxheads.inference.TextScorer` (the path `predict`
takes).

    clf = flaxheads.pipeline("text-classification", model="out")    # or model=model, tokenizer=tok
    clf("a fine film")                   # [{"label": "positive", "score": 0.97}]
    clf(["a fine film", "dull"], top_k=None)   # every label of every text, best first
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from flaxheads import problem
from flaxheads import thresholds as thresholds_lib
from flaxheads.tasks.classification.inference import TextScorer
from flaxheads.inference import pipeline_model
from flaxheads.names import PAD_TO_MULTIPLE_OF
from flaxheads.tasks.classification.model import SequenceClassifier
from flaxheads.tokenizer import longest_input

FUNCTIONS = ("softmax", "sigmoid", "none")
"""What `function_to_apply` may name: what turns a text's logits into its scores."""


class _BestLabel:
    """`top_k` left out: the best label alone, as a dict (transformers' legacy answer)."""

    def __repr__(self) -> str:
        return "best label only"


BEST_LABEL = _BestLabel()


def text_classification_pipeline(model: SequenceClassifier | str | os.PathLike | None = None, tokenizer: Any = None, *,
                                 max_seq_length: int | None = None, batch_size: int = 64,
                                 pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF) -> TextClassificationPipeline:
    """A text classifier answering as `transformers.pipeline("text-classification", model=...,
    tokenizer=...)`: what `flaxheads.pipeline("text-classification", ...)` builds.

    `model`: a `SequenceClassifier`, or the folder of a trained one (loaded as `predict` loads it:
    refused when its classifier was never trained). `tokenizer`: a transformers tokenizer or its
    folder; optional with a model folder that holds the model's tokenizer, required with an
    in-memory model. Texts are truncated to `max_seq_length` tokens (at most the model's position
    limit; None: that limit, else the tokenizer's `model_max_length`, else not at all, as
    transformers' pipeline) and classified `batch_size` at a time, padded to lengths that are
    multiples of `pad_to_multiple_of` (0: powers of two; the answers are the same either way).

    Raises ValueError for a missing or foreign tokenizer, a folder without a tokenizer or a
    trained classifier (UntrainedModel), and a model of another task (naming the pipeline task
    that reads it).
    """
    model, tokenizer, source = pipeline_model(model, tokenizer, SequenceClassifier)
    return TextClassificationPipeline(model, tokenizer, max_seq_length=max_seq_length, batch_size=batch_size,
                                      source=source, pad_to_multiple_of=pad_to_multiple_of)


class TextClassificationPipeline:
    """Classifies texts with an in-memory model and tokenizer; see `text_classification_pipeline`
and `__call__`."""

    def __init__(self, model: SequenceClassifier, tokenizer, *, max_seq_length: int | None = None,
                 batch_size: int = 64, source: str = "the model", pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF):
        self.model, self.tokenizer = model, tokenizer
        if max_seq_length is None:
            max_seq_length = longest_input(model.config.backbone, tokenizer)
        self.scorer = TextScorer(model, tokenizer, max_seq_length=max_seq_length, batch_size=batch_size,
                                 source=source, pad_to_multiple_of=pad_to_multiple_of)

    def __call__(self, inputs, *, top_k: int | None | _BestLabel = BEST_LABEL, function_to_apply: str | None = None,
                 apply_thresholds: bool = False):
        """Scores of one text (a str, or {"text", "text_pair"}) or a list of them, as transformers
        gives them:

        - `top_k` left out: {"label", "score"} of the best label per text; a single str gives a
          list of that one dict.
        - `top_k` an int k, or None for all: per text a list of {"label", "score"} of its k best
          labels, best first (ties in label order).

        `function_to_apply` ("softmax", "sigmoid", "none"; None: transformers' default) turns
        logits into scores; the default is none for regression, sigmoid for multi-label and for
        one label, softmax otherwise. Raises FloatingPointError for non-finite scores, ValueError
        for a `top_k` that is not an int of at least 1 (or None).

        `apply_thresholds=True` (multi-label models): per text the labels whose sigmoid score is
        above their decision threshold (`thresholds`: config.json's tuned ones, else 0.5), each
        {"label", "score", "threshold"}, best first (for one text, its list).
        """
        _check_top_k(top_k)
        if apply_thresholds:
            return self._above_thresholds(inputs, top_k, function_to_apply)
        function = _function_name(self.default_function() if function_to_apply is None else function_to_apply)
        texts, pairs, single = _texts(inputs)
        scores = _apply(function, self.scorer.logits(texts, pairs))
        names = self.model.config.label_names
        if top_k is BEST_LABEL:
            answers = [{"label": names[int(s.argmax())], "score": s.max().item()} for s in scores]
            return [answers[0]] if isinstance(inputs, str) else answers[0] if single else answers
        answers = [_ranked(names, s, top_k) for s in scores]
        return answers[0] if single else answers

    @property
    def thresholds(self) -> dict[str, float]:
        """{label name: decision threshold} of a multi-label model (0.5 each where none were
        tuned: see `thresholds_tuned`)."""
        thresholds = self.model.config.decision_thresholds()
        if thresholds is None:
            raise ValueError(f"decision thresholds belong to {problem.MULTI_LABEL} models; this one is "
                             f"{self.model.config.problem_type or 'single-label'} and picks its best label")
        return thresholds

    @property
    def thresholds_tuned(self) -> bool:
        """Whether the model's decision thresholds were tuned (else 0.5 each)."""
        return self.model.config.thresholds is not None

    def _above_thresholds(self, inputs, top_k, function_to_apply) -> list:
        if top_k is not BEST_LABEL or function_to_apply not in (None, "sigmoid"):
            raise ValueError("apply_thresholds=True decides on sigmoid scores and returns every label above its "
                             "threshold: leave top_k and function_to_apply out")
        thresholds = self.thresholds
        texts, pairs, single = _texts(inputs)
        logits = self.scorer.logits(texts, pairs)
        answers = []
        for row, on in zip(_apply("sigmoid", logits), thresholds_lib.decide(logits, tuple(thresholds.values()))):
            chosen = [{"label": name, "score": s.item(), "threshold": t}
                      for (name, t), s, keep in zip(thresholds.items(), row, on) if keep]
            answers.append(sorted(chosen, key=lambda answer: answer["score"], reverse=True))
        return answers[0] if single else answers

    def default_function(self) -> str:
        """transformers' default `function_to_apply`, from the config the model was saved with (a
        problem type left unset means softmax for several labels, sigmoid for one)."""
        config = self.model.config
        if config.problem_type == problem.REGRESSION:
            return "none"
        if config.problem_type == problem.MULTI_LABEL or config.num_labels == 1:
            return "sigmoid"
        return "softmax"


def _check_top_k(top_k) -> None:
    """ValueError unless `top_k` is left out, None (every label) or an int of at least 1: -1 would
    slice off the last label and 0 answer nothing."""
    if top_k is BEST_LABEL or top_k is None:
        return
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise ValueError(f"top_k={top_k!r}: give the number of best labels to return (an int of at least 1), "
                         "top_k=None for every label, or leave top_k out for the best one")


def _texts(inputs) -> tuple[list[str], list[str] | None, bool]:
    """(texts, second texts or None, whether `inputs` was a single text)."""
    if isinstance(inputs, tuple):
        raise ValueError(
            "the pipeline does not read a tuple: a pair of texts is {'text': ..., 'text_pair': ...}, several texts a "
            "list (transformers refuses a tuple too, rather than guess which of the two it is)"
        )
    single = isinstance(inputs, (str, dict))
    if not single and not isinstance(inputs, Iterable) or isinstance(inputs, bytes):
        raise ValueError(f"the pipeline takes a text (str), a pair {{'text': ..., 'text_pair': ...}}, or a list of "
                         f"one of these kinds; got {type(inputs).__name__}")
    items = [inputs] if single else list(inputs)
    if not any(isinstance(item, dict) for item in items):
        return items, None, single  # every one a text: `TextScorer` names the first that is not
    if all(isinstance(item, dict) and set(item) <= {"text", "text_pair"} and "text" in item for item in items):
        if all("text_pair" in item for item in items):
            return [item["text"] for item in items], [item["text_pair"] for item in items], single
        if not any("text_pair" in item for item in items):
            return [item["text"] for item in items], None, single
    raise ValueError(
        "the pipeline takes a text (str), a pair {'text': ..., 'text_pair': ...}, or a list of one of "
        "these kinds (every pair with a text_pair, or none)"
    )


def _function_name(function) -> str:
    """"softmax", "sigmoid" or "none" from a name in any case (or transformers' enum)."""
    name = str(getattr(function, "value", function)).lower()
    if name not in FUNCTIONS:
        raise ValueError(f"function_to_apply={function!r}: choose one of {FUNCTIONS} (or None for the default)")
    return name


def _apply(function: str, logits: np.ndarray) -> np.ndarray:
    """Scores from float32 logits, computed as transformers' pipeline computes them."""
    if function == "softmax":
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)
    if function == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits))
    return logits


def _ranked(names: tuple[str, ...], scores: np.ndarray, top_k: int | None) -> list[dict[str, Any]]:
    ranked = sorted(({"label": name, "score": s.item()} for name, s in zip(names, scores)),
                    key=lambda answer: answer["score"], reverse=True)
    return ranked if top_k is None else ranked[:top_k]
