"""Dropout, and the train/eval mode it depends on.

Train/eval mode the NNX way: every module that applies dropout carries a ``deterministic``
attribute, which ``model.train()`` sets to False and ``model.eval()`` to True (``nnx.Module``
does this for every submodule that has the attribute). A freshly constructed model is in train
mode, as in NNX; ``from_pretrained`` returns one in eval mode. In train mode the dropout bits
come from the ``rngs`` the caller passes (an ``nnx.Rngs`` with a ``dropout`` stream), so the call
stays pure; forgetting them is a ValueError, never silently deterministic training.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

DROPOUT_BITS = 16
"""Random bits per element behind a dropout decision: the rate is applied in steps of 2**-16
(0.1 becomes 6554/65536 = 0.100006), and the kept values are scaled by the exact inverse of the
keep probability, so the expectation is unchanged."""


class DropoutKeys:
    """The keys an `nnx.Rngs(dropout=key)` stream gives, bit for bit: `fold_in(key, 0)`,
    `fold_in(key, 1)`, ... from `dropout()`, each call the next. Pass it as `rngs=` where the
    model runs under `jax.jit`: `nnx.Rngs` keeps its count in an array variable, and each update of
    that variable under a trace builds an error message that walks the whole trace (flax's
    `set_value` asks the traced count for its `sharding`), which made the MiniLM train step's
    tracing ~1/3 slower. Here the count is a Python int until a scan carries it (`as_rngs`)."""

    def __init__(self, key: jax.Array | int):
        if isinstance(key, int):
            key = jax.random.key(key)
        elif key.dtype == jnp.uint32:
            key = jax.random.wrap_key_data(key)
        self.key = key
        self.count: int | jax.Array = 0

    def dropout(self) -> jax.Array:
        key = jax.random.fold_in(self.key, self.count)
        self.count = self.count + 1
        return key

    def as_rngs(self) -> nnx.Rngs:
        """An `nnx.Rngs` whose `dropout` stream goes on where this one is (for a scan's carry)."""
        rngs = nnx.Rngs(dropout=self.key)
        rngs.dropout.count.set_value(jnp.asarray(self.count, jnp.uint32))
        return rngs

    def follow(self, rngs: nnx.Rngs) -> None:
        """Goes on where `rngs` (from `as_rngs`) has got to."""
        self.count = rngs.dropout.count.get_value()


def as_nnx_rngs(values: tuple) -> tuple[tuple, Callable[[], None]]:
    """(`values` with each `DropoutKeys` replaced by its `as_rngs()`, a function that moves those
    keys on to where their Rngs have got): nnx transforms (`nnx.remat`, a scan's carry) take the
    arguments they carry as graph nodes or arrays, which an `nnx.Rngs` is and `DropoutKeys` not.
    Call the function after the transformed call."""
    swapped = tuple(value.as_rngs() if isinstance(value, DropoutKeys) else value for value in values)

    def follow() -> None:
        for value, rngs in zip(values, swapped):
            if rngs is not value:
                value.follow(rngs)

    return swapped, follow


def active(rate: float, *, deterministic: bool, rngs: nnx.Rngs | None) -> bool:
    """Whether dropout at `rate` applies: in train mode (`deterministic` False) at a non-zero rate.

    Raises ValueError in train mode at a non-zero rate without `rngs`: the model would otherwise
    have to choose between training without dropout and inventing a key.
    """
    if deterministic or rate == 0.0:
        return False
    if rngs is None:
        raise ValueError(
            f"the model is in train mode (dropout rate {rate}) but no rngs were passed: pass "
            "rngs=nnx.Rngs(dropout=key), or call model.eval() for inference"
        )
    return True


@dataclasses.dataclass(frozen=True)
class Rows:
    """Where an array sits in a larger one: along `axis` it holds rows `index` of an array whose
    `axis` is `length` long (the other axes equal). `index` broadcasts against the array, with
    the array's size on `axis` (e.g. (batch, 1, P, 1) for rows of (batch, heads, T, S) scores).

    A layer that computes only the positions a head reads (`backbones.encoder`) drops its units
    with the larger array's mask at those rows: the same units as the full computation drops."""

    axis: int
    index: jax.Array
    length: int

    def full_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (*shape[:self.axis], self.length, *shape[self.axis + 1:])


def apply(x: jax.Array, rate: float, rngs: nnx.Rngs | None, *, deterministic: bool = False,
          rows: Rows | None = None) -> jax.Array:
    """Inverted dropout in train mode (`deterministic` False); `x` itself in eval mode or at rate 0.
    ValueError in train mode at a non-zero rate without `rngs` (see `active`). With `rows`, `x`
    is those rows of a larger array and gets that array's mask there (`Rows`)."""
    if not active(rate, deterministic=deterministic, rngs=rngs):
        return x
    keep, keep_prob = keep_mask(rngs.dropout(), rate, x.shape, rows=rows)
    return jnp.where(keep, x * jnp.asarray(1.0 / keep_prob, x.dtype), jnp.zeros_like(x))


def keep_mask(key: jax.Array, rate: float, shape: tuple[int, ...], *,
              rows: Rows | None = None) -> tuple[jax.Array, float]:
    """(mask of kept elements, keep probability) with 16 random bits per element.

    Each 32-bit random word decides two elements (its low and high halves), which halves the
    random-number work of `jax.random.bernoulli` (one word per element). The halves sit side by
    side on the last axis, so the bits of an element depend on its index alone and a sharded
    batch draws the same mask as an unsharded one. With `rows` (not on the last axis), the mask
    of the larger array at those rows.
    """
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate {rate}: it must be in [0, 1)")
    if rows is not None and rows.axis in (-1, len(shape) - 1):
        raise ValueError("dropout rows must not lie on the last axis (its words hold two elements each)")
    levels = 1 << DROPOUT_BITS
    threshold = round(rate * levels)
    if not shape or shape[-1] < 2:
        bits = random_bits(key, shape, rows=rows) >> (32 - DROPOUT_BITS)
    else:
        last, half = shape[-1], (shape[-1] + 1) // 2
        words = random_bits(key, (*shape[:-1], half), rows=rows)
        # (..., 2, half) by broadcasting, then a free reshape: XLA fuses this into the consumer,
        # where a concatenate of the two halves was a separate pass over memory.
        shifts = jnp.array([[0], [DROPOUT_BITS]], jnp.uint32)
        pairs = (words[..., None, :] >> shifts) & np.uint32(levels - 1)
        bits = pairs.reshape(*shape[:-1], 2 * half)[..., :last]
    return bits >= threshold, (levels - threshold) / levels


_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def random_bits(key: jax.Array, shape: tuple[int, ...], *, rows: Rows | None = None) -> jax.Array:
    """`jax.random.bits(key, shape, jnp.uint32)`, bit for bit, for threefry keys.

    The same Threefry-2x32 over the same counters (the element's flat index), written as plain
    uint32 arithmetic that XLA fuses into one loop. jax lowers its threefry on CPU as a rolled
    `while` loop that keeps four arrays in memory between rounds: on CPU this form runs 3x faster
    and compiles 10x faster (measured on 16x12x128x64 words: 2.1 vs 6.6 ms, 0.07 vs 0.8 s).
    Other key implementations (rbg) go to `jax.random.bits`. With `rows`, the bits of the larger
    array at those rows (`Rows`): the counters are the larger array's flat indices.
    """
    full = shape if rows is None else rows.full_shape(shape)
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        if str(jax.random.key_impl(key)) != "threefry2x32":
            return _rows_of(jax.random.bits(key, full, jnp.uint32), shape, rows)
        key = jax.random.key_data(key)
    if math.prod(full) >= 2**32:  # jax's counters then need a high word too
        return _rows_of(jax.random.bits(jax.random.wrap_key_data(key), full, jnp.uint32), shape, rows)
    strides = [math.prod(full[d + 1:]) for d in range(len(full))]
    counter = jnp.zeros(shape, jnp.uint32)
    for d, stride in enumerate(strides):
        if rows is not None and d == rows.axis % len(shape):
            coordinate = jnp.broadcast_to(rows.index.astype(jnp.uint32), shape)
        else:
            coordinate = jax.lax.broadcasted_iota(jnp.uint32, shape, d)
        counter = counter + coordinate * np.uint32(stride)
    return _counter_bits(key, counter)


@jax.jit
def _counter_bits(key: jax.Array, counter: jax.Array) -> jax.Array:
    """jax.random.bits' words for the threefry key data `key` (2,) at `counter`'s values.

    A jit of its own: a train step draws ~20 masks of 3-4 shapes, and a nested jit is traced once
    per shape (jax caches its jaxpr), where inline arithmetic was traced for every mask, a third of
    the MiniLM step's tracing; XLA inlines the call, so the compiled step is the same."""
    high, low = _threefry2x32(key[0], key[1], jnp.zeros_like(counter), counter)
    return high ^ low


def _rows_of(bits: jax.Array, shape: tuple[int, ...], rows: Rows | None) -> jax.Array:
    """`bits` of the larger array at `rows` (itself without)."""
    if rows is None:
        return bits
    return jnp.take_along_axis(bits, jnp.broadcast_to(rows.index, shape), axis=rows.axis)


def _threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 with 20 rounds (Salmon et al. 2011), as jax.random implements it.

    Constants are numpy scalars: `jnp.uint32(c)` puts an array on the device for every constant
    of every round while jax traces."""
    keys = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0, x1 = x0 + k0, x1 + k1
    for i in range(5):
        for r in _THREEFRY_ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
        x0 = x0 + keys[(i + 1) % 3]
        x1 = x1 + keys[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1
