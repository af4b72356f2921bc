"""ModernBERT (`transformers.ModernBertModel`) in Flax NNX.

A pre-LayerNorm encoder that differs from BERT in every block, so it has its own modules:

- **Embeddings**: token embeddings -> LayerNorm -> dropout; no positions, no token types.
- **Rotary positions** (`rope.py`, shared with the decoders) with one theta for global layers (`global_rope_theta`) and
  another for sliding-window layers (`local_rope_theta`); positions are 0..T-1 whatever the padding.
- **Alternating attention**: layer i is global when i % global_attn_every_n_layers == 0 (config.json's
  `layer_types` when it lists them), else a query sees the keys at most local_attention // 2
  positions away on either side (transformers' `create_bidirectional_sliding_window_mask`),
  as well as the padding mask in both cases.
- **GeGLU MLP**: `Wi` projects to 2 * intermediate_size; act(first half) * second half -> `Wo`.
- **No biases** unless `attention_bias`, `mlp_bias`, `norm_bias` say so; layer 0 has no
  attention LayerNorm (transformers' Identity); a final LayerNorm follows the last layer.

`hidden_states` is the embeddings' output, then every layer's, the last one after the final
norm, as transformers' `output_hidden_states` (it overwrites the last with `last_hidden_state`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from flaxheads.backbones import attention, dropout, layers, rope, segments, stacking
from flaxheads.backbones.interface import BackboneOutput, known_fields, require_multiple, require_sizes

GLOBAL, SLIDING = "full_attention", "sliding_attention"
"""transformers' `layer_types` names."""
HEAD_OPTION_FIELDS = ("classifier_pooling", "classifier_activation", "classifier_bias", "norm_bias", "norm_eps")
"""The config.json fields `ModernBertForSequenceClassification`'s head reads: the "modernbert"
head's options (see `heads/classifiers.py`), defaulted from and written back to this config."""


@dataclasses.dataclass(frozen=True)
class ModernBertConfig:
    """Architecture of a ModernBERT, with the field names and defaults of transformers' `ModernBertConfig`."""

    model_type: str = "modernbert"
    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    """Width of the GeGLU's gated half: `Wi` outputs twice this."""
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    pad_token_id: int | None = 50283
    eos_token_id: int | None = 50282
    bos_token_id: int | None = 50281
    cls_token_id: int | None = 50281
    sep_token_id: int | None = 50282
    attention_bias: bool = False
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities and on the attention output."""
    global_attn_every_n_layers: int = 3
    layer_types: tuple[str, ...] | None = None
    """"full_attention" or "sliding_attention" per layer; None: from global_attn_every_n_layers."""
    local_attention: int = 128
    """Total sliding window: a query sees local_attention // 2 keys on each side."""
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    embedding_dropout: float = 0.0
    mlp_bias: bool = False
    mlp_dropout: float = 0.0
    decoder_bias: bool = True
    """The masked-LM decoder's (unused by flaxheads; kept so an export keeps what config.json said)."""
    classifier_pooling: str = "cls"
    classifier_dropout: float | None = 0.0
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    sparse_prediction: bool = False
    sparse_pred_ignore_index: int = -100
    deterministic_flash_attn: bool = False
    tie_word_embeddings: bool = True

    def __post_init__(self):
        if self.model_type != "modernbert":
            raise ValueError(f"ModernBertConfig serves model_type 'modernbert', not {self.model_type!r}")
        require_sizes(self, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "max_position_embeddings")
        require_multiple(hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads)
        if self.head_dim % 2:
            raise ValueError(
                f"head_dim={self.head_dim} (hidden_size / num_attention_heads) is odd: RoPE rotates pairs of "
                "features, so choose hidden_size and num_attention_heads with an even quotient"
            )
        if self.layer_types is None:
            if self.global_attn_every_n_layers < 1:
                raise ValueError(f"global_attn_every_n_layers={self.global_attn_every_n_layers}: it must be at least 1")
            every = self.global_attn_every_n_layers
            object.__setattr__(self, "layer_types", tuple(
                SLIDING if i % every else GLOBAL for i in range(self.num_hidden_layers)
            ))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {GLOBAL, SLIDING}:
            raise ValueError(
                f"layer_types={list(self.layer_types)}: give one of {GLOBAL!r} or {SLIDING!r} for each of the "
                f"num_hidden_layers={self.num_hidden_layers} layers"
            )
        if self.classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling={self.classifier_pooling!r}; choose 'cls' or 'mean'")

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> "ModernBertConfig":
        """Reads a Hugging Face `config.json` dict of model_type modernbert: transformers 5's
        `layer_types` and `rope_parameters`, or transformers 4's global_attn_every_n_layers,
        global_rope_theta and local_rope_theta. NotImplementedError for rope types other than "default"."""
        known = known_fields(hf, cls)
        if hf.get("rope_scaling"):
            raise NotImplementedError(f"rope_scaling={hf['rope_scaling']!r}: flaxheads' ModernBERT has default RoPE only")
        for kind, field in ((GLOBAL, "global_rope_theta"), (SLIDING, "local_rope_theta")):
            params = (hf.get("rope_parameters") or {}).get(kind) or {}
            if params.get("rope_type", "default") != "default":
                raise NotImplementedError(
                    f"rope_parameters[{kind!r}] has rope_type={params['rope_type']!r}: flaxheads' ModernBERT "
                    "has the default RoPE only"
                )
            if "rope_theta" in params:
                known[field] = params["rope_theta"]
        if known.get("classifier_dropout") is None:
            known.pop("classifier_dropout", None)
        return cls(**known)

    def to_hf_config(self) -> dict[str, Any]:
        """config.json fields that transformers 5 reads (layer_types, rope_parameters) and that
        transformers 4 reads (global_attn_every_n_layers when the layers follow it, *_rope_theta)."""
        out = dataclasses.asdict(self)
        out["layer_types"] = list(self.layer_types)
        pattern = ModernBertConfig(num_hidden_layers=self.num_hidden_layers,
                                   global_attn_every_n_layers=self.global_attn_every_n_layers).layer_types
        if pattern != self.layer_types:
            del out["global_attn_every_n_layers"]
        out["rope_parameters"] = {
            GLOBAL: {"rope_type": "default", "rope_theta": self.global_rope_theta},
            SLIDING: {"rope_type": "default", "rope_theta": self.local_rope_theta},
        }
        return out

    @property
    def default_classifier_dropout(self) -> float:
        """`ModernBertForSequenceClassification`'s rule: classifier_dropout (0.0 by default)."""
        return self.classifier_dropout or 0.0

    @property
    def max_sequence_length(self) -> int:
        """The longest input ModernBERT was trained for; RoPE itself has no table to run out of."""
        return self.max_position_embeddings

    position_table_size = None
    """Rotary positions: no table to run out of."""
    token_type_vocab_size = None
    """No token types: token_type_ids are ignored."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def sliding_window(self) -> int:
        """Keys a sliding-window query sees on each side: transformers' local_attention // 2."""
        return self.local_attention // 2

    head_options_shared_with_layers: ClassVar[tuple[str, ...]] = ("norm_bias", "norm_eps")
    """Head options that this config.json also sets for the backbone's own LayerNorms: on a
    ModernBERT backbone the head must keep them (`ClassifierConfig` refuses other values)."""

    @property
    def modernbert_options(self) -> dict[str, Any]:
        """The "modernbert" head's options as this config.json sets them (`HEAD_OPTION_FIELDS`)."""
        return {name: getattr(self, name) for name in HEAD_OPTION_FIELDS}


