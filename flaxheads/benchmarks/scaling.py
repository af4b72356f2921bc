"""Train-step throughput on 1 vs N devices and compile time per length bucket.

Each device count runs in its own process (XLA_FLAGS fixes the count before jax starts), on a
MiniLM-size random BERT with the jitted step of `flaxheads train`, the global batch fixed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

_MEASURE = r"""
import json, sys, time
import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx
from flaxheads.backbones import EncoderConfig
from flaxheads.tasks.classification.model import ClassifierConfig, SequenceClassifier
from flaxheads.training.optim import make_optimizer
from flaxheads.training.parallel import JitParallel
from flaxheads.training.sharding import Layout

mesh, global_batch, buckets, steps = sys.argv[1], int(sys.argv[2]), [int(b) for b in sys.argv[3].split(",")], int(sys.argv[4])
hf = dict(model_type="bert", hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
model = SequenceClassifier(ClassifierConfig(backbone=EncoderConfig.from_hf_config(hf), head="pooler"), rngs=nnx.Rngs(0))
graphdef, params = nnx.split(model)
schedule = optax.constant_schedule(2e-5)
layout = Layout.create(mesh)
runner = JitParallel(layout, graphdef, make_optimizer(schedule, weight_decay=0.01), schedule,
                     "single_label_classification", params)
state = runner.init(params)
rng = jax.random.key(0)
rows = []
for length in buckets:
    rs = np.random.RandomState(length)
    batch = {"input_ids": rs.randint(1000, 30000, (1, global_batch, length)).astype(np.int32),
             "attention_mask": np.ones((1, global_batch, length), np.int32),
             "token_type_ids": np.zeros((1, global_batch, length), np.int32),
             "labels": rs.randint(0, 2, (1, global_batch)).astype(np.int32),
             "example_mask": np.ones((1, global_batch), np.float32)}
    t0 = time.perf_counter(); state, m = runner.step(state, batch, rng); jax.block_until_ready(m)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        state, m = runner.step(state, batch, rng)
    jax.block_until_ready(m)
    per_step = (time.perf_counter() - t0) / steps
    rows.append({"bench": "scaling", "devices": jax.device_count(), "mesh": mesh, "seq_len": length,
                 "global_batch": global_batch, "compile_and_first_step_s": round(first, 2),
                 "step_s": round(per_step, 3), "examples_per_s": round(global_batch / per_step, 1)})
print(json.dumps(rows))
"""


def measure(devices: int, mesh: str, *, global_batch: int = 16, buckets=(16, 32, 64, 128), steps: int = 3) -> list[dict]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, mesh, str(global_batch), ",".join(map(str, buckets)), str(steps)],
        env=env, capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])
