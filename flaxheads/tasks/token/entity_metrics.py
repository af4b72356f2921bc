"""Entity-level precision, recall and F1 of a tagger, identical to seqeval 1.2.2, and token accuracy.

`entity_report(true_tags, predicted_tags)` gives what seqeval's `classification_report(...,
output_dict=True)` gives, per entity type and micro, macro and weighted averages with support, in
either of seqeval's modes:

- `mode="default"`: conlleval's lenient chunking (seqeval's default, and what transformers'
  run_ner.py reports through `evaluate`'s seqeval): an I-PER after O still starts an entity.
- `mode="strict"`: seqeval's `mode='strict'` with a `scheme` (IOB1, IOB2 or IOBES): only
  well-formed entities count. Without a scheme it is detected from the true tags
  (`flaxheads.tasks.token.tags.detect_scheme`, which, unlike seqeval's `auto_detect`, can answer IOB1: pass
  the scheme to compare with seqeval on IOB1 data).

Ratios whose denominator is 0 are 0, as seqeval's default `zero_division` gives them (without
its warning). Where seqeval gives NaN, the macro average when neither the true nor the predicted
tags hold any entity, the report holds None, so that it can go to results.json as it is.
Every number is tested against seqeval on the same tags (`tests/test_entity_metrics.py`);
seqeval is only used by the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flaxheads.tasks.token import tags as tags_lib

DEFAULT = "default"
STRICT = "strict"
MODES = (DEFAULT, STRICT)


def entity_report(
    true_tags: Sequence[Sequence[str]], predicted_tags: Sequence[Sequence[str]], *, mode: str = DEFAULT,
    scheme: str | None = None,
) -> dict[str, Any]:
    """The report of predicted word tags against true ones, one list of tags per sentence:

    {"precision", "recall", "f1": the micro averages (seqeval's `f1_score` and namesakes),
     "accuracy": `token_accuracy` (None without any word), "mode", "scheme" (None in the default mode),
     "per_type": {type: {"precision", "recall", "f1", "support"}} (types sorted, as seqeval),
     "micro_avg", "macro_avg", "weighted_avg": {"precision", "recall", "f1", "support"}}.

    `support` counts the true entities. Raises ValueError for an unknown mode, sentences or
    sentence lengths that differ between the two (naming the first), an empty tag, and in strict
    mode a tag whose prefix the scheme lacks or a scheme that is not IOB1, IOB2 or IOBES.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode={mode!r}; choose one of {MODES}")
    _check_same_shape(true_tags, predicted_tags)
    if mode == STRICT:
        if scheme is None:
            scheme, _ = tags_lib.detect_scheme(true_tags)
        true_counts = _strict_counts(true_tags, scheme, "true_tags")
        predicted_counts = _strict_counts(predicted_tags, scheme, "predicted_tags")
    else:
        scheme = None
        true_counts = _lenient_counts(true_tags, "true_tags")
        predicted_counts = _lenient_counts(predicted_tags, "predicted_tags")
    report = _report(true_counts, predicted_counts)
    micro = report["micro_avg"]
    return {"precision": micro["precision"], "recall": micro["recall"], "f1": micro["f1"],
            "accuracy": _accuracy(true_tags, predicted_tags), "mode": mode, "scheme": scheme, **report}


def token_accuracy(true_tags: Sequence[Sequence[str]], predicted_tags: Sequence[Sequence[str]]) -> float:
    """The share of words whose predicted tag is the true one (seqeval's `accuracy_score`). Raises
    ValueError when the shapes differ (naming the first sentence) or there is no word at all."""
    _check_same_shape(true_tags, predicted_tags)
    accuracy = _accuracy(true_tags, predicted_tags)
    if accuracy is None:
        raise ValueError("true_tags hold no word: accuracy is undefined")
    return accuracy


def _accuracy(true_tags, predicted_tags) -> float | None:
    total = sum(len(sentence) for sentence in true_tags)
    correct = sum(t == p for true, predicted in zip(true_tags, predicted_tags) for t, p in zip(true, predicted))
    return correct / total if total else None


def _check_same_shape(true_tags, predicted_tags) -> None:
    if len(true_tags) != len(predicted_tags):
        raise ValueError(
            f"true_tags hold {len(true_tags)} sentences and predicted_tags {len(predicted_tags)}: give one list "
            "of predicted tags per sentence"
        )
    for sentence, (true, predicted) in enumerate(zip(true_tags, predicted_tags)):
        if len(true) != len(predicted):
            raise ValueError(
                f"sentence {sentence + 1} has {len(true)} true tags and {len(predicted)} predicted ones: give one "
                "predicted tag per word (take each word's first subword, see flaxheads.tasks.token.subwords)"
            )


def _where(argument: str):
    return lambda sentence, word=None: f"{argument}, {tags_lib.default_where(sentence, word)}"


def _lenient_counts(sequences, argument: str) -> dict[str, set]:
    return tags_lib.lenient_entities(sequences, where=_where(argument))


def _strict_counts(sequences, scheme: str, argument: str) -> dict[str, set]:
    by_type: dict[str, set] = {}
    for sentence, kind, start, end in tags_lib.strict_entities(sequences, scheme, where=_where(argument)):
        by_type.setdefault(kind, set()).add((sentence, start, end))
    return by_type


def _report(true_entities: dict[str, set], predicted_entities: dict[str, set]) -> dict[str, Any]:
    """seqeval's arithmetic, step for step (so that the floats are the same): per type, then the
    micro sums, the plain mean and the support-weighted mean of the per-type ratios."""
    types = sorted(set(true_entities) | set(predicted_entities))
    empty: set = set()
    true_positives = np.array([len(true_entities.get(t, empty) & predicted_entities.get(t, empty)) for t in types],
                              dtype=np.int64)
    predicted = np.array([len(predicted_entities.get(t, empty)) for t in types], dtype=np.int64)
    support = np.array([len(true_entities.get(t, empty)) for t in types], dtype=np.int64)
    precision, recall, f1 = _ratios(true_positives, predicted, support)
    per_type = {t: _row(p, r, f, s) for t, p, r, f, s in zip(types, precision, recall, f1, support)}
    micro = _ratios(true_positives.sum(keepdims=True), predicted.sum(keepdims=True), support.sum(keepdims=True))
    total = int(support.sum())
    if types:
        macro = _row(precision.mean(), recall.mean(), f1.mean(), total)
    else:  # seqeval: np.average of nothing, NaN
        macro = {"precision": None, "recall": None, "f1": None, "support": 0}
    if total:
        weighted = _row(*(np.average(values, weights=support) for values in (precision, recall, f1)), total)
    else:  # seqeval's zero_division value for every weighted ratio
        weighted = _row(0.0, 0.0, 0.0, 0)
    return {"per_type": per_type, "micro_avg": _row(micro[0][0], micro[1][0], micro[2][0], total),
            "macro_avg": macro, "weighted_avg": weighted}


def _ratios(true_positives: np.ndarray, predicted: np.ndarray, support: np.ndarray):
    precision = _divide(true_positives, predicted)
    recall = _divide(true_positives, support)
    denominator = precision + recall
    denominator[denominator == 0.0] = 1.0
    return precision, recall, 2 * precision * recall / denominator


def _divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    safe = np.where(denominator == 0, 1, denominator)
    return np.where(denominator == 0, 0.0, numerator / safe)


def _row(precision, recall, f1, support) -> dict[str, Any]:
    return {"precision": float(precision), "recall": float(recall), "f1": float(f1), "support": int(support)}


__all__ = ["DEFAULT", "MODES", "STRICT", "entity_report", "token_accuracy"]
