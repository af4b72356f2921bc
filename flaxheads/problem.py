"""Problem types, label validation, and their losses (the ones Hugging Face's classifiers use).

| problem_type                   | logits        | labels                         | loss                 |
|--------------------------------|---------------|--------------------------------|----------------------|
| `regression`                   | (B, L)        | float (B,) if L == 1, (B, L)    | MSE                  |
| `single_label_classification`  | (B, L)        | integer class ids (B,)         | cross-entropy        |
| `multi_label_classification`   | (B, L)        | multi-hot floats (B, L)        | binary cross-entropy |
| `pairwise_reward`              | (B, 2)        | margins, float (B,)            | Bradley-Terry        |

`pairwise_reward` trains a reward model (`num_labels=1`) on preference pairs, the format of TRL's
`RewardTrainer`: each example is a `chosen` and a `rejected` text, scored in one forward pass, and
its logits are the two rewards `(r_chosen, r_rejected)`. The loss is
`-log sigmoid(r_chosen - r_rejected - margin)` in float32 (the margin is 0 unless given, as in
TRL). It is flaxheads' own name: transformers' config.json has no such problem type, so an export
leaves config.json's `problem_type` unset (transformers then reads one label as regression, which
is how it scores single texts) and records it in the `flaxheads` section (`model.py`). On single
texts a reward model's output is its score, read like a regression's.

When `problem_type` is None it is inferred the way transformers does: `num_labels == 1` means
regression, integer labels mean single-label, anything else multi-label. Without labels to look
at (prediction), it is regression for one label and single-label classification otherwise.

Problem types are what a text classifier's labels mean (transformers' `problem_type`); other
tasks (token classification, multiple choice: `flaxheads.tasks`) have their own labels and losses.
This module is the one home of the idea: the names, the check of a name (`require_known`,
`check_problem_type`), the defaults (`default_problem_type`, `resolved_problem_type`,
`infer_problem_type`), and `by_problem_type`, which picks the value for a problem type so that
other modules dispatch on it without repeating the check.
"""

from __future__ import annotations

from typing import TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

REGRESSION = "regression"
SINGLE_LABEL = "single_label_classification"
MULTI_LABEL = "multi_label_classification"
PAIRWISE_REWARD = "pairwise_reward"
HF_PROBLEM_TYPES = (REGRESSION, SINGLE_LABEL, MULTI_LABEL)
"""The problem types transformers' `PretrainedConfig.problem_type` accepts."""
PROBLEM_TYPES = (*HF_PROBLEM_TYPES, PAIRWISE_REWARD)
"""What a sequence classifier's labels may mean."""
IGNORE_INDEX = -100
"""The label of a token the loss skips (PyTorch's `CrossEntropyLoss` ignore_index): where a
per-token label is padded (`data.batching`), and where a task leaves a token unscored."""

T = TypeVar("T")


def require_known(problem_type: str) -> str:
    """`problem_type` itself when it is one of `PROBLEM_TYPES`; ValueError naming them otherwise
    (None included: callers that may infer the type check with `check_problem_type`)."""
    if problem_type not in PROBLEM_TYPES:
        raise ValueError(f"unknown problem_type={problem_type!r}; choose one of {PROBLEM_TYPES}")
    return problem_type


_UNDEFINED = object()


def by_problem_type(problem_type: str, *, single_label: T, multi_label: T, regression: T,
                    pairwise_reward: T = _UNDEFINED) -> T:
    """The argument named after `problem_type` (a value, or a function to call); ValueError as
    `require_known` for an unknown one, and for `pairwise_reward` where the caller gives none
    (that use has no meaning for it). Dispatch on the problem type goes through here."""
    by_name = {SINGLE_LABEL: single_label, MULTI_LABEL: multi_label, REGRESSION: regression,
               PAIRWISE_REWARD: pairwise_reward}
    if problem_type not in by_name:
        require_known(problem_type)
    chosen = by_name[problem_type]
    if chosen is _UNDEFINED:
        raise ValueError(f"problem_type={PAIRWISE_REWARD!r} is not supported here; use it with chosen/rejected pairs "
                         "to train a reward model")
    return chosen


def default_problem_type(num_labels: int) -> str:
    """The problem type when nothing says otherwise: regression for one output, else single-label."""
    return REGRESSION if num_labels == 1 else SINGLE_LABEL


def resolved_problem_type(problem_type: str | None, num_labels: int) -> str:
    """`problem_type` when set (checked as `check_problem_type` does), else the default for
    `num_labels`: what a model's outputs mean when there are no labels to infer it from."""
    check_problem_type(problem_type, num_labels)
    return problem_type or default_problem_type(num_labels)


def _is_integer(labels) -> bool:
    return jnp.issubdtype(labels.dtype, jnp.integer)


def infer_problem_type(num_labels: int, labels) -> str:
    """transformers' rule: 1 label -> regression; integer labels -> single-label; else multi-label."""
    if num_labels == 1:
        return REGRESSION
    return SINGLE_LABEL if _is_integer(labels) else MULTI_LABEL


