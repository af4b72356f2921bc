"""The fused attention kernels `attention.attend` hands work to on accelerators, each behind the
same call: query BTNH, key/value BSKH (K key/value heads dividing N query heads), returning BTNH.

- `cudnn`: cuDNN's flash attention (`jax.nn.dot_product_attention(implementation="cudnn")`),
  padding told by key lengths; GPUs, half precision.
- `pallas_gpu`: the Pallas (Triton) flash attention with segment ids, for packed rows on GPUs.
- `splash`: the Pallas TPU splash attention with segment ids and a static causal or local mask.

Masks reach the Pallas kernels as segment ids (`segment_ids_for`): a query sees a key when their
ids are equal (and the static mask allows it). Every kernel here runs in Pallas' interpret mode
off its device, which is how the tests check them on a CPU against XLA's path.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# The Pallas kernels are imported where they run (`pallas_gpu`, `_splash_kernel`): importing them
# costs every process ~0.16 s (-X importtime), and a jax that moved one of them then breaks that kernel
# alone, not every backbone.

SPLASH_BLOCK = 128
"""Splash attention's smallest tile (TPU lanes): rows are padded to a multiple of it."""

PALLAS_GPU_BLOCK = 16
"""The Pallas GPU kernel's smallest tile; rows are padded to a multiple of it, the tile grows to 64."""

_PAD_SEGMENT = -1
"""Segment id of the positions a kernel's tiling adds: they see only each other."""


def segment_ids_for(mask_BS: jax.Array | None, segment_ids_BT: jax.Array | None,
                    seq: int) -> tuple[jax.Array, jax.Array] | None:
    """(query ids (batch, T), key ids (batch, S)) int32 that say what `attend`'s XLA path masks.

    Packed rows: both are the segment ids (`segments.attention_mask`'s block-diagonal rule). A
    (batch, key) padding mask: every query has id 1 and a key its mask (1 real, 0 padding), so
    every query sees exactly the real keys, padded queries included, as the XLA path's mask says.
    No mask: None (nothing to mask)."""
    if segment_ids_BT is not None:
        ids_BT = segment_ids_BT.astype(jnp.int32)
        return ids_BT, ids_BT
    if mask_BS is None:
        return None
    return jnp.ones((mask_BS.shape[0], seq), jnp.int32), mask_BS.astype(jnp.int32)


def cudnn(query_BTNH, key_BSKH, value_BSKH, mask_BS, *, is_causal: bool, scale: float | None,
          local_window_size: int | None, implementation: str = "cudnn") -> jax.Array:
    """cuDNN flash attention. cuDNN takes padding as key lengths, which say right padding only:
    a (batch, key) mask of a right-padded batch (checked at run time) goes as lengths, any other
    mask (left padding) to XLA's kernel. A window is one-sided (causal): cuDNN has no right one.
    `implementation="xla"` runs the same choice with XLA's kernel in cuDNN's place (the tests)."""
    window = None if local_window_size is None else (local_window_size, 0)
    fused = functools.partial(jax.nn.dot_product_attention, query_BTNH, key_BSKH, value_BSKH, scale=scale,
                              is_causal=is_causal, local_window_size=window, implementation=implementation)
    if mask_BS is None:
        return fused()
    mask_BS = mask_BS.astype(bool)
    lengths_B = mask_BS.sum(axis=1, dtype=jnp.int32)
    right_padded = jnp.all(mask_BS == (jnp.arange(mask_BS.shape[1]) < lengths_B[:, None]))

    def by_mask():
        return jax.nn.dot_product_attention(query_BTNH, key_BSKH, value_BSKH, mask=mask_BS[:, None, None, :],
                                            scale=scale, is_causal=is_causal, local_window_size=window)

    return jax.lax.cond(right_padded, lambda: fused(key_value_seq_lengths=lengths_B), by_mask)


