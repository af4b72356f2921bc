"""Token classification's objective: what the train and eval steps compute for its batches."""

from __future__ import annotations

import dataclasses

import jax

from flaxheads.tasks.token.model import token_loss_terms
from flaxheads.training.objective import model_logits

METRIC_NAMES = ("f1", "precision", "recall", "accuracy", "macro_f1", "macro_precision", "macro_recall")
"""Entity-level micro averages, and macro ones, with word accuracy (`entity_metrics.entity_report`,
seqeval's numbers)."""


@dataclasses.dataclass(frozen=True)
class TokenObjective:
    """A tag per token: (B, T, C) logits, labels (B, T) with -100 where a token is not scored; the
    loss is the mean cross entropy over the scored tokens of the real examples of a whole global
    batch (`token_loss_terms`, which `TokenClassifier.loss` takes too). Its metrics are the
    scorer's, at the word level (`token_scoring.TokenSplitScorer`)."""

    metric_names = METRIC_NAMES

    def logits(self, model, batch: dict, rngs) -> jax.Array:
        return model_logits(model, batch, rngs)

    def loss_terms(self, logits, labels):
        return token_loss_terms(logits, labels)

    def eval_outputs(self, logits, labels) -> dict[str, jax.Array]:
        losses, scored = token_loss_terms(logits, labels)
        return {"loss": losses, "scored_tokens": scored}

    def metrics(self, logits, labels, thresholds=None) -> dict[str, float]:
        raise NotImplementedError("token classification is scored at the word level: token_scoring.TokenSplitScorer")


OBJECTIVE = TokenObjective()


__all__ = ["METRIC_NAMES", "OBJECTIVE", "TokenObjective"]
