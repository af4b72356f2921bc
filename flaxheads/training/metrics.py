"""Evaluation metrics of a text classifier's problem types, in plain numpy; `masked_metrics`, the
checks every task's metrics pass through.

Every metric matches its scikit-learn or SciPy namesake, edge cases included, so numbers
reported here can be compared with those of evaluation scripts built on those libraries:

- `accuracy`: `sklearn.metrics.accuracy_score` (subset accuracy for multi-label).
- `macro_f1` / `micro_f1`: `sklearn.metrics.f1_score` with its default `zero_division`
  (a class whose F1 is 0/0 counts as 0.0). For single-label problems the macro average runs
  over the classes present in the labels or the predictions, as scikit-learn does; for
  multi-label problems it runs over all `C` label columns.
- `mcc`: `sklearn.metrics.matthews_corrcoef` (multiclass form; 0.0 when undefined).
- `f1` / `precision` / `recall` of two-class single-label problems: `sklearn.metrics.f1_score`
  (`precision_score`, `recall_score`) with `average="binary"`: the positive class (id 1) alone.
- `mse`: `sklearn.metrics.mean_squared_error`.
- `accuracy` of preference pairs (`pairwise_reward`): the share of pairs whose chosen text gets
  the strictly higher reward; a tie counts as wrong (the model has not ranked the pair), as in
  TRL's `RewardTrainer`, whose accuracy is `mean(r_chosen > r_rejected)`. `margin`: the mean
  of `r_chosen - r_rejected`.
- `pearson` / `spearman`: the statistic of `scipy.stats.pearsonr` / `scipy.stats.spearmanr`
  (average ranks for ties). Like SciPy they are NaN when either input is constant; unlike
  SciPy they are NaN rather than an error when fewer than two examples remain.

scikit-learn and SciPy are only used by the tests; nothing here imports them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flaxheads import problem
from flaxheads import thresholds as thresholds_lib
from flaxheads.problem import (  # noqa: F401 (re-exported)
    MULTI_LABEL,
    PAIRWISE_REWARD,
    PROBLEM_TYPES,
    REGRESSION,
    SINGLE_LABEL,
)

# The metrics `compute_metrics` returns for each problem type, in the order it returns them.
METRIC_NAMES: Mapping[str, tuple[str, ...]] = {
    SINGLE_LABEL: ("accuracy", "macro_f1", "mcc"),
    MULTI_LABEL: ("accuracy", "micro_f1", "macro_f1"),
    REGRESSION: ("mse", "pearson", "spearman"),
    PAIRWISE_REWARD: ("accuracy", "margin"),
}
"""Other tasks name their own (`flaxheads.tasks`; a task's `Objective.metric_names`)."""

BINARY_METRIC_NAMES = ("f1", "precision", "recall")
"""What a single-label problem of two classes reports besides `METRIC_NAMES`: the positive
class's (class id 1) F1, precision and recall, as run_glue reports F1 for MRPC and QQP
(scikit-learn's `average="binary"`, `pos_label=1`, 0.0 where a ratio is 0/0)."""


def single_label_names(num_labels: int) -> tuple[str, ...]:
    """The metrics a single-label problem of `num_labels` classes reports, in order."""
    return METRIC_NAMES[SINGLE_LABEL] + (BINARY_METRIC_NAMES if num_labels == 2 else ())

class NonFiniteScores(FloatingPointError):
    """Logits or a loss that are NaN or infinite: no metric is computed from them (argmax of NaN
    still "predicts" a class, which would pass for an accuracy)."""


_HIGHER_IS_BETTER = {
    "accuracy": True,
    "macro_f1": True,
    "micro_f1": True,
    "mcc": True,
    "pearson": True,
    "spearman": True,
    "margin": True,
    "f1": True,
    "precision": True,
    "recall": True,
    "macro_precision": True,
    "macro_recall": True,
    "mse": False,
    "loss": False,
}


def higher_is_better(metric_name: str) -> bool:
    """Whether a larger value of `metric_name` is better, for picking the best checkpoint.

    Accepts a bare name (`"accuracy"`) or one prefixed with a split (`"eval/accuracy"`).
    Raises `ValueError` for a name this module does not compute, so that a misspelt
    `metric_for_best_model` fails at start-up instead of silently keeping the wrong checkpoint.
    """
    bare_name = metric_name.rsplit("/", 1)[-1]
    if bare_name not in _HIGHER_IS_BETTER:
        raise ValueError(
            f"Unknown metric {metric_name!r}; expected one of {sorted(_HIGHER_IS_BETTER)}."
        )
    return _HIGHER_IS_BETTER[bare_name]


# ---------------------------------------------------------------------------------------------
# Logits -> probabilities / predictions


def _as_float_array(values: Any) -> np.ndarray:
    # float64 also widens bfloat16/float16 logits, which numpy reductions handle poorly.
    return np.asarray(values).astype(np.float64)


def _regression_values(logits: np.ndarray) -> np.ndarray:
    if logits.ndim == 2 and logits.shape[1] == 1:
        return logits[:, 0]
    if logits.ndim != 1:
        raise ValueError(f"Regression logits must be (N,) or (N, 1); got shape {logits.shape}.")
    return logits


def probabilities(problem_type: str, logits: np.ndarray) -> np.ndarray:
    """Turns logits into the model's output distribution, as float64.

    single-label: softmax over the last axis, (N, C) -> (N, C).
    multi-label: elementwise sigmoid, (N, C) -> (N, C).
    regression, and a reward model's scores of single texts: the values themselves, (N,) or
    (N, 1) -> (N,).
    """
    to_probabilities = problem.by_problem_type(
        problem_type, single_label=_softmax, multi_label=_sigmoid, regression=_regression_values,
        pairwise_reward=_regression_values,
    )
    return to_probabilities(_as_float_array(logits))


def _softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def _sigmoid(logits: np.ndarray) -> np.ndarray:
    # exp(-log(1 + exp(-x))) neither overflows nor loses the tails, unlike 1 / (1 + exp(-x)).
    return np.exp(-np.logaddexp(0.0, -logits))


def predictions(problem_type: str, logits: np.ndarray, thresholds: Sequence[float] | None = None) -> np.ndarray:
    """Turns logits into hard predictions.

    single-label: argmax class ids, (N, C) -> (N,) int64 (of a choice's logits, the chosen index).
    multi-label: multi-hot, probability > the label's threshold (`thresholds`; None: 0.5, that is
    `logit > 0`), (N, C) -> (N, C) int64.
    regression: the predicted values, (N,) or (N, 1) -> (N,) float64.
    pairwise_reward: scores of single texts, (N, 1) -> (N,) float64; of pairs, (N, 2) rewards ->
    (N,) float64 margins `r_chosen - r_rejected`.
    """
    to_predictions = problem.by_problem_type(
        problem_type,
        single_label=_argmax,
        multi_label=lambda x: thresholds_lib.decide(x, thresholds).astype(np.int64),
        regression=lambda x: _regression_values(_as_float_array(x)),
        pairwise_reward=_reward_values,
    )
    return to_predictions(logits)


def _argmax(logits) -> np.ndarray:
    return np.asarray(logits).argmax(axis=-1).astype(np.int64)


def _reward_values(logits) -> np.ndarray:
    logits = _as_float_array(logits)
    if logits.ndim == 2 and logits.shape[1] == 2:
        return logits[:, 0] - logits[:, 1]
    return _regression_values(logits)


# ---------------------------------------------------------------------------------------------
# Metric formulas, on unmasked rows only


def _confusion_matrix(labels: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Confusion matrix over the classes seen in labels or predictions (rows: true)."""
    classes, encoded = np.unique(np.concatenate([labels, predicted]), return_inverse=True)
    true_index, predicted_index = encoded[: len(labels)], encoded[len(labels) :]
    matrix = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(matrix, (true_index, predicted_index), 1.0)
    return matrix


def _matthews_corrcoef(confusion: np.ndarray) -> float:
    # Gorodkin's multiclass form, written as sklearn writes it so the edge cases agree.
    true_count = confusion.sum(axis=1)
    predicted_count = confusion.sum(axis=0)
    correct = np.trace(confusion)
    total = predicted_count.sum()
    cov_true_pred = correct * total - np.dot(true_count, predicted_count)
    cov_pred_pred = total**2 - np.dot(predicted_count, predicted_count)
    cov_true_true = total**2 - np.dot(true_count, true_count)
    if cov_pred_pred * cov_true_true == 0:
        return 0.0
    return float(cov_true_pred / np.sqrt(cov_pred_pred * cov_true_true))


def _single_label_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    if logits.ndim != 2:
        raise ValueError(f"single-label logits must be (N, C); got shape {logits.shape}.")
    labels = labels.reshape(-1).astype(np.int64)
    predicted = logits.argmax(axis=-1)
    confusion = _confusion_matrix(labels, predicted)
    per_class_f1 = thresholds_lib.f1_from_counts(
        np.diag(confusion), confusion.sum(axis=0), confusion.sum(axis=1)
    )
    results = {
        "accuracy": float(np.mean(predicted == labels)),
        "macro_f1": float(per_class_f1.mean()),
        "mcc": _matthews_corrcoef(confusion),
    }
    if logits.shape[1] == 2:  # the positive class's, as scikit-learn's average="binary"
        positive, said = labels == 1, predicted == 1
        true_positives = float(np.sum(positive & said))
        results["f1"] = float(thresholds_lib.f1_from_counts(
            np.array([true_positives]), np.array([float(said.sum())]), np.array([float(positive.sum())]))[0])
        results["precision"] = float(true_positives / said.sum()) if said.any() else 0.0
        results["recall"] = float(true_positives / positive.sum()) if positive.any() else 0.0
    return results


def _multi_label_metrics(logits: np.ndarray, labels: np.ndarray, thresholds=None) -> dict[str, float]:
    if logits.ndim != 2 or labels.shape != logits.shape:
        raise ValueError(
            "multi-label logits and labels must both be (N, C); "
            f"got {logits.shape} and {labels.shape}."
        )
    predicted = thresholds_lib.decide(logits, thresholds)
    # Labels may arrive as 0./1. floats (the dtype BCE losses want).
    truth = labels > 0.5
    true_positives = np.sum(predicted & truth, axis=0)
    predicted_count = predicted.sum(axis=0)
    true_count = truth.sum(axis=0)
    micro_f1 = thresholds_lib.f1_from_counts(true_positives.sum(), predicted_count.sum(), true_count.sum())
    return {
        "accuracy": float(np.mean(np.all(predicted == truth, axis=1))),
        "micro_f1": float(micro_f1),
        "macro_f1": float(thresholds_lib.f1_from_counts(true_positives, predicted_count, true_count).mean()),
    }


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks with ties given their mean rank (scipy.stats.rankdata 'average')."""
    order = np.argsort(values, kind="stable")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    sorted_values = values[order]
    starts_new_group = np.concatenate([[True], sorted_values[1:] != sorted_values[:-1]])
    group_of_sorted = np.cumsum(starts_new_group) - 1
    group_bounds = np.concatenate([np.flatnonzero(starts_new_group), [len(values)]])
    # A tie group spanning sorted positions [lo, hi) shares rank (lo + 1 + hi) / 2.
    group_rank = 0.5 * (group_bounds[:-1] + 1 + group_bounds[1:])
    return group_rank[group_of_sorted][inverse]


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    x_centered = x - x.mean()
    y_centered = y - y.mean()
    # Scale by the largest deviation before taking norms so huge values cannot overflow.
    x_scale = np.abs(x_centered).max()
    y_scale = np.abs(y_centered).max()
    x_unit = x_centered / (x_scale * np.linalg.norm(x_centered / x_scale))
    y_unit = y_centered / (y_scale * np.linalg.norm(y_centered / y_scale))
    return float(np.clip(np.dot(x_unit, y_unit), -1.0, 1.0))


def _regression_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    predicted = _regression_values(logits)
    labels = labels.reshape(-1)
    if labels.shape != predicted.shape:
        raise ValueError(
            f"regression labels must match the {predicted.shape[0]} predictions; "
            f"got shape {labels.shape}."
        )
    return {
        "mse": float(np.mean((predicted - labels) ** 2)),
        "pearson": _pearson(predicted, labels),
        "spearman": _pearson(_average_ranks(predicted), _average_ranks(labels)),
    }


def _pairwise_metrics(rewards: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    if rewards.ndim != 2 or rewards.shape[1] != 2:
        raise ValueError(f"preference pair rewards must be (N, 2) (chosen, rejected); got shape {rewards.shape}.")
    difference = rewards[:, 0] - rewards[:, 1]
    return {"accuracy": float(np.mean(difference > 0)), "margin": float(np.mean(difference))}


def _example_keep(example_mask: np.ndarray | None, num_rows: int) -> np.ndarray:
    if example_mask is None:
        return np.ones(num_rows, dtype=bool)
    keep = np.asarray(example_mask).reshape(-1) != 0
    if keep.shape[0] != num_rows:
        raise ValueError(f"example_mask has {keep.shape[0]} rows; logits have {num_rows}.")
    return keep


def compute_metrics(
    problem_type: str,
    logits: np.ndarray,
    labels: np.ndarray,
    example_mask: np.ndarray | None = None,
    thresholds: Sequence[float] | None = None,
) -> dict[str, float]:
    """Computes the metrics of `METRIC_NAMES[problem_type]` over the rows whose mask is non-zero.

    Args:
      problem_type: "single_label_classification", "multi_label_classification" or
        "regression" (the values of a Hugging Face config's `problem_type`), or "pairwise_reward".
      logits: (N, C) for classification; (N,) or (N, 1) for regression; (N, 2) rewards
        (chosen, rejected) for pairs. Any float dtype.
      labels: (N,) integer class ids; (N, C) multi-hot (0/1, ints or floats); (N,) or (N, 1)
        regression targets; (N,) margins of pairs (unused by the metrics).
      example_mask: (N,); rows where it is 0 (padding examples) are ignored. None keeps all.
      thresholds: multi-label decision thresholds per label (`flaxheads.thresholds`); None: 0.5.

    Returns:
      A dict of Python floats, keyed and ordered as `METRIC_NAMES[problem_type]` (two-class
      single-label logits add `BINARY_METRIC_NAMES`).

    Raises:
      ValueError: unknown problem type, mismatched shapes, or no unmasked rows.
      NonFiniteScores: any unmasked row has a NaN or infinite logit.
    """
    problem.require_known(problem_type)
    metrics = problem.by_problem_type(
        problem_type,
        single_label=_single_label_metrics,
        multi_label=lambda logits, labels: _multi_label_metrics(logits, labels, thresholds),
        regression=lambda logits, labels: _regression_metrics(logits, _as_float_array(labels)),
        pairwise_reward=_pairwise_metrics,
    )
    return masked_metrics(metrics, logits, labels, example_mask)


def masked_metrics(metrics, logits: np.ndarray, labels: np.ndarray, example_mask: np.ndarray | None = None
                   ) -> dict[str, float]:
    """`metrics(logits, labels)` (float64 logits, labels as given) over the rows whose mask is
    non-zero, after the checks every metric needs: one row of labels per row of logits, a real
    row at least, every real row's logits finite (else NonFiniteScores). The one gate of every
    task's metrics."""
    logits = _as_float_array(logits)
    labels = np.asarray(labels)
    if labels.shape[:1] != logits.shape[:1]:
        raise ValueError(f"labels have {labels.shape[:1]} rows; logits have {logits.shape[:1]}.")
    keep = _example_keep(example_mask, logits.shape[0])
    if not keep.any():
        raise ValueError("compute_metrics needs at least one row with example_mask != 0.")
    finite = np.isfinite(logits.reshape(logits.shape[0], -1)).all(axis=1)
    if not finite[keep].all():
        bad = np.flatnonzero(keep & ~finite)
        raise NonFiniteScores(
            f"{bad.size} of {int(keep.sum())} examples have non-finite logits (e.g. example {int(bad[0])}); no metric "
            "is computed from NaN or infinite scores"
        )
    return metrics(logits[keep], labels[keep])


# ---------------------------------------------------------------------------------------------
# Batch-by-batch evaluation


class MetricAccumulator:
    """Collects evaluation batches on the host and computes metrics once at the end.

    Usage::

        accumulator = MetricAccumulator("single_label_classification")
        for batch in eval_batches:
            logits, loss = eval_step(state, batch)
            accumulator.add(logits, batch["labels"], batch["example_mask"], loss=loss)
        results = accumulator.compute()  # accuracy, macro_f1, mcc and loss

    Arrays are copied to host numpy when added; masked rows are dropped right away, so padding
    costs no memory. In a multi-process run, pass arrays that hold every process's rows (e.g.
    through `jax.experimental.multihost_utils.process_allgather`): `np.asarray` is only
    defined for fully addressable arrays.
    """

    def __init__(self, problem_type: str, thresholds: Sequence[float] | None = None, *, metrics=None):
        self.problem_type = problem_type if metrics is not None else problem.require_known(problem_type)
        self.thresholds = thresholds
        self._metrics = metrics
        """`(logits, labels, thresholds) -> metrics` of a task's objective (`Objective.metrics`);
        None: `compute_metrics` of the problem type."""
        self._logits: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        self._loss_sum = 0.0
        self._loss_weight = 0.0

    @property
    def num_examples(self) -> int:
        """How many unmasked examples have been added."""
        return sum(len(batch) for batch in self._logits)

    def add(
        self,
        logits: np.ndarray,
        labels: np.ndarray,
        example_mask: np.ndarray | None = None,
        *,
        loss: np.ndarray | float | None = None,
    ) -> None:
        """Adds one batch.

        Args:
          logits, labels, example_mask: as in `compute_metrics`.
          loss: either per-example losses, shape (N,), averaged with `example_mask` as weights;
            or a scalar that is already the mean over this batch's unmasked rows, weighted by
            their count (the sum of `example_mask`). None leaves "loss" out of the result
            unless another batch supplies it.
        """
        logits = np.asarray(logits)
        labels = np.asarray(labels)
        weights = (
            np.ones(logits.shape[0], dtype=np.float64)
            if example_mask is None
            else np.asarray(example_mask, dtype=np.float64).reshape(-1)
        )
        keep = _example_keep(weights, logits.shape[0])
        if loss is not None:
            loss = _as_float_array(loss)
            if loss.ndim == 0:
                self._loss_sum += float(loss) * weights.sum()
            else:
                self._loss_sum += float(np.sum(loss.reshape(-1) * weights))
            self._loss_weight += float(weights.sum())
        self._logits.append(logits[keep])
        self._labels.append(labels[keep])

    def compute(self) -> dict[str, float]:
        """Metrics over every added example, plus "loss" (the weighted mean) if losses were given.

        Raises:
          ValueError: when no unmasked example has been added.
          NonFiniteScores: a logit or the loss is NaN or infinite.
        """
        if self.num_examples == 0:
            raise ValueError("MetricAccumulator.compute() called before any unmasked example.")
        logits, labels = np.concatenate(self._logits), np.concatenate(self._labels)
        if self._metrics is not None:
            results = self._metrics(logits, labels, self.thresholds)
        else:
            results = compute_metrics(self.problem_type, logits, labels, thresholds=self.thresholds)
        if self._loss_weight > 0:
            results["loss"] = self._loss_sum / self._loss_weight
            if not np.isfinite(results["loss"]):
                raise NonFiniteScores(f"the loss is {results['loss']} although every logit is finite (labels the "
                                      "loss cannot take?); no metric is reported")
        return results

    def reset(self) -> None:
        """Forgets every added batch, for reuse at the next evaluation."""
        self._logits.clear()
        self._labels.clear()
        self._loss_sum = 0.0
        self._loss_weight = 0.0