class Attention(nnx.Module):
    """Fused `Wqkv` -> RoPE on q and k -> attention (global or sliding window) -> `Wo` -> dropout."""

    def __init__(self, cfg: ModernBertConfig, layer_type: str, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        self.window = cfg.sliding_window if layer_type == SLIDING else None
        self.rope = rope.Rope(cfg.local_rope_theta if layer_type == SLIDING else cfg.global_rope_theta)
        d = cfg.hidden_size
        self.Wqkv = layers.dense(d, 3 * d, use_bias=cfg.attention_bias, init_std=cfg.initializer_range,
                                 dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.Wo = layers.dense(d, d, use_bias=cfg.attention_bias, init_std=_out_std(cfg),
                               dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.deterministic = False

    def __call__(self, x_BTD: jax.Array, mask_BT: jax.Array, positions_BT: jax.Array, rngs,
                 segment_ids_BT: jax.Array | None = None) -> jax.Array:
        b, t, _ = x_BTD.shape
        # transformers views the fused projection as (3, heads, head_dim): q, k, v blocks in turn.
        qkv_BT3NH = self.Wqkv(x_BTD).reshape(b, t, 3, self.cfg.num_attention_heads, self.cfg.head_dim)
        query_BTNH, key_BTNH, value_BTNH = (qkv_BT3NH[:, :, i] for i in range(3))
        cos, sin = rope.cos_sin(positions_BT, self.rope, self.cfg.head_dim, x_BTD.dtype)
        context_BTNH = attention.attend(
            rope.rotate(query_BTNH, cos, sin, in_float32=True),
            rope.rotate(key_BTNH, cos, sin, in_float32=True),
            value_BTNH,
            mask_BT,
            local_window_size=self.window,
            dropout_rate=self.cfg.attention_dropout,
            deterministic=self.deterministic,
            rngs=rngs,
            segment_ids_BT=segment_ids_BT,
        )
        out_BTD = self.Wo(context_BTNH.reshape(b, t, -1))
        return dropout.apply(out_BTD, self.cfg.attention_dropout, rngs, deterministic=self.deterministic)


class GegluMlp(nnx.Module):
    """`ModernBertMLP`: Wi (hidden -> 2 * intermediate) -> act(input) * gate -> dropout -> Wo."""

    def __init__(self, cfg: ModernBertConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        kw = dict(use_bias=cfg.mlp_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.Wi = layers.dense(cfg.hidden_size, 2 * cfg.intermediate_size, init_std=cfg.initializer_range, **kw)
        self.Wo = layers.dense(cfg.intermediate_size, cfg.hidden_size, init_std=_out_std(cfg), **kw)
        self.act = layers.activation(cfg.hidden_activation)
        self.deterministic = False

    def __call__(self, x_BTD: jax.Array, rngs) -> jax.Array:
        input_BTI, gate_BTI = jnp.split(self.Wi(x_BTD), 2, axis=-1)  # torch's chunk(2): input first
        gated = dropout.apply(self.act(input_BTI) * gate_BTI, self.cfg.mlp_dropout, rngs, deterministic=self.deterministic)
        return self.Wo(gated)


class EncoderLayer(nnx.Module):
    """Pre-LayerNorm block: x += attn(attn_norm(x)); x += mlp(mlp_norm(x)). Layer 0 has no attn_norm."""

    def __init__(self, cfg: ModernBertConfig, index: int, *, dtype, param_dtype, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.attn_norm = _norm(cfg, **kw) if index else None
        self.attn = Attention(cfg, cfg.layer_types[index], **kw)
        self.mlp_norm = _norm(cfg, **kw)
        self.mlp = GegluMlp(cfg, **kw)

    def __call__(self, x_BTD, mask_BT, positions_BT, rngs, segment_ids_BT=None) -> jax.Array:
        normed = x_BTD if self.attn_norm is None else self.attn_norm(x_BTD)
        x_BTD = x_BTD + self.attn(normed, mask_BT, positions_BT, rngs, segment_ids_BT)
        return x_BTD + self.mlp(self.mlp_norm(x_BTD), rngs)


def _norm(cfg: ModernBertConfig, **kw) -> nnx.LayerNorm:
    return layers.layer_norm(cfg.hidden_size, eps=cfg.norm_eps, use_bias=cfg.norm_bias, **kw)


def _out_std(cfg: ModernBertConfig) -> float:
    """transformers' init std of the projections back into the residual stream."""
    return cfg.initializer_range / math.sqrt(2.0 * cfg.num_hidden_layers)


class Embeddings(nnx.Module):
    """`ModernBertEmbeddings`: tok_embeddings -> norm -> dropout."""

    def __init__(self, cfg: ModernBertConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        self.tok_embeddings = layers.embed(cfg.vocab_size, cfg.hidden_size, init_std=cfg.initializer_range,
                                           dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.norm = _norm(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.deterministic = False

    def __call__(self, input_ids_BT: jax.Array, rngs) -> jax.Array:
        x_BTD = self.norm(self.tok_embeddings(input_ids_BT))
        return dropout.apply(x_BTD, self.cfg.embedding_dropout, rngs, deterministic=self.deterministic)


class ModernBert(nnx.Module):
    """ModernBERT (`transformers.ModernBertModel`) in Flax NNX (module doc).

    `dtype` is the compute dtype (bfloat16 allowed), `param_dtype` the storage dtype. ModernBERT
    has no pooler: ValueError for `add_pooling_layer=True`. Built in train mode (dropout on,
    `rngs` needed at call time when a rate is non-zero); `.eval()` turns dropout off.
    """

    def __init__(
        self,
        cfg: ModernBertConfig,
        *,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        add_pooling_layer: bool = False,
        rngs: nnx.Rngs,
    ):
        if add_pooling_layer:
            raise ValueError("ModernBERT has no pooler: build it with add_pooling_layer=False")
        self.cfg = cfg
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.embeddings = Embeddings(cfg, **kw)
        self.layers = nnx.List([EncoderLayer(cfg, i, **kw) for i in range(cfg.num_hidden_layers)])
        self.final_norm = _norm(cfg, **kw)

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
        """input_ids, attention_mask (1 = real token), position_ids: (batch, seq) ints; ModernBERT
        has no token types (token_type_ids is ignored, as transformers' model takes none).

        `segment_ids` (batch, seq) packs several examples per row (`segments`): attention within
        a segment (attention_mask is then not read; a local window counts sequence indices, the
        segment's own distances) and rotary positions 0.. from each segment's start.

        `rngs` (an `nnx.Rngs` with a `dropout` stream) draws the dropout masks in train mode;
        eval mode ignores it. ValueError in train mode without it (non-zero dropout rates)."""
        del token_type_ids
        if segment_ids is not None:
            attention_mask = segments.attention_mask(segment_ids)
            if position_ids is None:
                position_ids = segments.positions(segment_ids)
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        if position_ids is None:
            position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
        x_BTD = self.embeddings(input_ids, rngs)
        hidden_states = stacking.run_layers(self, self.layers, x_BTD, attention_mask, position_ids, rngs=rngs,
                                            segment_ids_BT=segment_ids)
        x_BTD = self.final_norm(hidden_states[-1])
        hidden_states[-1] = x_BTD  # as transformers: the last hidden state is after the final norm
        return BackboneOutput(x_BTD, tuple(hidden_states))


__all__ = ["ModernBert", "ModernBertConfig"]
