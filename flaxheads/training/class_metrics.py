"""The per-class report of a classifier on a split, as scikit-learn computes it: precision,
recall, F1 and support per class with their macro and weighted averages, the confusion matrix,
and for binary and multi-label problems ROC-AUC and PR-AUC (average precision).

Written here in NumPy rather than calling scikit-learn: these are a few dozen lines, and
scikit-learn with SciPy would add ~150 MB to every training image for them. Every number is
tested against scikit-learn on the same predictions (`tests/test_class_metrics.py`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from flaxheads import problem
from flaxheads import thresholds as thresholds_lib


def report(problem_type: str, logits: np.ndarray, labels: np.ndarray, class_names: Sequence[str],
           thresholds: Sequence[float] | None = None) -> dict[str, Any]:
    """The report of a single-label or multi-label split ({} for regression and pairs):
    {"per_class": {name: {precision, recall, f1, support}}, "macro_avg": {...}, "weighted_avg": {...},
    "confusion_matrix": rows true, columns predicted (single-label), and, binary or multi-label,
    "roc_auc" and "pr_auc" (macro over the labels; a label whose split holds one class only has None
    and is left out of the average, where scikit-learn would raise). Multi-label decisions take
    `thresholds` (per label; None: 0.5)."""
    names = list(class_names)
    logits = np.asarray(logits, np.float64)
    if problem_type == problem.SINGLE_LABEL:
        labels = np.asarray(labels).reshape(-1).astype(np.int64)
        predicted = logits.argmax(axis=-1)
        num = len(names)
        truth_onehot, predicted_onehot = np.eye(num, dtype=bool)[labels], np.eye(num, dtype=bool)[predicted]
        out = _precision_recall_f1(truth_onehot, predicted_onehot, names)
        out["confusion_matrix"] = confusion_matrix(labels, predicted, num).tolist()
        if num == 2:
            # transformers scores a 2-label model by softmax: the positive class's probability.
            positive = np.exp(logits[:, 1] - np.logaddexp(logits[:, 0], logits[:, 1]))
            out["roc_auc"] = roc_auc(labels == 1, positive)
            out["pr_auc"] = average_precision(labels == 1, positive)
        return out
    if problem_type == problem.MULTI_LABEL:
        truth = np.asarray(labels) > 0.5
        out = _precision_recall_f1(truth, thresholds_lib.decide(logits, thresholds), names)
        per_label_roc = [roc_auc(truth[:, c], logits[:, c]) for c in range(len(names))]
        per_label_pr = [average_precision(truth[:, c], logits[:, c]) for c in range(len(names))]
        for name, roc, pr in zip(names, per_label_roc, per_label_pr):
            out["per_class"][name].update(roc_auc=roc, pr_auc=pr)
        out["roc_auc"] = _mean_defined(per_label_roc)
        out["pr_auc"] = _mean_defined(per_label_pr)
        return out
    return {}


def _precision_recall_f1(truth: np.ndarray, predicted: np.ndarray, names: list[str]) -> dict[str, Any]:
    """Per class (columns of the (N, C) boolean arrays) and averaged, with scikit-learn's
    zero_division=0: a ratio whose denominator is 0 is 0."""
    true_positives = (truth & predicted).sum(axis=0).astype(np.float64)
    predicted_count = predicted.sum(axis=0).astype(np.float64)
    support = truth.sum(axis=0).astype(np.float64)
    precision = _ratio(true_positives, predicted_count)
    recall = _ratio(true_positives, support)
    f1 = _ratio(2 * true_positives, predicted_count + support)
    per_class = {name: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
                 for name, p, r, f, s in zip(names, precision, recall, f1, support)}
    total = support.sum()
    weights = support / total if total else np.zeros_like(support)
    return {
        "per_class": per_class,
        "macro_avg": {"precision": float(precision.mean()), "recall": float(recall.mean()), "f1": float(f1.mean()),
                      "support": int(total)},
        "weighted_avg": {"precision": float(weights @ precision), "recall": float(weights @ recall),
                         "f1": float(weights @ f1), "support": int(total)},
    }


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1.0), 0.0)


def confusion_matrix(labels: np.ndarray, predicted: np.ndarray, num_classes: int) -> np.ndarray:
    """(C, C) counts, rows the true class, columns the predicted one, every class listed."""
    matrix = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(matrix, (labels, predicted), 1)
    return matrix


def roc_auc(positive: np.ndarray, scores: np.ndarray) -> float | None:
    """The area under the ROC curve: the probability that a positive outranks a negative, ties
    counted half (the Mann-Whitney U statistic, equal to scikit-learn's trapezoidal area). None
    when the examples are all of one class."""
    positive = np.asarray(positive, bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    ranks = _average_ranks(np.asarray(scores, np.float64))
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def average_precision(positive: np.ndarray, scores: np.ndarray) -> float | None:
    """PR-AUC as scikit-learn's `average_precision_score`: the sum over score thresholds, highest
    first, of the recall gained times the precision there (no interpolation). None without a positive."""
    positive = np.asarray(positive, bool)
    n_pos = int(positive.sum())
    if n_pos == 0:
        return None
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    sorted_scores, sorted_positive = np.asarray(scores, np.float64)[order], positive[order]
    last_of_threshold = np.r_[np.flatnonzero(np.diff(sorted_scores) != 0), len(sorted_scores) - 1]
    true_positives = np.cumsum(sorted_positive)[last_of_threshold]
    precision = true_positives / (last_of_threshold + 1)
    recall = true_positives / n_pos
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their mean rank."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts = np.r_[True, sorted_values[1:] != sorted_values[:-1]]
    group = np.cumsum(starts) - 1
    bounds = np.r_[np.flatnonzero(starts), len(values)]
    ranks = np.empty(len(values))
    ranks[order] = (0.5 * (bounds[:-1] + 1 + bounds[1:]))[group]
    return ranks


def _mean_defined(values: list[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return float(np.mean(defined)) if defined else None


__all__ = ["average_precision", "confusion_matrix", "report", "roc_auc"]
