"""Conversion table for ALBERT (`AlbertModel`, `AlbertForPreTraining`, `AlbertForMaskedLM`,
`AlbertForSequenceClassification`).

Shared layers are stored once in both formats: a rule names group `{g}`'s layer `{j}`, whatever
number of the num_hidden_layers layers apply that group.
"""

from __future__ import annotations

from flaxheads.conversion.table import (
    MULTIPLE_CHOICE, TOKEN_CLASSIFICATION, ArchitectureTable, TaskTable, embedding, layer_norm, linear,
    token_classification,
)

_LAYER = "{base}encoder.albert_layer_groups.{g}.albert_layers.{j}"
_FLAX_LAYER = "groups.{g}.layers.{j}"

ALBERT_BACKBONE = (
    *embedding("{base}embeddings.word_embeddings", "embeddings.word_embeddings"),
    *embedding("{base}embeddings.position_embeddings", "embeddings.position_embeddings"),
    *embedding("{base}embeddings.token_type_embeddings", "embeddings.token_type_embeddings"),
    *layer_norm("{base}embeddings.LayerNorm", "embeddings.layer_norm"),
    *linear("{base}encoder.embedding_hidden_mapping_in", "embedding_projection"),
    *linear(f"{_LAYER}.attention.query", f"{_FLAX_LAYER}.attention.query"),
    *linear(f"{_LAYER}.attention.key", f"{_FLAX_LAYER}.attention.key"),
    *linear(f"{_LAYER}.attention.value", f"{_FLAX_LAYER}.attention.value"),
    *linear(f"{_LAYER}.attention.dense", f"{_FLAX_LAYER}.attention.output"),
    *layer_norm(f"{_LAYER}.attention.LayerNorm", f"{_FLAX_LAYER}.attention_norm"),
    *linear(f"{_LAYER}.ffn", f"{_FLAX_LAYER}.intermediate"),
    *linear(f"{_LAYER}.ffn_output", f"{_FLAX_LAYER}.output"),
    *layer_norm(f"{_LAYER}.full_layer_layer_norm", f"{_FLAX_LAYER}.output_norm"),
)

# AlbertModel's pooler is a bare nn.Linear named `pooler` (BERT's is `pooler.dense`); the
# "pooler" head owns it in flaxheads, as for BERT.
_POOLER = tuple(linear("{base}pooler", "pooler.dense"))
_POOLER_HEAD = (*_POOLER, *linear("classifier", "classifier"))

ALBERT = ArchitectureTable(
    model_type="albert",
    base_prefix="albert",
    base_architecture="AlbertModel",
    classification_architecture="AlbertForSequenceClassification",
    canonical_head="pooler",
    backbone=ALBERT_BACKBONE,
    heads={"pooler": _POOLER_HEAD},
    pooler=_POOLER,
    layer_indices={"g": "num_hidden_groups", "j": "inner_group_num"},
    tasks={
        TOKEN_CLASSIFICATION: token_classification("AlbertForTokenClassification"),
        MULTIPLE_CHOICE: TaskTable("AlbertForMultipleChoice", "pooler", _POOLER_HEAD),
    },
)
