#!/usr/bin/env bash
# The GPU benchmark run recorded in docs/benchmarks.md (device machine: jax[cuda], torch, transformers).
# The device image lacks datasets and tensorboardX and holds other flax/transformers versions than
# the tests here use: scripts/gpu_wheels.sh (run here first) puts those wheels in .whl/, which the
# call carries (carry [".whl"]) and this script installs into /tmp/site, ahead of the image's.
set -u
site=
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "gpu_bench.sh: installing the carried wheels failed" >&2; exit 1; }
    site=/tmp/site:
else
    echo "gpu_bench.sh: no .whl/ carried: 'import flaxheads' needs datasets, which the device image lacks" \
         "(run bash scripts/gpu_wheels.sh here and carry .whl)" >&2
fi
export PYTHONPATH=$site$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m pip show pyarrow fsspec huggingface-hub tokenizers optax orbax-checkpoint 2>/dev/null | grep -E '^(Name|Version):' | paste - - | tr '\n' ';'
echo
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
from flaxheads.benchmarks import reward_step
# The issue's 1B Llama LoRA reward-model step: tokens/s and MFU (flaxheads only). The issue's two
# targets run first: a device command stops at 10 minutes, and the rows are written as they finish.
steps = [(cfg, lambda cfg=cfg: run(cfg)) for cfg in configs]
rewards = [(cfg, lambda cfg=cfg: [reward_step.run(cfg)]) for cfg in (
    reward_step.RewardBench(pairs=8, seq=512),
    reward_step.RewardBench(pairs=16, seq=512, gradient_checkpointing=True),
)]
jobs = steps[:2] + rewards[:1] + steps[2:] + rewards[1:]
for cfg, job in jobs:
    try:
        rows = job()
    except Exception as err:  # keep going: one failing config must not lose the others
        rows = [{"config": str(cfg), "error": repr(err)[:2000]}]
    for r in rows:
        line = json.dumps(r)
        print(line); out.write(line + "\n"); out.flush()
PY
