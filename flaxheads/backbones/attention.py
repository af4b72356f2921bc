"""Scaled dot-product attention for every backbone: `attend` over (batch, key) padding masks,
per-query masks, additive biases, causal and sliding windows, with dropout on the probabilities
in training. Fused kernels where the backend has them (cuDNN on GPUs for half precision)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from flaxheads.backbones import dropout

def _fused_implementation(query: jax.Array) -> str | None:
    """cuDNN's fused attention on GPUs for the half-precision dtypes it supports; XLA elsewhere
    (`None` lets jax choose, which today means XLA's own fusion)."""
    if jax.default_backend() == "gpu" and query.dtype in (jnp.bfloat16, jnp.float16):
        return "cudnn"
    return None


def attend(
    query_BTNH: jax.Array,
    key_BSNH: jax.Array,
    value_BSNH: jax.Array,
    mask_BS: jax.Array | None,
    *,
    bias_BNTS: jax.Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    local_window_size: int | None = None,
    dropout_rate: float = 0.0,
    deterministic: bool = False,
    rngs: nnx.Rngs | None = None,
    query_rows: dropout.Rows | None = None,
) -> jax.Array:
    """Scaled dot-product attention over a (batch, key) padding mask; returns BTNH.

    `scale` multiplies the query-key logits; None means 1/sqrt(head_dim). A query whose every
    key is masked (with `is_causal`, a left-padding position) gets an average of all values from
    XLA's kernel; kernels differ there, so a backbone that needs a defined value sets it itself
    (GPT-2 zeroes those rows, as torch does). Real queries never see such rows: they are padding.

    `mask_BS` may also be (batch, 1, query, key): a mask per query and key (DeBERTa masks padded
    queries too; such a row gets the average of all values, as torch's masked softmax gives).
    `bias_BNTS`, broadcastable to (batch, heads, query, key), is added to the scaled logits before
    masking (DeBERTa's relative-position scores); XLA then runs the attention, not cuDNN.
    `local_window_size` w lets query t see only keys s with |t - s| <= w (ModernBERT's
    bidirectional sliding window), on top of the padding mask.

    Eval mode (`deterministic`) and dropout-free training go through
    `jax.nn.dot_product_attention`, which GPUs run as a fused kernel. Attention-probability
    dropout (as BERT trains with) has no fused form there, so in train mode at a non-zero rate
    the probabilities are materialised; that needs `rngs` (ValueError without, as `dropout.apply`).
    `query_rows` says the queries are rows of a longer sequence (`dropout.Rows` on axis 1 of the
    queries): the probabilities then drop the units the full sequence's scores drop there.
    """
    if mask_BS is None:
        mask_B11S = None
    else:
        mask_B11S = (mask_BS if mask_BS.ndim == 4 else mask_BS[:, None, None, :]).astype(bool)
    if not dropout.active(dropout_rate, deterministic=deterministic, rngs=rngs):
        return jax.nn.dot_product_attention(
            query_BTNH, key_BSNH, value_BSNH, bias=bias_BNTS, mask=mask_B11S, is_causal=is_causal, scale=scale,
            local_window_size=local_window_size,
            # cuDNN's fused kernel takes neither a bias nor a two-sided window: those go to XLA's.
            implementation=_fused_implementation(query_BTNH) if bias_BNTS is None and local_window_size is None else None,
        )
    scale = 1.0 / math.sqrt(query_BTNH.shape[-1]) if scale is None else scale
    logits_BNTS = jnp.einsum("BTNH,BSNH->BNTS", query_BTNH, key_BSNH) * scale
    if bias_BNTS is not None:
        logits_BNTS = logits_BNTS + bias_BNTS
    if is_causal:
        t, s = logits_BNTS.shape[-2:]
        causal_TS = jnp.tril(jnp.ones((t, s), bool))
        mask_B11S = causal_TS if mask_B11S is None else mask_B11S & causal_TS
    if local_window_size is not None:
        t, s = logits_BNTS.shape[-2:]
        band_TS = jnp.abs(jnp.arange(t)[:, None] - jnp.arange(s)[None, :]) <= local_window_size
        mask_B11S = band_TS if mask_B11S is None else mask_B11S & band_TS
    if mask_B11S is not None:
        logits_BNTS = jnp.where(mask_B11S, logits_BNTS, jnp.finfo(logits_BNTS.dtype).min)
    probs_BNTS = jax.nn.softmax(logits_BNTS.astype(jnp.float32), axis=-1).astype(value_BSNH.dtype)
    rows = None if query_rows is None else dropout.Rows(2, query_rows.index[:, None, :, None], query_rows.length)
    probs_BNTS = dropout.apply(probs_BNTS, dropout_rate, rngs, deterministic=False, rows=rows)
    return jnp.einsum("BNTS,BSNH->BTNH", probs_BNTS, value_BSNH)
