#!/usr/bin/env bash
# The GPU benchmark run recorded in docs/benchmarks.md (device machine: jax[cuda], torch, transformers).
# The device image lacks datasets and tensorboardX and holds another transformers version than the
# tests here use: scripts/gpu_wheels.sh (run here first) puts those wheels in .whl/, which the call
# carries (carry [".whl"]) and this script installs into /tmp/site, ahead of the image's. flax, jax
# and torch are the image's (2026-11-27: jax 0.11.2, flax 0.12.10, torch 2.11.0+cu130).
set -u
site=
rm -rf /tmp/site  # a warm machine keeps an earlier call's install: start from the carried wheels alone
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "gpu_bench.sh: installing the carried wheels failed" >&2; exit 1; }
    site=/tmp/site:
else
    echo "gpu_bench.sh: no .whl/ carried: 'import flaxheads' needs datasets, which the device image lacks" \
         "(run bash scripts/gpu_wheels.sh here and carry .whl)" >&2
fi
export PYTHONPATH=$site$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
python3 -m pip show pyarrow fsspec huggingface-hub tokenizers optax orbax-checkpoint 2>/dev/null | grep -E '^(Name|Version):' | paste - - | tr '\n' ';'
echo
python3 -c "import jax, flax, optax, torch, transformers; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, jax.devices())"
out=${OUT:-.}/gpu_bench.jsonl
: >"$out"
# GPU_BENCH_TINY=1: every job at tiny shapes, for a CPU; GPU_BENCH_JOBS="a b": only those jobs
# (tests/test_gpu_bench.py runs a few so).
tiny=${GPU_BENCH_TINY:+--tiny}
# The jobs in flaxheads.benchmarks.gpu_run.ORDER: each group in its own interpreter, with its
# XLA_FLAGS. A device command stops at 10 minutes; rows are written as they finish, so the ones
# that matter most come first, and the jobs stop at GPU_BENCH_BUDGET_S (default 540 s) so that the
# summary below is printed from whatever rows exist.
budget=${GPU_BENCH_BUDGET_S:-540}
while IFS='|' read -r flags jobs; do
    left=$((budget - SECONDS))
    if ((left <= 0)); then echo "gpu_bench.sh: budget of ${budget} s spent; not run: $jobs" >&2; continue; fi
    # shellcheck disable=SC2086  # the job names are words
    XLA_FLAGS="${XLA_FLAGS:-}${flags:+ $flags}" timeout "$left" python3 -m flaxheads.benchmarks.gpu_run $tiny \
        --out "$out" $jobs || echo "gpu_bench.sh: stopped (exit $?) in: $jobs" >&2
done < <(python3 -m flaxheads.benchmarks.gpu_run --groups)
echo
echo "== summary ($out) =="
python3 -m flaxheads.benchmarks.gpu_run --summary "$out"
