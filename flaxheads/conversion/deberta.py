"""Conversion table for DeBERTa-v2/v3 (`DebertaV2Model`, `DebertaV2ForMaskedLM`,
`DebertaV2ForSequenceClassification`).

The table names every tensor a DeBERTa may have; a model built without an optional part (position
embeddings without position_biased_input, token types with type_vocab_size 0, `embed_proj`
when embedding_size == hidden_size, separate position projections with share_att_key, the
relative-position LayerNorm, the ConvLayer) skips its rules. Pretraining heads have no rule, so
loading reports them unused: the masked-LM head (`lm_predictions.*`, or `cls.predictions.*` with
legacy=True) and the replaced-token-detection head of ELECTRA-style v3 checkpoints (`mask_predictions.*`).
"""

from __future__ import annotations

from flaxheads.conversion.table import (
    MULTIPLE_CHOICE, TOKEN_CLASSIFICATION, ArchitectureTable, Rule, TaskTable, Transform, embedding, layer_norm, linear,
    token_classification, transposed,
)

# torch's Conv1d stores (out, in / groups, kernel); Flax's Conv kernel is (kernel, in / groups, out):
# the same axes reversed, both ways.
CONV1D_REVERSED = Transform("reverse axes (out, in, k) <-> (k, in, out)", transposed, transposed, lambda s: s[::-1])

_LAYER = "{base}encoder.layer.{i}"
_ATTENTION = f"{_LAYER}.attention.self"

DEBERTA_V2_BACKBONE = (
    *embedding("{base}embeddings.word_embeddings", "embeddings.word_embeddings"),
    *embedding("{base}embeddings.position_embeddings", "embeddings.position_embeddings"),
    *embedding("{base}embeddings.token_type_embeddings", "embeddings.token_type_embeddings"),
    *linear("{base}embeddings.embed_proj", "embeddings.embed_proj"),  # no bias: its rule is skipped
    *layer_norm("{base}embeddings.LayerNorm", "embeddings.layer_norm"),
    *embedding("{base}encoder.rel_embeddings", "rel_embeddings"),
    *layer_norm("{base}encoder.LayerNorm", "rel_embeddings_norm"),
    Rule("{base}encoder.conv.conv.weight", "conv.conv.kernel", CONV1D_REVERSED),
    Rule("{base}encoder.conv.conv.bias", "conv.conv.bias"),
    *layer_norm("{base}encoder.conv.LayerNorm", "conv.layer_norm"),
    *linear(f"{_ATTENTION}.query_proj", "layers.{i}.attention.query"),
    *linear(f"{_ATTENTION}.key_proj", "layers.{i}.attention.key"),
    *linear(f"{_ATTENTION}.value_proj", "layers.{i}.attention.value"),
    *linear(f"{_ATTENTION}.pos_key_proj", "layers.{i}.attention.pos_key"),
    *linear(f"{_ATTENTION}.pos_query_proj", "layers.{i}.attention.pos_query"),
    *linear(f"{_LAYER}.attention.output.dense", "layers.{i}.attention.output"),
    *layer_norm(f"{_LAYER}.attention.output.LayerNorm", "layers.{i}.attention_norm"),
    *linear(f"{_LAYER}.intermediate.dense", "layers.{i}.intermediate"),
    *linear(f"{_LAYER}.output.dense", "layers.{i}.output"),
    *layer_norm(f"{_LAYER}.output.LayerNorm", "layers.{i}.output_norm"),
)

_CONTEXT_POOLER_HEAD = (*linear("pooler.dense", "dense"), *linear("classifier", "classifier"))

DEBERTA_V2 = ArchitectureTable(
    model_type="deberta-v2",
    base_prefix="deberta",
    base_architecture="DebertaV2Model",
    classification_architecture="DebertaV2ForSequenceClassification",
    canonical_head="deberta",
    backbone=DEBERTA_V2_BACKBONE,
    # ContextPooler sits beside the base model, not in it: the "deberta" head owns it.
    heads={"deberta": _CONTEXT_POOLER_HEAD},
    tasks={
        TOKEN_CLASSIFICATION: token_classification("DebertaV2ForTokenClassification"),
        MULTIPLE_CHOICE: TaskTable("DebertaV2ForMultipleChoice", "deberta", _CONTEXT_POOLER_HEAD),
    },
)
