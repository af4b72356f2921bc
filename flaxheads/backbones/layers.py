"""Layer factories shared by every backbone, initialised and computed as transformers does:
Linear, LayerNorm and embedding factories, Hugging Face's activations by name, BERT's pooler.

The other shared pieces have files of their own: `dropout.py` (train/eval mode and the dropout
bits), `attention.py` (`attend`), `stacking.py` (running a stack of layers: rematerialisation
and scan over layers), `rope.py` (rotary positions), `segments.py` (packed rows).
"""

from __future__ import annotations

import contextlib
import math
import sys
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


@jax.custom_jvp
def gelu(x: jax.Array) -> jax.Array:
    """Exact GELU as torch computes it, x * (1 + erf(x / sqrt(2))) / 2 (transformers' "gelu").

    `jax.nn.gelu(approximate=False)` computes the same function through erfc, which XLA:CPU
    evaluates with two branches and a select: ~2x the forward's cost (measured in the MiniLM
    train step: -4% of the step with this form). The derivative is written out (Phi(x) + x phi(x))
    so that the backward pass reuses the forward's erf instead of differentiating through it."""
    return x * (0.5 * (1.0 + jax.lax.erf(x * math.sqrt(0.5))))


@gelu.defjvp
def _gelu_jvp(primals, tangents):
    (x,), (x_dot,) = primals, tangents
    cdf = 0.5 * (1.0 + jax.lax.erf(x * math.sqrt(0.5)))
    pdf = jnp.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    return x * cdf, x_dot * (cdf + x * pdf)


# Hugging Face `hidden_act` names -> functions with the same numerics as transformers.activations.
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": gelu,
    "gelu_python": gelu,
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
    "linear": lambda x: x,
}


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
    """The activation Hugging Face calls `name`; ValueError listing the supported ones otherwise."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(
            f"unsupported activation {name!r}; flaxheads supports {sorted(ACTIVATIONS)}"
        ) from None


def dense(
    in_features: int,
    out_features: int,
    *,
    init_std: float,
    dtype,
    param_dtype,
    rngs: nnx.Rngs,
    use_bias: bool = True,
) -> nnx.Linear:
    """A Linear layer initialised like Hugging Face's: kernel ~ normal(init_std), bias zeros;
    its product is `dot_general` (bfloat16 products accumulated in float32 on CPUs)."""
    return nnx.Linear(
        in_features,
        out_features,
        use_bias=use_bias,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=nnx.initializers.normal(init_std),
        bias_init=nnx.initializers.zeros,
        dot_general=dot_general,
        rngs=rngs,
    )


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
    """`jax.lax.dot_general`, except for a Linear layer's product on a CPU (`_backend()`):

    - in bfloat16, computed as bfloat16 x bfloat16 -> float32, rounded to bfloat16 once, forward
      and backward (`_bf16_matmul`). XLA:CPU then hands it to YNNPACK's bfloat16 kernels, 2.9x
      its float32 matmul rate on this project's AVX512-BF16 CPU (2560x384 by 384x1536: 569
      GFLOP/s against 197 in float32 and 145 for XLA's bfloat16 -> bfloat16 product);
    - otherwise, with the input's leading axes merged into one ((batch, seq, in) as
      (batch * seq, in)), as PyTorch's Linear computes it: the same sums, and the gradient
      program's products become plain matrix products (the weight's gradient contracts one
      axis, not two), which made the MiniLM train step ~3% faster on XLA:CPU.

    Elsewhere, and for other layouts, `jax.lax.dot_general` as it is: a GPU or TPU accumulates
    bfloat16 in float32 by itself."""
    linear = dimension_numbers == (((lhs.ndim - 1,), (0,)), ((), ())) and rhs.ndim == 2
    if not linear or _backend() != "cpu" or kwargs.get("out_sharding") is not None:
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type, **kwargs)
    if lhs.dtype == rhs.dtype == jnp.bfloat16 and preferred_element_type is None:
        return _bf16_matmul(lhs, rhs)
    lhs_MI = lhs.reshape(-1, lhs.shape[-1])
    out_MO = jax.lax.dot_general(lhs_MI, rhs, (((1,), (0,)), ((), ())), precision=precision,
                                 preferred_element_type=preferred_element_type, **kwargs)
    return out_MO.reshape(*lhs.shape[:-1], rhs.shape[1])


def _matmul_f32(a_MK, b_KN):
    return jax.lax.dot_general(a_MK, b_KN, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


@jax.custom_vjp
def _bf16_matmul(x_BI, w_IO):
    x_MI = x_BI.reshape(-1, x_BI.shape[-1])
    return _matmul_f32(x_MI, w_IO).astype(jnp.bfloat16).reshape(*x_BI.shape[:-1], w_IO.shape[1])


def _bf16_matmul_forward(x_BI, w_IO):
    return _bf16_matmul(x_BI, w_IO), (x_BI, w_IO)


def _bf16_matmul_backward(residuals, g_BO):
    x_BI, w_IO = residuals
    x_MI, g_MO = x_BI.reshape(-1, x_BI.shape[-1]), g_BO.reshape(-1, g_BO.shape[-1])
    # g . w over their output axes as it is (a transposed w is not handed to YNNPACK: 3.4x slower)
    dx_MI = jax.lax.dot_general(g_MO, w_IO, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    dx_BI = dx_MI.astype(jnp.bfloat16).reshape(x_BI.shape)
    dw_IO = jax.lax.dot_general(x_MI, g_MO, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    dw_IO = dw_IO.astype(jnp.bfloat16)
    return dx_BI, dw_IO


_bf16_matmul.defvjp(_bf16_matmul_forward, _bf16_matmul_backward)


def layer_norm(
    features: int, *, eps: float, dtype, param_dtype, rngs: nnx.Rngs, use_bias: bool = True
) -> nnx.LayerNorm:
    """LayerNorm with torch's numerics: variance as mean((x - mean)^2), not E[x^2] - E[x]^2."""
    return nnx.LayerNorm(
        features,
        epsilon=eps,
        use_bias=use_bias,
        dtype=dtype,
        param_dtype=param_dtype,
        use_fast_variance=False,
        rngs=rngs,
    )


