"""DistilBERT: BERT's post-LayerNorm encoder under DistilBERT's config names.

The computation is the BERT `Encoder`'s with three switches (no token types, no dropout on the
attention output, an optional sinusoidal position table at init), so this file holds only the
config that reads and writes transformers' `DistilBertConfig` names.
"""

from __future__ import annotations

import dataclasses
from typing import Any


import jax.numpy as jnp
from flax import nnx

from flaxheads.backbones.encoder import Encoder, EncoderConfig
from flaxheads.backbones.interface import known_fields, require_sizes

DISTILBERT_LAYER_NORM_EPS = 1e-12
"""Fixed in transformers' DistilBERT (not a config field)."""


@dataclasses.dataclass(frozen=True)
class DistilBertConfig:
    """Architecture of a DistilBERT encoder, with the field names of transformers' DistilBertConfig."""

    model_type: str = "distilbert"
    vocab_size: int = 30522
    max_position_embeddings: int = 512
    sinusoidal_pos_embds: bool = False
    n_layers: int = 6
    n_heads: int = 12
    dim: int = 768
    hidden_dim: int = 3072
    """Width of the feed-forward layer (BERT's intermediate_size)."""
    dropout: float = 0.1
    """Embeddings and feed-forward output (BERT's hidden_dropout_prob)."""
    attention_dropout: float = 0.1
    activation: str = "gelu"
    initializer_range: float = 0.02
    qa_dropout: float = 0.1
    """Dropout of `DistilBertForQuestionAnswering` (the question-answering model's, `tasks/qa/model.py`)."""
    seq_classif_dropout: float = 0.2
    """Dropout of `DistilBertForSequenceClassification`, the default for every head on DistilBERT."""
    pad_token_id: int | None = 0
    classifier_dropout: float | None = None
    """flaxheads' override of the heads' dropout (transformers' DistilBERT reads seq_classif_dropout)."""

    def __post_init__(self):
        if self.model_type != "distilbert":
            raise ValueError(f"DistilBertConfig serves model_type 'distilbert', not {self.model_type!r}")
        require_sizes(self, "vocab_size", "max_position_embeddings", "n_layers", "n_heads", "dim", "hidden_dim")
        self.encoder_config()  # validates the shapes (dim divisible by n_heads)

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> "DistilBertConfig":
        """Reads a Hugging Face `config.json` dict of model_type distilbert; absent fields take
        transformers' defaults."""
        return cls(**known_fields(hf, cls))

    def to_hf_config(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        # The names a reader expecting BERT's (transformers' attribute_map) finds as well.
        out.update(hidden_size=self.dim, num_hidden_layers=self.n_layers, num_attention_heads=self.n_heads)
        return out

    def encoder_config(self) -> EncoderConfig:
        """The `Encoder` settings that compute DistilBERT."""
        return EncoderConfig(
            model_type="distilbert",
            vocab_size=self.vocab_size,
            hidden_size=self.dim,
            num_hidden_layers=self.n_layers,
            num_attention_heads=self.n_heads,
            intermediate_size=self.hidden_dim,
            hidden_act=self.activation,
            hidden_dropout_prob=self.dropout,
            attention_probs_dropout_prob=self.attention_dropout,
            max_position_embeddings=self.max_position_embeddings,
            type_vocab_size=0,
            layer_norm_eps=DISTILBERT_LAYER_NORM_EPS,
            initializer_range=self.initializer_range,
            pad_token_id=self.pad_token_id,
            classifier_dropout=self.classifier_dropout,
            attention_output_dropout=False,
            sinusoidal_position_embeddings=self.sinusoidal_pos_embds,
        )

    @property
    def hidden_size(self) -> int:
        return self.dim

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layers

    @property
    def num_attention_heads(self) -> int:
        return self.n_heads

    @property
    def default_classifier_dropout(self) -> float:
        """classifier_dropout if set, else seq_classif_dropout (what DistilBertForSequenceClassification uses)."""
        return self.seq_classif_dropout if self.classifier_dropout is None else self.classifier_dropout

    @property
    def max_sequence_length(self) -> int:
        return self.max_position_embeddings

    @property
    def position_table_size(self) -> int:
        return self.max_position_embeddings

    token_type_vocab_size = None
    """DistilBERT has no token types: token_type_ids are ignored."""


def DistilBert(
    cfg: DistilBertConfig, *, dtype=jnp.float32, param_dtype=jnp.float32, add_pooling_layer: bool = False, rngs: nnx.Rngs
) -> Encoder:
    """`transformers.DistilBertModel` in Flax NNX: the `Encoder` built from `cfg.encoder_config()`.

    DistilBERT has no pooler: ValueError for `add_pooling_layer=True`."""
    if add_pooling_layer:
        raise ValueError("DistilBERT has no pooler: build it with add_pooling_layer=False")
    return Encoder(cfg.encoder_config(), dtype=dtype, param_dtype=param_dtype, rngs=rngs)


__all__ = ["DistilBert", "DistilBertConfig"]
