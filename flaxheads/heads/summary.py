"""The "summary" head: transformers' `XLNetSequenceSummary` followed by `logits_proj`, as
`XLNetForSequenceClassification` classifies.

    pick a vector (summary_type) -> first dropout -> [summary Linear] -> [activation]
    -> last dropout -> logits_proj

Options (Hugging Face names, `HeadConfig.options`; absent ones take `XLNetConfig`'s defaults,
so the head works on any backbone):

| option                   | default  | meaning                                                       |
|--------------------------|----------|---------------------------------------------------------------|
| `summary_type`           | "last"   | "last", "first", "mean" or "cls_index" (see below)            |
| `summary_use_proj`       | True     | a hidden -> hidden Linear (`summary`) after the pick           |
| `summary_proj_to_labels` | False    | that Linear outputs num_labels instead (only if num_labels == hidden, as in transformers) |
| `summary_activation`     | "tanh"   | any activation name, or None for none                        |
| `summary_first_dropout`  | 0.0      | dropout before the projection                                 |
| `summary_last_dropout`   | 0.1      | dropout after the activation                                  |

What each `summary_type` reads from the last layer:

- "last": the last *real* token (the last position whose attention mask is 1). With left padding
  or none, that is the last position, exactly transformers' `hidden_states[:, -1]`. With right
  padding transformers reads a pad token's state and silently returns wrong logits
  (transformers #1882, zihangdai/xlnet #73); flaxheads reads the last real token instead, so
  right-padded batches classify as their left-padded copies do (and differ from transformers).
- "first": position 0, as transformers. With left padding that is a pad token there too.
- "mean": the mean over *every* position, padding included: transformers' quirk, reproduced
  for parity. flaxheads' own "mean" head is the masked mean over real tokens.
- "cls_index": the position the model's `cls_index` input (batch,) gives per row; without it,
  the last real token (transformers: the last position). `XLNetForSequenceClassification` never
  passes cls_index, so with that architecture transformers always reads the last position.

Packed rows (`HeadInputs.segment_ids`): each segment is read as its example alone and unpadded:
"last" its last token, "first" its first, "mean" the mean over its tokens, "cls_index" the
position `cls_index[b, s]` (batch, num_segments) counts from the segment's first token (its
last token without cls_index).

`HeadConfig.dropout_rate` (`classifier_dropout`) does not apply: the two summary dropouts are
this head's only dropouts, as in transformers.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxheads.backbones import dropout, layers, segments
from flaxheads.heads.base import HeadConfig, HeadInputs

SUMMARY_TYPES = ("last", "first", "mean", "cls_index")
SUMMARY_DEFAULTS: dict[str, Any] = {
    "summary_type": "last",
    "summary_use_proj": True,
    "summary_proj_to_labels": False,
    "summary_activation": "tanh",
    "summary_first_dropout": 0.0,
    "summary_last_dropout": 0.1,
}


def summary_options(cfg: HeadConfig) -> dict[str, Any]:
    """The head's options, defaults filled in; ValueError for unknown keys or bad values."""
    given = dict(cfg.options)
    unknown = sorted(set(given) - set(SUMMARY_DEFAULTS))
    if unknown:
        raise ValueError(f'head "summary" has no option(s) {unknown}; its options are {sorted(SUMMARY_DEFAULTS)}')
    options = {**SUMMARY_DEFAULTS, **given}
    kind = options["summary_type"]
    if kind == "attn":
        raise NotImplementedError('summary_type="attn" is not implemented (nor is it in transformers)')
    if kind not in SUMMARY_TYPES:
        raise ValueError(f"summary_type={kind!r}; choose one of {SUMMARY_TYPES}")
    for key in ("summary_first_dropout", "summary_last_dropout"):
        if not 0.0 <= options[key] < 1.0:
            raise ValueError(f"{key}={options[key]} must be in [0, 1)")
    if options["summary_use_proj"] and options["summary_proj_to_labels"] and cfg.num_labels != cfg.hidden_size:
        raise ValueError(
            f"summary_proj_to_labels=True projects the summary to num_labels={cfg.num_labels} features, but "
            f"logits_proj (as in XLNetForSequenceClassification) takes hidden_size={cfg.hidden_size}; "
            "transformers fails the same way at its first forward pass. Set summary_proj_to_labels=False"
        )
    return options


