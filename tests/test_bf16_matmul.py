"""bfloat16 Linear layers on CPUs (`layers.dot_general`): products accumulated in float32 and
rounded to bfloat16 once, forward and backward, compiled with YNNPACK's bfloat16 kernels
(`compile_cache.CPU_OPTIONS`); the same values as float32 products rounded to bfloat16."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import flaxheads
from flaxheads import compile_cache
from flaxheads.backbones import layers
from flaxheads.training import parallel
from flaxheads.training.optim import make_optimizer
from flaxheads.training.sharding import Layout

BF16_ULP = 2.0 ** -7
"""bfloat16's relative spacing: two roundings of the same float32 sum differ by at most this."""


def _linear(dtype=jnp.bfloat16, param_dtype=jnp.float32):
    return layers.dense(48, 40, init_std=0.5, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0))


def _loss_and_grads(linear, x, cotangent):
    graphdef, params = nnx.split(linear)

    def loss(params, x):
        return jnp.sum(nnx.merge(graphdef, params)(x).astype(jnp.float32) * cotangent)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)


@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.bfloat16])
def test_bfloat16_products_and_gradients_are_float32_sums_rounded_once(param_dtype):
    linear = _linear(param_dtype=param_dtype)
    x = jax.random.normal(jax.random.key(1), (3, 5, 48)).astype(jnp.bfloat16)
    cotangent = jax.random.normal(jax.random.key(2), (3, 5, 40))
    kernel = np.asarray(linear.kernel[...].astype(jnp.bfloat16), np.float32)
    assert "custom_vjp" in str(jax.make_jaxpr(lambda x: linear(x))(x)), "the bfloat16 product is not taken"

    y = np.asarray(linear(x), np.float32)
    _, (grads, dx) = _loss_and_grads(linear, x, cotangent)

    x32 = np.asarray(x, np.float32)
    g32 = np.asarray(cotangent.astype(jnp.bfloat16), np.float32)  # the cotangent reaches the layer as bfloat16
    expected_y = x32 @ kernel + np.asarray(linear.bias[...].astype(jnp.bfloat16), np.float32)
    np.testing.assert_allclose(y, expected_y, rtol=2 * BF16_ULP, atol=1e-2)
    np.testing.assert_allclose(np.asarray(dx, np.float32), g32 @ kernel.T, rtol=2 * BF16_ULP, atol=1e-2)
    expected_dw = x32.reshape(-1, 48).T @ g32.reshape(-1, 40)
    np.testing.assert_allclose(np.asarray(grads["kernel"][...], np.float32), expected_dw, rtol=2 * BF16_ULP,
                               atol=1e-2)
    assert grads["kernel"][...].dtype == param_dtype


def test_other_products_stay_jax_s(monkeypatch):
    x = jnp.ones((2, 48), jnp.bfloat16)
    assert "custom_vjp" not in str(jax.make_jaxpr(lambda x: _linear(jnp.float32)(x))(x.astype(jnp.float32)))
    monkeypatch.setattr(layers, "_backend", lambda: "gpu")  # a GPU accumulates bfloat16 in float32 itself
    assert "custom_vjp" not in str(jax.make_jaxpr(lambda x: _linear()(x))(x))


def test_a_bfloat16_model_compiles_with_the_bfloat16_options(monkeypatch, hf_checkpoint):
    """The train step and the evaluation of a bfloat16 model compile with `CPU_OPTIONS[...,
    "bfloat16"]` (YNNPACK matmuls), a float32 model's with the float32 ones."""
    seen = []
    monkeypatch.setattr(compile_cache, "train_jit",
                        lambda fun, graphdef, **kwargs: seen.append(compile_cache.compute_dtype(graphdef)) or fun)
    schedule = optax.constant_schedule(1e-3)
    path = hf_checkpoint("BertForSequenceClassification").path
    for dtype in ("bfloat16", "float32"):
        graphdef, params = nnx.split(flaxheads.from_pretrained(path, dtype=dtype))
        assert compile_cache.compute_dtype(graphdef) == dtype
        parallel.JitParallel(Layout.create(), graphdef, make_optimizer(schedule), schedule,
                             "single_label_classification", params)
    assert seen == ["bfloat16", "float32"]
    if compile_cache.compiler_options("train") is not None:  # an XLA:CPU with YNNPACK fusions
        assert "INDIVIDUAL_DOT" in str(compile_cache.compiler_options("train", "bfloat16"))
        assert "INDIVIDUAL_DOT" in str(compile_cache.compiler_options("forward", "bfloat16"))
