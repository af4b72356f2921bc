#!/usr/bin/env bash
# The GPU benchmark run recorded in docs/benchmarks.md (device machine: jax[cuda], torch, transformers).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import jax, flax, optax, torch, transformers; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, jax.devices())"
python3 - "$@" <<'PY'
import json, sys, os
from flaxheads.benchmarks.step_shapes import StepBench
from flaxheads.benchmarks.steps import run
out = open(os.path.join(os.environ.get("OUT", "."), "gpu_bench.jsonl"), "w")
configs = [
    StepBench(size="bert-base", seq_len=128, batch=128, dtype="bfloat16", steps=10, repeats=5),
    StepBench(size="bert-base", seq_len=128, batch=128, dtype="bfloat16", steps=10, repeats=5, attention_dropout=0.0),
    StepBench(size="bert-base", seq_len=512, batch=32, dtype="bfloat16", steps=10, repeats=5),
    StepBench(size="minilm", seq_len=128, batch=128, dtype="bfloat16", steps=10, repeats=5),
    StepBench(size="bert-base", seq_len=128, batch=64, dtype="float32", steps=10, repeats=3),
]
for cfg in configs:
    try:
        rows = run(cfg)
    except Exception as err:  # keep going: one failing config must not lose the others
        rows = [{"config": str(cfg), "error": repr(err)[:2000]}]
    for r in rows:
        line = json.dumps(r)
        print(line); out.write(line + "\n"); out.flush()
PY
