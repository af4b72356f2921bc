"""Decision thresholds of a multi-label classifier: label c is predicted when its sigmoid
probability is above thresholds[c] (0.5 each unless tuned), that is when its logit is above
log(t / (1 - t)); with 0.5 that is `logit > 0`, transformers' and flaxheads' default.

`tune` picks, per label, the threshold that maximises F1 on a labelled split (the validation
split after training, `TrainConfig.tune_thresholds`); the chosen thresholds live in config.json's
"flaxheads" section (`ClassifierConfig.thresholds`), where `flaxheads predict`, `evaluate`, the
pipeline and the Trainer's metrics read them.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

DEFAULT = 0.5
"""The threshold of a label none was tuned for."""

MIN_EXAMPLES = 30
"""Fewest validation examples thresholds are tuned on. Below that one example moves a label's
F1 by several points (1/30 of the examples is 3%), and the chosen threshold sits between two
single scores: a fit to those examples, not to the task."""


def check(thresholds: Sequence[float], num_labels: int) -> tuple[float, ...]:
    """`thresholds` as a tuple of floats, or ValueError naming the problem: one per label, each a
    probability strictly between 0 and 1."""
    values = tuple(float(t) for t in thresholds)
    if len(values) != num_labels:
        raise ValueError(f"{len(values)} decision thresholds for {num_labels} labels: give one per label")
    bad = [t for t in values if not 0.0 < t < 1.0]
    if bad:
        raise ValueError(f"decision thresholds are probabilities strictly between 0 and 1; got {bad[:3]}")
    return values


def cutoffs(thresholds: Sequence[float] | None, num_labels: int) -> np.ndarray:
    """(num_labels,) float64 logit cutoffs log(t / (1 - t)); zeros (t = 0.5) for None."""
    if thresholds is None:
        return np.zeros(num_labels, np.float64)
    t = np.asarray(check(thresholds, num_labels), np.float64)
    return np.log(t) - np.log1p(-t)


def decide(logits: np.ndarray, thresholds: Sequence[float] | None = None) -> np.ndarray:
    """(N, C) bool: which labels each row predicts, `logit > cutoff` per label."""
    logits = np.asarray(logits)
    return logits > cutoffs(thresholds, logits.shape[-1])


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def f1_from_counts(true_positives, predicted_count, true_count) -> np.ndarray:
    """F1 = 2 TP / (true + predicted), 0.0 where that is 0/0 (sklearn's default zero_division);
    element-wise over arrays of counts (also `training.metrics`' per-class F1)."""
    numerator = 2.0 * np.asarray(true_positives, dtype=np.float64)
    denominator = np.asarray(true_count, dtype=np.float64) + np.asarray(predicted_count, dtype=np.float64)
    return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1.0), 0.0)


def _best_cutoff(scores: np.ndarray, truth: np.ndarray) -> float | None:
    """The logit cutoff maximising F1 of `scores > cutoff` against `truth`: one between two
    neighbouring distinct scores (their midpoint) or below them all (the search's bound: every
    example predicted); of equal F1s the one nearest 0 (the default). None when `truth` holds no
    positive (every cutoff gives F1 0) or no negative (predicting every example is then best,
    whatever the scores: nothing to learn a threshold from)."""
    positives = int(truth.sum())
    if positives == 0 or positives == len(truth):
        return None
    values = np.unique(scores)  # ascending
    # Predicting every score above values[k - 1] (k = 0: all) takes those >= values[k].
    order = np.argsort(scores, kind="stable")
    sorted_truth = truth[order].astype(np.float64)
    # Counts of examples (and positives) at or above each distinct value.
    starts = np.searchsorted(scores[order], values, side="left")
    above_tp = sorted_truth[::-1].cumsum()[::-1]
    predicted = len(scores) - starts
    f1 = f1_from_counts(above_tp[starts], predicted, positives)
    candidates = np.concatenate([[values[0] - 1.0], (values[:-1] + values[1:]) / 2.0])
    best = f1.max()
    tied = candidates[np.isclose(f1, best, rtol=0.0, atol=1e-12)]
    return float(tied[np.argmin(np.abs(tied))])


def check_tunable(labels: np.ndarray, label_names: Sequence[str]) -> None:
    """ValueError naming the fix for multi-hot validation `labels` no threshold can be tuned on:
    fewer than MIN_EXAMPLES examples, or no label with both a positive and a negative example
    (one class everywhere: every label would keep 0.5, and the run would claim tuned thresholds)."""
    truth = np.asarray(labels) > 0.5
    fix = (f"give a validation split of at least {MIN_EXAMPLES} examples where each label is present in some and "
           "absent in others, or leave tune_thresholds out")
    if len(truth) < MIN_EXAMPLES:
        raise ValueError(f"tune_thresholds=True tunes on the validation split, which has {len(truth)} example(s): too "
                         f"few to tune on (at least {MIN_EXAMPLES}); {fix}")
    counts = truth.reshape(len(truth), -1).sum(axis=0)
    if not np.any((counts > 0) & (counts < len(truth))):
        raise ValueError(f"tune_thresholds=True tunes on the validation split, and none of its labels "
                         f"({', '.join(label_names)}) is both present and absent there: with one class per label "
                         f"there is nothing to tune; {fix}")


def tune(logits: np.ndarray, labels: np.ndarray, label_names: Sequence[str]) -> dict[str, Any]:
    """Per label, the threshold maximising F1 on these logits and multi-hot labels, with the F1 at
    0.5 and at the chosen threshold: {"thresholds": tuple in label order, "per_label": {name:
    {"threshold", "f1_at_default", "f1", "tuned", "at_bound"}}, "warnings": [sentences]}.

    A label without a positive or without a negative example keeps 0.5 ("tuned": False). A
    threshold below every validation score of its label (the search's bound: the label is
    predicted for every text) has "at_bound": True and a warning: it says the split did not pin
    it down, not what the label's threshold is. ValueError for labels nothing can be tuned on
    (`check_tunable`)."""
    logits = np.asarray(logits, np.float64)
    truth = np.asarray(labels) > 0.5
    if logits.ndim != 2 or truth.shape != logits.shape:
        raise ValueError(f"tune needs (N, C) logits and multi-hot labels; got {logits.shape} and {truth.shape}")
    check_tunable(truth, label_names)
    chosen, per_label, warnings = [], {}, []
    for c, name in enumerate(label_names):
        scores, positive = logits[:, c], truth[:, c]
        cutoff = _best_cutoff(scores, positive)
        threshold = DEFAULT if cutoff is None else min(max(_sigmoid(cutoff), 1e-12), 1.0 - 1e-12)
        chosen.append(threshold)
        f1_at = lambda cut: float(f1_from_counts(np.sum((scores > cut) & positive),  # noqa: E731
                                                 np.sum(scores > cut), int(positive.sum())))
        bound = cutoff is not None and bool(cutoff < scores.min())
        per_label[name] = {"threshold": threshold, "f1_at_default": f1_at(0.0),
                           "f1": f1_at(cutoffs([threshold], 1)[0]), "tuned": cutoff is not None, "at_bound": bound}
        if bound:
            warnings.append(f"{name}: its threshold {threshold:.3g} is at the bound of the search, below every "
                            f"validation score of {name}: it predicts {name} for every text, so the split did not "
                            "pin it down (tune on a larger validation split, or leave tune_thresholds out)")
    return {"thresholds": tuple(chosen), "per_label": per_label, "warnings": warnings}
