"""Rotary position embeddings (RoPE) with transformers' numerics: the one home of RoPE for every
family that rotates queries and keys (ModernBERT, and the decoders: Llama, Mistral, Qwen2/3, Gemma).

`Rope` holds one layer type's parameters (transformers' `rope_parameters`: theta and the scaling
type), `Rope.inverse_frequencies` computes the frequencies as transformers' `ROPE_INIT_FUNCTIONS`
do (float32), `cos_sin` the angles in float32 cast to the compute dtype, and `rotate` applies
them. Where the rotation is computed differs by family in transformers, and so here: ModernBERT
rotates float32 copies of q and k and casts back (`in_float32=True`), the decoders rotate in the
compute dtype; float32 matches either way, bfloat16 rounds where transformers rounds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Rope:
    """Rotary position embedding parameters (transformers' `rope_parameters` for one layer type)."""

    theta: float = 10000.0
    rope_type: str = "default"
    """"default", "linear" (positions divided by `factor`) or "llama3" (frequency-dependent scaling)."""
    factor: float | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    SUPPORTED = ("default", "linear", "llama3")

    @classmethod
    def from_hf(cls, params: dict[str, Any], theta: float, max_position_embeddings: int) -> "Rope":
        """One `rope_parameters` / `rope_scaling` dict (4.x "type" or 5.x "rope_type" key)."""
        rope_type = params.get("rope_type", params.get("type")) or "default"
        if rope_type not in cls.SUPPORTED:
            raise NotImplementedError(
                f"rope type {rope_type!r}: flaxheads' decoders implement {cls.SUPPORTED}; set rope_scaling to "
                "one of these in config.json or use transformers for this checkpoint"
            )
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            raise NotImplementedError("partial_rotary_factor != 1 is not implemented by flaxheads' decoders")
        theta = float(params.get("rope_theta", theta))
        if rope_type == "default":
            return cls(theta)
        if rope_type == "linear":
            return cls(theta, rope_type, factor=float(params["factor"]))
        return cls(
            theta, rope_type, factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(
                params.get("original_max_position_embeddings", max_position_embeddings)),
        )

    def scaling_to_hf(self) -> dict[str, Any] | None:
        """The 4.x `rope_scaling` dict; None for default RoPE."""
        if self.rope_type == "default":
            return None
        names = ("factor",) if self.rope_type == "linear" else (
            "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        return {"rope_type": self.rope_type, **{n: getattr(self, n) for n in names}}

    def inverse_frequencies(self, head_dim: int) -> np.ndarray:
        """(head_dim // 2,) float32, computed as transformers' `ROPE_INIT_FUNCTIONS` do (float32 torch)."""
        exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
        inv_freq = (np.float32(1.0) / np.power(np.float32(self.theta), exponents)).astype(np.float32)
        if self.rope_type == "linear":
            return (inv_freq / np.float32(self.factor)).astype(np.float32)
        if self.rope_type == "llama3":
            return self._llama3(inv_freq)
        return inv_freq

    def _llama3(self, inv_freq: np.ndarray) -> np.ndarray:
        factor, low, high = np.float32(self.factor), self.low_freq_factor, self.high_freq_factor
        old_context = self.original_max_position_embeddings
        wavelen = (np.float32(2 * math.pi) / inv_freq).astype(np.float32)
        scaled = np.where(wavelen > old_context / low, inv_freq / factor, inv_freq).astype(np.float32)
        smooth = ((np.float32(old_context) / wavelen - np.float32(low)) / np.float32(high - low)).astype(np.float32)
        smoothed = ((1 - smooth) * scaled / factor + smooth * scaled).astype(np.float32)
        is_medium = ~(wavelen < old_context / high) & ~(wavelen > old_context / low)
        return np.where(is_medium, smoothed, scaled).astype(np.float32)


def cos_sin(positions_BT: jax.Array, rope: Rope, head_dim: int, dtype) -> tuple[jax.Array, jax.Array]:
    """(cos, sin), each (batch, seq, head_dim) in `dtype`: angles position * frequency in float32,
    the frequencies repeated once (the halves layout that `rotate` pairs up)."""
    inv_freq_F = jnp.asarray(rope.inverse_frequencies(head_dim))
    angles_BTF = positions_BT.astype(jnp.float32)[..., None] * inv_freq_F
    angles_BTH = jnp.concatenate([angles_BTF, angles_BTF], axis=-1)
    return jnp.cos(angles_BTH).astype(dtype), jnp.sin(angles_BTH).astype(dtype)


def rotate(x_BTNH: jax.Array, cos_BTH: jax.Array, sin_BTH: jax.Array, *, in_float32: bool = False) -> jax.Array:
    """x * cos + rotate_half(x) * sin, rotate_half swapping the two halves of the head (neox
    layout), one angle per (batch, position) for every head. `in_float32`: computed on float32
    copies and cast back to x's dtype (ModernBERT); else in x's dtype (the decoders)."""
    x = x_BTNH.astype(jnp.float32) if in_float32 else x_BTNH
    first, second = jnp.split(x, 2, axis=-1)
    rotated_half = jnp.concatenate([-second, first], axis=-1)
    cos, sin = cos_BTH[:, :, None, :], sin_BTH[:, :, None, :]
    return (x * cos + rotated_half * sin).astype(x_BTNH.dtype)


__all__ = ["Rope", "cos_sin", "rotate"]
