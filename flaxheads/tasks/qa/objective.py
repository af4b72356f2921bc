"""Question answering's objective: what the train and eval steps compute for its batches."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from flaxheads.tasks.qa.model import span_loss_terms
from flaxheads.training.objective import MODEL_INPUTS

METRIC_NAMES = ("exact_match", "f1")
"""SQuAD v1.1's metrics (percentages, as `evaluate`'s squad metric reports them)."""
METRIC_NAMES_V2 = ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_exact", "best_f1")
"""SQuAD v2.0's (`version_2_with_negative`): over every question, the answerable and the
unanswerable ones apart, and at the best null-score threshold."""


@dataclasses.dataclass(frozen=True)
class SpanObjective:
    """A span head's rows (a question and a window of its context): (B, T, 2) logits, the start and
    end logits of each token stacked; labels (B, 2), the gold start and end token (the <cls> index
    when the window holds no answer, run_qa.py's labels). The loss is transformers' mean of the
    start and end cross entropies (`model.span_loss_terms`, which `QuestionAnswering.loss` reduces
    the same way); the metrics are the scorer's, over whole examples after post-processing
    (`scoring.SpanSplitScorer`)."""

    version_2_with_negative: bool = False

    @property
    def metric_names(self) -> tuple[str, ...]:
        return METRIC_NAMES_V2 if self.version_2_with_negative else METRIC_NAMES

    def logits(self, model, batch: dict, rngs) -> jax.Array:
        out = model(**{k: batch[k] for k in MODEL_INPUTS if k in batch}, rngs=rngs)
        return jnp.stack([out.start_logits, out.end_logits], axis=-1)

    def loss_terms(self, logits, labels):
        return span_loss_terms(logits[..., 0], logits[..., 1], labels[:, 0], labels[:, 1])

    def eval_outputs(self, logits, labels) -> dict[str, jax.Array]:
        numerators, denominators = self.loss_terms(logits, labels)
        return {"loss": numerators, "scored_positions": denominators}

    def metrics(self, logits, labels, thresholds=None) -> dict[str, float]:
        raise NotImplementedError("question answering is scored over whole examples: qa.scoring.SpanSplitScorer")


__all__ = ["METRIC_NAMES", "METRIC_NAMES_V2", "SpanObjective"]