def pallas_gpu(query_BTNH, key_BSKH, value_BSKH, segment_ids_BT, *, is_causal: bool, scale: float,
               interpret: bool) -> jax.Array:
    """The Pallas GPU flash attention over packed rows: one set of segment ids for queries and
    keys, causal or not, no window. Key/value heads are repeated up to the query heads (the
    kernel has no grouped form)."""
    from jax.experimental.pallas.ops.gpu import attention as pallas_gpu_attention

    groups = query_BTNH.shape[2] // key_BSKH.shape[2]
    key_BSNH, value_BSNH = (jnp.repeat(x, groups, axis=2) for x in (key_BSKH, value_BSKH))
    seq = query_BTNH.shape[1]
    padded = _round_up(seq, PALLAS_GPU_BLOCK)
    block = max(b for b in (PALLAS_GPU_BLOCK, 32, 64) if padded % b == 0)
    blocks = pallas_gpu_attention.BlockSizes(block_q=block, block_k=block, block_q_dkv=block, block_kv_dkv=block,
                                             block_q_dq=block, block_kv_dq=block)
    out_BTNH = pallas_gpu_attention.mha(
        _pad_rows(query_BTNH, padded), _pad_rows(key_BSNH, padded), _pad_rows(value_BSNH, padded),
        _pad_rows(segment_ids_BT.astype(jnp.int32), padded, _PAD_SEGMENT),
        sm_scale=scale, causal=is_causal, block_sizes=blocks, interpret=interpret,
    )
    return out_BTNH[:, :seq]


def splash(query_BTNH, key_BSKH, value_BSKH, segment_ids: tuple[jax.Array, jax.Array] | None, *,
           is_causal: bool, scale: float, local_window_size: int | None, interpret: bool) -> jax.Array:
    """The Pallas TPU splash attention: a static causal, local (|t - s| <= w, or t - w <= s <= t
    when causal) or full mask, and'ed with the segment ids. Rows are padded to a multiple of
    `SPLASH_BLOCK` with their own segment; key/value heads may be fewer than query heads."""
    batch, seq, heads, _ = query_BTNH.shape
    padded = _round_up(seq, SPLASH_BLOCK)
    if segment_ids is None and padded != seq:
        ones_BT = jnp.ones((batch, seq), jnp.int32)
        segment_ids = (ones_BT, ones_BT)
    kernel = _splash_kernel(padded, heads, is_causal, local_window_size, interpret)
    # Splash takes one example (heads, seq, head_dim) and leaves the scaling to its caller.
    query_BNTH = _pad_rows(query_BTNH * jnp.asarray(scale, query_BTNH.dtype), padded).transpose(0, 2, 1, 3)
    key_BKSH, value_BKSH = (_pad_rows(x, padded).transpose(0, 2, 1, 3) for x in (key_BSKH, value_BSKH))
    if segment_ids is None:
        out_BNTH = jax.vmap(kernel)(query_BNTH, key_BKSH, value_BKSH)
    else:
        query_ids_BT, key_ids_BS = (_pad_rows(ids, padded, _PAD_SEGMENT) for ids in segment_ids)
        from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

        out_BNTH = jax.vmap(lambda q, k, v, q_ids, kv_ids: kernel(q, k, v, SegmentIds(q_ids, kv_ids)))(
            query_BNTH, key_BKSH, value_BKSH, query_ids_BT, key_ids_BS)
    return out_BNTH.transpose(0, 2, 1, 3)[:, :seq]


@functools.lru_cache(maxsize=64)
def _splash_kernel(seq: int, heads: int, is_causal: bool, local_window_size: int | None, interpret: bool):
    """One kernel per static mask and shape; its block-sparsity tables are built once (numpy)."""
    from jax.experimental.pallas.ops.tpu import splash_attention

    shape = (seq, seq)
    if local_window_size is not None:
        head_mask = splash_attention.LocalMask(shape, (local_window_size, 0 if is_causal else local_window_size), 0)
    elif is_causal:
        head_mask = splash_attention.CausalMask(shape)
    else:
        head_mask = splash_attention.FullMask(shape)
    block = max(b for b in (SPLASH_BLOCK, 256, 512) if seq % b == 0)
    blocks = splash_attention.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block, block_kv_dkv=block,
        block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block,
    )
    return splash_attention.make_splash_mha_single_device(
        splash_attention.MultiHeadMask([head_mask] * heads), block_sizes=blocks, interpret=interpret)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _pad_rows(x_BT: jax.Array, length: int, value=0) -> jax.Array:
    """`x` padded along axis 1 (the sequence) to `length` with `value`."""
    if x_BT.shape[1] == length:
        return x_BT
    widths = [(0, 0)] * x_BT.ndim
    widths[1] = (0, length - x_BT.shape[1])
    return jnp.pad(x_BT, widths, constant_values=np.asarray(value, x_BT.dtype))


__all__ = ["cudnn", "pallas_gpu", "segment_ids_for", "splash"]
