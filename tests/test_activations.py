"""Activations by Hugging Face name: values and gradients equal torch's (transformers.activations)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from flaxheads.backbones import layers

# Every region of erf: the tails where 1 + erf(x / sqrt 2) rounds to 0 or 2, and around 0.
X = np.concatenate([np.linspace(-12, 12, 4801), [-1e-30, 0.0, 1e-30, -40.0, 40.0]]).astype(np.float32)


def _torch_value_and_grad(name: str, x: np.ndarray):
    from transformers.activations import ACT2FN

    xt = torch.from_numpy(x).requires_grad_()
    y = ACT2FN[name](xt)
    (grad,) = torch.autograd.grad(y.sum(), xt)
    return y.detach().numpy(), grad.numpy()


# The tanh approximation's gradient: jax differentiates tanh in another order than torch's
# hand-written backward (up to 9.3e-6 where the gradient is ~1).
GRADIENT_TOLERANCE = {"gelu_new": 2e-5, "gelu_pytorch_tanh": 2e-5}


@pytest.mark.parametrize("name", ["gelu", "gelu_python", "gelu_new", "gelu_pytorch_tanh", "quick_gelu", "silu"])
def test_activation_values_and_gradients_equal_torch(name):
    fn = layers.activation(name)
    values = np.asarray(jax.jit(fn)(X))
    our_grad = np.asarray(jax.jit(jax.grad(lambda x: jnp.sum(fn(x))))(X))
    theirs, their_grad = _torch_value_and_grad(name, X)
    print(name, "max |value diff|", np.abs(values - theirs).max(), "max |grad diff|", np.abs(our_grad - their_grad).max())
    np.testing.assert_allclose(values, theirs, rtol=2e-6, atol=2e-6)
    tolerance = GRADIENT_TOLERANCE.get(name, 2e-6)
    np.testing.assert_allclose(our_grad, their_grad, rtol=tolerance, atol=tolerance)
    assert np.isfinite(values).all() and np.isfinite(our_grad).all()


@pytest.mark.slow
def test_exact_gelu_equals_jax_gelu_and_its_gradient_in_float32_and_bfloat16():
    ours = layers.activation("gelu")
    reference = lambda x: jax.nn.gelu(x, approximate=False)  # noqa: E731
    for dtype, tolerance in ((jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)):
        x = jnp.asarray(X, dtype)
        np.testing.assert_allclose(np.asarray(ours(x), np.float32), np.asarray(reference(x), np.float32),
                                   atol=tolerance, rtol=tolerance)
        grads = [np.asarray(jax.grad(lambda v, f=f: jnp.sum(f(v).astype(jnp.float32)))(x), np.float32)
                 for f in (ours, reference)]
        assert grads[0].dtype == grads[1].dtype
        np.testing.assert_allclose(grads[0], grads[1], atol=tolerance, rtol=tolerance)
