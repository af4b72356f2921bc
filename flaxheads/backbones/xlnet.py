"""XLNet (`transformers.XLNetModel`) in Flax NNX: the content stream, as classification uses it.

XLNet differs from BERT in three places that matter here:

- **No position embeddings.** Every layer scores query i against key j with a sinusoidal
  encoding of the *relative* distance i - j, projected by the layer's `r` and biased by
  `r_r_bias`, so shifting a whole sequence (left padding) changes no real token's state.
- **Segments are relative too.** `token_type_ids` are not embedded; each layer adds a score
  for "same segment or not" (`seg_embed`, biased by `r_s_bias`). Without `token_type_ids` there
  is no segment score, as in transformers (the same logits as a single segment: a score equal
  for every key cancels in the softmax). Any ids work; XLNet's tokenizer writes 2 for <cls>.
- **Two streams in pretraining.** The query stream (`mask_emb`, `target_mapping`, `perm_mask`)
  and memories (`mems`) are pretraining and generation machinery. Classification runs the
  content stream only, exactly what `XLNetModel` computes when given none of them; `mask_emb`
  is kept as a parameter so exports stay complete, and is never read.

Padding follows `XLNetModel`'s `attention_mask`: a query attends to every real key and to
itself (its "non-target mask"), so pads see real tokens but real tokens never see pads.

Packed rows (`segment_ids`, see `segments`) need only the block-diagonal mask: the position
scores depend on the distance i - j alone (the sinusoid of the distance, whatever the row's
length), and the token-type score on whether two tokens share a type, so a segment's tokens
score each other as they do when the example runs alone.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from flaxheads.backbones import dropout, layers, segments, stacking
from flaxheads.backbones.interface import BackboneOutput, known_fields, require_multiple, require_sizes

# transformers subtracts this from masked attention scores (float32/bfloat16 models).
_MASKED_SCORE = -1e30


@dataclasses.dataclass(frozen=True)
class XLNetConfig:
    """Architecture of an XLNet, with the field names and defaults of Hugging Face's `XLNetConfig`."""

    model_type: str = "xlnet"
    vocab_size: int = 32000
    d_model: int = 1024
    n_layer: int = 24
    n_head: int = 16
    d_inner: int = 4096
    """Feed-forward width."""
    ff_activation: str = "gelu"
    untie_r: bool = True
    """Kept for the round trip. transformers ignores it: every layer has its own r_w_bias,
    r_r_bias and r_s_bias whatever it says (its TensorFlow converter copies shared biases into
    each layer), and flaxheads does the same."""
    attn_type: str = "bi"
    """Only "bi" (XLNet); "uni" is Transformer-XL's causal attention."""
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    dropout: float = 0.1
    """Every dropout of the backbone: embeddings, positional encoding, attention, feed-forward."""
    mem_len: int | None = 512
    """This and the four fields below only matter with memories; kept for the round trip."""
    reuse_len: int | None = None
    use_mems_eval: bool = True
    use_mems_train: bool = False
    same_length: bool = False
    bi_data: bool = False
    """True is the pretraining input pipeline (batch halves read forwards and backwards); unsupported."""
    clamp_len: int = -1
    """Relative distances beyond +-clamp_len share one encoding; -1: no clamping."""
    summary_type: str = "last"
    """summary_*: the default options of the "summary" head (XLNetSequenceSummary); see heads/summary.py."""
    summary_use_proj: bool = True
    summary_activation: str | None = "tanh"
    """Any activation name; None or "" for none (written as "": transformers 5 refuses None)."""
    summary_proj_to_labels: bool = False
    """Not an `XLNetConfig` field; XLNetSequenceSummary reads it when present (else False)."""
    summary_first_dropout: float = 0.0
    """Not an `XLNetConfig` field; XLNetSequenceSummary reads it when present (else 0)."""
    summary_last_dropout: float = 0.1
    start_n_top: int = 5
    end_n_top: int = 5
    pad_token_id: int | None = 5
    bos_token_id: int | None = 1
    eos_token_id: int | tuple[int, ...] | None = 2
    classifier_dropout: float | None = None
    """Dropout before the classifier of heads other than "summary"; None: `dropout`."""

    def __post_init__(self):
        if self.model_type != "xlnet":
            raise ValueError(f"XLNetConfig serves model_type 'xlnet', not {self.model_type!r}")
        require_sizes(self, "vocab_size", "d_model", "n_layer", "n_head", "d_inner")
        require_multiple(d_model=self.d_model, n_head=self.n_head)
        if self.attn_type != "bi":
            raise NotImplementedError(
                f"attn_type={self.attn_type!r} is not supported; flaxheads' XLNet is bidirectional "
                "(attn_type='bi'), 'uni' is Transformer-XL's causal attention"
            )
        if self.bi_data:
            raise NotImplementedError(
                "bi_data=True is XLNet's pretraining input pipeline (half the batch read backwards); "
                "fine-tuning and classification use bi_data=False: set it in config.json"
            )

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> "XLNetConfig":
        """Reads a Hugging Face `config.json` dict of model_type xlnet; absent fields take
        transformers' defaults."""
        known = known_fields(hf, cls)
        if isinstance(known.get("eos_token_id"), list):  # configs must stay hashable (jit caches on them)
            known["eos_token_id"] = tuple(known["eos_token_id"])
        config = cls(**known)
        d_head = hf.get("d_head")
        if d_head is not None and d_head != config.d_head:
            raise ValueError(f"d_head={d_head} must be d_model // n_head = {config.d_head}, as transformers requires")
        return config

    def to_hf_config(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["d_head"] = self.d_head
        out["summary_activation"] = self.summary_activation or ""
        return out

    @property
    def hidden_size(self) -> int:
        return self.d_model

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layer

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    @property
    def default_classifier_dropout(self) -> float:
        return self.dropout if self.classifier_dropout is None else self.classifier_dropout

    @property
    def max_sequence_length(self) -> None:
        """Relative positions: no learned limit (memory is the limit)."""
        return None

    position_table_size = None
    token_type_vocab_size = None
    """XLNet compares token types (same segment or not) and looks none up: any ids work."""

    @property
    def summary_options(self) -> dict[str, Any]:
        """The "summary" head's options as this config.json sets them (HF names)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name.startswith("summary_")}


def relative_positional_encoding(seq_len: int, d_model: int, clamp_len: int) -> jax.Array:
    """(2 * seq_len, d_model) float32 sin/cos encodings of the relative distances
    seq_len, seq_len - 1, ..., -seq_len + 1 (`XLNetModel.relative_positional_encoding`, "bi")."""
    freq_F = jnp.arange(0, d_model, 2, dtype=jnp.int32).astype(jnp.float32)
    inv_freq_F = 1 / jnp.power(10000.0, freq_F / d_model)
    distance_P = jnp.arange(seq_len, -seq_len, -1, dtype=jnp.int32).astype(jnp.float32)
    if clamp_len > 0:
        distance_P = jnp.clip(distance_P, -clamp_len, clamp_len)
    sinusoid_PF = distance_P[:, None] * inv_freq_F
    return jnp.concatenate([jnp.sin(sinusoid_PF), jnp.cos(sinusoid_PF)], axis=-1)


def relative_shift(scores_BNTP: jax.Array, key_len: int) -> jax.Array:
    """Position scores by relative distance -> by key: out[..., i, j] = scores[..., i, j + T - i],
    the score of query i for distance i - j (`rel_shift_bnij`: two reshapes and a slice, no gather)."""
    b, n, t, p = scores_BNTP.shape
    # Read the (T, P) block as (P, T), drop the first row, read it back as (T, P - 1): row i is
    # now shifted left by T - i.
    shifted = scores_BNTP.reshape(b, n, p, t)[:, :, 1:, :].reshape(b, n, t, p - 1)
    return shifted[..., :key_len]


def _param(shape, *, std: float, param_dtype, rngs: nnx.Rngs) -> nnx.Param:
    return nnx.Param(nnx.initializers.normal(std)(rngs.params(), shape, param_dtype))


class RelativeAttention(nnx.Module):
    """`XLNetRelativeAttention`, content stream: (content + position + segment) scores -> softmax
    -> values -> `o` -> dropout -> residual -> LayerNorm."""

    def __init__(self, cfg: XLNetConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg, self.dtype = cfg, dtype
        d, n, h, std = cfg.d_model, cfg.n_head, cfg.d_head, cfg.initializer_range

        def projection(einsum_str: str) -> nnx.Einsum:
            # Kernels keep transformers' (d_model, n_head, d_head) layout: conversion is the identity.
            return nnx.Einsum(
                einsum_str, (d, n, h), dtype=dtype, param_dtype=param_dtype,
                kernel_init=nnx.initializers.normal(std), rngs=rngs,
            )

        self.q = projection("BTD,DNH->BTNH")
        self.k = projection("BSD,DNH->BSNH")
        self.v = projection("BSD,DNH->BSNH")
        self.r = projection("BPD,DNH->BPNH")
        self.o = projection("BTNH,DNH->BTD")
        kw = dict(std=std, param_dtype=param_dtype, rngs=rngs)
        self.r_w_bias = _param((n, h), **kw)
        """Content bias (u in the paper), added to queries scoring keys."""
        self.r_r_bias = _param((n, h), **kw)
        """Position bias (v), added to queries scoring relative distances."""
        self.r_s_bias = _param((n, h), **kw)
        """Segment bias, added to queries scoring same/different segment."""
        self.seg_embed = _param((2, n, h), **kw)
        """[same segment, different segment] embeddings."""
        self.layer_norm = layers.layer_norm(d, eps=cfg.layer_norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.deterministic = False
        """Eval mode: no dropout. `model.train()` / `model.eval()` set it (see `layers`)."""

    def _bias(self, param: nnx.Param) -> jax.Array:
        return param[...].astype(self.dtype)

    def __call__(self, h_BTD, positions_BPD, other_segment_BTS, allowed_BTS, rngs) -> jax.Array:
        def drop(y):
            return dropout.apply(y, self.cfg.dropout, rngs, deterministic=self.deterministic)

        q_BTNH = self.q(h_BTD)
        k_BSNH, v_BSNH = self.k(h_BTD), self.v(h_BTD)
        k_r_BPNH = self.r(positions_BPD)

        content_BNTS = jnp.einsum("BTNH,BSNH->BNTS", q_BTNH + self._bias(self.r_w_bias), k_BSNH)
        position_BNTP = jnp.einsum("BTNH,BPNH->BNTP", q_BTNH + self._bias(self.r_r_bias), k_r_BPNH)
        scores_BNTS = content_BNTS + relative_shift(position_BNTP, key_len=k_BSNH.shape[1])
        if other_segment_BTS is not None:
            segment_BTNK = jnp.einsum("BTNH,KNH->BTNK", q_BTNH + self._bias(self.r_s_bias), self._bias(self.seg_embed))
            segment_BNTK = segment_BTNK.transpose(0, 2, 1, 3)
            # Selecting by the one-hot same/different flag is what transformers' einsum over it computes.
            scores_BNTS = scores_BNTS + jnp.where(
                other_segment_BTS[:, None], segment_BNTK[..., 1:], segment_BNTK[..., :1]
            )
        scores_BNTS = scores_BNTS * (1 / math.sqrt(self.cfg.d_head))

        scores_BNTS = scores_BNTS.astype(jnp.float32)
        if allowed_BTS is not None:
            scores_BNTS = jnp.where(allowed_BTS[:, None], scores_BNTS, _MASKED_SCORE)
        probs_BNTS = jax.nn.softmax(scores_BNTS, axis=-1).astype(v_BSNH.dtype)
        context_BTNH = jnp.einsum("BNTS,BSNH->BTNH", drop(probs_BNTS), v_BSNH)
        out_BTD = drop(self.o(context_BTNH))
        return self.layer_norm(out_BTD + h_BTD)


class FeedForward(nnx.Module):
    """`XLNetFeedForward`: LN(x + dropout(layer_2(dropout(act(layer_1(x))))))."""

    def __init__(self, cfg: XLNetConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        kw = dict(init_std=cfg.initializer_range, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.layer_1 = layers.dense(cfg.d_model, cfg.d_inner, **kw)
        self.layer_2 = layers.dense(cfg.d_inner, cfg.d_model, **kw)
        self.layer_norm = layers.layer_norm(
            cfg.d_model, eps=cfg.layer_norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )
        self.act = layers.activation(cfg.ff_activation)
        self.deterministic = False

    def __call__(self, x_BTD, rngs) -> jax.Array:
        def drop(y):
            return dropout.apply(y, self.cfg.dropout, rngs, deterministic=self.deterministic)

        hidden = drop(self.act(self.layer_1(x_BTD)))
        return self.layer_norm(drop(self.layer_2(hidden)) + x_BTD)


class XLNetLayer(nnx.Module):
    def __init__(self, cfg: XLNetConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.attention = RelativeAttention(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.ff = FeedForward(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, h_BTD, positions_BPD, other_segment_BTS, allowed_BTS, rngs) -> jax.Array:
        return self.ff(self.attention(h_BTD, positions_BPD, other_segment_BTS, allowed_BTS, rngs), rngs)


class XLNet(nnx.Module):
    """XLNet (`transformers.XLNetModel` without mems, perm_mask or target_mapping) in Flax NNX.

    `dtype` is the compute dtype (bfloat16 allowed), `param_dtype` the storage dtype. XLNet has
    no pooler; `add_pooling_layer` exists for the common backbone signature and must be False.
    Built in train mode (dropout on, `rngs` needed at call time); `.eval()` turns dropout off.
    """

    def __init__(
        self,
        cfg: XLNetConfig,
        *,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        add_pooling_layer: bool = False,
        rngs: nnx.Rngs,
    ):
        if add_pooling_layer:
            raise ValueError("XLNet has no pooler; build it with add_pooling_layer=False")
        self.cfg, self.dtype = cfg, dtype
        std = cfg.initializer_range
        self.word_embedding = layers.embed(
            cfg.vocab_size, cfg.d_model, init_std=std, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )
        # The query stream's input (pretraining only): loaded and saved, never read here.
        self.mask_emb = _param((1, 1, cfg.d_model), std=std, param_dtype=param_dtype, rngs=rngs)
        self.layers = nnx.List(
            [XLNetLayer(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs) for _ in range(cfg.n_layer)]
        )
        self.deterministic = False

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        position_ids: jax.Array | None = None,
        *,
        segment_ids: jax.Array | None = None,
        rngs: nnx.Rngs | None = None,
    ) -> BackboneOutput:
        """input_ids, attention_mask (1 = real token), token_type_ids: (batch, seq) ints.

        `segment_ids` (batch, seq) packs several examples per row: attention within a segment
        (attention_mask is then not read); see the module doc for why nothing else changes.

        `hidden_states` are the embeddings' output, then every layer's; the last one has the
        final dropout applied (transformers' `last_hidden_state`). `rngs` (an `nnx.Rngs` with a
        `dropout` stream) draws the dropout masks in train mode; eval mode ignores it. ValueError
        for position_ids (XLNet's positions are relative and cannot be set), and in train mode
        without `rngs` (non-zero dropout rates).
        """
        if position_ids is not None:
            raise ValueError(
                "XLNet has no position ids: its attention uses relative distances only; pass position_ids=None"
            )

        def drop(y):
            return dropout.apply(y, self.cfg.dropout, rngs, deterministic=self.deterministic)

        seq_len = input_ids.shape[1]
        h_BTD = drop(self.word_embedding(input_ids))
        positions_PD = relative_positional_encoding(seq_len, self.cfg.d_model, self.cfg.clamp_len)
        # One copy per example, as transformers expands it before dropout: each example gets its own mask.
        positions_BPD = jnp.broadcast_to(positions_PD.astype(self.dtype), (input_ids.shape[0], *positions_PD.shape))
        positions_BPD = drop(positions_BPD)
        other_segment_BTS = (
            None if token_type_ids is None else token_type_ids[:, :, None] != token_type_ids[:, None, :]
        )
        allowed_BTS = None
        if segment_ids is not None:
            allowed_BTS = segments.attention_mask(segment_ids)[:, 0]
        elif attention_mask is not None:
            # transformers' non-target mask for the content stream: real keys, and always oneself.
            allowed_BTS = (attention_mask != 0)[:, None, :] | jnp.eye(seq_len, dtype=bool)[None]

        hidden_states = stacking.run_layers(self, self.layers, h_BTD, positions_BPD, other_segment_BTS, allowed_BTS,
                                          rngs=rngs)
        hidden_states[-1] = drop(hidden_states[-1])
        return BackboneOutput(hidden_states[-1], tuple(hidden_states))
