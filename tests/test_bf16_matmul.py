"""Linear layers' products on CPUs (`layers.dot_general`). bfloat16: accumulated in float32 and
rounded to bfloat16 once, forward and backward, compiled with YNNPACK's bfloat16 kernels
(`compile_cache.CPU_OPTIONS`); the same values as float32 products rounded to bfloat16. float32:
the input's leading axes merged into one, the same bits as jax's product, forward and backward."""

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


def _dot_dimensions(fun, *args) -> list:
    """The dimension numbers of every dot_general in `fun`'s program."""
    return [eqn.params["dimension_numbers"] for eqn in jax.make_jaxpr(fun)(*args).eqns
            if eqn.primitive.name == "dot_general"]


@pytest.mark.parametrize("shape", [(4, 9, 48), (2, 3, 5, 48), (48,)])
def test_float32_products_merge_the_leading_axes_with_the_same_bits(monkeypatch, shape):
    linear = _linear(jnp.float32)
    x = jax.random.normal(jax.random.key(1), shape)
    cotangent = jax.random.normal(jax.random.key(2), (*shape[:-1], 40))
    y = linear(x)
    loss, (grads, dx) = _loss_and_grads(linear, x, cotangent)
    # a fresh function each time: jax caches traces by function
    graphdef, params = nnx.split(linear)
    contracted = lambda: {dims[0] for dims in _dot_dimensions(
        jax.grad(lambda p, x: jnp.sum(nnx.merge(graphdef, p)(x) * cotangent), argnums=(0, 1)), params, x)}
    # forward, input gradient, weight gradient: each a matrix product contracting one axis
    assert contracted() == {((1,), (0,)), ((1,), (1,)), ((0,), (0,))}

    monkeypatch.setattr(layers, "_backend", lambda: "gpu")  # jax's product as it is
    if len(shape) > 2:
        assert ((0,), (0,)) not in contracted()
    expected_loss, (expected_grads, expected_dx) = _loss_and_grads(linear, x, cotangent)
    np.testing.assert_array_equal(y, linear(x))
    np.testing.assert_array_equal(loss, expected_loss)
    np.testing.assert_array_equal(dx, expected_dx)
    np.testing.assert_array_equal(grads["kernel"][...], expected_grads["kernel"][...])
    np.testing.assert_array_equal(grads["bias"][...], expected_grads["bias"][...])


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