def check_problem_type(problem_type: str | None, num_labels: int | None = None) -> None:
    """ValueError unless `problem_type` is None (inferred later) or known (`require_known`) and,
    when `num_labels` is given, fits it: single-label classification needs two labels or more, a
    pairwise reward model exactly one."""
    if problem_type is None:
        return
    require_known(problem_type)
    if problem_type == PAIRWISE_REWARD and num_labels is not None and num_labels != 1:
        raise ValueError(
            f"problem_type={PAIRWISE_REWARD!r} trains a reward model, which scores each text with one number, "
            f"but got num_labels={num_labels}; load the model with from_pretrained(..., num_labels=1) "
            "(and ignore_mismatched_sizes=True when its checkpoint has a trained head of another size)"
        )
    if problem_type == SINGLE_LABEL and num_labels is not None and num_labels < 2:
        raise ValueError(
            f"problem_type={SINGLE_LABEL!r} needs num_labels >= 2, got num_labels={num_labels}; "
            f"for a single score use problem_type={REGRESSION!r}"
        )


def check_labels(labels, *, num_labels: int, problem_type: str | None, batch_size: int) -> str:
    """Validates `labels` against `num_labels` and the problem type; returns the problem type.

    Raises ValueError saying what was received, what was expected, and which setting to change.
    Value ranges are checked only for concrete (not traced) labels.
    """
    check_problem_type(problem_type, num_labels)
    resolved = problem_type or infer_problem_type(num_labels, labels)
    shape, dtype = tuple(labels.shape), labels.dtype
    got = f"labels of shape {shape} and dtype {dtype}"
    if resolved == REGRESSION:
        expected = [(batch_size,), (batch_size, 1)] if num_labels == 1 else [(batch_size, num_labels)]
        if shape not in expected:
            raise ValueError(
                f"regression with num_labels={num_labels} expects float labels of shape "
                f"{' or '.join(map(str, expected))}, got {got}; set num_labels to the number of "
                "regression targets"
            )
        if not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
            raise ValueError(f"regression expects numeric labels, got {got}")
    elif resolved == PAIRWISE_REWARD:
        if shape not in [(batch_size,), (batch_size, 1)]:
            raise ValueError(
                f"{PAIRWISE_REWARD} expects one margin per pair, float labels of shape ({batch_size},) "
                f"(zeros for none), got {got}"
            )
    elif resolved == SINGLE_LABEL:
        if not jnp.issubdtype(dtype, jnp.integer):
            raise ValueError(
                f"single_label_classification expects integer class ids of shape ({batch_size},), "
                f"got {got}; cast class ids to int, or for multi-hot labels set "
                f"problem_type={MULTI_LABEL!r}, or for a score set num_labels=1 (regression)"
            )
        if shape != (batch_size,):
            raise ValueError(
                f"single_label_classification expects class ids of shape ({batch_size},), got {got}; "
                f"for multi-hot labels of shape ({batch_size}, {num_labels}) set problem_type={MULTI_LABEL!r}"
            )
        _check_class_ids(labels, num_labels)
    else:
        if shape != (batch_size, num_labels):
            hint = (
                "; for class ids pass integer labels (single_label_classification), "
                "or for one score per example set num_labels=1 (regression)"
                if shape == (batch_size,)
                else "; set num_labels to the width of the multi-hot labels"
            )
            raise ValueError(
                f"multi_label_classification with num_labels={num_labels} expects multi-hot float "
                f"labels of shape ({batch_size}, {num_labels}), got {got}{hint}"
            )
    return resolved


def _check_class_ids(labels, num_labels: int) -> None:
    if isinstance(labels, jax.core.Tracer):
        return
    values = np.asarray(labels)
    bad = values[(values < 0) | (values >= num_labels)]
    if bad.size:
        raise ValueError(
            f"class id {int(bad[0])} is outside [0, {num_labels}) for num_labels={num_labels}; "
            f"set num_labels to at least {int(values.max()) + 1} or fix the labels"
        )


def per_example_loss(logits, labels, problem_type: str) -> jax.Array:
    """(batch,) losses; their mean equals the Hugging Face loss for the same batch."""
    per_example = by_problem_type(
        problem_type, single_label=cross_entropy, multi_label=_binary_cross_entropy, regression=_squared_error,
        pairwise_reward=bradley_terry,
    )
    return per_example(logits.astype(jnp.float32), labels)


def _squared_error(logits, labels) -> jax.Array:
    return jnp.mean(jnp.square(logits - labels.astype(jnp.float32).reshape(logits.shape)), axis=-1)


