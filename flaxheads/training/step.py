"""The pure train and eval steps. The model is split once into (graphdef, params); the steps
merge it back inside, so jit sees plain pytrees and compiles once per batch shape. Each step
sets the mode it needs after merging (train: dropout on; eval: off), so the graphdef a caller
split may be in either mode. What the model's logits are and what loss they take is the task's
`Objective` (`objective.py`); the steps know no task."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from flaxheads.backbones.dropout import DropoutKeys
from flaxheads.training.objective import MODEL_INPUTS, Objective, objective_of  # noqa: F401 (MODEL_INPUTS re-exported)


class TrainState(NamedTuple):
    step: jax.Array
    """Optimizer updates done so far (int32 scalar)."""
    params: nnx.State
    opt_state: optax.OptState


def _logits(graphdef, params, batch, *, train: bool, objective: Objective, rngs=None, frozen=None):
    if frozen is not None:
        # New Variables at this trace level (no array is copied): a non-differentiated input keeps
        # the caller's, which nnx.remat (gradient checkpointing) may not update from inside grad.
        frozen = jax.tree.map(lambda x: x, frozen)
    model = nnx.merge(graphdef, params) if frozen is None else nnx.merge(graphdef, params, frozen)
    if train:
        model.train()
    else:
        model.eval()
    return objective.logits(model, batch, rngs)


PER_EXAMPLE = ("labels", "example_mask", "example_index")
"""Batch arrays with one entry per example: (B, ...) or, packed, (B, S, ...)."""


def per_example(batch: dict) -> dict:
    """The batch's `PER_EXAMPLE` arrays with one leading example axis: packed (B, S, ...) arrays
    flattened to (B * S, ...), slot s of row b at b * S + s (absent slots keep `example_mask` 0);
    those of other batches as they are."""
    present = {k: batch[k] for k in PER_EXAMPLE if k in batch}
    if "segment_ids" not in batch:
        return present
    return {k: v.reshape(-1, *v.shape[2:]) for k, v in present.items()}


def per_example_logits(logits: jax.Array, batch: dict) -> jax.Array:
    """`logits` with one row per example, aligned with `per_example(batch)`: a packed batch's
    (B, S, C) flattened to (B * S, C)."""
    return logits.reshape(-1, logits.shape[-1]) if "segment_ids" in batch else logits


def make_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    objective: Objective | str,
    *,
    axis_name: str | None = None,
    **loss_options,
) -> Callable[..., tuple[TrainState, dict]]:
    """`(state, batch, rng, frozen=None, schedule_values=None) -> (state, metrics)`.

    `state.params` are the parameters that train; `frozen` (see `flaxheads.training.trainable`)
    the rest of the model, an input only: no gradient and no optimizer state is made for it.
    `schedule_values` are an `optim.Schedule`'s numbers (`schedule.values()`) as arguments, so
    that runs with another learning rate or length share the compiled step; `tx` then takes
    them as `tx.update(..., schedule_values=...)` (`optim.make_optimizer`'s does). None: the
    schedule's numbers are constants in the program.

    Every array in `batch` has a leading gradient-accumulation axis: (accum, batch, ...). Packed
    batches (with `segment_ids`) have (accum, rows, S) labels and `example_mask`, and the model
    returns a logit row per slot. The gradient is the mean over all real examples (`example_mask`
    1) of all micro-batches, so filler rows and the split into micro-batches change nothing but
    the reduction order.
    Dropout keys are `fold_in(fold_in(rng, step), micro_batch)`, and under pmap also folded with
    the device index so replicas drop different units.

    Under `jax.jit` the batch is one global array and XLA inserts the collectives. Under
    `jax.pmap(..., axis_name=axis_name)` each device sees its slice; the example-weighted sums
    of loss and gradients are then summed over `axis_name` before dividing (a pmean weighted by
    real examples, which equals the plain pmean when every device has the same count).

    `objective` (`objective.Objective`, or a problem type's name with `loss_options`, its
    `ProblemObjective`) gives the logits and the loss terms: the gradient is that of
    sum(numerators) / sum(denominators) over the real examples of the whole global batch. A
    problem type's plain loss has denominators 1 (the mean over examples); with `class_weights`
    or `label_smoothing` it is PyTorch's weighted cross-entropy over the same batch; token
    classification's numerators are each example's summed token losses and its denominators its
    scored tokens, so the step's loss is the mean over the global batch's real tokens.
    """
    objective = objective_of(objective, **loss_options)

    def summed_loss(params, micro_batch, key, frozen):
        logits = _logits(graphdef, params, micro_batch, train=True, objective=objective, rngs=DropoutKeys(key),
                         frozen=frozen)
        logits, examples = per_example_logits(logits, micro_batch), per_example(micro_batch)
        mask = examples["example_mask"]
        numerators, denominators = objective.loss_terms(logits, examples["labels"])
        return jnp.sum(numerators * mask), jnp.sum(denominators * mask)

    def train_step(state: TrainState, batch: dict, rng: jax.Array, frozen=None,
                   schedule_values: dict | None = None) -> tuple[TrainState, dict]:
        step_key = jax.random.fold_in(rng, state.step)
        if axis_name is not None:
            step_key = jax.random.fold_in(step_key, jax.lax.axis_index(axis_name))
        accum = batch["example_mask"].shape[0]

        def accumulate(carry, xs):
            grads, loss_sum, weight_sum = carry
            micro_batch, index = xs
            key = jax.random.fold_in(step_key, index)
            (loss_i, weight_i), grads_i = jax.value_and_grad(summed_loss, has_aux=True)(
                state.params, micro_batch, key, frozen)
            return (jax.tree.map(jnp.add, grads, grads_i), loss_sum + loss_i, weight_sum + weight_i), None

        if accum == 1:  # no scan: its zero-filled carry and adds cost a pass over every parameter
            micro_batch = jax.tree.map(lambda x: x[0], batch)
            key = jax.random.fold_in(step_key, 0)
            (loss_sum, weight_sum), grads = jax.value_and_grad(summed_loss, has_aux=True)(
                state.params, micro_batch, key, frozen)
        else:
            zeros = jax.tree.map(jnp.zeros_like, state.params)
            (grads, loss_sum, weight_sum), _ = jax.lax.scan(
                accumulate, (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32)),
                (batch, jnp.arange(accum))
            )
        examples = jnp.sum(batch["example_mask"])
        if axis_name is not None:
            grads, loss_sum, weight_sum, examples = jax.lax.psum((grads, loss_sum, weight_sum, examples), axis_name)
        # The summed denominators: a count of examples (or scored tokens), or class weights, which
        # may sum below 1. A batch without any gives a zero loss and gradient either way.
        count = jnp.maximum(weight_sum, 1e-12)
        # kept in the gradients' dtype: bf16 ones (param_dtype bfloat16) stay half size until the
        # optimizer upcasts them inside its fused update; float32 ones are unchanged
        grads = jax.tree.map(lambda g: (g / count).astype(g.dtype), grads)
        if schedule_values is None:
            updates, opt_state = tx.update(grads, state.opt_state, state.params)
            learning_rate = schedule(state.step)
        else:
            updates, opt_state = tx.update(grads, state.opt_state, state.params, schedule_values=schedule_values)
            learning_rate = schedule(state.step, schedule_values)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": loss_sum / count,
            "grad_norm": optax.tree.norm(grads),
            "learning_rate": learning_rate,
            "examples": examples,
        }
        return TrainState(state.step + 1, params, opt_state), metrics

    return train_step


def make_eval_step(graphdef: nnx.GraphDef, objective: Objective | str) -> Callable[[nnx.State, dict], dict[str, Any]]:
    """`(params, batch) -> {"logits", "loss", ...}` per example, deterministic (no dropout): the
    logits and, for a labelled batch, the objective's `eval_outputs` (a problem type's name: its
    `ProblemObjective`); for packed rows one entry per slot, (B * S, ...) as `per_example`
    flattens a batch (mask them with its `example_mask`)."""
    objective = objective_of(objective)

    def eval_step(params, batch):
        logits = per_example_logits(_logits(graphdef, params, batch, train=False, objective=objective), batch)
        examples = per_example(batch)
        out = {"logits": logits}
        if "labels" in examples:
            out.update(objective.eval_outputs(logits, examples["labels"]))
        return out

    return eval_step
