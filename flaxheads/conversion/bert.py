"""Conversion tables for BERT, RoBERTa and XLM-RoBERTa (one encoder, two naming schemes for the
heads; XLM-RoBERTa is RoBERTa's table under another model_type)."""

from __future__ import annotations

import dataclasses

from flaxheads.conversion.table import (
    MULTIPLE_CHOICE, TOKEN_CLASSIFICATION, ArchitectureTable, TaskTable, embedding, layer_norm, linear,
    token_classification,
)

_LAYER = "{base}encoder.layer.{i}"

ENCODER_BACKBONE = (
    *embedding("{base}embeddings.word_embeddings", "embeddings.word_embeddings"),
    *embedding("{base}embeddings.position_embeddings", "embeddings.position_embeddings"),
    *embedding("{base}embeddings.token_type_embeddings", "embeddings.token_type_embeddings"),
    *layer_norm("{base}embeddings.LayerNorm", "embeddings.layer_norm"),
    *linear(f"{_LAYER}.attention.self.query", "layers.{i}.attention.query"),
    *linear(f"{_LAYER}.attention.self.key", "layers.{i}.attention.key"),
    *linear(f"{_LAYER}.attention.self.value", "layers.{i}.attention.value"),
    *linear(f"{_LAYER}.attention.output.dense", "layers.{i}.attention.output"),
    *layer_norm(f"{_LAYER}.attention.output.LayerNorm", "layers.{i}.attention_norm"),
    *linear(f"{_LAYER}.intermediate.dense", "layers.{i}.intermediate"),
    *linear(f"{_LAYER}.output.dense", "layers.{i}.output"),
    *layer_norm(f"{_LAYER}.output.LayerNorm", "layers.{i}.output_norm"),
)

# The pretrained pooler lives in the base model; the "pooler" head owns it in flaxheads.
_POOLER = tuple(linear("{base}pooler.dense", "pooler.dense"))
_POOLER_HEAD = (*_POOLER, *linear("classifier", "classifier"))
"""`BertForSequenceClassification`'s head, and every `*ForMultipleChoice` of this table's families."""

BERT = ArchitectureTable(
    model_type="bert",
    base_prefix="bert",
    base_architecture="BertModel",
    classification_architecture="BertForSequenceClassification",
    canonical_head="pooler",
    backbone=ENCODER_BACKBONE,
    heads={"pooler": _POOLER_HEAD},
    pooler=_POOLER,
    tasks={
        TOKEN_CLASSIFICATION: token_classification("BertForTokenClassification"),
        MULTIPLE_CHOICE: TaskTable("BertForMultipleChoice", "pooler", _POOLER_HEAD),
    },
    nsp_classifier=tuple(linear("cls.seq_relationship", "classifier")),
)

def _roberta_tasks(name: str) -> dict[str, TaskTable]:
    """`RobertaForMultipleChoice` scores a choice with the base model's pooler and a `classifier`
    Linear (not `RobertaClassificationHead`): the "pooler" head under transformers' names."""
    return {
        TOKEN_CLASSIFICATION: token_classification(f"{name}ForTokenClassification"),
        MULTIPLE_CHOICE: TaskTable(f"{name}ForMultipleChoice", "pooler", _POOLER_HEAD),
    }


ROBERTA = ArchitectureTable(
    model_type="roberta",
    base_prefix="roberta",
    base_architecture="RobertaModel",
    classification_architecture="RobertaForSequenceClassification",
    canonical_head="roberta",
    backbone=ENCODER_BACKBONE,
    heads={
        "roberta": (*linear("classifier.dense", "dense"), *linear("classifier.out_proj", "out_proj")),
        "pooler": (*_POOLER, *linear("head.classifier", "classifier")),
    },
    pooler=_POOLER,
    tasks=_roberta_tasks("Roberta"),
)

XLM_ROBERTA = dataclasses.replace(
    ROBERTA,
    model_type="xlm-roberta",
    base_architecture="XLMRobertaModel",
    classification_architecture="XLMRobertaForSequenceClassification",
    tasks=_roberta_tasks("XLMRoberta"),
)
