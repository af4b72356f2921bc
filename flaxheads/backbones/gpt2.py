"""GPT-2 (`transformers.GPT2Model`) in Flax NNX: a pre-LayerNorm causal decoder.

Differences from the encoder that matter for classification: every position sees only itself
and earlier positions (causal mask, plus the padding mask on keys), position ids are 0..T-1
whatever the padding (as transformers), and the last layer's output goes through a final
LayerNorm `ln_f`. A sequence's summary is therefore at its *last* real token, which is where
the "last_token" head reads.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from flaxheads.backbones import attention, dropout, layers, segments, stacking
from flaxheads.backbones.interface import BackboneOutput, check_shapes, known_fields, require_multiple, require_sizes


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    """Architecture of a GPT-2 decoder, with Hugging Face's `GPT2Config` field names."""

    model_type: str = "gpt2"
    vocab_size: int = 50257
    n_positions: int = 1024
    """Longest sequence the learned position embeddings cover."""
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    """MLP width; None means 4 * n_embd."""
    activation_function: str = "gelu_new"
    resid_pdrop: float = 0.1
    """Dropout on each block's attention and MLP outputs."""
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    scale_attn_weights: bool = True
    """Divide attention logits by sqrt(head_dim)."""
    scale_attn_by_inverse_layer_idx: bool = False
    """Also divide layer i's attention logits by i + 1."""
    reorder_and_upcast_attn: bool = False
    """Kept for the round trip only: in transformers it changes eager float16 numerics, not the model."""
    bos_token_id: int | None = 50256
    eos_token_id: int | tuple[int, ...] | None = 50256
    pad_token_id: int | None = None
    """GPT-2 has no pad token; classifiers need one (or an attention mask) to find the last real
    token in a batch. The common practice is pad_token_id = eos_token_id."""
    classifier_dropout: float | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self):
        if self.model_type != "gpt2":
            raise ValueError(f"GPT2Config serves model_type 'gpt2', not {self.model_type!r}")
        require_sizes(self, "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", optional=("n_inner",))
        require_multiple(n_embd=self.n_embd, n_head=self.n_head)
        if isinstance(self.eos_token_id, list):  # configs must hash: they are static in jit
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> "GPT2Config":
        """Reads a Hugging Face `config.json` dict of model_type gpt2."""
        if hf.get("add_cross_attention"):
            raise NotImplementedError("add_cross_attention=True: flaxheads' GPT-2 has self-attention only")
        return cls(**known_fields(hf, cls))

    def to_hf_config(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if isinstance(self.eos_token_id, tuple):
            out["eos_token_id"] = list(self.eos_token_id)
        return out

    # The BackboneConfig protocol, under transformers' `attribute_map` names.
    @property
    def hidden_size(self) -> int:
        return self.n_embd

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layer

    @property
    def default_classifier_dropout(self) -> float:
        """classifier_dropout if set, else resid_pdrop (GPT-2's hidden dropout): the dropout of the
        heads flaxheads adds on GPT-2 (cls, mean, ...). The "last_token" head has no dropout at all,
        and `GPT2ForTokenClassification` takes classifier_dropout, else 0.1 (`TOKEN_DROPOUT`)."""
        return self.resid_pdrop if self.classifier_dropout is None else self.classifier_dropout

    @property
    def max_sequence_length(self) -> int:
        return self.n_positions

    @property
    def position_table_size(self) -> int:
        return self.n_positions

    @property
    def token_type_vocab_size(self) -> int:
        """GPT-2 looks token types up in its token embeddings (as transformers)."""
        return self.vocab_size

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def inner_size(self) -> int:
        return 4 * self.n_embd if self.n_inner is None else self.n_inner

    def attention_scale(self, layer: int) -> float:
        scale = 1.0 / math.sqrt(self.head_dim) if self.scale_attn_weights else 1.0
        return scale / (layer + 1) if self.scale_attn_by_inverse_layer_idx else scale


def _projection(in_features: int, out_features: int, *, init_std: float, dtype, param_dtype, rngs) -> nnx.Linear:
    """A transformers `Conv1D` (y = x W + b, W stored (in, out)) as an `nnx.Linear`: same layout."""
    return layers.dense(in_features, out_features, init_std=init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)


def _residual_init_std(cfg: GPT2Config) -> float:
    """GPT-2's scaled init of the projections that write into the residual stream: two per block."""
    return cfg.initializer_range / math.sqrt(2 * cfg.n_layer)


class SelfAttention(nnx.Module):
    def __init__(self, cfg: GPT2Config, layer: int, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        self.scale = cfg.attention_scale(layer)
        d = cfg.n_embd
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        # Fused query/key/value projection, as transformers' `c_attn`, so weights convert as-is.
        self.qkv = _projection(d, 3 * d, init_std=cfg.initializer_range, **kw)
        self.output = _projection(d, d, init_std=_residual_init_std(cfg), **kw)
        self.deterministic = False
        """Eval mode: no dropout. `model.train()` / `model.eval()` set it (see `layers`)."""

    def __call__(self, x_BTD: jax.Array, mask_BT: jax.Array | None, rngs,
                 segment_ids_BT: jax.Array | None = None) -> jax.Array:
        b, t, d = x_BTD.shape
        # c_attn's output is [query | key | value], each split as (heads, head_dim).
        qkv_BT3NH = self.qkv(x_BTD).reshape(b, t, 3, self.cfg.n_head, self.cfg.head_dim)
        context_BTNH = attention.attend(
            qkv_BT3NH[:, :, 0],
            qkv_BT3NH[:, :, 1],
            qkv_BT3NH[:, :, 2],
            mask_BT,
            is_causal=True,
            scale=self.scale,
            dropout_rate=self.cfg.attn_pdrop,
            deterministic=self.deterministic,
            rngs=rngs,
            segment_ids_BT=segment_ids_BT,
        )
        if mask_BT is not None and mask_BT.ndim == 2:  # a packed row's (B, 1, T, T) mask lets every query see itself
            # A query that sees no key (left padding before a row's first real token) gets a zero
            # context, as torch's scaled_dot_product_attention (transformers' default) gives it;
            # jax's kernel would average all values there. Real tokens are never affected, but
            # heads that read position 0 of a left-padded row (cls, pooler) then match too.
            sees_a_key_BT = jnp.cumsum(mask_BT.astype(jnp.int32), axis=1) > 0
            context_BTNH = jnp.where(sees_a_key_BT[:, :, None, None], context_BTNH, 0)
        return self.output(context_BTNH.reshape(b, t, d))


class Block(nnx.Module):
    """Pre-LayerNorm block: x = x + attn(LN(x)); x = x + mlp(LN(x))."""

    def __init__(self, cfg: GPT2Config, layer: int, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        norm = dict(eps=cfg.layer_norm_epsilon, **kw)
        self.attention_norm = layers.layer_norm(cfg.n_embd, **norm)
        self.attention = SelfAttention(cfg, layer, **kw)
        self.mlp_norm = layers.layer_norm(cfg.n_embd, **norm)
        self.intermediate = _projection(cfg.n_embd, cfg.inner_size, init_std=cfg.initializer_range, **kw)
        self.output = _projection(cfg.inner_size, cfg.n_embd, init_std=_residual_init_std(cfg), **kw)
        self.act = layers.activation(cfg.activation_function)
        self.deterministic = False

    def __call__(self, x_BTD, mask_BT, rngs, segment_ids_BT=None) -> jax.Array:
        def drop(y):
            return dropout.apply(y, self.cfg.resid_pdrop, rngs, deterministic=self.deterministic)

        x_BTD = x_BTD + drop(self.attention(self.attention_norm(x_BTD), mask_BT, rngs, segment_ids_BT))
        return x_BTD + drop(self.output(self.act(self.intermediate(self.mlp_norm(x_BTD)))))


class GPT2(nnx.Module):
    """`transformers.GPT2Model` in Flax NNX.

    `dtype` is the compute dtype (bfloat16 allowed), `param_dtype` the storage dtype. GPT-2 has
    no pooler; `add_pooling_layer` exists for the backbone interface and must be False.
    Built in train mode (dropout on, `rngs` needed at call time); `.eval()` turns dropout off.
    """

    def __init__(
        self,
        cfg: GPT2Config,
        *,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        add_pooling_layer: bool = False,
        rngs: nnx.Rngs,
    ):
        if add_pooling_layer:
            raise ValueError("GPT-2 has no pooler; build it with add_pooling_layer=False")
        self.cfg = cfg
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.token_embeddings = layers.embed(cfg.vocab_size, cfg.n_embd, init_std=cfg.initializer_range, **kw)
        self.position_embeddings = layers.embed(cfg.n_positions, cfg.n_embd, init_std=cfg.initializer_range, **kw)
        self.layers = nnx.List([Block(cfg, i, **kw) for i in range(cfg.n_layer)])
        self.final_norm = layers.layer_norm(cfg.n_embd, eps=cfg.layer_norm_epsilon, **kw)
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
        """input_ids, attention_mask (1 = real token), token_type_ids, position_ids: (batch, seq) ints.

        Position ids default to 0..T-1 whatever the padding, as transformers does; pass
        `position_ids` to count from the first real token of a left-padded row instead.
        `segment_ids` (batch, seq) packs several examples per row (`segments`): causal attention
        within a segment (attention_mask is then not read), positions 0.. from each segment's start.
        `token_type_ids`, when given, are looked up in the token embeddings and added (as in
        transformers). `rngs` (an `nnx.Rngs` with a `dropout` stream) draws the dropout masks in
        train mode; eval mode ignores it. Raises ValueError for inputs that are not (batch, seq)
        or longer than `n_positions`, and in train mode without `rngs` (non-zero dropout rates).
        """
        check_shapes(self.cfg, input_ids, attention_mask, token_type_ids, position_ids, segment_ids=segment_ids)
        if segment_ids is not None:
            attention_mask = segments.attention_mask(segment_ids)
            if position_ids is None:
                position_ids = segments.positions(segment_ids)
        if position_ids is None:
            position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
        x_BTD = self.token_embeddings(input_ids) + self.position_embeddings(position_ids)
        if token_type_ids is not None:
            x_BTD = x_BTD + self.token_embeddings(token_type_ids)
        x_BTD = dropout.apply(x_BTD, self.cfg.embd_pdrop, rngs, deterministic=self.deterministic)
        hidden_states = stacking.run_layers(self, self.layers, x_BTD, attention_mask, rngs=rngs,
                                            segment_ids_BT=segment_ids)
        x_BTD = hidden_states[-1]
        # As transformers: the last entry of hidden_states is the output after ln_f.
        x_BTD = self.final_norm(x_BTD)
        hidden_states[-1] = x_BTD
        return BackboneOutput(x_BTD, tuple(hidden_states))

