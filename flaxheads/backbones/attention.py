"""Scaled dot-product attention for every backbone: `attend` over (batch, key) padding masks,
per-query masks, packed rows (segment ids), additive biases, causal and sliding windows, with
dropout on the probabilities in training.

`attend` picks its kernel by backend (`kernel`): on GPUs cuDNN's flash attention (half precision;
padding as key lengths) or, for packed rows, the Pallas GPU flash attention; on TPUs the Pallas
splash attention; XLA's everywhere else, and for what no fused kernel expresses (a bias, a
per-query mask without segment ids, ModernBERT's two-sided window on GPUs, dropout in training).
`FLAXHEADS_ATTENTION=xla` in the environment, `set_implementation("xla")` or
`with implementation("xla"):` force XLA's kernel everywhere; "auto" (the default) picks by backend.
The choice is made while tracing: a function jitted before a change keeps its kernel.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Iterator

import jax
import jax.numpy as jnp
from flax import nnx

from flaxheads.backbones import dropout, fused_attention, segments

ENVIRONMENT_VARIABLE = "FLAXHEADS_ATTENTION"
"""Environment variable read by `configured_implementation`: "auto" (default) or "xla"."""

IMPLEMENTATIONS = ("auto", "xla")

XLA, CUDNN, PALLAS_GPU, SPLASH = "xla", "cudnn", "pallas_gpu", "splash"
"""The kernels `kernel` chooses between (`fused_attention` holds the fused ones)."""

_HALF_PRECISION = (jnp.bfloat16, jnp.float16)

_setting: str | None = None
"""`set_implementation`'s value; None defers to the environment variable."""


def set_implementation(name: str | None) -> None:
    """Use `name` ("auto" or "xla") for every attention traced from now on; None goes back to
    the environment variable. ValueError for another name."""
    global _setting
    _setting = None if name is None else _checked(name, "set_implementation")


@contextlib.contextmanager
def implementation(name: str) -> Iterator[None]:
    """`with attention.implementation("xla"):` traces the attention inside with that setting,
    and restores the previous one after."""
    global _setting
    previous, _setting = _setting, _checked(name, "implementation")
    try:
        yield
    finally:
        _setting = previous


def configured_implementation() -> str:
    """"auto" or "xla": `set_implementation` / `implementation`'s setting if any, else the
    environment variable FLAXHEADS_ATTENTION (default "auto")."""
    if _setting is not None:
        return _setting
    return _checked(os.environ.get(ENVIRONMENT_VARIABLE, "auto").strip().lower() or "auto", ENVIRONMENT_VARIABLE)


def _checked(name: str, where: str) -> str:
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"{where}: attention implementation {name!r} is not one of {IMPLEMENTATIONS}")
    return name


def _backend() -> str:
    """The platform attention runs on ("cpu", "gpu", "tpu"); tests replace it."""
    return jax.default_backend()


