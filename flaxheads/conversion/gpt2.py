"""Conversion table for GPT-2: `GPT2Model`, `GPT2LMHeadModel`, `GPT2ForSequenceClassification`.

transformers keeps GPT-2's projections in `Conv1D` modules whose weights are stored (in, out),
the Flax layout, so they convert without a transpose (`conv1d`); only the classifier `score`
is an `nn.Linear` (out, in). `GPT2LMHeadModel`'s `lm_head.weight` is tied to `wte` and usually
absent from the file; when present it is reported as unused, as are the causal-mask buffers
(`attn.bias`, `attn.masked_bias`) that old checkpoints carry.
"""

from __future__ import annotations

from flaxheads.conversion.table import (
    LINEAR, TOKEN_CLASSIFICATION, ArchitectureTable, Rule, conv1d, embedding, layer_norm, token_classification,
)

_BLOCK = "{base}h.{i}"

GPT2_BACKBONE = (
    *embedding("{base}wte", "token_embeddings"),
    *embedding("{base}wpe", "position_embeddings"),
    *layer_norm(f"{_BLOCK}.ln_1", "layers.{i}.attention_norm"),
    *conv1d(f"{_BLOCK}.attn.c_attn", "layers.{i}.attention.qkv"),
    *conv1d(f"{_BLOCK}.attn.c_proj", "layers.{i}.attention.output"),
    *layer_norm(f"{_BLOCK}.ln_2", "layers.{i}.mlp_norm"),
    *conv1d(f"{_BLOCK}.mlp.c_fc", "layers.{i}.intermediate"),
    *conv1d(f"{_BLOCK}.mlp.c_proj", "layers.{i}.output"),
    *layer_norm("{base}ln_f", "final_norm"),
)

GPT2 = ArchitectureTable(
    model_type="gpt2",
    base_prefix="transformer",
    base_architecture="GPT2Model",
    classification_architecture="GPT2ForSequenceClassification",
    canonical_head="last_token",
    backbone=GPT2_BACKBONE,
    # `score` is a bias-free nn.Linear outside the base model: "score.weight", no prefix.
    heads={"last_token": (Rule("score.weight", "score.kernel", LINEAR),)},
    # GPT2ForTokenClassification's Linear is `classifier`, with a bias (the sequence classifier's is `score`).
    tasks={TOKEN_CLASSIFICATION: token_classification("GPT2ForTokenClassification")},
)
