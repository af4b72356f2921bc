"""Token-classification heads: one row of logits per token, as transformers' `*ForTokenClassification`.

| name         | computation (on every token's last-layer state)                               | reference |
|--------------|--------------------------------------------------------------------------------|-----------|
| `linear`     | dropout -> classifier (bias unless the `token_classification_bias` option is False) | `BertForTokenClassification`, `GenericForTokenClassification` (Llama, ...) |
| `modernbert` | `ModernBertPredictionHead` (dense -> act -> LayerNorm) -> dropout -> classifier | `ModernBertForTokenClassification` |

Both return (batch, seq, num_labels); padding positions get logits too, as in transformers (the
loss ignores them through labels of -100).
"""

from __future__ import annotations

import jax
from flax import nnx

from flaxheads.backbones import dropout, layers
from flaxheads.heads.base import HeadConfig, HeadInputs
from flaxheads.heads.classifiers import ModernBertHead


def every_token(inputs: HeadInputs) -> jax.Array:
    """(batch, seq, hidden): the last layer's state of every token, padding included."""
    return inputs.hidden_states[-1]


class TokenHead(nnx.Module):
    """Every token's state -> dropout -> `classifier` (the `linear` token head)."""

    OUTPUT_LAYER = "classifier"
    """The Linear that gives the logits (calibration folds a temperature into it)."""

    def __init__(self, cfg: HeadConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        self.classifier = layers.dense(
            cfg.hidden_size, cfg.num_labels, init_std=cfg.init_std,
            use_bias=cfg.option("token_classification_bias", True), dtype=dtype, param_dtype=param_dtype, rngs=rngs,
        )
        self.deterministic = False
        """Eval mode: no dropout. `model.train()` / `model.eval()` set it (see `backbones.dropout`)."""

    def __call__(self, inputs: HeadInputs, rngs: nnx.Rngs | None = None) -> jax.Array:
        hidden_BTD = dropout.apply(every_token(inputs), self.cfg.dropout_rate, rngs, deterministic=self.deterministic)
        return self.classifier(hidden_BTD)


def modernbert_token_head(cfg: HeadConfig, **kw) -> ModernBertHead:
    """`ModernBertForTokenClassification`: the "modernbert" head on every token (its
    classifier_pooling is not read)."""
    return ModernBertHead(cfg, pool=every_token, **kw)