def kernel(
    query_BTNH: jax.Array,
    key_BSKH: jax.Array,
    mask_BS: jax.Array | None = None,
    *,
    segment_ids_BT: jax.Array | None = None,
    has_bias: bool = False,
    is_causal: bool = False,
    local_window_size: int | None = None,
    dropout_active: bool = False,
    query_rows: bool = False,
    backend: str | None = None,
    padding_side: str | None = None,
) -> str:
    """Which kernel `attend` runs for these inputs on `backend` (default: `_backend()`): one of
    XLA, CUDNN, PALLAS_GPU, SPLASH. XLA whenever the setting says "xla", and for a bias, dropout,
    queries that are rows of a longer sequence, a per-query mask without segment ids, or queries
    and keys of different lengths. Otherwise: TPU -> SPLASH; GPU in half precision -> PALLAS_GPU
    for packed rows without a window, CUDNN for the rest but a two-sided window (cuDNN's windows
    look left only); XLA on every other platform and dtype.

    `padding_side="left"` says a (batch, key) padding mask pads on the left (the tokenizer's side,
    decoders'): cuDNN takes right padding only, as key lengths, so such a mask goes to XLA here,
    while tracing, instead of to cuDNN's adapter, which would check at run time (`lax.cond`) and
    then run XLA's kernel anyway. None or "right": the adapter's run-time check stays."""
    per_query_mask = mask_BS is not None and mask_BS.ndim == 4 and segment_ids_BT is None
    if (configured_implementation() == "xla" or has_bias or dropout_active or query_rows or per_query_mask
            or query_BTNH.shape[1] != key_BSKH.shape[1]):
        return XLA
    backend = _backend() if backend is None else backend
    if backend == "tpu":
        return SPLASH
    if backend != "gpu" or query_BTNH.dtype not in _HALF_PRECISION:
        return XLA
    if segment_ids_BT is not None:
        return PALLAS_GPU if local_window_size is None else XLA
    if local_window_size is not None and not is_causal:
        return XLA
    if padding_side == "left" and mask_BS is not None:
        return XLA
    return CUDNN


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
    segment_ids_BT: jax.Array | None = None,
    padding_side: str | None = None,
) -> jax.Array:
    """Scaled dot-product attention over a (batch, key) padding mask; returns BTNH.

    Keys and values may have fewer heads than the queries (grouped-query attention: K heads
    dividing N, query head n reading key/value head n // (N // K)).
    `scale` multiplies the query-key logits; None means 1/sqrt(head_dim). A query whose every
    key is masked (with `is_causal`, a left-padding position) gets an average of all values from
    XLA's kernel; kernels differ there, so a backbone that needs a defined value sets it itself
    (GPT-2 zeroes those rows, as torch does). Real queries never see such rows: they are padding.

    `mask_BS` may also be (batch, 1, query, key): a mask per query and key (DeBERTa masks padded
    queries too; such a row gets the average of all values, as torch's masked softmax gives).
    `segment_ids_BT` (batch, T) says a packed row's examples (`segments`): the fused kernels read
    these ids; XLA's reads `mask_BS`, which must then be `segments.attention_mask(segment_ids_BT)`
    or None (built from the ids). Without the ids a per-query mask runs on XLA's kernel.
    `bias_BNTS`, broadcastable to (batch, heads, query, key), is added to the scaled logits before
    masking (DeBERTa's relative-position scores); XLA then runs the attention.
    `local_window_size` w lets query t see only keys s with |t - s| <= w (ModernBERT's
    bidirectional sliding window), on top of the padding mask; with `is_causal`, t - w <= s <= t.

    The kernel is chosen by `kernel` (module doc): fused kernels on GPUs and TPUs, XLA's on CPUs;
    `padding_side="left"` (the tokenizer pads left) keeps a padding mask off cuDNN (`kernel`).
    Attention-probability dropout (as BERT trains with) has no fused form that draws our masks,
    so in train mode at a non-zero rate the probabilities are materialised; that needs `rngs`
    (ValueError without, as `dropout.apply`).
    `query_rows` says the queries are rows of a longer sequence (`dropout.Rows` on axis 1 of the
    queries): the probabilities then drop the units the full sequence's scores drop there.
    """
    dropout_active = dropout.active(dropout_rate, deterministic=deterministic, rngs=rngs)
    chosen = kernel(query_BTNH, key_BSNH, mask_BS, segment_ids_BT=segment_ids_BT, has_bias=bias_BNTS is not None,
                    is_causal=is_causal, local_window_size=local_window_size, dropout_active=dropout_active,
                    query_rows=query_rows is not None, padding_side=padding_side)
    if chosen != XLA:
        return _fused(chosen, query_BTNH, key_BSNH, value_BSNH, mask_BS, segment_ids_BT, is_causal=is_causal,
                      scale=scale, local_window_size=local_window_size)
    if mask_BS is None and segment_ids_BT is not None:
        mask_BS = segments.attention_mask(segment_ids_BT)
    if mask_BS is None:
        mask_B11S = None
    else:
        mask_B11S = (mask_BS if mask_BS.ndim == 4 else mask_BS[:, None, None, :]).astype(bool)
    if not dropout_active:
        return jax.nn.dot_product_attention(
            query_BTNH, key_BSNH, value_BSNH, bias=bias_BNTS, mask=mask_B11S, is_causal=is_causal, scale=scale,
            local_window_size=local_window_size,
        )
    return _xla_with_dropout(query_BTNH, key_BSNH, value_BSNH, mask_B11S, bias_BNTS=bias_BNTS, is_causal=is_causal,
                             scale=scale, local_window_size=local_window_size, dropout_rate=dropout_rate, rngs=rngs,
                             query_rows=query_rows)


def _fused(chosen: str, query_BTNH, key_BSKH, value_BSKH, mask_BS, segment_ids_BT, *, is_causal: bool,
           scale: float | None, local_window_size: int | None) -> jax.Array:
    """`attend` on the fused kernel `chosen` (`kernel` vouched that it expresses the inputs)."""
    if chosen == CUDNN:
        return fused_attention.cudnn(query_BTNH, key_BSKH, value_BSKH, mask_BS, is_causal=is_causal, scale=scale,
                                     local_window_size=local_window_size)
    scale = 1.0 / math.sqrt(query_BTNH.shape[-1]) if scale is None else scale
    # Pallas runs its kernels in interpret mode off their own device (how the tests run them).
    if chosen == PALLAS_GPU:
        return fused_attention.pallas_gpu(query_BTNH, key_BSKH, value_BSKH, segment_ids_BT, is_causal=is_causal,
                                          scale=scale, interpret=jax.default_backend() != "gpu")
    ids = fused_attention.segment_ids_for(mask_BS, segment_ids_BT, query_BTNH.shape[1])
    return fused_attention.splash(query_BTNH, key_BSKH, value_BSKH, ids, is_causal=is_causal, scale=scale,
                                  local_window_size=local_window_size, interpret=jax.default_backend() != "tpu")


def _xla_with_dropout(query_BTNH, key_BSKH, value_BSKH, mask_B11S, *, bias_BNTS, is_causal, scale,
                      local_window_size, dropout_rate, rngs, query_rows) -> jax.Array:
    """The probabilities materialised, dropped as `dropout.apply` drops, then applied."""
    groups = query_BTNH.shape[2] // key_BSKH.shape[2]
    # transformers' repeat_kv: query head n reads key/value head n // groups.
    key_BSNH, value_BSNH = (x if groups == 1 else jnp.repeat(x, groups, axis=2) for x in (key_BSKH, value_BSKH))
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
