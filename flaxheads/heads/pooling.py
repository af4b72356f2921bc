"""Ways to turn (batch, seq, hidden) states into one (batch, features) vector per sequence, or,
for packed rows (`HeadInputs.segment_ids`), one (batch, num_segments, features) vector per
example: the dense layers after a pooling function work on either shape unchanged."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flaxheads.backbones import segments
from flaxheads.heads.base import HeadInputs


def first_token_of(inputs: HeadInputs, hidden_BTD: jax.Array) -> jax.Array:
    """`hidden_BTD` at position 0 of each sequence (or at each segment's first token)."""
    if inputs.packed:
        return segments.gather(hidden_BTD, segments.starts(inputs.segment_ids, inputs.num_segments))
    return hidden_BTD[:, 0]


def first_token(inputs: HeadInputs) -> jax.Array:
    """The last layer's state at position 0 ([CLS] / <s>), as BERT and RoBERTa classify."""
    return first_token_of(inputs, inputs.hidden_states[-1])


def first_token_positions(inputs: HeadInputs) -> jax.Array:
    """(batch, P) int32: the positions `first_token` reads, 0 (P = 1) or each segment's first
    token (P = num_segments). Needs no hidden states: a model asks before running the backbone."""
    if inputs.packed:
        return segments.starts(inputs.segment_ids, inputs.num_segments)
    return jnp.zeros((inputs.input_ids.shape[0], 1), jnp.int32)


def positions_read(pool, inputs: HeadInputs) -> jax.Array | None:
    """The last-layer positions the pooling function `pool` reads (`first_token_positions` for
    `first_token`), or None when it reads every position (a mean) or more than the last layer."""
    return first_token_positions(inputs) if pool is first_token else None


def first_real_token(inputs: HeadInputs) -> jax.Array:
    """The last layer's state at each row's first real token (the first position whose attention
    mask is 1; position 0 without a mask, or in a row with no real token): what
    `ModernBertForMultipleChoice` reads as its "cls" token, left padding included. Packed rows:
    each segment's first token."""
    if inputs.packed or inputs.attention_mask is None:
        return first_token(inputs)
    hidden_BTD = inputs.hidden_states[-1]
    # argmax returns the first maximum: the first 1 of the mask, or 0 for an all-padding row.
    index_B = jnp.argmax(inputs.attention_mask != 0, axis=-1)
    return jnp.take_along_axis(hidden_BTD, index_B[:, None, None], axis=1)[:, 0]


def masked_mean(inputs: HeadInputs) -> jax.Array:
    """Mean of the last layer over real tokens only; padding never dilutes the average."""
    hidden_BTD = inputs.hidden_states[-1]
    if inputs.packed:
        return segments.mean(hidden_BTD, inputs.segment_ids, inputs.num_segments)
    mask_BT = inputs.attention_mask
    if mask_BT is None:
        mask_BT = jnp.ones(hidden_BTD.shape[:2], jnp.int32)
    weights_BT1 = mask_BT.astype(hidden_BTD.dtype)[..., None]
    # An all-padding row would divide by zero; it has no real token to average, so it gets 0s.
    count_B1 = jnp.maximum(weights_BT1.sum(axis=1), 1.0)
    return (hidden_BTD * weights_BT1).sum(axis=1) / count_B1


def real_tokens_of_each_example(inputs: HeadInputs, hidden_BTD: jax.Array) -> jax.Array:
    """(batch, S, T) bool: token t is a real token of example s; S = 1 for unpacked rows (their
    attention mask; every token without one), the segments for packed rows."""
    if inputs.packed:
        return segments.one_hot(inputs.segment_ids, inputs.num_segments)
    if inputs.attention_mask is None:
        return jnp.ones((hidden_BTD.shape[0], 1, hidden_BTD.shape[1]), bool)
    return (inputs.attention_mask != 0)[:, None, :]


def per_example(inputs: HeadInputs, pooled_BSD: jax.Array) -> jax.Array:
    """(batch, S, features) for packed rows, (batch, features) for unpacked ones (S = 1)."""
    return pooled_BSD if inputs.packed else pooled_BSD[:, 0]


def masked_max(inputs: HeadInputs) -> jax.Array:
    """Elementwise max of the last layer over real tokens only (each segment's alone)."""
    hidden_BTD = inputs.hidden_states[-1]
    real_BST = real_tokens_of_each_example(inputs, hidden_BTD)
    lowest = jnp.finfo(hidden_BTD.dtype).min
    max_BSD = jnp.max(jnp.where(real_BST[..., None], hidden_BTD[:, None], lowest), axis=2)
    # An example without a real token (an all-padding row) has nothing to take the max of: 0s, as its mean.
    return per_example(inputs, jnp.where(real_BST.any(axis=-1, keepdims=True), max_BSD, 0.0))


def mean_max(inputs: HeadInputs) -> jax.Array:
    """Masked mean and masked max of the last layer, concatenated: (..., 2 * hidden)."""
    return jnp.concatenate([masked_mean(inputs), masked_max(inputs)], axis=-1)


def attention_pool(inputs: HeadInputs, scores_BT: jax.Array) -> jax.Array:
    """The last layer's real tokens averaged with softmax(`scores`) weights, the softmax taken over
    each example's real tokens only (each segment's alone); 0s for an example without one."""
    hidden_BTD = inputs.hidden_states[-1]
    real_BST = real_tokens_of_each_example(inputs, hidden_BTD)
    scores_BST = jnp.where(real_BST, scores_BT.astype(jnp.float32)[:, None, :], -jnp.inf)
    top_BS1 = jnp.max(scores_BST, axis=-1, keepdims=True)
    # exp(-inf - finite) is 0 for padding; the where keeps an example with no real token (top -inf) from NaN.
    weights_BST = jnp.where(real_BST, jnp.exp(scores_BST - jnp.where(jnp.isfinite(top_BS1), top_BS1, 0.0)), 0.0)
    weights_BST = weights_BST / jnp.maximum(weights_BST.sum(axis=-1, keepdims=True), jnp.finfo(jnp.float32).tiny)
    return per_example(inputs, jnp.einsum("BST,BTD->BSD", weights_BST.astype(hidden_BTD.dtype), hidden_BTD))


def concat_last4_first_token(inputs: HeadInputs) -> jax.Array:
    """First-token states of the last four layers, last layer first: (batch, 4 * hidden)."""
    return jnp.concatenate([first_token_of(inputs, inputs.hidden_states[-k]) for k in range(1, 5)], axis=-1)
