"""A LoRA reward model's train step on a 1B Llama shape, timed: tokens/s and MFU.

    python -m flaxheads.benchmarks.reward_step                  # 8 pairs of 512 tokens, bf16
    python -m flaxheads.benchmarks.reward_step --pairs 16 --gradient_checkpointing

The model: `train_memory.LLAMA_1B` (TinyLlama's shape, 1.03B parameters without an LM head) with
its canonical `last_token` head and num_labels=1, LoRA r=16 (alpha 32) on q_proj and v_proj,
parameters and compute in `dtype` (bf16 keeps the frozen base as a GPU LoRA run keeps it),
trained as a pairwise reward model (`problem.PAIRWISE_REWARD`, Bradley-Terry on chosen/rejected
pairs): a step scores 2 x pairs sequences of `seq` tokens, none of them padding. Weights and token
ids are random: the step's speed does not depend on them.

FLOPs are model FLOPs (PaLM's appendix B convention, attention counted in full although it is
causal): per token, 2 N + 4 L T d forward and 2 N + 8 L T d backward, N the parameters that
multiply a token (embeddings excluded), L layers, T tokens a sequence, d the hidden size; plus
2 N_lora for the LoRA matrices' weight gradients (the frozen base has none). MFU divides the
achieved rate by the device's data-sheet peak (`steps.published_peak`); None where the table does
not know the device (a CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from typing import Any

from flaxheads.benchmarks.train_memory import LLAMA_1B, QUERY_VALUE, Setup, build_step


@dataclasses.dataclass(frozen=True)
class RewardBench:
    shape: tuple[tuple[str, Any], ...] = tuple(LLAMA_1B.items())
    """The Hugging Face config.json fields of the backbone (`train_memory.LLAMA_1B`)."""
    pairs: int = 8
    seq: int = 512
    dtype: str = "bfloat16"
    lora_r: int = 16
    gradient_checkpointing: bool = False
    steps: int = 10
    repeats: int = 3
    warmup: int = 2

    def flops(self, multiplying: int, lora: int, layers: int, hidden: int) -> float:
        """Model FLOPs of one step (module docstring), for `multiplying` parameters that multiply
        each token (LoRA's included), `lora` of them trainable."""
        tokens = 2 * self.pairs * self.seq
        per_token = 4 * multiplying + 2 * lora + 12 * layers * self.seq * hidden
        return float(tokens * per_token)


def run(bench: RewardBench = RewardBench()) -> dict[str, Any]:
    """One row: the step's median seconds over `repeats` rounds of `steps` steps (after `warmup`),
    tokens/s, TFLOP/s, MFU, parameter counts and the device's peak memory where jax reports it."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from flaxheads import lora, problem
    from flaxheads.benchmarks.steps import published_peak

    setup = Setup("reward", lora=lora.LoRAConfig(r=bench.lora_r, alpha=2 * bench.lora_r, target_modules=QUERY_VALUE),
                  gradient_checkpointing=bench.gradient_checkpointing, param_dtype=bench.dtype)
    built = build_step(dict(bench.shape), setup, problem.PAIRWISE_REWARD, num_labels=1, abstract=False)
    backbone, step, state, frozen = built.backbone, built.step, built.state, built.frozen

    rng = np.random.default_rng(0)
    shape = (1, bench.pairs, 2, bench.seq)  # (accumulation, pairs, chosen/rejected, tokens)
    batch = {"input_ids": jnp.asarray(rng.integers(3, backbone.vocab_size, shape), jnp.int32),
             "attention_mask": jnp.ones(shape, jnp.int32),
             "labels": jnp.zeros((1, bench.pairs), jnp.float32),
             "example_mask": jnp.ones((1, bench.pairs), jnp.float32)}
    key = jax.random.key(0)
    for _ in range(bench.warmup):
        state, metrics = step(state, batch, key, frozen)
    jax.block_until_ready(metrics)
    if not np.isfinite(float(metrics["loss"])):
        raise FloatingPointError(f"the reward step's loss is {float(metrics['loss'])}: the timing would mean nothing")
    seconds = []
    for _ in range(bench.repeats):
        start = time.perf_counter()
        for _ in range(bench.steps):
            state, metrics = step(state, batch, key, frozen)
        jax.block_until_ready(metrics)
        seconds.append((time.perf_counter() - start) / bench.steps)

    flops = bench.flops(built.multiplying_params, built.lora_params, backbone.num_hidden_layers, backbone.hidden_size)
    median = statistics.median(seconds)
    device = jax.devices()[0]
    peak = published_peak(device.device_kind, bench.dtype)
    memory = device.memory_stats() or {}
    return {
        **{k: v for k, v in dataclasses.asdict(bench).items() if k != "shape"},
        "model_type": backbone.model_type, "layers": backbone.num_hidden_layers, "hidden": backbone.hidden_size,
        "device": device.device_kind,
        "all_params": built.all_params,
        "trainable_params": built.trainable_params, "lora_params": built.lora_params,
        "step_s_median": round(median, 5), "step_s_min": round(min(seconds), 5),
        "tokens_per_s": round(2 * bench.pairs * bench.seq / median), "tflops": round(flops / median / 1e12, 3),
        "mfu_vs_published": round(flops / median / peak, 3) if peak else None,
        "peak_memory_gib": round(memory["peak_bytes_in_use"] / 2**30, 2) if "peak_bytes_in_use" in memory else None,
        "loss": float(metrics["loss"]),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = RewardBench()
    parser.add_argument("--pairs", type=int, default=defaults.pairs)
    parser.add_argument("--seq", type=int, default=defaults.seq)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=defaults.dtype)
    parser.add_argument("--lora_r", type=int, default=defaults.lora_r)
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    args = parser.parse_args(argv)
    bench = dataclasses.replace(defaults, **{k: v for k, v in vars(args).items()})
    print(json.dumps(run(bench)))


if __name__ == "__main__":
    main()


__all__ = ["RewardBench", "run"]
