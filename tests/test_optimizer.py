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
from flaxheads.tasks.classification.model import ClassifierConfig, SequenceClassifier
from flaxheads.training import optim


def _params():
    cfg = ClassifierConfig(EncoderConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=24, max_position_embeddings=16), head="pooler", num_labels=3)
    return nnx.state(SequenceClassifier(cfg, rngs=nnx.Rngs(0)), nnx.Param)


@pytest.mark.slow
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


@pytest.mark.slow
def test_make_optimizer_keeps_float32_state_for_bfloat16_parameters():
    params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), _params())
    tx = optim.make_optimizer(optim.learning_rate_schedule(1e-3, 10, 1), weight_decay=0.01)
    state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, state = jax.jit(tx.update)(grads, state, params)
    assert {x.dtype for x in jax.tree.leaves(updates)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(state) if x.ndim} == {jnp.dtype(jnp.float32)}


def _optax_schedule(learning_rate, total_steps, warmup_steps, kind):
    """The schedule as optax's own functions compose it (what `learning_rate_schedule` built before
    its numbers could be run-time arguments)."""
    warmup_steps = min(warmup_steps, total_steps)
    decay_steps = max(total_steps - warmup_steps, 1)
    decay = {"linear": optax.linear_schedule(learning_rate, 0.0, decay_steps),
             "cosine": optax.cosine_decay_schedule(learning_rate, decay_steps),
             "constant": optax.constant_schedule(learning_rate)}[kind]
    if warmup_steps == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, learning_rate, warmup_steps), decay], [warmup_steps])


@pytest.mark.parametrize("kind", optim.SCHEDULES)
@pytest.mark.parametrize("learning_rate, total_steps, warmup_steps",
                         [(2e-5, 265, 0), (1e-4, 260, 26), (3e-4, 7, 7), (5e-5, 12, 30), (1e-3, 1, 0)])
def test_run_time_schedule_numbers_give_optax_values_to_float32_rounding(kind, learning_rate, total_steps,
                                                                        warmup_steps):
    schedule = optim.learning_rate_schedule(learning_rate, total_steps, warmup_steps, kind)
    reference = _optax_schedule(learning_rate, total_steps, warmup_steps, kind)
    counts = jnp.arange(0, total_steps + 3, dtype=jnp.int32)
    expected = np.asarray(jax.jit(jax.vmap(reference))(counts), np.float32)
    constants = np.asarray(jax.jit(jax.vmap(schedule))(counts))
    traced = np.asarray(jax.jit(jax.vmap(schedule, in_axes=(0, None)))(counts, schedule.values()))
    np.testing.assert_array_equal(constants, expected)  # without values: optax's schedules themselves
    # optax's warmup, -lr * frac + lr, cancels near its start: a last-bit difference in `frac`
    # (XLA may divide by a constant through its reciprocal) moves the value by ulps of lr itself
    np.testing.assert_allclose(traced, expected, rtol=0, atol=4 * np.finfo(np.float32).eps * learning_rate)


@pytest.mark.slow
@pytest.mark.parametrize("kind", optim.SCHEDULES)
def test_updates_with_run_time_schedule_numbers_equal_those_with_constants(kind):
    """An optimizer made with one schedule and given another's numbers at run time updates as the
    optimizer made with the other's numbers as constants: the numbers given are the ones used."""
    params = _params()
    made_with = optim.learning_rate_schedule(1e-2, 9, 3, kind)
    schedule = optim.learning_rate_schedule(4e-3, 12, 5, kind)
    given, constant = (optim.make_optimizer(s, weight_decay=0.01) for s in (made_with, schedule))
    rng = np.random.default_rng(1)
    states = {"given": (params, given.init(params)), "constant": (params, constant.init(params))}
    updates = {"given": jax.jit(lambda g, s, p, v: given.update(g, s, p, schedule_values=v)),
               "constant": jax.jit(lambda g, s, p, v: constant.update(g, s, p))}
    for _ in range(7):  # through the warmup and into the decay
        grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
        for name, update in updates.items():
            p, s = states[name]
            u, s = update(grads, s, p, schedule.values())
            states[name] = (optax.apply_updates(p, u), s)
    for ours, theirs in zip(jax.tree.leaves(states["given"]), jax.tree.leaves(states["constant"])):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-6, atol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("max_grad_norm, weight_decay", [(0.5, 0.05), (None, 0.05), (1.0, 0.0)])
def test_run_time_optimizer_numbers_update_as_the_same_numbers_made_constants(max_grad_norm, weight_decay):
    """An optimizer made with the default betas, epsilon, decay and clipping norm, given other
    numbers at run time (`optimizer_values`), updates bit for bit as the optimizer made with them:
    a search over them shares one compiled step and changes no result."""
    params = _params()
    schedule = optim.learning_rate_schedule(1e-2, 9, 3)
    numbers = dict(weight_decay=weight_decay, max_grad_norm=max_grad_norm, adam_b1=0.8, adam_b2=0.99, adam_eps=1e-6)
    constant = optim.make_optimizer(schedule, **numbers)
    given = optim.make_optimizer(schedule, weight_decay=weight_decay and 0.01, max_grad_norm=max_grad_norm and 1.0)
    values = {**schedule.values(), **optim.optimizer_values(**numbers)}
    rng = np.random.default_rng(2)
    states = {"given": (params, given.init(params)), "constant": (params, constant.init(params))}
    updates = {"given": jax.jit(lambda g, s, p, v: given.update(g, s, p, schedule_values=v)),
               "constant": jax.jit(lambda g, s, p, v: constant.update(g, s, p, schedule_values=v))}
    for step in range(5):  # gradients large and small: clipping on some steps, off on others
        grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape) * 10.0 ** (step % 3 - 2), p.dtype), params)
        for name, update in updates.items():
            p, s = states[name]
            u, s = update(grads, s, p, values if name == "given" else schedule.values())
            states[name] = (optax.apply_updates(p, u), s)
    for ours, theirs in zip(jax.tree.leaves(states["given"]), jax.tree.leaves(states["constant"])):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
