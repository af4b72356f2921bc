"""Sequence packing: several examples back to back in one row, told apart by `segment_ids`.

`segment_ids` (batch, T) int: 1 for the first example of a row, 2 for the second, ... S, and 0
for the padding after them; each example's tokens are contiguous and the examples are in order
(the packing contract `data/packing.py` fills). Each example is laid out as its tokenizer made it
alone, so a packed model reproduces the example's logits exactly when

- attention stays within an example (`attention_mask`): a block-diagonal mask, combined with
  the causal mask and sliding windows by the backbones that have them (a window measured in
  sequence indices is the same window within a segment);
- positions restart at every example (`positions`, `segment_cumsum` for fairseq's rule);
- heads read each example's tokens only (`one_hot`, `starts`, `ends`, `gather`): (batch, S, ...)
  in place of (batch, ...), slot s - 1 for segment s.

One home for these rules: backbones and heads call them and never rebuild them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def check(segment_ids_BT: jax.Array, num_segments: int | None, input_ids_BT: jax.Array) -> None:
    """ValueError unless `segment_ids` is (batch, T) ints shaped like `input_ids` and
    `num_segments` a Python int >= 1 (static under jit: it sets the logits' shape)."""
    if num_segments is None:
        raise ValueError(
            "segment_ids was given without num_segments: pass num_segments=S, the most examples a packed "
            "row holds (the logits are (batch, S, num_labels))"
        )
    if isinstance(num_segments, bool) or not isinstance(num_segments, (int, np.integer)) or num_segments < 1:
        raise ValueError(f"num_segments={num_segments!r}: it must be a Python int >= 1 (static under jit)")
    check_ids(segment_ids_BT, input_ids_BT)


def check_ids(segment_ids_BT: jax.Array, input_ids_BT: jax.Array) -> None:
    """ValueError unless `segment_ids` is (batch, T) ints shaped like `input_ids`."""
    if tuple(segment_ids_BT.shape) != tuple(input_ids_BT.shape):
        raise ValueError(
            f"segment_ids has shape {tuple(segment_ids_BT.shape)} but input_ids has {tuple(input_ids_BT.shape)}; "
            "they must match"
        )
    if not jnp.issubdtype(segment_ids_BT.dtype, jnp.integer):
        raise ValueError(f"segment_ids must be integers (0 for padding, 1..S for the examples); got {segment_ids_BT.dtype}")


def attention_mask(segment_ids_BT: jax.Array) -> jax.Array:
    """(batch, 1, query, key) bool: query and key in the same segment. Padding (segment 0) sees
    padding only, so every query sees at least itself and no row of scores is fully masked
    (kernels differ there, and a NaN would reach the heads' sums); real tokens never see it."""
    return segment_ids_BT[:, None, :, None] == segment_ids_BT[:, None, None, :]


def segment_cumsum(values_BT: jax.Array, segment_ids_BT: jax.Array) -> jax.Array:
    """Inclusive cumulative sum of `values` along the row, restarting at every segment (and at
    the padding after them): exact for integers."""
    total_BT = jnp.cumsum(values_BT, axis=1)
    before_BT = total_BT - values_BT
    return total_BT - jnp.take_along_axis(before_BT, run_starts(segment_ids_BT), axis=1)


def run_starts(segment_ids_BT: jax.Array) -> jax.Array:
    """(batch, T) int32: for each position, where its segment (or the padding run) begins."""
    index_BT = jnp.broadcast_to(jnp.arange(segment_ids_BT.shape[1], dtype=jnp.int32), segment_ids_BT.shape)
    is_start_BT = jnp.concatenate(
        [jnp.ones_like(segment_ids_BT[:, :1], bool), segment_ids_BT[:, 1:] != segment_ids_BT[:, :-1]], axis=1
    )
    return jax.lax.cummax(jnp.where(is_start_BT, index_BT, 0), axis=1)


def positions(segment_ids_BT: jax.Array) -> jax.Array:
    """(batch, T) int32 index of each token within its segment: 0, 1, ... from every segment's
    first token (the padding run counts from 0 too, so its positions stay in range)."""
    index_BT = jnp.arange(segment_ids_BT.shape[1], dtype=jnp.int32)
    return index_BT - run_starts(segment_ids_BT)


def one_hot(segment_ids_BT: jax.Array, num_segments: int) -> jax.Array:
    """(batch, S, T) bool: token t belongs to segment s + 1."""
    ids_S1 = jnp.arange(1, num_segments + 1, dtype=segment_ids_BT.dtype)[:, None]
    return segment_ids_BT[:, None, :] == ids_S1


def starts(segment_ids_BT: jax.Array, num_segments: int) -> jax.Array:
    """(batch, S) int32 position of each segment's first token; 0 for an absent segment."""
    return jnp.argmax(one_hot(segment_ids_BT, num_segments), axis=-1).astype(jnp.int32)


def ends(segment_ids_BT: jax.Array, num_segments: int) -> jax.Array:
    """(batch, S) int32 position of each segment's last token; T - 1 for an absent segment."""
    seq = segment_ids_BT.shape[1]
    from_end_BS = jnp.argmax(one_hot(segment_ids_BT, num_segments)[..., ::-1], axis=-1)
    return (seq - 1 - from_end_BS).astype(jnp.int32)


def gather(hidden_BTD: jax.Array, index_BS: jax.Array) -> jax.Array:
    """(batch, S, hidden): the states at one position per segment."""
    return jnp.take_along_axis(hidden_BTD, index_BS[..., None], axis=1)


def scatter(rows_BPD: jax.Array, index_BP: jax.Array, length: int) -> jax.Array:
    """(batch, length, hidden) holding `rows_BPD` at positions `index_BP` and zeros elsewhere: the
    inverse of `gather` for the positions gathered. A position listed twice must carry the same
    row both times (one of them is kept, and the gradient reaches one of them)."""
    batch_B1 = jnp.arange(rows_BPD.shape[0])[:, None]
    zeros_BTD = jnp.zeros((rows_BPD.shape[0], length, *rows_BPD.shape[2:]), rows_BPD.dtype)
    return zeros_BTD.at[batch_B1, index_BP].set(rows_BPD)


def mean(hidden_BTD: jax.Array, segment_ids_BT: jax.Array, num_segments: int) -> jax.Array:
    """(batch, S, hidden) mean of each segment's states (0 for an absent segment)."""
    weights_BST = one_hot(segment_ids_BT, num_segments).astype(hidden_BTD.dtype)
    count_BS1 = jnp.maximum(weights_BST.sum(axis=-1, keepdims=True), 1.0)
    return jnp.einsum("BST,BTD->BSD", weights_BST, hidden_BTD) / count_BS1


def last_where(is_wanted_BT: jax.Array, segment_ids_BT: jax.Array, num_segments: int) -> jax.Array:
    """(batch, S) int32: each segment's rightmost position where `is_wanted`; the segment's first
    position when it has none (what argmax over an unpacked row without one gives: position 0)."""
    seq = segment_ids_BT.shape[1]
    wanted_BST = one_hot(segment_ids_BT, num_segments) & is_wanted_BT[:, None, :].astype(bool)
    first_BS1 = starts(segment_ids_BT, num_segments)[..., None]
    return jnp.max(jnp.where(wanted_BST, jnp.arange(seq, dtype=jnp.int32), first_BS1), axis=-1)


__all__ = [
    "attention_mask", "check", "ends", "gather", "last_where", "mean", "one_hot", "positions", "run_starts",
    "segment_cumsum", "starts",
]
