"""Conversion table for XLNet (`XLNetModel`, `XLNetLMHeadModel`, `XLNetForSequenceClassification`).

The relative-attention projections are stored by transformers as (d_model, n_head, d_head)
parameters and by flaxheads as `nnx.Einsum` kernels of the same layout: no transform.
"""

from __future__ import annotations

from flaxheads.conversion.table import (
    MULTIPLE_CHOICE, TOKEN_CLASSIFICATION, ArchitectureTable, Rule, TaskTable, embedding, layer_norm, linear,
    token_classification,
)

_LAYER = "{base}layer.{i}"
_ATTENTION = "layers.{i}.attention"

XLNET_BACKBONE = (
    *embedding("{base}word_embedding", "word_embedding"),
    Rule("{base}mask_emb", "mask_emb"),
    *(Rule(f"{_LAYER}.rel_attn.{name}", f"{_ATTENTION}.{name}.kernel") for name in ("q", "k", "v", "o", "r")),
    *(
        Rule(f"{_LAYER}.rel_attn.{name}", f"{_ATTENTION}.{name}")
        for name in ("r_r_bias", "r_s_bias", "r_w_bias", "seg_embed")
    ),
    *layer_norm(f"{_LAYER}.rel_attn.layer_norm", f"{_ATTENTION}.layer_norm"),
    *linear(f"{_LAYER}.ff.layer_1", "layers.{i}.ff.layer_1"),
    *linear(f"{_LAYER}.ff.layer_2", "layers.{i}.ff.layer_2"),
    *layer_norm(f"{_LAYER}.ff.layer_norm", "layers.{i}.ff.layer_norm"),
)

_SUMMARY_HEAD = (*linear("sequence_summary.summary", "summary"), *linear("logits_proj", "logits_proj"))

XLNET = ArchitectureTable(
    model_type="xlnet",
    base_prefix="transformer",
    base_architecture="XLNetModel",
    classification_architecture="XLNetForSequenceClassification",
    canonical_head="summary",
    backbone=XLNET_BACKBONE,
    # `sequence_summary.summary` exists only with summary_use_proj=True; a head without it skips that rule.
    heads={"summary": _SUMMARY_HEAD},
    tasks={
        TOKEN_CLASSIFICATION: token_classification("XLNetForTokenClassification"),
        MULTIPLE_CHOICE: TaskTable("XLNetForMultipleChoice", "summary", _SUMMARY_HEAD),
    },
    loading_notes=(
        "XLNet's mask_emb feeds the query stream, which only pretraining uses: it is loaded and "
        "saved (exports stay complete) but classification never reads it",
    ),
)
