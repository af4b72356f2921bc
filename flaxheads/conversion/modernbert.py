"""Conversion table for ModernBERT: `ModernBertModel`, `ModernBertForMaskedLM`,
`ModernBertForSequenceClassification`.

Every bias and the LayerNorm biases are optional (`attention_bias`, `mlp_bias`, `norm_bias`,
`classifier_bias`) and layer 0 has no `attn_norm`: the table names every tensor a ModernBERT may
have and a model built without one skips its rule. `ModernBertForMaskedLM` and
`ModernBertForSequenceClassification` share the prediction head's names (`head.dense`,
`head.norm`): loading a masked-LM checkpoint with the "modernbert" head takes them as pretrained,
as transformers does; only `decoder.*` (the vocabulary projection) is then unused. Heads
transformers has no class for are stored under `flaxheads_head.` instead of `head.`, so that a
"roberta" head's `dense` is never filled from the prediction head's `head.dense`.
"""

from __future__ import annotations

from flaxheads.conversion.table import (
    MULTIPLE_CHOICE, TOKEN_CLASSIFICATION, ArchitectureTable, TaskTable, embedding, layer_norm, linear,
)

_LAYER = "{base}layers.{i}"

MODERNBERT_BACKBONE = (
    *embedding("{base}embeddings.tok_embeddings", "embeddings.tok_embeddings"),
    *layer_norm("{base}embeddings.norm", "embeddings.norm"),
    *layer_norm(f"{_LAYER}.attn_norm", "layers.{i}.attn_norm"),  # layers 1.. only
    *linear(f"{_LAYER}.attn.Wqkv", "layers.{i}.attn.Wqkv"),
    *linear(f"{_LAYER}.attn.Wo", "layers.{i}.attn.Wo"),
    *layer_norm(f"{_LAYER}.mlp_norm", "layers.{i}.mlp_norm"),
    *linear(f"{_LAYER}.mlp.Wi", "layers.{i}.mlp.Wi"),
    *linear(f"{_LAYER}.mlp.Wo", "layers.{i}.mlp.Wo"),
    *layer_norm("{base}final_norm", "final_norm"),
)

_HEAD = (*linear("head.dense", "dense"), *layer_norm("head.norm", "norm"), *linear("classifier", "classifier"))

MODERNBERT = ArchitectureTable(
    model_type="modernbert",
    base_prefix="model",
    base_architecture="ModernBertModel",
    classification_architecture="ModernBertForSequenceClassification",
    canonical_head="modernbert",
    backbone=MODERNBERT_BACKBONE,
    own_head_prefix="flaxheads_head.",
    heads={"modernbert": _HEAD},
    # The token classifier runs the same prediction head on every token.
    tasks={
        TOKEN_CLASSIFICATION: TaskTable("ModernBertForTokenClassification", "modernbert", _HEAD),
        MULTIPLE_CHOICE: TaskTable("ModernBertForMultipleChoice", "modernbert", _HEAD),
    },
)
