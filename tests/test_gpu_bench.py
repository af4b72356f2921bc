"""The GPU record's plumbing on this CPU (`scripts/gpu_bench.sh`, `benchmarks.gpu_run`, the profile
reader `benchmarks.profile_ops` / `scripts/xplane_ops.py`), so that the one short GPU run cannot
fail on it: the jobs' order, the summary, the reader on a real CPU trace, and the script end to
end at tiny shapes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from flaxheads.benchmarks import gpu_run
from flaxheads.benchmarks.profile_ops import top_ops

ROOT = Path(__file__).resolve().parents[1]
ISSUE_ORDER = ["bert_bf16", "bert_bf16_vocabulary_scatter_add", "bert_bf16_scatter_add",
               "bert_bf16_scatter_add_vocabulary_sorted", "profile", "minilm_bf16", "bert_bf16_512", "reward_1b",
               "fused_attention", "decoder_left_padding"]
"""Issue 48's order: BERT-base bf16 (as is, scatter-add, both with the vocabulary fix), the profile,
MiniLM, seq 512, the 1B Llama LoRA reward step, the fused attention check, decoder left padding."""


def test_the_jobs_run_in_the_issues_order_and_each_once():
    ordered = [name for _, names in gpu_run.ORDER for name in names]

    assert ordered[:len(ISSUE_ORDER)] == ISSUE_ORDER
    assert sorted(ordered) == sorted(gpu_run.jobs(gpu_run.Shapes()))


def test_the_summary_gives_each_jobs_ms_ratio_and_mfu_and_every_error():
    rows = [
        {"job": "bert_bf16", "impl": "flaxheads", "step": "train", "step_s_median": 0.0725, "flaxheads_speedup": 1.0,
         "mfu_vs_published": 0.12},
        {"job": "bert_bf16", "impl": "transformers 5.24.0 PyTorch 2.11.0 (sdpa, adamw_torch_fused, bf16 autocast)",
         "step": "train", "step_s_median": 0.0562, "flaxheads_speedup": 0.78, "mfu_vs_published": 0.155},
        {"job": "bert_bf16", "bench": "matmul_peak", "tflops": 900.0},
        {"job": "reward_1b", "step_s_median": 0.0842, "mfu_vs_published": 0.41},
        {"job": "profile", "bench": "profile", "timeline": "device", "op": "scatter.12", "module": "jit_step",
         "self_us": 120.5, "percent": 33.3, "count": 3},
        {"job": "fused_attention", "bench": "fused_attention", "case": "encoder, no padding", "chosen": "cudnn",
         "passes": True, "speedup": 1.5},
        {"job": "minilm_bf16", "error": "RuntimeError('out of memory')"},
    ]

    text = gpu_run.summary(rows).splitlines()

    assert len(text) <= 40
    assert any("bert_bf16" in line and "72.50" in line and "1.00x" in line and "12.0%" in line for line in text)
    assert any("adamw_torch_fused" in line and "56.20" in line and "0.78x" in line and "15.5%" in line
               for line in text)
    assert any(line.startswith("reward_1b") and "84.20" in line and "41.0%" in line for line in text)
    assert any("scatter.12" in line and "33.3%" in line for line in text)
    assert any("encoder, no padding: cudnn ok 1.5x" in line for line in text)
    assert text[-1] == "ERROR minilm_bf16: RuntimeError('out of memory')"


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory) -> str:
    """A jax profiler trace of a small jitted function's three runs on this CPU."""
    folder = tmp_path_factory.mktemp("trace")
    f = jax.jit(lambda x: jnp.sin(x @ x).sum())
    x = jnp.ones((128, 128))
    f(x).block_until_ready()
    with jax.profiler.trace(str(folder)):
        for _ in range(3):
            f(x).block_until_ready()
    (trace,) = folder.rglob("*.xplane.pb")
    return str(trace)


def test_the_profile_reader_ranks_a_cpu_traces_operations(cpu_trace):
    ops, where = top_ops(cpu_trace, top=5)

    assert where == "host" and 0 < len(ops) <= 5
    assert [op["self_us"] for op in ops] == sorted((op["self_us"] for op in ops), reverse=True)
    assert all(op["count"] >= 1 and 0 <= op["percent"] <= 100 and op["module"] for op in ops)


def test_the_profile_script_prints_the_table(cpu_trace):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "xplane_ops.py"), cpu_trace, "--top", "3"],
                            capture_output=True, text=True, check=True)

    lines = result.stdout.splitlines()
    assert "host timelines" in lines[0] and len(lines) == 4, result.stdout


@pytest.mark.slow  # ~90 CPU-s: tiny train steps (the PyTorch peer too), a profile, two interpreters
def test_the_gpu_bench_script_runs_end_to_end_at_tiny_shapes(tmp_path):
    jobs = "bert_bf16 profile decoder_left_padding bert_bf16_scatter_add_ftz"
    env = {**os.environ, "OUT": str(tmp_path), "GPU_BENCH_TINY": "1", "GPU_BENCH_JOBS": jobs,
           "PYTHONPATH": str(ROOT)}
    result = subprocess.run(["bash", "scripts/gpu_bench.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=900)

    summary = result.stdout.split("== summary")[-1]
    assert "ERROR" not in summary, result.stdout + result.stderr
    for job in jobs.split():
        if job != "profile":
            assert job in summary, (job, result.stdout, result.stderr)
    assert "profile (host time)" in summary and (tmp_path / "train_step.xplane.pb").exists()
    assert "adamw_torch_fused" in summary
