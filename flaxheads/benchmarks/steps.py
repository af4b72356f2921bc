"""Train- and eval-step throughput of flaxheads and of Hugging Face PyTorch, same config and data.

Both sides run BERT-family `*ForSequenceClassification` (flaxheads: the "pooler" head) on the
same random token batch with a full attention mask, AdamW and global-norm clipping; flaxheads
through exactly the jitted step `flaxheads train` uses. Timings: warm-up steps (compilation
included, reported separately), then `repeats` timed runs of `steps` steps each; median and
spread over runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

# Dense bf16/fp32 peaks, FLOP/s, from the vendors' data sheets (dense, no sparsity).
PUBLISHED_PEAKS = {
    "H100 SXM": {"bfloat16": 989e12, "float32": 67e12},
    "H100 PCIe": {"bfloat16": 756e12, "float32": 51e12},
    "H200": {"bfloat16": 989e12, "float32": 67e12},
    "A100": {"bfloat16": 312e12, "float32": 19.5e12},
    "TPU v4": {"bfloat16": 275e12, "float32": 275e12 / 2},
    "TPU v5e": {"bfloat16": 197e12, "float32": 197e12 / 2},
    "TPU v5p": {"bfloat16": 459e12, "float32": 459e12 / 2},
}


@dataclasses.dataclass(frozen=True)
class StepBench:
    size: str = "minilm"  # "minilm" (6 x 384) or "bert-base" (12 x 768)
    seq_len: int = 128
    batch: int = 16
    dtype: str = "float32"  # compute dtype; parameters stay float32
    steps: int = 5
    repeats: int = 5
    warmup: int = 2
    attention_dropout: float = 0.1
    """BERT trains with 0.1; with 0 the flaxheads train step keeps cuDNN's fused attention."""

    def hf_config(self) -> dict[str, Any]:
        if self.size == "minilm":
            sizes = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
        elif self.size == "bert-base":
            sizes = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
        else:
            raise ValueError(f"size {self.size!r}: choose minilm or bert-base")
        return dict(model_type="bert", vocab_size=30522, max_position_embeddings=512, type_vocab_size=2,
                    hidden_act="gelu", layer_norm_eps=1e-12, num_labels=2,
                    attention_probs_dropout_prob=self.attention_dropout, **sizes)


def train_flops(cfg: dict[str, Any], batch: int, seq_len: int) -> float:
    """Matmul FLOPs of one training step (forward + backward = 3x forward), embeddings excluded:
    6 * tokens * (dense parameters) + 12 * layers * batch * seq^2 * hidden (attention scores)."""
    d, f, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    dense_params = layers * (4 * d * d + 2 * d * f) + d * d + d * cfg["num_labels"]
    tokens = batch * seq_len
    return 6 * tokens * dense_params + 12 * layers * batch * seq_len**2 * d


def _timed(run_steps: Callable[[int], None], bench: StepBench) -> dict[str, float]:
    t0 = time.perf_counter()
    run_steps(1)
    first = time.perf_counter() - t0
    run_steps(bench.warmup)
    per_step = []
    for _ in range(bench.repeats):
        t0 = time.perf_counter()
        run_steps(bench.steps)
        per_step.append((time.perf_counter() - t0) / bench.steps)
    return {"first_step_s": first, "step_s_median": statistics.median(per_step),
            "step_s_min": min(per_step), "step_s_max": max(per_step)}


def _batch(bench: StepBench, vocab: int) -> dict[str, np.ndarray]:
    rs = np.random.RandomState(0)
    return {
        "input_ids": rs.randint(1000, vocab, (bench.batch, bench.seq_len)).astype(np.int32),
        "attention_mask": np.ones((bench.batch, bench.seq_len), np.int32),
        "token_type_ids": np.zeros((bench.batch, bench.seq_len), np.int32),
        "labels": rs.randint(0, 2, (bench.batch,)).astype(np.int32),
    }


