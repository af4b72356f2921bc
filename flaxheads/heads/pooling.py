"""Ways to turn (batch, seq, hidden) states into one (batch, features) vector per sequence."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flaxheads.heads.base import HeadInputs


def first_token(inputs: HeadInputs) -> jax.Array:
    """The last layer's state at position 0 ([CLS] / <s>), as BERT and RoBERTa classify."""
    return inputs.hidden_states[-1][:, 0]


def masked_mean(inputs: HeadInputs) -> jax.Array:
    """Mean of the last layer over real tokens only; padding never dilutes the average."""
    hidden_BTD = inputs.hidden_states[-1]
    mask_BT = inputs.attention_mask
    if mask_BT is None:
        mask_BT = jnp.ones(hidden_BTD.shape[:2], jnp.int32)
    weights_BT1 = mask_BT.astype(hidden_BTD.dtype)[..., None]
    # An all-padding row would divide by zero; it has no real token to average, so it gets 0s.
    count_B1 = jnp.maximum(weights_BT1.sum(axis=1), 1.0)
    return (hidden_BTD * weights_BT1).sum(axis=1) / count_B1


def concat_last4_first_token(inputs: HeadInputs) -> jax.Array:
    """First-token states of the last four layers, last layer first: (batch, 4 * hidden)."""
    return jnp.concatenate([inputs.hidden_states[-k][:, 0] for k in range(1, 5)], axis=-1)
