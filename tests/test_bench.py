"""The benchmark plumbing (never the timings): the command line, equal work on every side, the
tables, and the Hugging Face Flax peer's errors."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx

from flaxheads import conversion
from flaxheads.backbones import backbone_config_from_hf
from flaxheads.benchmarks import cli as bench_cli
from flaxheads.benchmarks.hf_flax import hf_flax_steps
from flaxheads.benchmarks.step_shapes import ARCHS, StepBench
from flaxheads.benchmarks.steps import published_peak, run, train_flops
from flaxheads.cli import build_parser
from flaxheads.tasks.classification.model import ClassifierConfig, SequenceClassifier


def test_flaxheads_bench_takes_comma_lists_and_defaults_to_everything():
    args = build_parser().parse_args(["bench", "steps", "--arch", "bert,gpt2", "--seq_len", "128,512", "--no-torch"])
    assert (args.what, args.arch, args.size, args.seq_len, args.torch) == (
        "steps", ["bert", "gpt2"], ["minilm"], [128, 512], False)
    assert build_parser().parse_args(["bench"]).what == "all"
    assert build_parser().parse_args(["bench", "--hf-flax-python", "/x/python"]).hf_flax_python == "/x/python"


@pytest.mark.parametrize("arch", ARCHS)
def test_both_sides_of_the_step_benchmark_build_the_same_model(arch):
    """Equal work: flaxheads and transformers get models with the same number of parameters."""
    hf = StepBench(arch=arch).hf_config()
    head = conversion.architecture_table(hf["model_type"]).canonical_head  # "deberta-v3" is deberta-v2
    config = ClassifierConfig(backbone=backbone_config_from_hf(hf), head=head, num_labels=2)
    abstract = nnx.eval_shape(lambda: SequenceClassifier(config, param_dtype=jnp.float32, rngs=nnx.Rngs(0)))
    ours = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(abstract, nnx.Param)))

    hf = dict(hf)
    torch_model = transformers.AutoModelForSequenceClassification.from_config(
        transformers.AutoConfig.for_model(hf.pop("model_type"), **hf))
    assert ours == sum(p.numel() for p in torch_model.parameters())


def test_flops_count_every_matmul_once():
    bench = StepBench(size="minilm", seq_len=128, batch=16)
    d, f, layers, tokens = 384, 1536, 6, 16 * 128
    dense = layers * (4 * d * d + 2 * d * f) + d * d + 2 * d
    assert train_flops(bench) == 6 * tokens * dense + 6 * layers * 16 * 2 * 128**2 * d
    xlnet = StepBench(arch="xlnet", size="minilm", seq_len=128, batch=16)
    assert train_flops(xlnet) == 6 * tokens * (dense + layers * 2 * d * d) + 6 * layers * 16 * 4 * 128**2 * d


@pytest.mark.parametrize("device_kind, bf16", [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12), ("TPU v4", 275e12),
    ("TPU v5 lite", 197e12), ("TPU v5", 459e12), ("TPU v6 lite", 918e12), ("cpu", None),
])
def test_the_published_peak_is_found_by_the_names_jax_gives_the_devices(device_kind, bf16):
    """jax calls the H100 SXM "NVIDIA H100 80GB HBM3" and a v5e "TPU v5 lite": MFU needs their peaks."""
    assert published_peak(device_kind, "bfloat16") == bf16


def test_markdown_puts_step_rows_and_other_rows_in_their_own_tables():
    step = {"arch": "bert", "size": "minilm", "seq_len": 128, "batch": 16, "dtype": "float32", "impl": "flaxheads",
            "step": "train", "step_s_median": 1.25, "step_s_min": 1.2, "step_s_max": 1.5, "first_step_s": 9.87,
            "examples_per_s": 12.8, "tokens_per_s": 1638, "tflops": 0.1, "util_vs_measured_matmul": 0.55,
            "mfu_vs_published": None, "flaxheads_speedup": 1.0}
    peak = {"bench": "matmul_peak", "device": "cpu", "dtype": "float32", "tflops": 0.19}
    tables = bench_cli.markdown([step, peak, dict(step, step="eval"), peak]).split("\n\n")
    assert len(tables) == 2
    lines = tables[0].splitlines()
    assert lines[0].startswith("| arch | size | seq |") and len(lines) == 4
    assert "| 1.250 (1.200-1.500) |" in lines[2] and "| 9.9 |" in lines[2]
    assert tables[1].splitlines()[0] == "| device | dtype | tflops |"


@pytest.mark.slow
def test_the_flax_peer_names_the_fix_when_its_python_is_missing_or_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="make_hf_flax_env.sh"):
        hf_flax_steps(StepBench(), str(tmp_path / "bin" / "python"))
    # this environment has transformers 5, which has no Flax models
    with pytest.raises(RuntimeError, match="lacks transformers 4.57 with Flax models.*make_hf_flax_env.sh"):
        hf_flax_steps(StepBench(), sys.executable)


def test_the_flax_peer_is_refused_for_other_architectures_before_anything_runs():
    with pytest.raises(ValueError, match="runs BERT only, not 'gpt2'"):
        run(StepBench(arch="gpt2"), hf_flax_python="/x/python")


@pytest.mark.slow  # compiles a scanned model and times it
def test_the_scan_runner_times_the_scanned_model(monkeypatch):
    from flaxheads.backbones import stacking
    from flaxheads.benchmarks.steps import flaxheads_runners

    scanned = []
    real = stacking.set_scan_layers
    monkeypatch.setattr(stacking, "set_scan_layers", lambda backbone, on=True: scanned.append(on) or real(backbone, on))
    runners = flaxheads_runners(StepBench(size="minilm", seq_len=8, batch=2), scan=True)
    assert [r.impl for r in runners] == ["flaxheads (scan over layers)"] * 2
    assert scanned == [True]
    runners[0].run(1)


@pytest.mark.slow  # saves checkpoints both ways and times them
def test_the_checkpoint_bench_saves_both_ways_and_reports_the_blocked_seconds(tiny_bert):
    from flaxheads.benchmarks.checkpoint_save import measure

    assert build_parser().parse_args(["bench", "checkpoint"]).what == "checkpoint"
    rows = measure(tiny_bert, saves=2, pause=0.0)
    assert [row["asynchronous"] for row in rows] == [False, True]
    assert all(row["saves"] == 2 and 0 < row["blocked_s_min"] <= row["blocked_s_max"] for row in rows)


@pytest.mark.slow
def test_the_lora_reward_step_counts_its_parameters_and_flops_on_a_tiny_llama():
    """The GPU record's 1B LoRA reward step (benchmarks.reward_step), on a Llama small enough for the CPU."""
    from flaxheads.benchmarks.reward_step import RewardBench, run as run_reward

    tiny = dict(model_type="llama", vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    bench = RewardBench(shape=tuple(tiny.items()), pairs=2, seq=16, dtype="float32", lora_r=4, steps=1, repeats=1,
                        warmup=1)
    row = run_reward(bench)
    # per layer: q 32x32, k and v 32x16, o 32x32, the gated MLP 3 x 32x64, two norms; LoRA r=4 on q and v
    layer = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64 + 2 * 32
    lora = 2 * ((32 + 32) * 4 + (32 + 16) * 4)
    multiplying = 2 * layer + 32 + lora + 32  # layers, final norm, LoRA, the score head (no bias)
    assert row["lora_params"] == lora and row["trainable_params"] == lora + 32
    assert row["all_params"] == multiplying + 128 * 32  # + the embeddings, which multiply nothing
    tokens = 2 * 2 * 16
    flops = tokens * (4 * multiplying + 2 * lora + 12 * 2 * 16 * 32)
    assert bench.flops(multiplying, lora, layers=2, hidden=32) == flops
    seconds = row["step_s_median"]  # rounded to 10 microseconds in the row
    assert row["tflops"] == pytest.approx(flops / seconds / 1e12, rel=0.02, abs=1e-3)
    assert row["tokens_per_s"] == pytest.approx(tokens / seconds, rel=0.02) and row["mfu_vs_published"] is None
    assert np.isfinite(row["loss"])
