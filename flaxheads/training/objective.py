"""What the train and eval steps compute from a batch, whatever the task: the model's logits,
the training loss's terms, the evaluation's per-example outputs, and the metrics of a split.

The steps (`step.py`), the parallel runners and the evaluator call an `Objective` and know no
task. A text classifier's problem types are `ProblemObjective` (`objective_of` turns a problem
type's name into one); each other task gives its own (`flaxheads.tasks`: token classification's
loss over scored tokens, multiple choice's cross entropy over choices). A model's `.loss` takes
the same terms, so there is one loss path per task.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from flaxheads import problem
from flaxheads.training import metrics as metrics_lib

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class Objective(Protocol):
    """What a step asks of the task it trains (every method is traced inside jit but `metrics`)."""

    metric_names: tuple[str, ...]
    """The metrics `metrics` returns, in that order (what metric_for_best_model may name)."""

    def logits(self, model, batch: dict, rngs) -> jax.Array:
        """The model's logits for `batch` (its `MODEL_INPUTS`, and `segment_ids` when packed)."""

    def loss_terms(self, logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(numerators, denominators), each (examples,): the training loss over a batch's real
        examples is sum(numerators * mask) / sum(denominators * mask)."""

    def eval_outputs(self, logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
        """Per-example evaluation outputs: "loss" (unweighted), and what the task's scorer reads."""

    def metrics(self, logits: np.ndarray, labels: np.ndarray, thresholds=None) -> dict[str, float]:
        """A split's metrics from its real examples' logits and labels (host numpy)."""


def model_logits(model, batch: dict, rngs) -> jax.Array:
    """`model(**inputs)`, packed rows with their `segment_ids` and slot count: the forward pass of
    every model a batch of rows feeds ((B, S, C) logits for packed rows, S static from the mask)."""
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    if "segment_ids" in batch:
        return model(**inputs, segment_ids=batch["segment_ids"], num_segments=batch["example_mask"].shape[-1],
                     rngs=rngs)
    return model(**inputs, rngs=rngs)


@dataclasses.dataclass(frozen=True)
class ProblemObjective:
    """A text classifier's objective for its problem type (`flaxheads.problem`): the loss
    `problem.per_example_loss`, or with `class_weights` / `label_smoothing` the weighted terms
    `problem.weighted_loss_terms`; metrics `metrics.compute_metrics`. Preference pairs
    (`pairwise_reward`) are (B, 2, T) inputs scored in one forward pass of 2B rows."""

    problem_type: str
    class_weights: tuple[float, ...] | None = None
    label_smoothing: float = 0.0

    def __post_init__(self):
        problem.require_known(self.problem_type)

    @property
    def metric_names(self) -> tuple[str, ...]:
        return metrics_lib.METRIC_NAMES[self.problem_type]

    def logits(self, model, batch: dict, rngs) -> jax.Array:
        if batch["input_ids"].ndim == 3:  # (B, 2, T) preference pairs; single texts are scored as they are
            return _pair_rewards(model, {k: batch[k] for k in MODEL_INPUTS if k in batch}, rngs)
        return model_logits(model, batch, rngs)

    def loss_terms(self, logits, labels):
        if self.class_weights is None and not self.label_smoothing:
            losses = problem.per_example_loss(logits, labels, self.problem_type)
            return losses, jnp.ones_like(losses)
        return problem.weighted_loss_terms(logits, labels, self.problem_type, class_weights=self.class_weights,
                                           label_smoothing=self.label_smoothing)

    def eval_outputs(self, logits, labels) -> dict[str, jax.Array]:
        return {"loss": problem.per_example_loss(logits, labels, self.problem_type)}

    def metrics(self, logits, labels, thresholds=None) -> dict[str, float]:
        return metrics_lib.compute_metrics(self.problem_type, logits, labels, thresholds=thresholds)


def objective_of(objective: Objective | str, **loss_options) -> Objective:
    """`objective` itself, or the `ProblemObjective` of a problem type's name with `loss_options`
    (class_weights, label_smoothing)."""
    if isinstance(objective, str):
        return ProblemObjective(objective, **loss_options)
    if loss_options:
        raise ValueError(f"loss options {sorted(loss_options)} go with a problem type's name; {objective!r} is "
                         "an objective with its own loss")
    return objective


def _pair_rewards(model, inputs: dict, rngs):
    """(B, 2) rewards `(r_chosen, r_rejected)` of a batch of preference pairs, whose inputs are
    (B, 2, T): both texts of every pair in one forward pass of 2B rows."""
    pairs, _, length = inputs["input_ids"].shape
    # (B, 2, T) -> (2B, T): rows 2b and 2b + 1 are pair b's chosen and rejected text.
    flat = {k: v.reshape(2 * pairs, length) for k, v in inputs.items()}
    logits = model(**flat, rngs=rngs)
    if logits.shape[-1] != 1:
        raise ValueError(f"preference pairs need a reward model with num_labels=1, got num_labels={logits.shape[-1]}; "
                         "load the model with from_pretrained(..., num_labels=1)")
    return logits.reshape(pairs, 2)


__all__ = ["MODEL_INPUTS", "Objective", "ProblemObjective", "model_logits", "objective_of"]
