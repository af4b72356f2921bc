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
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m pip show pyarrow fsspec huggingface-hub tokenizers optax orbax-checkpoint 2>/dev/null | grep -E '^(Name|Version):' | paste - - | tr '\n' ';'
echo
python3 -c "import jax, flax, optax, torch, transformers; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, jax.devices())"
out=${OUT:-.}/gpu_bench.jsonl
: >"$out"
# jobs: names of the entries of JOBS below, run in this order, each in its own interpreter where it
# needs other XLA_FLAGS. A device command stops at 10 minutes; rows are written as they finish, so
# the ones that matter most come first.
run_jobs() { python3 - "$out" "$@" <<'PY'
import json, sys
from flaxheads.backbones import layers
from flaxheads.benchmarks import fused_check, reward_step
from flaxheads.benchmarks.step_shapes import StepBench
from flaxheads.benchmarks.steps import run

BERT_BF16 = StepBench(size="bert-base", seq_len=128, batch=128, dtype="bfloat16", steps=10, repeats=5)


def scatter_add_gradient(variant):
    """flaxheads alone with every embedding table's gradient a scatter-add (before 2026-11-27)."""
    def job():
        layers.ONE_HOT_GRADIENT_ROWS = 0
        try:
            rows = run(BERT_BF16, torch_peer=False)
        finally:
            layers.ONE_HOT_GRADIENT_ROWS = 2048
        return [dict(r, variant=variant) for r in rows]
    return job


def profile():
    """3 steps of BERT_BF16's train step under jax's profiler; the trace (.xplane.pb) goes to
    $OUT/train_step.xplane.pb (a file the device tool brings back: at most 2 folders down)."""
    import glob, os, shutil, tempfile
    import jax
    from flaxheads.benchmarks.steps import flaxheads_runners

    train = next(r for r in flaxheads_runners(BERT_BF16) if r.step == "train")
    train.run(3)  # compiled and warm
    folder = tempfile.mkdtemp()
    with jax.profiler.trace(folder):
        train.run(3)
    traces = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
    target = os.path.join(os.environ.get("OUT", "."), "train_step.xplane.pb")
    shutil.copy(traces[0], target)
    return [{"profile": target, "bytes": os.path.getsize(target), "traces": len(traces)}]


JOBS = {
    # The issue's target: BERT-base bf16, seq 128, batch 128 against transformers PyTorch (sdpa).
    "bert_bf16": lambda: run(BERT_BF16),
    # The same step with the scatter-add embedding gradient (GPU atomics under contention), and
    # with it and the LLVM option that gives jaxlib 0.10.2-0.11.0 back native float atomics.
    "bert_bf16_scatter_add": scatter_add_gradient("scatter-add gradient"),
    "bert_bf16_scatter_add_ftz": scatter_add_gradient("scatter-add gradient, -nvptx-allow-ftz-atomics"),
    "profile": profile,
    "bert_bf16_no_attention_dropout": lambda: run(StepBench(size="bert-base", seq_len=128, batch=128,
                                                            dtype="bfloat16", steps=10, repeats=5,
                                                            attention_dropout=0.0)),
    "minilm_bf16": lambda: run(StepBench(size="minilm", seq_len=128, batch=128, dtype="bfloat16", steps=10,
                                         repeats=5)),
    "bert_bf16_512": lambda: run(StepBench(size="bert-base", seq_len=512, batch=32, dtype="bfloat16", steps=10,
                                           repeats=5)),
    # The issue's 1B Llama LoRA reward-model step: tokens/s and MFU (flaxheads only).
    "reward_1b": lambda: [reward_step.run(reward_step.RewardBench(pairs=8, seq=512))],
    "reward_1b_remat": lambda: [reward_step.run(reward_step.RewardBench(pairs=16, seq=512,
                                                                        gradient_checkpointing=True))],
    # The fused attention kernels on the device against XLA's path (what the CPU tests cannot run).
    "fused_attention": fused_check.run_all,
    "bert_f32": lambda: run(StepBench(size="bert-base", seq_len=128, batch=64, dtype="float32", steps=10,
                                      repeats=3)),
}
with open(sys.argv[1], "a") as out:
    for name in sys.argv[2:]:
        try:
            rows = JOBS[name]()
        except Exception as err:  # keep going: one failing job must not lose the others
            rows = [{"job": name, "error": repr(err)[:2000]}]
        for row in rows:
            line = json.dumps({"job": name, **row})
            print(line)
            out.write(line + "\n")
            out.flush()
PY
}
run_jobs bert_bf16 bert_bf16_scatter_add profile
XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_backend_extra_options=-nvptx-allow-ftz-atomics" run_jobs bert_bf16_scatter_add_ftz
run_jobs minilm_bf16 reward_1b bert_bf16_512 bert_bf16_no_attention_dropout fused_attention reward_1b_remat bert_f32