def bradley_terry(rewards, margins) -> jax.Array:
    """(B,) `-log sigmoid(r_chosen - r_rejected - margin)` of (B, 2) rewards `(r_chosen,
    r_rejected)`: TRL's `RewardTrainer` loss. `log_sigmoid` keeps it finite for any difference
    (log(sigmoid(x)) underflows to -inf below x = -104 in float32)."""
    if rewards.ndim != 2 or rewards.shape[-1] != 2:
        raise ValueError(
            f"{PAIRWISE_REWARD} expects (pairs, 2) rewards (chosen, rejected) from num_labels=1 models, got logits "
            f"of shape {tuple(rewards.shape)}; batch pairs with flaxheads.data (input_ids of shape (B, 2, T))"
        )
    difference = rewards[:, 0] - rewards[:, 1] - margins.astype(jnp.float32).reshape(-1)
    return -jax.nn.log_sigmoid(difference)


def cross_entropy(logits, labels) -> jax.Array:
    """(B,) cross entropy of integer `labels` (B,) under `logits` (B, C): single-label
    classification's loss, and multiple choice's over each example's choices."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def _binary_cross_entropy(logits, labels) -> jax.Array:
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels.astype(jnp.float32)), axis=-1)


def weighted_loss_terms(logits, labels, problem_type: str, *, class_weights=None,
                        label_smoothing: float = 0.0) -> tuple[jax.Array, jax.Array]:
    """(numerators, denominators), each (batch,): the loss over real examples is
    sum(numerators * mask) / sum(denominators * mask). Without class weights or smoothing these are
    `per_example_loss` and ones.

    Single-label, as PyTorch's `CrossEntropyLoss(weight=class_weights, label_smoothing=e)`:
    numerator (1 - e) w[y] (-log p_y) + e/C sum_c w_c (-log p_c), denominator w[y]; with no
    weights this is transformers' Trainer `label_smoothing_factor` (its `LabelSmoother`).
    Multi-label, as `BCEWithLogitsLoss(pos_weight=class_weights)`: the mean over labels of
    -(w_c y log s(x) + (1 - y) log(1 - s(x))), denominator 1."""
    if problem_type == SINGLE_LABEL and (class_weights is not None or label_smoothing):
        log_p = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        num_classes = log_p.shape[-1]
        weights = jnp.ones(num_classes, jnp.float32) if class_weights is None else jnp.asarray(class_weights, jnp.float32)
        labels = labels.astype(jnp.int32)
        nll = -jnp.take_along_axis(log_p, labels[:, None], axis=-1)[:, 0]
        weight_of_label = weights[labels]
        smoothed = -jnp.sum(log_p * weights, axis=-1) / num_classes
        return (1.0 - label_smoothing) * weight_of_label * nll + label_smoothing * smoothed, weight_of_label
    if problem_type == MULTI_LABEL and class_weights is not None:
        x, y = logits.astype(jnp.float32), labels.astype(jnp.float32)
        pos_weight = jnp.asarray(class_weights, jnp.float32)
        # -log s(x) = softplus(-x), -log(1 - s(x)) = softplus(x): finite for any x
        losses = jnp.mean(pos_weight * y * jax.nn.softplus(-x) + (1.0 - y) * jax.nn.softplus(x), axis=-1)
        return losses, jnp.ones_like(losses)
    losses = per_example_loss(logits, labels, problem_type)
    return losses, jnp.ones_like(losses)


def balanced_class_weights(labels, problem_type: str, num_labels: int) -> tuple[float, ...]:
    """Weights that balance the classes of `labels` (the train split's): single-label
    n / (C * count_c), as scikit-learn's `compute_class_weight("balanced")`; multi-label the
    positive weight negatives_c / positives_c of each label, as `BCEWithLogitsLoss(pos_weight)`
    is usually set. ValueError naming a class (label) with no example (no positive)."""
    import numpy as np

    labels = np.asarray(labels)
    if problem_type == SINGLE_LABEL:
        counts = np.bincount(labels.astype(np.int64), minlength=num_labels)
        if (counts == 0).any():
            raise ValueError(f"class_weights='balanced': class {int(np.argmin(counts))} has no training example, so "
                             "its weight would be infinite; give the weights (class_weights='w1,w2,...')")
        return tuple(float(w) for w in counts.sum() / (num_labels * counts))
    positives = labels.reshape(-1, num_labels).sum(axis=0)
    negatives = labels.reshape(-1, num_labels).shape[0] - positives
    if (positives == 0).any():
        raise ValueError(f"class_weights='balanced': label {int(np.argmin(positives))} is never positive in the training "
                         "data, so its weight would be infinite; give the weights (class_weights='w1,w2,...')")
    return tuple(float(w) for w in negatives / positives)


def loss(logits, labels, *, problem_type: str | None, num_labels: int, example_mask=None) -> jax.Array:
    """Mean loss over real examples (`example_mask` 1) after checking labels; float32 scalar."""
    resolved = check_labels(labels, num_labels=num_labels, problem_type=problem_type, batch_size=logits.shape[0])
    losses = per_example_loss(logits, labels, resolved)
    if example_mask is None:
        return jnp.mean(losses)
    weights = example_mask.astype(jnp.float32)
    return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)
