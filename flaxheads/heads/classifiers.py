"""The encoder-family heads: BERT's pooler head, RoBERTa's head, DistilBERT's head, DeBERTa's head,
ModernBERT's head, and pooled-feature linear heads."""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from flaxheads.backbones import dropout, layers
from flaxheads.heads import pooling
from flaxheads.heads.base import HeadConfig, HeadInputs


class FirstTokenReader:
    """A head that reads the last layer at the first token only (`pooling.first_token`): a model
    may run that layer at those positions alone (`SequenceClassifier`)."""

    def last_layer_positions(self, inputs: HeadInputs) -> jax.Array | None:
        """(batch, P) positions of the last layer this head reads; None: all of them."""
        return pooling.first_token_positions(inputs)


class PoolReader:
    """A head that pools with `self.pool`: the last-layer positions are those the pooling reads."""

    def last_layer_positions(self, inputs: HeadInputs) -> jax.Array | None:
        """(batch, P) positions of the last layer this head reads; None: all of them."""
        return pooling.positions_read(self.pool, inputs)


class PoolerHead(FirstTokenReader, nnx.Module):
    """`BertForSequenceClassification`: pooler (dense + tanh on the first token) -> dropout -> classifier."""

    OUTPUT_LAYER = "classifier"
    """The Linear that gives the logits (calibration folds a temperature into it)."""

    def __init__(self, cfg: HeadConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        kw = dict(init_std=cfg.init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.pooler = layers.Pooler(cfg.hidden_size, **kw)
        self.classifier = layers.dense(cfg.hidden_size, cfg.num_labels, **kw)
        self.deterministic = False
        """Eval mode: no dropout. `model.train()` / `model.eval()` set it (see `backbones.dropout`)."""

    def __call__(self, inputs: HeadInputs, rngs: nnx.Rngs | None = None) -> jax.Array:
        pooled = self.pooler.project(pooling.first_token(inputs))
        return self.classifier(dropout.apply(pooled, self.cfg.dropout_rate, rngs, deterministic=self.deterministic))


class RobertaHead(FirstTokenReader, nnx.Module):
    """`RobertaClassificationHead`: first token -> dropout -> dense -> tanh -> dropout -> out_proj.

    `activation` replaces the tanh: ELECTRA's `ElectraClassificationHead` is this head with GELU."""

    OUTPUT_LAYER = "out_proj"
    """The Linear that gives the logits (calibration folds a temperature into it)."""

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
            return dropout.apply(y, self.cfg.dropout_rate, rngs, deterministic=self.deterministic)

        x = self.activation(self.dense(drop(pooling.first_token(inputs))))
        return self.out_proj(drop(x))


class DistilBertHead(FirstTokenReader, nnx.Module):
    """`DistilBertForSequenceClassification`: first token -> pre_classifier -> ReLU -> dropout -> classifier."""

    OUTPUT_LAYER = "classifier"
    """The Linear that gives the logits (calibration folds a temperature into it)."""

    def __init__(self, cfg: HeadConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        kw = dict(init_std=cfg.init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.pre_classifier = layers.dense(cfg.hidden_size, cfg.hidden_size, **kw)
        self.classifier = layers.dense(cfg.hidden_size, cfg.num_labels, **kw)
        self.deterministic = False

    def __call__(self, inputs: HeadInputs, rngs: nnx.Rngs | None = None) -> jax.Array:
        x = jax.nn.relu(self.pre_classifier(pooling.first_token(inputs)))
        return self.classifier(dropout.apply(x, self.cfg.dropout_rate, rngs, deterministic=self.deterministic))


class DebertaHead(FirstTokenReader, nnx.Module):
    """`DebertaV2ForSequenceClassification`: `ContextPooler` (first token -> dropout at the
    `pooler_dropout` option -> dense -> the `pooler_hidden_act` option) -> dropout -> classifier.

    The options default to `DebertaV2Config`'s (0.0, "gelu"); on a DeBERTa backbone they come
    from its config.json (`DebertaV2Config.deberta_options`)."""

    OUTPUT_LAYER = "classifier"
    """The Linear that gives the logits (calibration folds a temperature into it)."""

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
            return dropout.apply(y, rate, rngs, deterministic=self.deterministic)

        pooled = self.activation(self.dense(drop(pooling.first_token(inputs), self.pooler_dropout)))
        return self.classifier(drop(pooled, self.cfg.dropout_rate))


class LinearHead(PoolReader, nnx.Module):
    """pool(hidden states) -> dropout -> classifier, for a pooling function of `heads.pooling`."""

    OUTPUT_LAYER = "classifier"
    """The Linear that gives the logits (calibration folds a temperature into it)."""

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
        return self.classifier(dropout.apply(pooled, self.cfg.dropout_rate, rngs, deterministic=self.deterministic))


class AttentionPoolHead(nnx.Module):
    """Learned attention pooling: one query vector scores every real token of the last layer,
    softmax over the real tokens (each packed example's alone) -> weighted mean -> dropout ->
    classifier. The query is a bias-free (hidden -> 1) Linear, so the export stores it as
    `query.weight` like any head Linear; it starts at normal(init_std), scores near 0, so the
    head starts close to mean pooling."""

    OUTPUT_LAYER = "classifier"
    """The Linear that gives the logits (calibration folds a temperature into it)."""

    def __init__(self, cfg: HeadConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        kw = dict(init_std=cfg.init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.query = layers.dense(cfg.hidden_size, 1, use_bias=False, **kw)
        self.classifier = layers.dense(cfg.hidden_size, cfg.num_labels, **kw)
        self.deterministic = False

    def __call__(self, inputs: HeadInputs, rngs: nnx.Rngs | None = None) -> jax.Array:
        scores_BT = self.query(inputs.hidden_states[-1])[..., 0]
        pooled = pooling.attention_pool(inputs, scores_BT)
        return self.classifier(dropout.apply(pooled, self.cfg.dropout_rate, rngs, deterministic=self.deterministic))


def electra_head(cfg: HeadConfig, **kw) -> RobertaHead:
    """`ElectraClassificationHead`: RoBERTa's head with GELU whatever the backbone's hidden_act
    (transformers' head hard-codes it)."""
    return RobertaHead(cfg, activation=layers.activation("gelu"), **kw)


def cls_head(cfg: HeadConfig, **kw) -> LinearHead:
    """First token -> dropout -> linear (the BERT paper's classifier)."""
    return LinearHead(cfg, pooling.first_token, cfg.hidden_size, **kw)


def mean_head(cfg: HeadConfig, **kw) -> LinearHead:
    """Mean over the real tokens (attention mask) -> dropout -> linear."""
    return LinearHead(cfg, pooling.masked_mean, cfg.hidden_size, **kw)


def mean_max_head(cfg: HeadConfig, **kw) -> LinearHead:
    """Mean and max over the real tokens, concatenated -> dropout -> linear."""
    return LinearHead(cfg, pooling.mean_max, 2 * cfg.hidden_size, **kw)


def concat_last4_head(cfg: HeadConfig, **kw) -> LinearHead:
    """The first token of the last 4 layers, concatenated -> dropout -> linear; ValueError for a
    backbone of fewer than 4 layers."""
    if cfg.num_hidden_layers < 4:
        raise ValueError(
            f'head "concat_last4" needs at least 4 layers; the backbone has {cfg.num_hidden_layers}: choose '
            'another head, e.g. head="cls"'
        )
    return LinearHead(cfg, pooling.concat_last4_first_token, 4 * cfg.hidden_size, **kw)

MODERNBERT_DEFAULTS: dict[str, Any] = {
    "classifier_pooling": "cls",
    "classifier_activation": "gelu",
    "classifier_bias": False,
    "norm_bias": False,
    "norm_eps": 1e-5,
}
"""The "modernbert" head's options (transformers' `ModernBertConfig` names and defaults). On a
ModernBERT backbone config.json sets them; on any other backbone these defaults apply."""


MODERNBERT_POOLING: dict[str, Callable[[HeadInputs], jax.Array]] = {
    "cls": pooling.first_token,  # position 0 whatever the padding, as transformers
    "mean": pooling.masked_mean,
}


def modernbert_options(cfg: HeadConfig) -> dict[str, Any]:
    """The "modernbert" head's options, defaults filled in; ValueError for unknown keys or values."""
    given = dict(cfg.options)
    unknown = sorted(set(given) - set(MODERNBERT_DEFAULTS))
    if unknown:
        raise ValueError(f'head "modernbert" has no option(s) {unknown}; its options are {sorted(MODERNBERT_DEFAULTS)}')
    options = {**MODERNBERT_DEFAULTS, **given}
    if options["classifier_pooling"] not in MODERNBERT_POOLING:
        raise ValueError(f"classifier_pooling={options['classifier_pooling']!r}; choose one of {sorted(MODERNBERT_POOLING)}")
    layers.activation(options["classifier_activation"])  # ValueError naming the supported ones
    return options


class ModernBertHead(PoolReader, nnx.Module):
    """`ModernBertForSequenceClassification`'s head: pool (classifier_pooling "cls": the first
    token; "mean": the mean over real tokens) -> `ModernBertPredictionHead` (dense, bias only with
    classifier_bias -> classifier_activation -> LayerNorm(norm_eps, bias only with norm_bias))
    -> dropout -> classifier. New parameters start as transformers initialises them: dense
    ~ normal(init_std / sqrt(2 * layers)), classifier ~ normal(hidden_size ** -0.5) (untruncated).

    `pool` replaces classifier_pooling's choice (ModernBERT's token and multiple-choice heads)."""

    OUTPUT_LAYER = "classifier"
    """The Linear that gives the logits (calibration folds a temperature into it)."""

    def __init__(
        self,
        cfg: HeadConfig,
        *,
        pool: Callable[[HeadInputs], jax.Array] | None = None,
        dtype,
        param_dtype,
        rngs: nnx.Rngs,
    ):
        self.cfg = cfg
        options = modernbert_options(cfg)
        self.pool = pool or MODERNBERT_POOLING[options["classifier_pooling"]]
        self.act = layers.activation(options["classifier_activation"])
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        d = cfg.hidden_size
        self.dense = layers.dense(d, d, use_bias=options["classifier_bias"],
                                  init_std=cfg.init_std / math.sqrt(2.0 * cfg.num_hidden_layers), **kw)
        self.norm = layers.layer_norm(d, eps=options["norm_eps"], use_bias=options["norm_bias"], **kw)
        self.classifier = layers.dense(d, cfg.num_labels, init_std=d ** -0.5, **kw)
        self.deterministic = False

    def __call__(self, inputs: HeadInputs, rngs: nnx.Rngs | None = None) -> jax.Array:
        x = self.norm(self.act(self.dense(self.pool(inputs))))
        return self.classifier(dropout.apply(x, self.cfg.dropout_rate, rngs, deterministic=self.deterministic))


MODERNBERT_CHOICE_POOLING: dict[str, Callable[[HeadInputs], jax.Array]] = {
    "cls": pooling.first_real_token,  # attention_mask.argmax(-1) in transformers: left padding included
    "mean": pooling.masked_mean,
}


def modernbert_choice_head(cfg: HeadConfig, **kw) -> ModernBertHead:
    """`ModernBertForMultipleChoice`'s head: the "modernbert" head, except that classifier_pooling
    "cls" reads each choice's first real token, not position 0 (the two differ on left padding)."""
    return ModernBertHead(cfg, pool=MODERNBERT_CHOICE_POOLING[modernbert_options(cfg)["classifier_pooling"]], **kw)
