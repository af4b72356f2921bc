"""Dropout's random bits: jax's threefry bit for bit, 16 bits per decision, the same mask sharded."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxheads.backbones import layers


@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (2, 3, 4, 6)])
@pytest.mark.parametrize("seed", [0, 2**31 + 17])
def test_random_bits_are_jax_threefry_bits(shape, seed):
    key = jax.random.fold_in(jax.random.key(seed), 3)
    ours = jax.jit(layers.random_bits, static_argnums=1)(key, shape)
    assert ours.dtype == jnp.uint32
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(jax.random.bits(key, shape, jnp.uint32)))
    raw = jax.random.key_data(key)  # old-style uint32[2] keys give the same bits
    np.testing.assert_array_equal(np.asarray(layers.random_bits(raw, shape)), np.asarray(ours))


def test_other_key_implementations_go_to_jax():
    key = jax.random.key(0, impl="rbg")
    np.testing.assert_array_equal(
        np.asarray(layers.random_bits(key, (4, 8))), np.asarray(jax.random.bits(key, (4, 8), jnp.uint32))
    )


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_keep_mask_keeps_the_right_fraction_and_dropout_is_unbiased(rate):
    shape = (64, 128, 129)  # odd last axis: low and high halves of the last word
    keep, keep_prob = layers.keep_mask(jax.random.key(1), rate, shape)
    assert keep.shape == shape and keep.dtype == jnp.bool_
    assert keep_prob == (65536 - round(rate * 65536)) / 65536
    n = np.prod(shape)
    sigma = np.sqrt(keep_prob * (1 - keep_prob) / n)
    assert abs(float(keep.mean()) - keep_prob) < 6 * sigma
    # the low and high halves of a word decide independently
    pairs = np.asarray(keep[..., :64]).astype(float), np.asarray(keep[..., 64:128]).astype(float)
    assert abs(np.corrcoef(pairs[0].ravel(), pairs[1].ravel())[0, 1]) < 0.01

    class Rngs:  # what layers.dropout needs of nnx.Rngs
        def dropout(self):
            return jax.random.key(2)

    out = layers.dropout(jnp.ones(shape), rate, Rngs())
    kept = np.asarray(out) != 0
    np.testing.assert_allclose(np.asarray(out)[kept], 1 / keep_prob, rtol=1e-6)
    assert abs(float(out.mean()) - 1.0) < 6 * sigma / keep_prob


def test_bad_rates_are_refused():
    with pytest.raises(ValueError, match=r"dropout rate 1.0: it must be in \[0, 1\)"):
        layers.keep_mask(jax.random.key(0), 1.0, (4,))


def test_a_batch_sharded_over_devices_draws_the_same_mask():
    script = textwrap.dedent("""
        import jax, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from flaxheads.backbones import layers
        mesh = Mesh(np.array(jax.devices()), ("data",))
        key = jax.random.key(5)
        f = lambda k: layers.keep_mask(k, 0.1, (8, 12, 16, 16))[0]
        whole = jax.jit(f)(key)
        sharded = jax.jit(f, out_shardings=NamedSharding(mesh, P("data")))(key)
        assert len(sharded.sharding.device_set) == 4
        assert np.array_equal(np.asarray(whole), np.asarray(sharded))
        print("same")
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "same"
