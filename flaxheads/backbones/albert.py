"""ALBERT (`transformers.AlbertModel`) in Flax NNX: BERT's layer, shared across depth.

ALBERT differs from BERT in two places, and reuses the encoder's pieces everywhere else:

- **Factorised embeddings.** Tokens are embedded `embedding_size` wide (BERT's `Embeddings`
  with a narrower width), then projected to `hidden_size` by one dense layer
  (`encoder.embedding_hidden_mapping_in`).
- **Cross-layer parameter sharing.** There are `num_hidden_groups` groups of `inner_group_num`
  layers each; layer i of `num_hidden_layers` applies the whole group
  int(i / (num_hidden_layers / num_hidden_groups)). Each group is one module, called as many
  times as layers use it, so its parameters exist once in the model, in the optimizer state and
  in checkpoints.

A layer is BERT's post-LayerNorm `EncoderLayer` without dropout on the feed-forward output (as
`AlbertLayer`). `hidden_states` holds the projected embeddings, then the output of every one of
the `num_hidden_layers` layers (after its whole group), as the backbone interface promises and
transformers 4 returned; transformers 5 instead records every inner layer, which differs only
when inner_group_num > 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from flaxheads.backbones import layers, segments, stacking
from flaxheads.backbones.encoder import Embeddings, EncoderLayer
from flaxheads.backbones.interface import BackboneOutput, known_fields, require_multiple, require_sizes


@dataclasses.dataclass(frozen=True)
class AlbertConfig:
    """Architecture of an ALBERT, with the field names and defaults of Hugging Face's `AlbertConfig`."""

    model_type: str = "albert"
    vocab_size: int = 30000
    embedding_size: int = 128
    """Width of the token embeddings, projected to hidden_size before the first layer."""
    hidden_size: int = 4096
    num_hidden_layers: int = 12
    num_hidden_groups: int = 1
    """Groups of layers with their own parameters; the layers share them in consecutive runs."""
    num_attention_heads: int = 64
    intermediate_size: int = 16384
    inner_group_num: int = 1
    """Layers (each with its own parameters) in a group; a group applies all of them in turn."""
    hidden_act: str = "gelu_new"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    classifier_dropout_prob: float = 0.1
    """Dropout before the classifier of `AlbertForSequenceClassification` (the "pooler" head)."""
    pad_token_id: int | None = 0
    bos_token_id: int | None = 2
    eos_token_id: int | None = 3

    classifier_dropout_key: ClassVar[str] = "classifier_dropout_prob"
    """The config.json field transformers reads the classifier's dropout from."""
    position_ids_from_padding: ClassVar[bool] = False
    """Positions are 0..T-1 whatever the padding, as BERT's (read by the shared `Embeddings`)."""
    sinusoidal_position_embeddings: ClassVar[bool] = False
    attention_output_dropout: ClassVar[bool] = True
    """The shared `Embeddings` and `EncoderLayer` read these switches; ALBERT has BERT's."""

    def __post_init__(self):
        if self.model_type != "albert":
            raise ValueError(f"AlbertConfig serves model_type 'albert', not {self.model_type!r}")
        require_sizes(self, "vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_hidden_groups",
                      "num_attention_heads", "intermediate_size", "inner_group_num", "max_position_embeddings")
        require_sizes(self, "type_vocab_size", at_least=0)
        require_multiple(hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads)
        if not 1 <= self.num_hidden_groups <= self.num_hidden_layers:
            raise ValueError(
                f"num_hidden_groups={self.num_hidden_groups}: it must be between 1 and "
                f"num_hidden_layers={self.num_hidden_layers}"
            )
        if self.inner_group_num < 1:
            raise ValueError(f"inner_group_num={self.inner_group_num}: it must be at least 1")

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> "AlbertConfig":
        """Reads a Hugging Face `config.json` dict of model_type albert."""
        kind = hf.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise NotImplementedError(
                f"position_embedding_type={kind!r} is not supported; flaxheads' ALBERT uses absolute "
                "position embeddings only (as transformers 5 does)"
            )
        return cls(**known_fields(hf, cls))

    def to_hf_config(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def classifier_dropout(self) -> float:
        """ALBERT's classifier dropout has its own name; this is the interface's spelling."""
        return self.classifier_dropout_prob

    @property
    def default_classifier_dropout(self) -> float:
        """`AlbertForSequenceClassification`'s rule: classifier_dropout_prob."""
        return self.classifier_dropout_prob

    @property
    def max_sequence_length(self) -> int:
        return self.max_position_embeddings

    @property
    def position_table_size(self) -> int:
        return self.max_position_embeddings

    @property
    def token_type_vocab_size(self) -> int | None:
        return self.type_vocab_size or None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def group_of_layer(self, layer: int) -> int:
        """The group layer `layer` applies: transformers' int(i / (layers / groups)), float division
        included, so uneven splits round as they do there."""
        return int(layer / (self.num_hidden_layers / self.num_hidden_groups))


class LayerGroup(nnx.Module):
    """`inner_group_num` layers applied in turn; one group's parameters serve several layers."""

    def __init__(self, cfg: AlbertConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.layers = nnx.List([
            EncoderLayer(cfg, mlp_dropout=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
            for _ in range(cfg.inner_group_num)
        ])

    def __call__(self, x_BTD: jax.Array, mask_BT: jax.Array | None, rngs, **attention_inputs) -> jax.Array:
        """`attention_inputs`: what `EncoderLayer` passes to its attention (packed rows' segment ids)."""
        for layer in self.layers:
            x_BTD = layer(x_BTD, mask_BT, rngs, **attention_inputs)
        return x_BTD


class Albert(nnx.Module):
    """ALBERT (`transformers.AlbertModel`) in Flax NNX.

    `dtype` is the compute dtype (bfloat16 allowed), `param_dtype` the storage dtype.
    `add_pooling_layer` gives the standalone backbone ALBERT's pooler (dense + tanh on the first
    token); classifiers built by flaxheads keep it in the "pooler" head instead.
    Built in train mode (dropout on, `rngs` needed at call time); `.eval()` turns dropout off.
    """

    def __init__(
        self,
        cfg: AlbertConfig,
        *,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        add_pooling_layer: bool = False,
        rngs: nnx.Rngs,
    ):
        self.cfg = cfg
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.embeddings = Embeddings(cfg, features=cfg.embedding_size, **kw)
        self.embedding_projection = layers.dense(
            cfg.embedding_size, cfg.hidden_size, init_std=cfg.initializer_range, **kw
        )
        self.groups = nnx.List([LayerGroup(cfg, **kw) for _ in range(cfg.num_hidden_groups)])
        self.pooler = (
            layers.Pooler(cfg.hidden_size, init_std=cfg.initializer_range, **kw) if add_pooling_layer else None
        )

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

        `segment_ids` (batch, seq) packs several examples per row (`segments`): attention stays
        within a segment (attention_mask is then not read) and positions restart at each one.
        `rngs` (an `nnx.Rngs` with a `dropout` stream) draws the dropout masks in train mode;
        eval mode ignores it. ValueError in train mode without it (non-zero dropout rates)."""
        x_BTD = self.embedding_projection(self.embeddings(input_ids, token_type_ids, position_ids, rngs, segment_ids))
        packed = {}
        if segment_ids is not None:
            attention_mask = segments.attention_mask(segment_ids)
            packed = {"segment_ids_BT": segment_ids}  # for a fused attention kernel
        stack = [self.groups[self.cfg.group_of_layer(layer)] for layer in range(self.cfg.num_hidden_layers)]
        hidden_states = stacking.run_layers(self, stack, x_BTD, attention_mask, rngs=rngs, **packed)
        x_BTD = hidden_states[-1]
        pooled = None if self.pooler is None else self.pooler(x_BTD)
        return BackboneOutput(x_BTD, tuple(hidden_states), pooled)
