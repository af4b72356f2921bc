"""The optimizer: AdamW with warmup then linear or cosine decay, global-norm clipping, and no
weight decay on biases or LayerNorm parameters."""

from __future__ import annotations

import jax
import optax

SCHEDULES = ("linear", "cosine", "constant")


def learning_rate_schedule(
    learning_rate: float, total_steps: int, warmup_steps: int, kind: str = "linear"
) -> optax.Schedule:
    """0 -> `learning_rate` linearly over `warmup_steps`, then `kind` decay to 0 at `total_steps`
    (the shape of transformers' get_linear/cosine_schedule_with_warmup)."""
    if kind not in SCHEDULES:
        raise ValueError(f"lr_scheduler_type={kind!r}; choose one of {SCHEDULES}")
    warmup_steps = min(warmup_steps, total_steps)
    decay_steps = max(total_steps - warmup_steps, 1)
    warmup = optax.linear_schedule(0.0, learning_rate, max(warmup_steps, 1))
    decay = {
        "linear": optax.linear_schedule(learning_rate, 0.0, decay_steps),
        "cosine": optax.cosine_decay_schedule(learning_rate, decay_steps),
        "constant": optax.constant_schedule(learning_rate),
    }[kind]
    if warmup_steps == 0:
        return decay
    return optax.join_schedules([warmup, decay], [warmup_steps])


def decay_mask(params) -> object:
    """True for matrices (kernels, embeddings), False for vectors (biases, LayerNorm scales and
    biases): exactly the parameters transformers' Trainer exempts from weight decay."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(
    schedule: optax.Schedule,
    *,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = 1.0,
    adam_b1: float = 0.9,
    adam_b2: float = 0.999,
    adam_eps: float = 1e-8,
) -> optax.GradientTransformation:
    steps = []
    if max_grad_norm:
        steps.append(optax.clip_by_global_norm(max_grad_norm))
    steps.append(
        optax.adamw(schedule, b1=adam_b1, b2=adam_b2, eps=adam_eps, weight_decay=weight_decay, mask=decay_mask)
    )
    return optax.chain(*steps)
