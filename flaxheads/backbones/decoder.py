"""Decoder LLMs in Flax NNX: Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2 and Gemma3 text
(`transformers.LlamaModel`, ... `Gemma3TextModel`), one module whose differences are the
switches of `decoder_config.Family`.

Every layer: x += attn(norm(x)); x += mlp(norm(x)), with RMSNorm, rotary positions, grouped-
query attention and a gated MLP (act(gate(x)) * up(x) -> down). Gemma's families add (1 + w)
norms and scaled embeddings, Gemma2/3 norms on the sublayer outputs ("sandwich") and
alternating sliding/global layers, Qwen3/Gemma3 RMSNorm on each query and key head.

Attention is computed as transformers' eager attention is (logits in the compute dtype, soft-
capped, masked, softmax in float32), so that parity holds in bfloat16 too. Masks follow
transformers' `masking_utils`: causal, the padding mask on keys, and for sliding layers keys
less than `sliding_window` positions (sequence indices, not position ids) behind the query. A
query that sees no key (left padding) averages all values, as eager attention does; real
tokens never see such rows. As in transformers, position ids default to 0..T-1 whatever the
padding. Packed sequences (position ids restarting inside a row, without attention_mask),
which transformers detects and masks apart, are not detected here: pass `segment_ids` (the
block-diagonal mask and positions restarting per segment, `segments`), or attention_mask.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from flaxheads.backbones import attention, dropout, layers, rope, segments, stacking
from flaxheads.backbones.decoder_config import DecoderConfig
from flaxheads.backbones.interface import BackboneOutput, check_shapes


class RMSNorm(nnx.Module):
    """x / rms(x) in float32, times `scale` (Llama) or (1 + `scale`) (Gemma, `offset=True`).

    Llama casts the normalised x back to the input dtype before the scale, Gemma after it, as
    transformers does; the two differ in bfloat16 only."""

    def __init__(self, features: int, *, eps: float, offset: bool, dtype, param_dtype, rngs: nnx.Rngs):
        init = nnx.initializers.zeros if offset else nnx.initializers.ones
        self.scale = nnx.Param(init(rngs.params(), (features,), param_dtype))
        self.eps, self.offset, self.dtype = eps, offset, dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        if self.offset:
            return (normed * (1.0 + self.scale[...].astype(jnp.float32))).astype(self.dtype)
        return self.scale[...].astype(self.dtype) * normed.astype(self.dtype)


def attention_mask_BTS(mask_BS: jax.Array | None, batch: int, seq: int, sliding_window: int | None) -> jax.Array:
    """(batch, query, key) bool: causal, keys that are real tokens, and for a sliding layer keys
    fewer than `sliding_window` positions back (`kv_idx > q_idx - sliding_window`, masking_utils)."""
    q_T1, k_1S = jnp.arange(seq)[:, None], jnp.arange(seq)[None, :]
    allowed_TS = k_1S <= q_T1
    if sliding_window is not None:
        allowed_TS &= k_1S > q_T1 - sliding_window
    allowed_BTS = jnp.broadcast_to(allowed_TS, (batch, seq, seq))
    if mask_BS is not None:
        allowed_BTS &= mask_BS[:, None, :].astype(bool)
    return allowed_BTS


class LayerInputs(NamedTuple):
    """What every layer needs besides the hidden states, computed once per forward pass."""

    masks: dict[str, jax.Array]
    """"full" or "sliding" -> (batch, query, key) bool mask."""
    rotary: dict[str, tuple[jax.Array, jax.Array]]
    """"global" or "local" (Gemma3's sliding layers) -> (cos, sin) tables."""
    padding_BS: jax.Array | None = None
    """The (batch, key) attention_mask (None with segment ids): what a fused kernel reads."""
    segment_ids_BT: jax.Array | None = None
    """Packed rows' segment ids, for a fused kernel."""


def _linear(cfg: DecoderConfig, d_in: int, d_out: int, use_bias: bool, *, dtype, param_dtype, rngs) -> nnx.Linear:
    return layers.dense(d_in, d_out, init_std=cfg.initializer_range, use_bias=use_bias, dtype=dtype,
                        param_dtype=param_dtype, rngs=rngs)


def _norm(cfg: DecoderConfig, features: int, **kw) -> RMSNorm:
    return RMSNorm(features, eps=cfg.rms_norm_eps, offset=cfg.family.gemma_norms, **kw)


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE, optional q/k norms, soft-capping and a sliding window."""

    def __init__(self, cfg: DecoderConfig, layer: int, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg, self.dtype = cfg, dtype
        # Keys into `LayerInputs`: strings, so that the inputs stay a pytree jax can flatten (remat).
        self.mask_kind = "sliding" if cfg.is_sliding(layer) else "full"
        self.rope_kind = "local" if cfg.uses_local_rope(layer) else "global"
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        d, h = cfg.hidden_size, cfg.head_dim
        self.query = _linear(cfg, d, cfg.num_attention_heads * h, cfg.qkv_bias, **kw)
        self.key = _linear(cfg, d, cfg.num_key_value_heads * h, cfg.qkv_bias, **kw)
        self.value = _linear(cfg, d, cfg.num_key_value_heads * h, cfg.qkv_bias, **kw)
        self.output = _linear(cfg, cfg.num_attention_heads * h, d, cfg.output_bias, **kw)
        if cfg.family.qk_norm:
            self.query_norm = _norm(cfg, h, **kw)
            self.key_norm = _norm(cfg, h, **kw)
        self.deterministic = False
        """Eval mode: no attention dropout. `model.train()` / `model.eval()` set it (see `layers`)."""
        self.padding_side: str | None = None
        """The side the tokenizer pads ("left" for most of these families; `build_backbone` sets the
        family's): with "left" a padding mask takes XLA's path, chosen while tracing
        (`attention.kernel`), not cuDNN's behind a run-time check for right padding."""

    def __call__(self, x_BTD: jax.Array, inputs: LayerInputs, rngs) -> jax.Array:
        cfg = self.cfg
        b, t, _ = x_BTD.shape
        kv_heads, groups = cfg.num_key_value_heads, cfg.num_attention_heads // cfg.num_key_value_heads
        q_BTNH = self.query(x_BTD).reshape(b, t, cfg.num_attention_heads, cfg.head_dim)
        k_BTKH = self.key(x_BTD).reshape(b, t, kv_heads, cfg.head_dim)
        v_BTKH = self.value(x_BTD).reshape(b, t, kv_heads, cfg.head_dim)
        if cfg.family.qk_norm:
            q_BTNH, k_BTKH = self.query_norm(q_BTNH), self.key_norm(k_BTKH)
        cos, sin = inputs.rotary[self.rope_kind]
        q_BTNH, k_BTKH = rope.rotate(q_BTNH, cos, sin), rope.rotate(k_BTKH, cos, sin)
        fused = self._fused(q_BTNH, k_BTKH, v_BTKH, inputs, rngs)
        if fused is not None:
            return self.output(fused.reshape(b, t, cfg.num_attention_heads * cfg.head_dim))
        # Query head n uses key/value head n // groups (transformers' repeat_kv): split N as (K, G).
        q_BTKGH = q_BTNH.reshape(b, t, kv_heads, groups, cfg.head_dim)
        logits_BKGTS = jnp.einsum("BTKGH,BSKH->BKGTS", q_BTKGH, k_BTKH) * jnp.asarray(cfg.attention_scale, self.dtype)
        if cfg.attention_logit_cap is not None:
            cap = jnp.asarray(cfg.attention_logit_cap, self.dtype)
            logits_BKGTS = jnp.tanh(logits_BKGTS / cap) * cap
        mask_B11TS = inputs.masks[self.mask_kind][:, None, None]
        logits_BKGTS = jnp.where(mask_B11TS, logits_BKGTS, jnp.finfo(logits_BKGTS.dtype).min)
        probs_BKGTS = jax.nn.softmax(logits_BKGTS.astype(jnp.float32), axis=-1).astype(self.dtype)
        probs_BKGTS = dropout.apply(probs_BKGTS, cfg.attention_dropout, rngs, deterministic=self.deterministic)
        context_BTKGH = jnp.einsum("BKGTS,BSKH->BTKGH", probs_BKGTS, v_BTKH)
        return self.output(context_BTKGH.reshape(b, t, cfg.num_attention_heads * cfg.head_dim))


    def _fused(self, q_BTNH, k_BTKH, v_BTKH, inputs: LayerInputs, rngs) -> jax.Array | None:
        """The attention on the backend's fused kernel (`attention.kernel`), or None where the
        eager path below runs: XLA's kernel, soft-capped logits (Gemma2), attention dropout. The
        window: keys fewer than `sliding_window` positions back, t - (w - 1) <= s <= t."""
        cfg = self.cfg
        window = cfg.effective_sliding_window - 1 if self.mask_kind == "sliding" else None
        options = dict(segment_ids_BT=inputs.segment_ids_BT, is_causal=True, local_window_size=window,
                       padding_side=self.padding_side)
        dropout_active = dropout.active(cfg.attention_dropout, deterministic=self.deterministic, rngs=rngs)
        if (cfg.attention_logit_cap is not None or attention.kernel(
                q_BTNH, k_BTKH, inputs.padding_BS, dropout_active=dropout_active, **options) == attention.XLA):
            return None
        return attention.attend(q_BTNH, k_BTKH, v_BTKH, inputs.padding_BS, scale=cfg.attention_scale, **options)


class MLP(nnx.Module):
    """down(act(gate(x)) * up(x)): SwiGLU for Llama's families, GeGLU (tanh GELU) for Gemma's."""

    def __init__(self, cfg: DecoderConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        d, inner = cfg.hidden_size, cfg.intermediate_size
        self.gate = _linear(cfg, d, inner, cfg.mlp_bias, **kw)
        self.up = _linear(cfg, d, inner, cfg.mlp_bias, **kw)
        self.down = _linear(cfg, inner, d, cfg.mlp_bias, **kw)
        self.act = layers.activation(cfg.hidden_act)

    def __call__(self, x_BTD: jax.Array) -> jax.Array:
        return self.down(self.act(self.gate(x_BTD)) * self.up(x_BTD))


class DecoderLayer(nnx.Module):
    """Pre-norm block; with sandwich norms (Gemma2/3) the sublayer outputs are normed too."""

    def __init__(self, cfg: DecoderConfig, layer: int, *, dtype, param_dtype, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.sandwich = cfg.family.sandwich_norms
        self.attention_norm = _norm(cfg, cfg.hidden_size, **kw)
        self.attention = Attention(cfg, layer, **kw)
        self.mlp_norm = _norm(cfg, cfg.hidden_size, **kw)
        self.mlp = MLP(cfg, **kw)
        if self.sandwich:
            self.attention_output_norm = _norm(cfg, cfg.hidden_size, **kw)
            self.mlp_output_norm = _norm(cfg, cfg.hidden_size, **kw)

    def __call__(self, x_BTD: jax.Array, inputs: LayerInputs, rngs) -> jax.Array:
        attended = self.attention(self.attention_norm(x_BTD), inputs, rngs)
        x_BTD = x_BTD + (self.attention_output_norm(attended) if self.sandwich else attended)
        transformed = self.mlp(self.mlp_norm(x_BTD))
        return x_BTD + (self.mlp_output_norm(transformed) if self.sandwich else transformed)


class Decoder(nnx.Module):
    """`transformers.LlamaModel` (and Mistral/Qwen2/Qwen3/Gemma/Gemma2/Gemma3 text) in Flax NNX.

    `dtype` is the compute dtype (bfloat16 allowed), `param_dtype` the storage dtype. These
    models have no pooler; `add_pooling_layer` exists for the backbone interface and must be
    False. The only dropout is on attention probabilities (`attention_dropout`, usually 0).
    """

    def __init__(
        self,
        cfg: DecoderConfig,
        *,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        add_pooling_layer: bool = False,
        rngs: nnx.Rngs,
    ):
        if add_pooling_layer:
            raise ValueError(f"{cfg.model_type} has no pooler; build it with add_pooling_layer=False")
        self.cfg, self.dtype = cfg, dtype
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.token_embeddings = layers.embed(cfg.vocab_size, cfg.hidden_size, init_std=cfg.initializer_range, **kw)
        self.layers = nnx.List([DecoderLayer(cfg, i, **kw) for i in range(cfg.num_hidden_layers)])
        self.final_norm = _norm(cfg, cfg.hidden_size, **kw)

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
        """input_ids, attention_mask (1 = real token), position_ids: (batch, seq) ints.

        `segment_ids` (batch, seq) packs several examples per row (`segments`): causal (and
        sliding-window) attention within a segment, attention_mask then not read, and rotary
        positions 0.. from each segment's start.

        `token_type_ids` must be None: these models have no token types (ValueError otherwise).
        hidden_states are transformers' `output_hidden_states`: the (scaled) embeddings, then each
        layer's output, the last one after the final norm. Raises ValueError for inputs that are not
        (batch, seq) and in train mode with attention dropout but no `rngs`.
        """
        self._check_inputs(input_ids, attention_mask, token_type_ids, position_ids)
        batch, seq = input_ids.shape
        if position_ids is None:
            position_ids = (jnp.broadcast_to(jnp.arange(seq), input_ids.shape) if segment_ids is None
                            else segments.positions(segment_ids))
        x_BTD = self.token_embeddings(input_ids)
        if self.cfg.family.gemma_norms:
            x_BTD = x_BTD * jnp.asarray(math.sqrt(self.cfg.hidden_size), self.dtype)
        inputs = self._layer_inputs(attention_mask, position_ids, batch, seq, segment_ids)
        hidden_states = stacking.run_layers(self, self.layers, x_BTD, inputs, rngs=rngs)
        # As transformers: the last entry of hidden_states is the output after the final norm.
        hidden_states[-1] = self.final_norm(hidden_states[-1])
        return BackboneOutput(hidden_states[-1], tuple(hidden_states))

    def _layer_inputs(self, attention_mask, position_ids, batch: int, seq: int, segment_ids=None) -> LayerInputs:
        cfg = self.cfg
        attentions = [layer.attention for layer in self.layers]
        window = cfg.effective_sliding_window
        if segment_ids is not None:
            # Windows count sequence indices, which within a segment are the segment's own distances.
            attention_mask = None
        masks = {kind: attention_mask_BTS(attention_mask, batch, seq, window if kind == "sliding" else None)
                 for kind in {a.mask_kind for a in attentions}}
        if segment_ids is not None:
            masks = {kind: mask_BTS & segments.attention_mask(segment_ids)[:, 0] for kind, mask_BTS in masks.items()}
        ropes = {"global": cfg.rope, "local": cfg.local_rope}
        rotary = {kind: rope.cos_sin(position_ids, ropes[kind], cfg.head_dim, self.dtype)
                  for kind in {a.rope_kind for a in attentions}}
        return LayerInputs(masks, rotary, attention_mask, segment_ids)

    def _check_inputs(self, input_ids, attention_mask, token_type_ids, position_ids) -> None:
        if token_type_ids is not None:
            raise ValueError(f"{self.cfg.model_type} has no token types: pass token_type_ids=None")
        check_shapes(self.cfg, input_ids, attention_mask, position_ids=position_ids)
