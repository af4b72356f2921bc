"""Rotary position embeddings (RoPE) with transformers' numerics, for any backbone that rotates
queries and keys (ModernBERT; the decoder families use the same "default" rope_type).

transformers computes the inverse frequencies in float32, the angles in float32, casts cos/sin to
the compute dtype, then rotates float32 copies of q and k and casts the result back
(`apply_rotary_pos_emb`); `rotate` does the same, so float32 matches to rounding and bfloat16
rounds where transformers rounds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def inverse_frequencies(head_dim: int, theta: float) -> np.ndarray:
    """(head_dim // 2,) float32 1 / theta^(2i / head_dim): transformers' default rope_type."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (np.float32(1.0) / np.power(np.float32(theta), exponents)).astype(np.float32)


def cos_sin(positions_BT: jax.Array, head_dim: int, theta: float, dtype) -> tuple[jax.Array, jax.Array]:
    """(cos, sin), each (batch, seq, head_dim) in `dtype`: angles position * frequency, the
    frequencies repeated once (the halves layout that `rotate_half` pairs up)."""
    angles_BTF = positions_BT.astype(jnp.float32)[..., None] * jnp.asarray(inverse_frequencies(head_dim, theta))
    angles_BTH = jnp.concatenate([angles_BTF, angles_BTF], axis=-1)
    return jnp.cos(angles_BTH).astype(dtype), jnp.sin(angles_BTH).astype(dtype)


def rotate(x_BTNH: jax.Array, cos_BTH: jax.Array, sin_BTH: jax.Array) -> jax.Array:
    """x rotated by the angles: x * cos + rotate_half(x) * sin, computed in float32, returned in x's dtype."""
    x = x_BTNH.astype(jnp.float32)
    first, second = jnp.split(x, 2, axis=-1)
    rotated_half = jnp.concatenate([-second, first], axis=-1)
    cos, sin = cos_BTH[:, :, None, :], sin_BTH[:, :, None, :]  # one angle per (batch, position), every head
    return (x * cos + rotated_half * sin).astype(x_BTNH.dtype)


__all__ = ["cos_sin", "inverse_frequencies", "rotate"]
