"""Checks `attention.attend`'s fused kernels on the device they were built for, against XLA's path,
and times both: what the CPU tests (interpret mode, or XLA in cuDNN's place) cannot show.

    python -m flaxheads.benchmarks.fused_check            # on a GPU or TPU: one JSON row per case

Each case draws random queries, keys and values (batch 8, 512 positions, 12 heads of 64: a
BERT-base layer at its longest), runs `attend` in half precision with the default setting (the
backend's fused kernel where `attention.kernel` picks one) and with `implementation("xla")`, and
compares both with XLA's path in float32 on the same (rounded) inputs: outputs at the queries that
see a key, and the gradients of a random projection of the output. A fused kernel passes when its
error is at most `SLACK` times XLA's own half-precision error (plus a floor of `FLOOR`): both round
in the same precision, in other orders. Rows also say which kernel ran (read from the compiled
program: a cuDNN or Triton custom call) and each path's median forward+backward milliseconds.
On a CPU every case runs XLA's kernel, so the rows only show that the check itself runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flaxheads.backbones import attention, segments

SLACK, FLOOR = 2.0, 2e-3
"""A fused kernel's error may be SLACK x XLA's half-precision error, and at least FLOOR."""


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    padding: str = "none"
    """"none", "right", "left" (a (batch, key) mask) or "packed" (segment ids)."""
    is_causal: bool = False
    window: int | None = None
    kv_heads: int = 12


CASES = (
    Case("encoder, no padding"),
    Case("encoder, right padding", padding="right"),
    Case("encoder, left padding", padding="left"),
    Case("encoder, packed rows", padding="packed"),
    Case("decoder GQA, right padding", padding="right", is_causal=True, kv_heads=4),
    Case("decoder GQA, left padding", padding="left", is_causal=True, kv_heads=4),
    Case("decoder GQA, packed rows", padding="packed", is_causal=True, kv_heads=4),
    Case("decoder, sliding window 128, right padding", padding="right", is_causal=True, window=128),
)


def _inputs(case: Case, batch: int, seq: int, heads: int, head_dim: int, seed: int = 0):
    """float32 q, k, v rounded to bfloat16 (both precisions then see the same numbers), the
    (batch, key) mask or None, the segment ids or None, and the (batch, T) queries that see a key."""
    keys = jax.random.split(jax.random.key(seed), 4)
    query = jax.random.normal(keys[0], (batch, seq, heads, head_dim))
    key, value = (jax.random.normal(k, (batch, seq, case.kv_heads, head_dim)) for k in keys[1:3])
    query, key, value = (x.astype(jnp.bfloat16).astype(jnp.float32) for x in (query, key, value))
    rng = np.random.default_rng(seed)
    lengths = rng.integers(seq // 4, seq + 1, batch)
    lengths[0] = seq
    mask, segment_ids = None, None
    if case.padding in ("right", "left"):
        mask = np.arange(seq)[None, :] < lengths[:, None]
        mask = mask if case.padding == "right" else mask[:, ::-1]
    elif case.padding == "packed":
        segment_ids = np.zeros((batch, seq), np.int32)
        for row in range(batch):
            start, segment = 0, 1
            while start < lengths[row]:
                end = min(int(lengths[row]), start + int(rng.integers(seq // 16, seq // 2)))
                segment_ids[row, start:end] = segment
                start, segment = end, segment + 1
    allowed = np.ones((batch, seq, seq), bool)
    if segment_ids is not None:
        allowed = np.asarray(segments.attention_mask(jnp.asarray(segment_ids)))[:, 0]
    elif mask is not None:
        allowed = np.broadcast_to(mask[:, None, :], (batch, seq, seq))
    t, s = np.arange(seq)[:, None], np.arange(seq)[None, :]
    if case.is_causal:
        allowed = allowed & (s <= t)
    if case.window is not None:
        allowed = allowed & (np.abs(t - s) <= case.window)
    return (query, key, value), mask, segment_ids, allowed.any(axis=-1)


def _step(case: Case, mask, segment_ids, cotangent):
    """jitted (q, k, v) -> (output, (dq, dk, dv)) of sum(attend(q, k, v) * cotangent)."""
    mask = None if mask is None else jnp.asarray(mask)
    segment_ids = None if segment_ids is None else jnp.asarray(segment_ids)

    def loss(q, k, v):
        out = attention.attend(q, k, v, mask, segment_ids_BT=segment_ids, is_causal=case.is_causal,
                               local_window_size=case.window)
        return jnp.sum(out.astype(jnp.float32) * cotangent), out

    def step(q, k, v):
        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
        return out, grads

    return jax.jit(step)


def _kernel_in(compiled_text: str) -> str:
    """The fused kernel a compiled program calls. "triton" covers a Pallas kernel and XLA's own
    Triton fusions alike (jax 0.11's compiled text was not read to tell them apart)."""
    text = compiled_text.lower()
    if "cudnn$fmha" in text or "__cudnn" in text:
        return "cudnn"
    if "triton" in text:
        return "triton"
    if "tpu_custom_call" in text:
        return "mosaic (pallas)"
    return "xla"


def _time_ms(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return round(statistics.median(times), 3)


def _error(got, expected, sees_BT) -> tuple[float, float]:
    """(max |got - expected| over the output's queries that see a key, max over the gradients)."""
    out, grads = got
    out_expected, grads_expected = expected
    out_error = float(np.abs(np.asarray(out, np.float32) - np.asarray(out_expected))[sees_BT].max())
    grad_error = max(float(np.abs(np.asarray(g, np.float32) - np.asarray(e)).max())
                     for g, e in zip(grads, grads_expected))
    return out_error, grad_error


def check(case: Case, *, batch: int = 8, seq: int = 512, heads: int = 12, head_dim: int = 64,
          dtype=jnp.bfloat16, repeats: int = 20) -> dict[str, Any]:
    """One row: the kernel `attend` chose, its errors and XLA's half-precision errors against
    XLA in float32, whether it passes, and both paths' forward+backward milliseconds."""
    inputs32, mask, segment_ids, sees_BT = _inputs(case, batch, seq, heads, head_dim)
    cotangent = jax.random.normal(jax.random.key(7), (batch, seq, heads, head_dim)) * jnp.asarray(
        sees_BT, jnp.float32)[:, :, None, None]
    inputs = tuple(x.astype(dtype) for x in inputs32)
    with attention.implementation("xla"):
        expected = _step(case, mask, segment_ids, cotangent)(*inputs32)
        xla = _step(case, mask, segment_ids, cotangent)
        xla_text = xla.lower(*inputs).compile().as_text()
        xla_result = xla(*inputs)
    fused = _step(case, mask, segment_ids, cotangent)
    fused_text = fused.lower(*inputs).compile().as_text()
    fused_result = fused(*inputs)
    chosen = attention.kernel(inputs[0], inputs[1], None if mask is None else jnp.asarray(mask),
                              segment_ids_BT=None if segment_ids is None else jnp.asarray(segment_ids),
                              is_causal=case.is_causal, local_window_size=case.window)
    fused_errors, xla_errors = _error(fused_result, expected, sees_BT), _error(xla_result, expected, sees_BT)
    passes = all(np.isfinite(f) and f <= max(SLACK * x, FLOOR) for f, x in zip(fused_errors, xla_errors))
    with attention.implementation("xla"):
        xla_ms = _time_ms(xla, inputs, repeats)
    fused_ms = _time_ms(fused, inputs, repeats)
    return {
        "bench": "fused_attention", "case": case.name, "device": jax.devices()[0].device_kind,
        "shape": [batch, seq, heads, head_dim], "kv_heads": case.kv_heads, "dtype": jnp.dtype(dtype).name,
        "chosen": chosen, "compiled_kernel": _kernel_in(fused_text), "xla_compiled_kernel": _kernel_in(xla_text),
        "out_error": fused_errors[0], "grad_error": fused_errors[1],
        "xla_half_out_error": xla_errors[0], "xla_half_grad_error": xla_errors[1], "passes": bool(passes),
        "fused_fwd_bwd_ms": fused_ms, "xla_fwd_bwd_ms": xla_ms,
        "speedup": round(xla_ms / fused_ms, 3) if fused_ms else None,
    }


def run_all(*, batch: int = 8, seq: int = 512, heads: int = 12, head_dim: int = 64,
            repeats: int = 20) -> list[dict[str, Any]]:
    """`check` of every case in `CASES` (key/value heads and windows capped to fit the shape); a
    case that raises gives a row with its error and passes=False."""
    rows = []
    for case in CASES:
        window = None if case.window is None else min(case.window, seq // 4)
        case = dataclasses.replace(case, kv_heads=min(case.kv_heads, heads), window=window)
        try:
            rows.append(check(case, batch=batch, seq=seq, heads=heads, head_dim=head_dim, repeats=repeats))
        except Exception as err:  # keep going: one failing case must not hide the others
            rows.append({"bench": "fused_attention", "case": case.name, "error": repr(err)[:2000], "passes": False})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head_dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    rows = run_all(batch=args.batch, seq=args.seq, heads=args.heads, head_dim=args.head_dim, repeats=args.repeats)
    for row in rows:
        print(json.dumps(row))
    return 0 if all(row["passes"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
