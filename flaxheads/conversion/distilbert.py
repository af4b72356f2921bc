"""Conversion table for DistilBERT: the BERT encoder's parameters under DistilBERT's names."""

from __future__ import annotations

from flaxheads.conversion.table import (
    MULTIPLE_CHOICE, TOKEN_CLASSIFICATION, ArchitectureTable, TaskTable, embedding, layer_norm, linear,
    token_classification,
)

_LAYER = "{base}transformer.layer.{i}"
_HEAD = (*linear("pre_classifier", "pre_classifier"), *linear("classifier", "classifier"))

DISTILBERT = ArchitectureTable(
    model_type="distilbert",
    base_prefix="distilbert",
    base_architecture="DistilBertModel",
    classification_architecture="DistilBertForSequenceClassification",
    canonical_head="distilbert",
    backbone=(
        *embedding("{base}embeddings.word_embeddings", "embeddings.word_embeddings"),
        *embedding("{base}embeddings.position_embeddings", "embeddings.position_embeddings"),
        *layer_norm("{base}embeddings.LayerNorm", "embeddings.layer_norm"),
        *linear(f"{_LAYER}.attention.q_lin", "layers.{i}.attention.query"),
        *linear(f"{_LAYER}.attention.k_lin", "layers.{i}.attention.key"),
        *linear(f"{_LAYER}.attention.v_lin", "layers.{i}.attention.value"),
        *linear(f"{_LAYER}.attention.out_lin", "layers.{i}.attention.output"),
        *layer_norm(f"{_LAYER}.sa_layer_norm", "layers.{i}.attention_norm"),
        *linear(f"{_LAYER}.ffn.lin1", "layers.{i}.intermediate"),
        *linear(f"{_LAYER}.ffn.lin2", "layers.{i}.output"),
        *layer_norm(f"{_LAYER}.output_layer_norm", "layers.{i}.output_norm"),
    ),
    # DistilBERT has no pooler; its masked-LM head (vocab_transform, vocab_layer_norm,
    # vocab_projector) has no rule, so loading reports it unused.
    heads={"distilbert": _HEAD},
    tasks={
        TOKEN_CLASSIFICATION: token_classification("DistilBertForTokenClassification"),
        MULTIPLE_CHOICE: TaskTable("DistilBertForMultipleChoice", "distilbert", _HEAD),
    },
)
