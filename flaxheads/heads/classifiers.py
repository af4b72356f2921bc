"""The encoder-family heads: BERT's pooler head, RoBERTa's head, DistilBERT's head, DeBERTa's
head, and pooled-feature linear heads."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from flaxheads.backbones import layers
from flaxheads.heads import pooling
from flaxheads.heads.base import HeadConfig, HeadInputs


class PoolerHead(nnx.Module):
    """`BertForSequenceClassification`: pooler (dense + tanh on the first token) -> dropout -> classifier."""

    def __init__(self, cfg: HeadConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        kw = dict(init_std=cfg.init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.pooler = layers.Pooler(cfg.hidden_size, **kw)
        self.classifier = layers.dense(cfg.hidden_size, cfg.num_labels, **kw)
        self.deterministic = False
        """Eval mode: no dropout. `model.train()` / `model.eval()` set it (see `backbones.layers`)."""

    def __call__(self, inputs: HeadInputs, rngs: nnx.Rngs | None = None) -> jax.Array:
        pooled = self.pooler(inputs.hidden_states[-1])
        return self.classifier(layers.dropout(pooled, self.cfg.dropout_rate, rngs, deterministic=self.deterministic))


class RobertaHead(nnx.Module):
    """`RobertaClassificationHead`: first token -> dropout -> dense -> tanh -> dropout -> out_proj.

    `activation` replaces the tanh: ELECTRA's `ElectraClassificationHead` is this head with GELU."""

    def __init__(
        self,
        cfg: HeadConfig,
        *,
        activation: Callable[[jax.Array], jax.Array] = jnp.tanh,
        dtype,
        param_dtype,
        rngs: nnx.Rngs,
    ):
        self.cfg = cfg
        self.activation = activation
        kw = dict(init_std=cfg.init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.dense = layers.dense(cfg.hidden_size, cfg.hidden_size, **kw)
        self.out_proj = layers.dense(cfg.hidden_size, cfg.num_labels, **kw)
        self.deterministic = False

    def __call__(self, inputs: HeadInputs, rngs: nnx.Rngs | None = None) -> jax.Array:
        def drop(y):
            return layers.dropout(y, self.cfg.dropout_rate, rngs, deterministic=self.deterministic)

        x = self.activation(self.dense(drop(pooling.first_token(inputs))))
        return self.out_proj(drop(x))


class DistilBertHead(nnx.Module):
    """`DistilBertForSequenceClassification`: first token -> pre_classifier -> ReLU -> dropout -> classifier."""

    def __init__(self, cfg: HeadConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        kw = dict(init_std=cfg.init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.pre_classifier = layers.dense(cfg.hidden_size, cfg.hidden_size, **kw)
        self.classifier = layers.dense(cfg.hidden_size, cfg.num_labels, **kw)
        self.deterministic = False

    def __call__(self, inputs: HeadInputs, rngs: nnx.Rngs | None = None) -> jax.Array:
        x = jax.nn.relu(self.pre_classifier(pooling.first_token(inputs)))
        return self.classifier(layers.dropout(x, self.cfg.dropout_rate, rngs, deterministic=self.deterministic))


class DebertaHead(nnx.Module):
    """`DebertaV2ForSequenceClassification`: `ContextPooler` (first token -> dropout at the
    `pooler_dropout` option -> dense -> the `pooler_hidden_act` option) -> dropout -> classifier.

    The options default to `DebertaV2Config`'s (0.0, "gelu"); on a DeBERTa backbone they come
    from its config.json (`DebertaV2Config.deberta_options`)."""

    def __init__(self, cfg: HeadConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        self.pooler_dropout = cfg.option("pooler_dropout", 0.0)
        self.activation = layers.activation(cfg.option("pooler_hidden_act", "gelu"))
        kw = dict(init_std=cfg.init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.dense = layers.dense(cfg.hidden_size, cfg.hidden_size, **kw)
        self.classifier = layers.dense(cfg.hidden_size, cfg.num_labels, **kw)
        self.deterministic = False

    def __call__(self, inputs: HeadInputs, rngs: nnx.Rngs | None = None) -> jax.Array:
        def drop(y, rate):
            return layers.dropout(y, rate, rngs, deterministic=self.deterministic)

        pooled = self.activation(self.dense(drop(pooling.first_token(inputs), self.pooler_dropout)))
        return self.classifier(drop(pooled, self.cfg.dropout_rate))


class LinearHead(nnx.Module):
    """pool(hidden states) -> dropout -> classifier, for a pooling function of `heads.pooling`."""

    def __init__(
        self,
        cfg: HeadConfig,
        pool: Callable[[HeadInputs], jax.Array],
        features: int,
        *,
        dtype,
        param_dtype,
        rngs: nnx.Rngs,
    ):
        self.cfg = cfg
        self.pool = pool
        self.classifier = layers.dense(
            features, cfg.num_labels, init_std=cfg.init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )
        self.deterministic = False

    def __call__(self, inputs: HeadInputs, rngs: nnx.Rngs | None = None) -> jax.Array:
        pooled = self.pool(inputs)
        return self.classifier(layers.dropout(pooled, self.cfg.dropout_rate, rngs, deterministic=self.deterministic))
