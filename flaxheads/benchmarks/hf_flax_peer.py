"""The Hugging Face Flax peer of the step benchmark, run as a program in a second environment.

transformers 4.57 is the last line with Flax models, so this file runs under the Python that
`scripts/make_hf_flax_env.sh` builds and must not import flaxheads (that environment does not
have it). `flaxheads.benchmarks.hf_flax.hf_flax_steps` starts it as

    PYTHON hf_flax_peer.py '{"size": ..., "seq_len": ..., "batch": ..., "dtype": ..., "steps": ...,
                             "repeats": ..., "warmup": ..., "hf_config": {...}, "checkpoint": null}'

and reads one JSON line per step kind from stdout. The model is `FlaxBertForSequenceClassification`
(compute in `dtype`, parameters float32, as flaxheads); the train step is the one of Hugging Face's
Flax GLUE example (examples/flax/text-classification/run_flax_glue.py): optax.adamw with the
example's decay mask, a dropout key split every step, value_and_grad, jit with donated state; plus
global-norm clipping, so the optimizer does the same work as the other two peers. The batch and the
timing protocol are copies of `_batch` and `timed` (for one runner) in flaxheads/benchmarks/steps.py.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

LEARNING_RATE = 2e-5
WEIGHT_DECAY = 0.01
MAX_GRAD_NORM = 1.0
ADAM_EPS = 1e-8
"""The GLUE example hard-codes 1e-6; 1e-8 is what flaxheads and torch.optim.AdamW use (same work)."""


def _timed(run_steps: Callable[[int], None], cfg: dict[str, Any]) -> dict[str, float]:
    t0 = time.perf_counter()
    run_steps(1)
    first = time.perf_counter() - t0
    run_steps(cfg["warmup"])
    per_step = []
    for _ in range(cfg["repeats"]):
        t0 = time.perf_counter()
        run_steps(cfg["steps"])
        per_step.append((time.perf_counter() - t0) / cfg["steps"])
    return {"first_step_s": first, "step_s_median": statistics.median(per_step),
            "step_s_min": min(per_step), "step_s_max": max(per_step)}


def _batch(cfg: dict[str, Any], vocab: int) -> dict[str, np.ndarray]:
    rs = np.random.RandomState(0)
    shape = (cfg["batch"], cfg["seq_len"])
    return {
        "input_ids": rs.randint(1000, vocab, shape).astype(np.int32),
        "attention_mask": np.ones(shape, np.int32),
        "token_type_ids": np.zeros(shape, np.int32),
        "labels": rs.randint(0, 2, (cfg["batch"],)).astype(np.int32),
    }


def build_model(cfg: dict[str, Any]):
    """FlaxBertForSequenceClassification, 2 labels: the checkpoint's weights (PyTorch safetensors,
    converted by transformers) or a random model of `cfg["hf_config"]`."""
    import jax.numpy as jnp
    from transformers import BertConfig, FlaxBertForSequenceClassification

    dtype = jnp.dtype(cfg["dtype"])
    if cfg.get("checkpoint"):
        return FlaxBertForSequenceClassification.from_pretrained(cfg["checkpoint"], from_pt=True, num_labels=2, dtype=dtype)
    hf = {k: v for k, v in cfg["hf_config"].items() if k != "model_type"}
    return FlaxBertForSequenceClassification(BertConfig(**hf), dtype=dtype, seed=0)


def decay_mask(params):
    """The GLUE example's mask: decay everything but biases and LayerNorm scales."""
    from flax import traverse_util

    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict({path: path[-1] != "bias" and path[-2:] != ("LayerNorm", "scale") for path in flat})


def make_steps(model, num_labels: int):
    """(train_state, jitted train step, jitted eval step), as in the GLUE example."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax.training import train_state

    schedule = optax.constant_schedule(LEARNING_RATE)
    tx = optax.chain(
        optax.clip_by_global_norm(MAX_GRAD_NORM),
        optax.adamw(schedule, b1=0.9, b2=0.999, eps=ADAM_EPS, weight_decay=WEIGHT_DECAY, mask=decay_mask),
    )
    state = train_state.TrainState.create(apply_fn=model.__call__, params=model.params, tx=tx)

    def train_step(state, batch, dropout_rng):
        dropout_rng, next_dropout_rng = jax.random.split(dropout_rng)
        inputs = {k: v for k, v in batch.items() if k != "labels"}

        def loss_fn(params):
            logits = state.apply_fn(**inputs, params=params, dropout_rng=dropout_rng, train=True)[0]
            # float32 loss under bfloat16 compute, as flaxheads and torch.autocast do
            onehot = jax.nn.one_hot(batch["labels"], num_labels)
            return jnp.mean(optax.softmax_cross_entropy(logits.astype(jnp.float32), onehot))

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        metrics = {"loss": loss, "learning_rate": schedule(state.step)}
        return state.apply_gradients(grads=grads), metrics, next_dropout_rng

    def eval_step(params, batch):
        return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], params=params, train=False)[0]

    return state, jax.jit(train_step, donate_argnums=(0,)), jax.jit(eval_step)


def run(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp
    import transformers

    model = build_model(cfg)
    state, train_step, eval_step = make_steps(model, model.config.num_labels)
    batch = {k: jnp.asarray(v) for k, v in _batch(cfg, model.config.vocab_size).items()}
    holder = {"state": state, "rng": jax.random.PRNGKey(0)}

    def run_train(n):
        for _ in range(n):
            holder["state"], metrics, holder["rng"] = train_step(holder["state"], batch, holder["rng"])
        jax.block_until_ready(metrics)

    def run_eval(n):
        for _ in range(n):
            logits = eval_step(holder["state"].params, batch)
        jax.block_until_ready(logits)

    impl = f"transformers {transformers.__version__} Flax (jax {jax.__version__})"
    device = jax.devices()[0].device_kind
    return [dict(_timed(run_train, cfg), impl=impl, step="train", device=device),
            dict(_timed(run_eval, cfg), impl=impl, step="eval", device=device)]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} '<json config>'", file=sys.stderr)
        return 2
    for row in run(json.loads(argv[1])):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
