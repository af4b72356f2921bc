"""Multiple choice's objective: what the train and eval steps compute for its batches."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from flaxheads.tasks.choice.model import choice_loss_terms
from flaxheads.training import metrics as metrics_lib
from flaxheads.training.objective import MODEL_INPUTS


@dataclasses.dataclass(frozen=True)
class ChoiceObjective:
    """Inputs (B, C, T), one score per choice (B, C) (the model reads its choices itself), labels
    the right choices' indices; the loss is the cross entropy over the choices
    (`choice_loss_terms`, which `MultipleChoice.loss` takes too), the metric accuracy: the share
    of examples whose highest-scored choice is the right one (run_swag.py's)."""

    metric_names = ("accuracy",)

    def logits(self, model, batch: dict, rngs) -> jax.Array:
        return model(**{k: batch[k] for k in MODEL_INPUTS if k in batch}, rngs=rngs)

    def loss_terms(self, logits, labels):
        return choice_loss_terms(logits, labels)

    def eval_outputs(self, logits, labels) -> dict[str, jax.Array]:
        return {"loss": choice_loss_terms(logits, labels)[0]}

    def metrics(self, logits, labels, thresholds=None) -> dict[str, float]:
        return metrics_lib.masked_metrics(_accuracy, logits, labels)


def _accuracy(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    if logits.ndim != 2:
        raise ValueError(f"multiple-choice logits must be (N, num_choices); got shape {logits.shape}.")
    return {"accuracy": float(np.mean(logits.argmax(axis=-1) == labels.reshape(-1)))}


OBJECTIVE = ChoiceObjective()


__all__ = ["OBJECTIVE", "ChoiceObjective"]
