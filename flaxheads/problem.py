"""Problem types, label validation, and their losses (the ones Hugging Face's classifiers use).

| problem_type                   | logits        | labels                         | loss                 |
|--------------------------------|---------------|--------------------------------|----------------------|
| `regression`                   | (B, L)        | float (B,) if L == 1, (B, L)    | MSE                  |
| `single_label_classification`  | (B, L)        | integer class ids (B,)         | cross-entropy        |
| `multi_label_classification`   | (B, L)        | multi-hot floats (B, L)        | binary cross-entropy |

When `problem_type` is None it is inferred the way transformers does: `num_labels == 1` means
regression, integer labels mean single-label, anything else multi-label.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

REGRESSION = "regression"
SINGLE_LABEL = "single_label_classification"
MULTI_LABEL = "multi_label_classification"
PROBLEM_TYPES = (REGRESSION, SINGLE_LABEL, MULTI_LABEL)


def _is_integer(labels) -> bool:
    return jnp.issubdtype(labels.dtype, jnp.integer)


def infer_problem_type(num_labels: int, labels) -> str:
    """transformers' rule: 1 label -> regression; integer labels -> single-label; else multi-label."""
    if num_labels == 1:
        return REGRESSION
    return SINGLE_LABEL if _is_integer(labels) else MULTI_LABEL


def check_problem_type(problem_type: str | None, num_labels: int) -> None:
    if problem_type is not None and problem_type not in PROBLEM_TYPES:
        raise ValueError(f"problem_type={problem_type!r} is not one of {PROBLEM_TYPES}")
    if problem_type == SINGLE_LABEL and num_labels < 2:
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
    logits = logits.astype(jnp.float32)
    if problem_type == REGRESSION:
        labels = labels.astype(jnp.float32).reshape(logits.shape)
        return jnp.mean(jnp.square(logits - labels), axis=-1)
    if problem_type == SINGLE_LABEL:
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    if problem_type == MULTI_LABEL:
        return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels.astype(jnp.float32)), axis=-1)
    raise ValueError(f"problem_type={problem_type!r} is not one of {PROBLEM_TYPES}")


def loss(logits, labels, *, problem_type: str | None, num_labels: int, example_mask=None) -> jax.Array:
    """Mean loss over real examples (`example_mask` 1) after checking labels; float32 scalar."""
    resolved = check_labels(labels, num_labels=num_labels, problem_type=problem_type, batch_size=logits.shape[0])
    losses = per_example_loss(logits, labels, resolved)
    if example_mask is None:
        return jnp.mean(losses)
    weights = example_mask.astype(jnp.float32)
    return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)
