"""Conversion table for ELECTRA (`ElectraModel`, `ElectraForPreTraining`, `ElectraForMaskedLM`,
`ElectraForSequenceClassification`): BERT's encoder names under `electra.`, plus the projection
from embedding_size to hidden_size, which only models with embedding_size != hidden_size have."""

from __future__ import annotations

from flaxheads.conversion.bert import ENCODER_BACKBONE
from flaxheads.conversion.table import (
    MULTIPLE_CHOICE, TOKEN_CLASSIFICATION, ArchitectureTable, TaskTable, linear, token_classification,
)

ELECTRA = ArchitectureTable(
    model_type="electra",
    base_prefix="electra",
    base_architecture="ElectraModel",
    classification_architecture="ElectraForSequenceClassification",
    canonical_head="electra",
    # A model without `embeddings_project` (embedding_size == hidden_size) skips its rule.
    backbone=(*ENCODER_BACKBONE, *linear("{base}embeddings_project", "embeddings_project")),
    # No pooler in ELECTRA: the "pooler" head on it is new, stored in flaxheads' own layout.
    heads={"electra": (*linear("classifier.dense", "dense"), *linear("classifier.out_proj", "out_proj"))},
    tasks={
        TOKEN_CLASSIFICATION: token_classification("ElectraForTokenClassification"),
        # ElectraSequenceSummary, then a one-output `classifier`: the "summary" head (its output
        # layer `logits_proj` is transformers' `classifier` here).
        MULTIPLE_CHOICE: TaskTable("ElectraForMultipleChoice", "summary", (
            *linear("sequence_summary.summary", "summary"), *linear("classifier", "logits_proj"))),
    },
)
