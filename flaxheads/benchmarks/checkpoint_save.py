"""`flaxheads bench checkpoint`: how long a checkpoint save blocks training, synchronous vs
asynchronous Orbax writes, for the train state (parameters and AdamW moments) of a model folder
(default: the shipped MiniLM). Saves `saves` times with `pause` seconds of "training" between
them; the state is donated to a jitted update right after each save, as the train step does."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any


def measure(model: str | Path | None = None, *, saves: int = 4, pause: float = 1.5) -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from flaxheads.tasks.classification.model import from_pretrained
    from flaxheads.shipped_model import minilm_path
    from flaxheads.training.checkpoints import RunCheckpoints
    from flaxheads.training.optim import make_optimizer
    from flaxheads.training.step import TrainState

    _, params = nnx.split(from_pretrained(model or minilm_path(), num_labels=2))
    tx = make_optimizer(optax.constant_schedule(1e-4), weight_decay=0.01, max_grad_norm=1.0)
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    megabytes = sum(x.nbytes for x in jax.tree.leaves(state)) / 2**20
    update = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)
    rows = []
    for asynchronous in (False, True):
        with tempfile.TemporaryDirectory() as directory:
            checkpoints = RunCheckpoints(directory, max_to_keep=2, identity={}, asynchronous=asynchronous)
            blocked = []
            for step in range(1, saves + 1):
                start = time.perf_counter()
                checkpoints.save(state, step, {})
                blocked.append(time.perf_counter() - start)
                state = update(state)
                jax.block_until_ready(state)
                time.sleep(pause)  # training goes on
            start = time.perf_counter()
            checkpoints.close()
            rows.append(dict(bench="checkpoint", asynchronous=asynchronous, state_mib=round(megabytes, 1),
                             saves=saves, pause_s=pause, blocked_s_min=round(min(blocked), 3),
                             blocked_s_max=round(max(blocked), 3), close_s=round(time.perf_counter() - start, 3)))
    return rows
