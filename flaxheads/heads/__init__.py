"""Sequence-classification heads. Any head sits on any backbone; names are public API.

| name           | computation                                                        | reference                      |
|----------------|--------------------------------------------------------------------|--------------------------------|
| `pooler`       | tanh(dense(first token)) -> dropout -> linear                      | `BertForSequenceClassification`, `AlbertForSequenceClassification` |
| `roberta`      | first token -> dropout -> dense -> tanh -> dropout -> out_proj     | `RobertaClassificationHead`    |
| `electra`      | first token -> dropout -> dense -> GELU -> dropout -> out_proj     | `ElectraClassificationHead`    |
| `cls`          | first token -> dropout -> linear                                   | BERT paper                     |
| `mean`         | mean over real tokens (attention mask) -> dropout -> linear        |                                |
| `mean_max`     | mean and max over real tokens, concatenated -> dropout -> linear   |                                |
| `attention`    | softmax(query . token) weighted mean over real tokens -> dropout -> linear (one learned query) |  |
| `concat_last4` | first token of the last 4 layers, concatenated -> dropout -> linear |                                |
| `last_token`   | last real token (pad id, else mask; see `last_token.py`) -> score, no bias | `GPT2ForSequenceClassification` |
| `summary`      | last/first/mean/cls_index -> [dense] -> [tanh] -> logits_proj (see `summary.py`) | `XLNetForSequenceClassification` |
| `distilbert`   | first token -> pre_classifier -> ReLU -> dropout -> classifier      | `DistilBertForSequenceClassification` |
| `deberta`      | first token -> dropout (pooler_dropout) -> dense -> pooler_hidden_act (GELU) -> dropout -> classifier | `DebertaV2ForSequenceClassification` (`ContextPooler`) |
| `modernbert`   | first token or masked mean (classifier_pooling) -> dense -> act -> LayerNorm -> dropout -> classifier | `ModernBertForSequenceClassification` |

Packed rows (`HeadInputs.segment_ids`, several examples per row): every head reads each segment as
its example alone and unpadded ("first token" is the segment's first, "last real token" and the
means stay inside it) and returns (batch, num_segments, num_labels); the pooling functions
(`pooling`, `segments`) return (batch, num_segments, features) and the layers after them are unchanged.

The other tasks' heads: `TOKEN_HEADS` (`token.py`, one row of logits per token) and `CHOICE_HEADS`
(the sequence heads with one output scoring each choice of a multiple-choice batch).
"""

from __future__ import annotations

from typing import Callable

from flax import nnx

from flaxheads.heads.base import HeadConfig, HeadInputs
from flaxheads.heads.classifiers import (
    AttentionPoolHead, DebertaHead, DistilBertHead, ModernBertHead, PoolerHead, RobertaHead, concat_last4_head, cls_head,
    electra_head, mean_head, mean_max_head, modernbert_choice_head,
)
from flaxheads.heads.last_token import LastTokenHead
from flaxheads.heads.summary import SummaryHead
from flaxheads.heads.token import TokenHead, modernbert_token_head

HeadBuilder = Callable[..., nnx.Module]
"""`builder(cfg: HeadConfig, *, dtype, param_dtype, rngs) -> head module`."""

HEADS: dict[str, HeadBuilder] = {
    "pooler": PoolerHead,
    "roberta": RobertaHead,
    "cls": cls_head,
    "mean": mean_head,
    "mean_max": mean_max_head,
    "attention": AttentionPoolHead,
    "concat_last4": concat_last4_head,
    "last_token": LastTokenHead,
    "summary": SummaryHead,
    "electra": electra_head,
    "distilbert": DistilBertHead,
    "deberta": DebertaHead,
    "modernbert": ModernBertHead,
}
"""Every head by its public name. A new head is one module with its builder plus one line here."""

HEAD_NAMES = tuple(HEADS)

TOKEN_HEADS: dict[str, HeadBuilder] = {
    "linear": TokenHead,
    "modernbert": modernbert_token_head,
}
"""Token-classification heads (`heads/token.py`): (batch, seq, num_labels) logits. Each family's
is the one its conversion table names (`ArchitectureTable.tasks`)."""

CHOICE_HEADS: dict[str, HeadBuilder] = {**HEADS, "modernbert": modernbert_choice_head}
"""Multiple-choice heads: a sequence head with one output scores each choice. Each family's is
the one its conversion table names; ModernBERT's reads the first real token where its sequence
classifier reads position 0 (`modernbert_choice_head`)."""


def output_layer(head: nnx.Module) -> nnx.Linear:
    """The Linear layer whose output is a head's logits (each head class names it in OUTPUT_LAYER)."""
    return getattr(head, type(head).OUTPUT_LAYER)


def build_head(cfg: HeadConfig, *, dtype, param_dtype, rngs: nnx.Rngs,
               registry: dict[str, HeadBuilder] = HEADS) -> nnx.Module:
    """The head of `registry` (sequence heads unless given) called `cfg.name`; ValueError listing
    the known names otherwise."""
    try:
        builder = registry[cfg.name]
    except KeyError:
        raise ValueError(f"unknown head {cfg.name!r}; choose one of {tuple(registry)}") from None
    return builder(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs)


__all__ = ["CHOICE_HEADS", "HEADS", "HEAD_NAMES", "HeadBuilder", "HeadConfig", "HeadInputs", "TOKEN_HEADS",
           "build_head", "output_layer"]