ONE_HOT_GRADIENT_ROWS = 2048
"""On GPUs and TPUs, an embedding table of at most this many rows (token types, positions) takes its
gradient as a matmul with the ids' one-hot matrix (`lookup`); 0 turns that off."""
SORTED_GRADIENT_ROWS = 2048
"""On GPUs, an embedding table of more than this many rows (a vocabulary) sums its gradient's rows
by id after sorting the ids, then writes each id's row once (`lookup`); a very large number turns
that off (the scatter-add)."""
GATHERED_GRADIENT_ROWS = 4096
"""On CPUs, an embedding table of more than this many rows (a vocabulary) builds its gradient from
the rows its ids read (`lookup`); a very large number turns that off."""


def embed(num_embeddings: int, features: int, *, init_std: float, dtype, param_dtype, rngs) -> Embed:
    return Embed(
        num_embeddings,
        features,
        dtype=dtype,
        param_dtype=param_dtype,
        embedding_init=nnx.initializers.normal(init_std),
        rngs=rngs,
    )


class Embed(nnx.Embed):
    """`nnx.Embed` (same parameter, same lookup) whose rows are read by `lookup`."""

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        if out_sharding is not None or self.num_embeddings == 1:
            return super().__call__(inputs, out_sharding)
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError("Input type must be an integer or unsigned integer.")
        (embedding,) = self.promote_dtype((self.embedding[...],), dtype=self.dtype, inexact=False)
        return lookup(embedding, inputs)


def _backend() -> str:
    """The platform the lookup runs on; tests replace it."""
    return jax.default_backend()


