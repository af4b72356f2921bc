"""The optimizer: `clipped_adamw` is optax's clip_by_global_norm + adamw, its state and its
results bit for bit, in one pass per parameter."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from flaxheads.backbones import EncoderConfig
from flaxheads.model import ClassifierConfig, SequenceClassifier
from flaxheads.training import optim


def _params():
    cfg = ClassifierConfig(EncoderConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=24, max_position_embeddings=16), head="pooler", num_labels=3)
    return nnx.state(SequenceClassifier(cfg, rngs=nnx.Rngs(0)), nnx.Param)


@pytest.mark.parametrize("max_grad_norm", [1.0, None, 1e6])
@pytest.mark.parametrize("weight_decay", [0.01, 0.0])
def test_clipped_adamw_equals_optax_chain_bit_for_bit_with_the_same_state(max_grad_norm, weight_decay):
    params = _params()
    schedule = optim.learning_rate_schedule(1e-2, 20, 3)
    settings = dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                    mask=optim.decay_mask)
    reference, fused = optim.reference_adamw(schedule, **settings), optim.clipped_adamw(schedule, **settings)
    state_ref, state_fused = reference.init(params), fused.init(params)
    assert jax.tree.structure(state_ref) == jax.tree.structure(state_fused)
    p_ref = p_fused = params
    rng = np.random.default_rng(0)
    for step in range(6):  # gradients large and small: clipping on some steps, off on others
        grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape) * 10.0 ** (step % 3 - 2), p.dtype), params)
        u_ref, state_ref = jax.jit(reference.update)(grads, state_ref, p_ref)
        u_fused, state_fused = jax.jit(fused.update)(grads, state_fused, p_fused)
        p_ref, p_fused = optax.apply_updates(p_ref, u_ref), optax.apply_updates(p_fused, u_fused)
    assert jax.tree.structure(state_ref) == jax.tree.structure(state_fused)
    for ours, theirs in zip(jax.tree.leaves((p_fused, state_fused)), jax.tree.leaves((p_ref, state_ref))):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_make_optimizer_keeps_float32_state_for_bfloat16_parameters():
    params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), _params())
    tx = optim.make_optimizer(optim.learning_rate_schedule(1e-3, 10, 1), weight_decay=0.01)
    state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, state = jax.jit(tx.update)(grads, state, params)
    assert {x.dtype for x in jax.tree.leaves(updates)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(state) if x.ndim} == {jnp.dtype(jnp.float32)}
