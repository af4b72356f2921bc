"""Temperature scaling (Guo et al., 2017): one number T, fitted on the validation split, divides
the logits so that the probabilities say how often the model is right; the predicted classes do
not change (T > 0 keeps the argmax, and every sigmoid's side of 0.5).

`fit_temperature` minimises the validation log-loss over T by golden-section search on log T
(the loss is convex in 1/T, so unimodal in log T). `calibration_scores` measures, before and
after: expected calibration error (15 equal-width confidence bins), Brier score and log-loss.
`folded` divides the head's output layer (`heads.output_layer`: kernel and bias) by T, so the
exported model gives the calibrated logits and nothing downstream needs to know T.

Single-label: softmax probabilities, confidence = the top probability. Multi-label: each class's
sigmoid is a binary prediction of its own; the scores pool all (example, class) pairs."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
from flax import nnx

from flaxheads import heads, problem

PROBLEM_TYPES = (problem.SINGLE_LABEL, problem.MULTI_LABEL)
"""The problem types whose outputs are probabilities to calibrate."""

ECE_BINS = 15
"""Confidence bins of the expected calibration error (Guo et al.'s number)."""

LOG_T_RANGE = (math.log(0.05), math.log(20.0))
"""Where the temperature is searched: a model 20 times over- or under-confident is out of reach."""

MIN_EXAMPLES = 2 * ECE_BINS
"""Fewest validation examples a temperature is fitted on: two per ECE bin. Fewer cannot show
whether a temperature calibrates anything (most bins would hold one prediction or none), and one
example moves the log-loss minimum far: a fit on a handful of examples is noise folded into the
export."""

AT_BOUND = 1e-3
"""How near (in log T) an end of LOG_T_RANGE a fitted temperature is "at the bound": the search
stopped there, and the log-loss minimum lies at or beyond it."""


def _log_probabilities(logits: np.ndarray, problem_type: str) -> tuple[np.ndarray, np.ndarray]:
    """(log p, log (1 - p)) for multi-label; (log softmax, unused) for single-label; float64."""
    z = np.asarray(logits, np.float64)
    if problem_type == problem.MULTI_LABEL:
        return -np.logaddexp(0.0, -z), -np.logaddexp(0.0, z)
    shifted = z - z.max(axis=-1, keepdims=True)
    # log(sum exp) = log1p(the others' sum): log(1 + 1e-18) is 0 in float64, and a log-loss of 0 for
    # every temperature below some T leaves the search nothing to follow (it stopped at T = 0.098
    # on answers all right by a margin of 4, not at the bound where the loss keeps falling).
    top = np.arange(z.shape[-1]) == np.argmax(z, axis=-1)[..., None]
    others = np.where(top, 0.0, np.exp(shifted)).sum(axis=-1, keepdims=True)
    return shifted - np.log1p(others), np.empty(0)


def log_loss(logits: np.ndarray, labels: np.ndarray, problem_type: str, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of `labels` under logits / temperature (multi-label: mean
    binary cross-entropy over every example and class)."""
    log_p, log_not_p = _log_probabilities(np.asarray(logits, np.float64) / temperature, problem_type)
    if problem_type == problem.MULTI_LABEL:
        y = np.asarray(labels, np.float64)
        return float(-np.mean(y * log_p + (1.0 - y) * log_not_p))
    y = np.asarray(labels, np.int64)
    return float(-np.mean(log_p[np.arange(len(y)), y]))


def fit_temperature(logits: np.ndarray, labels: np.ndarray, problem_type: str, *, tolerance: float = 1e-7) -> float:
    """The T in LOG_T_RANGE that minimises `log_loss(logits, labels, problem_type, T)`; ValueError
    for labels it cannot be fitted on (`check_fittable`). A T at an end of the range (`at_bound`)
    is where the search stopped, not a minimum."""
    check_problem_type(problem_type)
    check_fittable(labels, problem_type)
    loss = lambda log_t: log_loss(logits, labels, problem_type, math.exp(log_t))  # noqa: E731
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = LOG_T_RANGE
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = loss(c), loss(d)
    while b - a > tolerance:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = loss(d)
    return math.exp((a + b) / 2.0)


def probabilities(logits: np.ndarray, problem_type: str, temperature: float = 1.0) -> np.ndarray:
    """Softmax (single-label) or per-class sigmoid (multi-label) of logits / temperature."""
    log_p, _ = _log_probabilities(np.asarray(logits, np.float64) / temperature, problem_type)
    return np.exp(log_p)


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> float:
    """Sum over equal-width bins (0, 1/bins], ... of (share of predictions in the bin) x
    |accuracy - mean confidence| in it."""
    confidence, correct = np.ravel(confidence), np.ravel(correct).astype(np.float64)
    which = np.clip(np.ceil(confidence * bins).astype(np.int64) - 1, 0, bins - 1)
    total = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            total += inside.mean() * abs(correct[inside].mean() - confidence[inside].mean())
    return float(total)


def reliability_bins(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> list[dict[str, float]]:
    """The bins of the ECE that hold predictions, for a reliability diagram: {"lower", "upper",
    "count", "confidence" (mean), "accuracy" (share correct)} each."""
    confidence, correct = np.ravel(confidence), np.ravel(correct).astype(np.float64)
    which = np.clip(np.ceil(confidence * bins).astype(np.int64) - 1, 0, bins - 1)
    return [{"lower": b / bins, "upper": (b + 1) / bins, "count": int((which == b).sum()),
             "confidence": float(confidence[which == b].mean()), "accuracy": float(correct[which == b].mean())}
            for b in range(bins) if (which == b).any()]


def _confidence_and_correct(logits, labels, problem_type: str, temperature: float):
    p = probabilities(logits, problem_type, temperature)
    if problem_type == problem.MULTI_LABEL:
        return p, np.asarray(labels, np.float64)
    y = np.asarray(labels, np.int64)
    return p.max(axis=-1), p.argmax(axis=-1) == y


def calibration_scores(logits: np.ndarray, labels: np.ndarray, problem_type: str,
                       temperature: float = 1.0) -> dict[str, float]:
    """{"ece", "brier", "log_loss"} of logits / temperature against `labels`.

    Single-label: ECE of the top probability against whether the top class is right; Brier score
    = mean over examples of the squared distance between the probabilities and the one-hot label.
    Multi-label: ECE of each class's probability against whether the class is present; Brier =
    mean over examples and classes of (p - y)^2."""
    p = probabilities(logits, problem_type, temperature)
    if problem_type == problem.MULTI_LABEL:
        y = np.asarray(labels, np.float64)
        ece = expected_calibration_error(p, y)
        brier = float(np.mean((p - y) ** 2))
    else:
        y = np.asarray(labels, np.int64)
        ece = expected_calibration_error(p.max(axis=-1), p.argmax(axis=-1) == y)
        brier = float(np.mean(np.sum((p - np.eye(p.shape[-1])[y]) ** 2, axis=-1)))
    return {"ece": ece, "brier": brier, "log_loss": log_loss(logits, labels, problem_type, temperature)}


def calibrate(logits: np.ndarray, labels: np.ndarray, problem_type: str) -> dict[str, Any]:
    """{"temperature", "at_bound", "before": scores, "after": scores, "reliability": {"before",
    "after"}: `reliability_bins`} for the validation `logits`, `labels`; with "warning" (a sentence
    to show) when the temperature is at an end of its search range ("at_bound": "lower" or
    "upper", else None): the data did not pin it down, and its scores are not a calibration.
    ValueError for labels a temperature cannot be fitted on (`check_fittable`)."""
    temperature = fit_temperature(logits, labels, problem_type)
    bound = at_bound(temperature)
    warning = {} if bound is None else {"warning": _bound_warning(temperature, bound)}
    return {"temperature": temperature, "at_bound": bound, **warning, "ece_bins": ECE_BINS,
            "before": calibration_scores(logits, labels, problem_type),
            "after": calibration_scores(logits, labels, problem_type, temperature),
            "reliability": {when: reliability_bins(*_confidence_and_correct(logits, labels, problem_type, t))
                            for when, t in (("before", 1.0), ("after", temperature))}}


def _bound_warning(temperature: float, bound: str) -> str:
    why = ("every lower temperature fits it better: the model's answers on it are all right, or it separates them"
           if bound == "lower" else "the model's answers on it are no better than chance")
    low, high = (math.exp(end) for end in LOG_T_RANGE)
    return (f"the temperature {temperature:.4g} is at the {bound} end of its search range [{low:.3g}, {high:.3g}]: "
            f"the validation split does not pin it down ({why}), so its scores are not a calibration, and the export's "
            "probabilities are pushed to an extreme. Calibrate on a larger validation split with every class, or leave "
            "calibrate out")


def at_bound(temperature: float) -> str | None:
    """"lower" or "upper" when `temperature` is within AT_BOUND (in log T) of that end of
    LOG_T_RANGE, else None."""
    low, high = LOG_T_RANGE
    log_t = math.log(temperature)
    return "lower" if log_t - low < AT_BOUND else "upper" if high - log_t < AT_BOUND else None


def check_fittable(labels: np.ndarray, problem_type: str, names: Mapping[int, str] | None = None) -> None:
    """ValueError naming the fix for validation `labels` no temperature can be fitted on: fewer
    than MIN_EXAMPLES examples, or one class only (single-label: every example of one class;
    multi-label: every (example, label) pair present, or every one absent). With one class the
    log-loss falls without end as T shrinks wherever the model favours that class: the fit lands
    on its bound and the export answers that class for every text with near certainty. `names`
    (class id -> name) names the class."""
    y = np.asarray(labels)
    fix = "give a validation split of at least {} examples with every class, or leave calibrate out".format(
        MIN_EXAMPLES)
    if len(y) < MIN_EXAMPLES:
        raise ValueError(f"calibrate=True fits its temperature on the validation split, which has {len(y)} "
                         f"example(s): too few to fit it on (at least {MIN_EXAMPLES}, two per ECE bin); {fix}")
    present = np.unique(np.asarray(y, np.float64).ravel() > 0.5) if problem_type == problem.MULTI_LABEL else np.unique(y)
    if len(present) < 2:
        what = (f"every label of every example is {'present' if present[0] else 'absent'}"
                if problem_type == problem.MULTI_LABEL else f"every example is of class {_name(present[0], names)}")
        raise ValueError(f"calibrate=True fits its temperature on the validation split, and {what}: with one class "
                         f"the fit only makes the model surer of it, whatever the text; {fix}")


def _name(class_id, names: Mapping[int, str] | None) -> str:
    return repr(names[int(class_id)]) if names else str(class_id)


def check_problem_type(problem_type: str) -> None:
    if problem_type not in PROBLEM_TYPES:
        raise ValueError(f"calibrate fits a temperature to class probabilities, and {problem_type} has none: "
                         f"it applies to {' and '.join(PROBLEM_TYPES)}; leave calibrate out")


def folded(graphdef, params: nnx.State, temperature: float) -> nnx.State:
    """`params` with the head's output layer divided by `temperature`: the classifier's logits
    become logits / temperature."""
    model = nnx.merge(graphdef, params, copy=True)  # params itself stays as it is
    layer = heads.output_layer(model.head)
    if type(layer) is not nnx.Linear:
        raise ValueError(f"calibrate folds the temperature into the head's output layer, which is a "
                         f"{type(layer).__name__} here (a LoRA target?): leave the head's "
                         f"{type(model.head).OUTPUT_LAYER} out of lora_target_modules, or leave calibrate out")
    # A new value, never written into the old one: the best evaluation's weights
    # (load_best_model_at_end) are read-only numpy copies on the host.
    for weight in (layer.kernel, layer.bias):
        if weight is not None:
            weight.set_value((weight[...] / temperature).astype(weight.dtype))
    return nnx.split(model)[1]