@contextlib.contextmanager
def gradient_paths(*, backend: str | None = None, **rows: int) -> Iterator[None]:
    """Inside the block, `lookup` traces as it would on `backend` (None: the real one) with the
    row limits `rows` (`ONE_HOT_GRADIENT_ROWS=0`, `SORTED_GRADIENT_ROWS=...`); afterwards as before.
    For tests and benchmarks that compare the embedding gradient's paths; not thread-safe."""
    unknown = sorted(set(rows) - {"ONE_HOT_GRADIENT_ROWS", "SORTED_GRADIENT_ROWS", "GATHERED_GRADIENT_ROWS"})
    if unknown:
        raise ValueError(f"gradient_paths takes the row limits ONE_HOT_GRADIENT_ROWS, SORTED_GRADIENT_ROWS and "
                         f"GATHERED_GRADIENT_ROWS, not {', '.join(unknown)}")
    module = sys.modules[__name__]
    settings = {**rows, **({"_backend": lambda: backend} if backend is not None else {})}
    saved = {name: getattr(module, name) for name in settings}
    try:
        for name, value in settings.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def lookup(table_VD: jax.Array, ids: jax.Array) -> jax.Array:
    """`jnp.take(table, ids, axis=0)`: the rows of `ids`, out-of-range ids giving NaN rows.

    Its gradient is a scatter-add of the output's gradient into a table of zeros; the forward is
    `jnp.take` whatever the backend. Two backends take the same gradient another way:

    - On GPUs XLA adds with atomics, which serialise where many tokens read one row: every token
      of a batch reads row 0 of BERT's token-type table, every row reads the same positions, and
      jaxlib 0.10.2-0.11.0 emit those float32 adds as compare-and-swap loops (jax-ml/jax#38806)
      that retry under such contention. On GPUs and TPUs a table of at most
      `ONE_HOT_GRADIENT_ROWS` rows therefore takes its gradient as one_hot(ids)^T @ gradient
      (float32 accumulation, full precision): no atomics, deterministic, equal to the scatter-add's
      sum to float32 rounding.
    - On GPUs a table of more than `SORTED_GRADIENT_ROWS` rows (a vocabulary: too many rows for a
      one-hot matmul, 16,384 tokens x 30,522 rows x 768) still sees [CLS], [SEP] and padding ids in
      every row of a batch. There the ids are sorted (stably: each id's tokens keep their order),
      each run of equal ids is summed by a segmented scan in float32, and each run's total is
      written to its row by one scatter whose indices are distinct: no atomics contend, and the
      result equals the scatter-add's to float32 rounding (`_lookup_sorted_gradient`).
    - On CPUs a table of more than `GATHERED_GRADIENT_ROWS` rows (a vocabulary: MiniLM's is 30522
      x 384, 47 MB) spent a pass writing zeros and another scattering into them, and the optimizer
      then read the result back. Here the gradient's rows are summed into one row per distinct
      id, in token order (the scatter-add's order: the same bits), and the table-sized gradient
      is gathered from them, which XLA fuses into the optimizer's first pass over it
      (`_lookup_gathered_gradient`)."""
    rows = table_VD.shape[0]
    backend = _backend()
    if backend in ("gpu", "tpu") and rows <= ONE_HOT_GRADIENT_ROWS:
        return _lookup_one_hot_gradient(table_VD, ids)
    if backend == "gpu" and rows > SORTED_GRADIENT_ROWS:
        return _lookup_sorted_gradient(table_VD, ids)
    if backend == "cpu" and rows > GATHERED_GRADIENT_ROWS:
        return _lookup_gathered_gradient(table_VD, ids)
    return jnp.take(table_VD, ids, axis=0)


@jax.custom_vjp
def _lookup_one_hot_gradient(table_VD: jax.Array, ids: jax.Array) -> jax.Array:
    return jnp.take(table_VD, ids, axis=0)


def _lookup_forward(table_VD, ids):
    # The residuals: the ids, and an empty (rows, 0) array that carries the table's shape and dtype.
    return jnp.take(table_VD, ids, axis=0), (ids, jnp.zeros((table_VD.shape[0], 0), table_VD.dtype))


def _flat_ids_and_gradient(ids, rows: int, gradient):
    """(ids as one axis, negative ids counted from the end as jnp.take counts them; the output's
    gradient as (ids, features))."""
    ids_N = ids.reshape(-1)
    return jnp.where(ids_N < 0, ids_N + rows, ids_N), gradient.reshape(-1, gradient.shape[-1])


def _in_table_ids_and_gradient(ids, rows: int, gradient):
    """`_flat_ids_and_gradient`, with an id outside the table as `rows` (no row: dropped where
    the table's gradient is written)."""
    ids_N, gradient_ND = _flat_ids_and_gradient(ids, rows, gradient)
    return jnp.where((ids_N >= 0) & (ids_N < rows), ids_N, rows), gradient_ND


def _one_hot_backward(residuals, gradient):
    ids, like = residuals
    rows = like.shape[0]
    ids_N, gradient_ND = _flat_ids_and_gradient(ids, rows, gradient)
    one_hot_NV = (ids_N[:, None] == jnp.arange(rows)[None, :]).astype(gradient_ND.dtype)
    table_gradient_VD = jnp.einsum("NV,ND->VD", one_hot_NV, gradient_ND, precision=jax.lax.Precision.HIGHEST,
                                   preferred_element_type=jnp.float32)
    ids_gradient = np.zeros(ids.shape, jax.dtypes.float0)
    return table_gradient_VD.astype(like.dtype), ids_gradient