def last_real_index(attention_mask_BT: jax.Array | None, seq_len: int, batch: int) -> jax.Array:
    """(batch,) index of each row's last position whose mask is 1; the last position for rows
    with no mask or no real token (what transformers reads)."""
    if attention_mask_BT is None:
        return jnp.full((batch,), seq_len - 1, jnp.int32)
    # argmax finds the first 1 of the reversed mask; an all-zero row gives 0, i.e. seq_len - 1.
    from_end_B = jnp.argmax(attention_mask_BT[:, ::-1] != 0, axis=1)
    return (seq_len - 1 - from_end_B).astype(jnp.int32)


def _check_cls_index(cls_index_B: jax.Array, batch: int, seq_len: int, num_segments: int | None = None) -> None:
    shape, per = ((batch,), "one per row") if num_segments is None else (
        (batch, num_segments), "one per segment, counted from the segment's first token")
    if cls_index_B.shape != shape or not jnp.issubdtype(cls_index_B.dtype, jnp.integer):
        raise ValueError(
            f"cls_index must be integer positions of shape {shape}, {per}; got shape "
            f"{tuple(cls_index_B.shape)} and dtype {cls_index_B.dtype}"
        )
    if isinstance(cls_index_B, jax.core.Tracer):
        return
    values = np.asarray(cls_index_B)
    bad = values[(values < 0) | (values >= seq_len)]
    if bad.size:
        raise ValueError(f"cls_index {int(bad[0])} is outside [0, {seq_len}) for sequences of length {seq_len}")


def pick(inputs: HeadInputs, summary_type: str) -> jax.Array:
    """(batch, hidden): the vector `summary_type` reads from the last layer (module doc)."""
    hidden_BTD = inputs.hidden_states[-1]
    batch, seq_len = hidden_BTD.shape[:2]
    if inputs.packed:
        return _pick_packed(inputs, summary_type)
    if summary_type == "first":
        return hidden_BTD[:, 0]
    if summary_type == "mean":
        return hidden_BTD.mean(axis=1)
    cls_index_B = inputs.cls_index if summary_type == "cls_index" else None
    if cls_index_B is None:
        index_B = last_real_index(inputs.attention_mask, seq_len, batch)
    else:
        _check_cls_index(cls_index_B, batch, seq_len)
        index_B = cls_index_B
    return jnp.take_along_axis(hidden_BTD, index_B[:, None, None], axis=1)[:, 0]


def _pick_packed(inputs: HeadInputs, summary_type: str) -> jax.Array:
    """(batch, num_segments, hidden): `pick` for each segment of packed rows (module doc)."""
    hidden_BTD, ids_BT, count = inputs.hidden_states[-1], inputs.segment_ids, inputs.num_segments
    if summary_type == "mean":
        return segments.mean(hidden_BTD, ids_BT, count)
    if summary_type == "first":
        return segments.gather(hidden_BTD, segments.starts(ids_BT, count))
    if summary_type == "cls_index" and inputs.cls_index is not None:
        _check_cls_index(inputs.cls_index, *ids_BT.shape, num_segments=count)
        index_BS = segments.starts(ids_BT, count) + inputs.cls_index.astype(jnp.int32)
        return segments.gather(hidden_BTD, jnp.minimum(index_BS, ids_BT.shape[1] - 1))
    return segments.gather(hidden_BTD, segments.ends(ids_BT, count))


class SummaryHead(nnx.Module):
    """`XLNetSequenceSummary` -> `logits_proj`, options as in the module doc."""

    OUTPUT_LAYER = "logits_proj"
    """The Linear that gives the logits (calibration folds a temperature into it)."""

    def __init__(self, cfg: HeadConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        options = summary_options(cfg)
        self.summary_type = options["summary_type"]
        self.first_dropout = options["summary_first_dropout"]
        self.last_dropout = options["summary_last_dropout"]
        activation = options["summary_activation"]
        self.activation = layers.activation(activation) if activation else None
        kw = dict(init_std=cfg.init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        d = cfg.hidden_size
        width = cfg.num_labels if options["summary_proj_to_labels"] else d
        self.summary = layers.dense(d, width, **kw) if options["summary_use_proj"] else None
        self.logits_proj = layers.dense(d, cfg.num_labels, **kw)
        self.deterministic = False
        """Eval mode: no dropout. `model.train()` / `model.eval()` set it (see `backbones.layers`)."""

    def __call__(self, inputs: HeadInputs, rngs: nnx.Rngs | None = None) -> jax.Array:
        x = dropout.apply(pick(inputs, self.summary_type), self.first_dropout, rngs, deterministic=self.deterministic)
        if self.summary is not None:
            x = self.summary(x)
        if self.activation is not None:
            x = self.activation(x)
        return self.logits_proj(dropout.apply(x, self.last_dropout, rngs, deterministic=self.deterministic))
