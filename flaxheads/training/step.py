"""The pure train and eval steps. The model is split once into (graphdef, params); the steps
merge it back inside, so jit sees plain pytrees and compiles once per batch shape. Each step
sets the mode it needs after merging (train: dropout on; eval: off), so the graphdef a caller
split may be in either mode."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from flaxheads import problem
from flaxheads.backbones.dropout import DropoutKeys

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class TrainState(NamedTuple):
    step: jax.Array
    """Optimizer updates done so far (int32 scalar)."""
    params: nnx.State
    opt_state: optax.OptState


def _logits(graphdef, params, batch, *, train: bool, problem_type: str, rngs=None, frozen=None):
    if frozen is not None:
        # New Variables at this trace level (no array is copied): a non-differentiated input keeps
        # the caller's, which nnx.remat (gradient checkpointing) may not update from inside grad.
        frozen = jax.tree.map(lambda x: x, frozen)
    model = nnx.merge(graphdef, params) if frozen is None else nnx.merge(graphdef, params, frozen)
    if train:
        model.train()
    else:
        model.eval()
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    # (B, 2, T) preference pairs; a multiple-choice model reads its (B, C, T) choices itself
    if inputs["input_ids"].ndim == 3 and problem_type != problem.MULTIPLE_CHOICE:
        return _pair_rewards(model, inputs, rngs)
    if "segment_ids" in batch:  # packed rows: (B, S, C) logits, S static from the mask's shape
        return model(**inputs, segment_ids=batch["segment_ids"], num_segments=batch["example_mask"].shape[-1],
                     rngs=rngs)
    return model(**inputs, rngs=rngs)


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


def _pair_rewards(model, inputs: dict, rngs):
    """(B, 2) rewards `(r_chosen, r_rejected)` of a batch of preference pairs, whose inputs are
    (B, 2, T): both texts of every pair in one forward pass of 2B rows."""
    pairs, _, length = inputs["input_ids"].shape
    # (B, 2, T) -> (2B, T): rows 2b and 2b + 1 are pair b's chosen and rejected text.
    flat = {k: v.reshape(2 * pairs, length) for k, v in inputs.items()}
    logits = model(**flat, rngs=rngs)
    if logits.shape[-1] != 1:
        raise ValueError(f"preference pairs need a reward model with num_labels=1, got num_labels={logits.shape[-1]}; "
                         "load the model with from_pretrained(..., num_labels=1)")
    return logits.reshape(pairs, 2)


def make_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    problem_type: str,
    *,
    axis_name: str | None = None,
    class_weights: tuple[float, ...] | None = None,
    label_smoothing: float = 0.0,
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

    Token classification: logits (accum, batch, T, C), labels (accum, batch, T) with -100 where a
    token is not scored; the loss (and gradient) is the mean cross entropy over the scored tokens
    of the real examples of all micro-batches (and devices), as PyTorch's
    `CrossEntropyLoss(ignore_index=-100)` over the whole global batch at once.

    Multiple choice: inputs (accum, batch, C, T), logits (accum, batch, C), labels the right
    choices' indices; the loss is the mean cross entropy over the choices (`choice_loss`).

    `class_weights` and `label_smoothing` shape the training loss (`problem.weighted_loss_terms`):
    the gradient is then that of sum(numerators) / sum(denominators) over the real examples of the
    whole global batch, as PyTorch's weighted cross-entropy over the same batch.
    """

    def summed_loss(params, micro_batch, key, frozen):
        logits = _logits(graphdef, params, micro_batch, train=True, problem_type=problem_type,
                         rngs=DropoutKeys(key), frozen=frozen)
        logits, examples = per_example_logits(logits, micro_batch), per_example(micro_batch)
        mask = examples["example_mask"]
        # Token classification: numerators the examples' summed token losses, denominators their
        # scored tokens, so the step's loss is the mean over the global batch's real tokens.
        if class_weights is None and not label_smoothing and problem_type != problem.TOKEN_CLASSIFICATION:
            return jnp.sum(problem.per_example_loss(logits, examples["labels"], problem_type) * mask), jnp.sum(mask)
        numerators, denominators = problem.weighted_loss_terms(
            logits, examples["labels"], problem_type, class_weights=class_weights, label_smoothing=label_smoothing)
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
        # Unweighted, the example count: the mean over real examples.
        count = jnp.maximum(weight_sum, 1e-12) if class_weights is not None else jnp.maximum(weight_sum, 1.0)
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


def make_eval_step(graphdef: nnx.GraphDef, problem_type: str) -> Callable[[nnx.State, dict], dict[str, Any]]:
    """`(params, batch) -> {"logits", "loss"}` per example, deterministic (no dropout); for packed
    rows one entry per slot, (B * S, ...) as `per_example` flattens a batch (mask them with its
    `example_mask`). Token classification: (B, T, C) logits, "loss" each example's summed token
    losses and "scored_tokens" how many tokens they are (`problem.token_loss_terms`)."""

    def eval_step(params, batch):
        logits = per_example_logits(_logits(graphdef, params, batch, train=False, problem_type=problem_type), batch)
        examples = per_example(batch)
        out = {"logits": logits}
        if "labels" in examples and problem_type == problem.TOKEN_CLASSIFICATION:
            out["loss"], out["scored_tokens"] = problem.token_loss_terms(logits, examples["labels"])
        elif "labels" in examples:
            out["loss"] = problem.per_example_loss(logits, examples["labels"], problem_type)
        return out

    return eval_step