_lookup_one_hot_gradient.defvjp(_lookup_forward, _one_hot_backward)


@jax.custom_vjp
def _lookup_gathered_gradient(table_VD: jax.Array, ids: jax.Array) -> jax.Array:
    return jnp.take(table_VD, ids, axis=0)


def _gathered_backward(residuals, gradient):
    ids, like = residuals
    rows = like.shape[0]
    ids_N, gradient_ND = _in_table_ids_and_gradient(ids, rows, gradient)
    n = ids_N.shape[0]
    # Each token's slot: the rank of its id among the distinct ids (unused slots hold `rows`).
    distinct_N, slot_N = jnp.unique(ids_N, return_inverse=True, size=n, fill_value=rows)
    # Summed per slot in token order, as the scatter-add into the table sums each row.
    sums_ND = jnp.zeros_like(gradient_ND).at[slot_N].add(gradient_ND)
    slot_V = jnp.full((rows,), n, jnp.int32).at[distinct_N].set(jnp.arange(n, dtype=jnp.int32), mode="drop")
    table_gradient_VD = jnp.where((slot_V < n)[:, None], sums_ND[jnp.minimum(slot_V, n - 1)],
                                  jnp.zeros((), gradient_ND.dtype))
    return table_gradient_VD.astype(like.dtype), np.zeros(ids.shape, jax.dtypes.float0)


_lookup_gathered_gradient.defvjp(_lookup_forward, _gathered_backward)


@jax.custom_vjp
def _lookup_sorted_gradient(table_VD: jax.Array, ids: jax.Array) -> jax.Array:
    return jnp.take(table_VD, ids, axis=0)


def _add_within_runs(left, right):
    """The segmented scan's step: the right part's sum alone where a run starts inside it."""
    (left_sums, left_starts), (right_sums, right_starts) = left, right
    return jnp.where(right_starts, right_sums, left_sums + right_sums), left_starts | right_starts


def _sorted_backward(residuals, gradient):
    ids, like = residuals
    rows = like.shape[0]
    ids_N, gradient_ND = _in_table_ids_and_gradient(ids, rows, gradient)
    n = ids_N.shape[0]
    order_N = jnp.argsort(ids_N, stable=True)
    sorted_ids_N = ids_N[order_N]
    new_id_N = sorted_ids_N[1:] != sorted_ids_N[:-1]
    starts_N1 = jnp.concatenate([jnp.ones((1,), bool), new_id_N])[:, None]
    # Inclusive sums within each run of equal ids (float32 whatever the dtype, as the one-hot path):
    # the run's last element holds its total.
    sums_ND, _ = jax.lax.associative_scan(_add_within_runs, (gradient_ND[order_N].astype(jnp.float32), starts_N1))
    last_N = jnp.concatenate([new_id_N, jnp.ones((1,), bool)])
    # Every other element goes to a distinct row past the table's end, dropped: the indices stay unique.
    target_N = jnp.where(last_N, sorted_ids_N, rows + jnp.arange(n, dtype=sorted_ids_N.dtype))
    table_gradient_VD = jnp.zeros((rows, gradient_ND.shape[1]), jnp.float32).at[target_N].set(
        sums_ND, mode="drop", unique_indices=True)
    return table_gradient_VD.astype(like.dtype), np.zeros(ids.shape, jax.dtypes.float0)


_lookup_sorted_gradient.defvjp(_lookup_forward, _sorted_backward)


class Pooler(nnx.Module):
    """BERT's pooler: tanh(dense(hidden state of the first token))."""

    def __init__(self, hidden_size: int, *, init_std: float, dtype, param_dtype, rngs: nnx.Rngs):
        self.dense = dense(
            hidden_size, hidden_size, init_std=init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )

    def __call__(self, hidden_BTD: jax.Array) -> jax.Array:
        return self.project(hidden_BTD[:, 0])

    def project(self, first_token_BD: jax.Array) -> jax.Array:
        """tanh(dense(x)) of first-token states already picked, (..., hidden) (packed rows: (B, S, D))."""
        return jnp.tanh(self.dense(first_token_BD))