def flaxheads_steps(bench: StepBench, checkpoint: str | Path | None = None) -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from flaxheads.backbones import EncoderConfig
    from flaxheads.model import ClassifierConfig, SequenceClassifier
    from flaxheads.pretrained import from_pretrained
    from flaxheads.training.optim import make_optimizer
    from flaxheads.training.step import TrainState, make_eval_step, make_train_step

    hf = bench.hf_config()
    if checkpoint:
        model = from_pretrained(checkpoint, num_labels=2, dtype=bench.dtype)
    else:
        config = ClassifierConfig(backbone=EncoderConfig.from_hf_config(hf), head="pooler", num_labels=2)
        model = SequenceClassifier(config, dtype=jnp.dtype(bench.dtype), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    schedule = optax.constant_schedule(2e-5)
    tx = make_optimizer(schedule, weight_decay=0.01, max_grad_norm=1.0)
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    train_step = jax.jit(make_train_step(graphdef, tx, schedule, "single_label_classification"), donate_argnums=0)
    eval_step = jax.jit(make_eval_step(graphdef, "single_label_classification"))
    host = _batch(bench, hf["vocab_size"])
    train_batch = {k: jnp.asarray(v)[None] for k, v in {**host, "example_mask": np.ones(bench.batch, np.float32)}.items()}
    eval_batch = {k: v[0] for k, v in train_batch.items()}
    rng = jax.random.key(0)
    holder = {"state": state}

    def run_train(n):
        for _ in range(n):
            holder["state"], metrics = train_step(holder["state"], train_batch, rng)
        jax.block_until_ready(metrics)

    def run_eval(n):
        for _ in range(n):
            out = eval_step(holder["state"].params, eval_batch)
        jax.block_until_ready(out)

    device = jax.devices()[0].device_kind
    return [dict(_timed(run_train, bench), impl="flaxheads", step="train", device=device),
            dict(_timed(run_eval, bench), impl="flaxheads", step="eval", device=device)]


def torch_steps(bench: StepBench, checkpoint: str | Path | None = None) -> list[dict[str, Any]]:
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        torch.set_num_threads(os.cpu_count())
    attn = "sdpa" if cuda else "eager"
    if checkpoint:
        model = transformers.BertForSequenceClassification.from_pretrained(checkpoint, num_labels=2, attn_implementation=attn)
    else:
        model = transformers.BertForSequenceClassification(transformers.BertConfig(**bench.hf_config(), attn_implementation=attn))
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    batch = {k: torch.as_tensor(v.astype(np.int64)).to(device) for k, v in _batch(bench, model.config.vocab_size).items()}
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bench.dtype == "bfloat16")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def run_train(n):
        model.train()
        for _ in range(n):
            with autocast:
                loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync()

    def run_eval(n):
        model.eval()
        with torch.no_grad(), autocast:
            for _ in range(n):
                model(**{k: v for k, v in batch.items() if k != "labels"})
        sync()

    name = torch.cuda.get_device_name() if cuda else "cpu"
    label = f"transformers {transformers.__version__} PyTorch {torch.__version__} ({attn})"
    return [dict(_timed(run_train, bench), impl=label, step="train", device=name),
            dict(_timed(run_eval, bench), impl=label, step="eval", device=name)]


def matmul_peak(dtype: str, n: int | None = None) -> float:
    """Dense matmul FLOP/s jax reaches on this device in this process (the same-run ceiling)."""
    import jax
    import jax.numpy as jnp

    gpu = jax.default_backend() != "cpu"
    n = n or (8192 if gpu else 1024)
    a = jnp.ones((n, n), dtype)
    f = jax.jit(lambda a: a @ a)
    f(a).block_until_ready()
    reps = 20 if gpu else 5
    t0 = time.perf_counter()
    for _ in range(reps):
        out = f(a)
    out.block_until_ready()
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def summarise(rows: list[dict[str, Any]], bench: StepBench, peak_measured: float, published: float | None) -> list[dict]:
    """Adds examples/s, tokens/s, FLOP/s, utilisation and the ratio to flaxheads to every row."""
    cfg = bench.hf_config()
    flops = {"train": train_flops(cfg, bench.batch, bench.seq_len)}
    flops["eval"] = flops["train"] / 3
    ours = {r["step"]: r["step_s_median"] for r in rows if r["impl"] == "flaxheads"}
    out = []
    for r in rows:
        achieved = flops[r["step"]] / r["step_s_median"]
        out.append({
            **dataclasses.asdict(bench), **r,
            "examples_per_s": round(bench.batch / r["step_s_median"], 1),
            "tokens_per_s": round(bench.batch * bench.seq_len / r["step_s_median"]),
            "tflops": round(achieved / 1e12, 3),
            "util_vs_measured_matmul": round(achieved / peak_measured, 3),
            "mfu_vs_published": round(achieved / published, 3) if published else None,
            "flaxheads_speedup": round(r["step_s_median"] / ours[r["step"]], 2) if r["step"] in ours else None,
        })
    return out


def published_peak(device_kind: str, dtype: str) -> float | None:
    for name, peaks in PUBLISHED_PEAKS.items():
        if all(part.lower() in device_kind.lower() for part in name.split()):
            return peaks[dtype]
    return None


def run(bench: StepBench, *, torch_peer: bool = True, checkpoint: str | None = None) -> list[dict[str, Any]]:
    import jax

    rows = flaxheads_steps(bench, checkpoint)
    if torch_peer:
        rows += torch_steps(bench, checkpoint)
    peak = matmul_peak(bench.dtype)
    device = jax.devices()[0].device_kind
    return summarise(rows, bench, peak, published_peak(device, bench.dtype)) + [
        {"bench": "matmul_peak", "device": device, "dtype": bench.dtype, "tflops": round(peak / 1e12, 3)}
    ]


if __name__ == "__main__":
    for row in run(StepBench(steps=2, repeats=2)):
        print(json.dumps(row))
