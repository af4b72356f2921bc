"""Sequence-classification heads. Any head sits on any backbone; names are public API.

| name           | computation                                                        | reference                      |
|----------------|--------------------------------------------------------------------|--------------------------------|
| `pooler`       | tanh(dense(first token)) -> dropout -> linear                      | `BertForSequenceClassification`, `AlbertForSequenceClassification` |
| `roberta`      | first token -> dropout -> dense -> tanh -> dropout -> out_proj     | `RobertaClassificationHead`    |
| `electra`      | first token -> dropout -> dense -> GELU -> dropout -> out_proj     | `ElectraClassificationHead`    |
| `cls`          | first token -> dropout -> linear                                   | BERT paper                     |
| `mean`         | mean over real tokens (attention mask) -> dropout -> linear        |                                |
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
"""

from __future__ import annotations

from flax import nnx

from flaxheads.backbones import layers
from flaxheads.heads import pooling
from flaxheads.heads.base import HeadConfig, HeadInputs
from flaxheads.heads.classifiers import (
    DebertaHead, DistilBertHead, LinearHead, ModernBertHead, PoolerHead, RobertaHead,
)
from flaxheads.heads.last_token import LastTokenHead
from flaxheads.heads.summary import SummaryHead

HEAD_NAMES = (
    "pooler", "roberta", "cls", "mean", "concat_last4", "last_token", "summary", "electra", "distilbert", "deberta",
    "modernbert",
)


def build_head(cfg: HeadConfig, *, dtype, param_dtype, rngs: nnx.Rngs) -> nnx.Module:
    """The head called `cfg.name`; ValueError listing the known names otherwise."""
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    d = cfg.hidden_size
    if cfg.name == "pooler":
        return PoolerHead(cfg, **kw)
    if cfg.name == "roberta":
        return RobertaHead(cfg, **kw)
    if cfg.name == "electra":
        # GELU whatever the backbone's hidden_act: transformers' head hard-codes it.
        return RobertaHead(cfg, activation=layers.activation("gelu"), **kw)
    if cfg.name == "cls":
        return LinearHead(cfg, pooling.first_token, d, **kw)
    if cfg.name == "mean":
        return LinearHead(cfg, pooling.masked_mean, d, **kw)
    if cfg.name == "concat_last4":
        if cfg.num_hidden_layers < 4:
            raise ValueError(
                f'head "concat_last4" needs at least 4 layers; the backbone has '
                f"{cfg.num_hidden_layers}: choose another head, e.g. head=\"cls\""
            )
        return LinearHead(cfg, pooling.concat_last4_first_token, 4 * d, **kw)
    if cfg.name == "last_token":
        return LastTokenHead(cfg, **kw)
    if cfg.name == "summary":
        return SummaryHead(cfg, **kw)
    if cfg.name == "distilbert":
        return DistilBertHead(cfg, **kw)
    if cfg.name == "deberta":
        return DebertaHead(cfg, **kw)
    if cfg.name == "modernbert":
        return ModernBertHead(cfg, **kw)
    raise ValueError(f"unknown head {cfg.name!r}; choose one of {HEAD_NAMES}")


__all__ = ["HEAD_NAMES", "HeadConfig", "HeadInputs", "build_head"]
