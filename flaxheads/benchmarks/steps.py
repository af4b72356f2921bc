"""Train- and eval-step throughput of flaxheads and of Hugging Face PyTorch, same config and data.

Both sides run `*ForSequenceClassification` of one architecture (flaxheads: that family's
canonical head) on the same random token batch with a full attention mask, AdamW and global-norm
clipping; flaxheads through exactly the jitted step `flaxheads train` uses. Timings: a first step
(compilation included, reported separately) and warm-up steps, then `repeats` rounds of `steps`
steps each, the implementations taking turns within a round; median and spread over rounds.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from flaxheads.benchmarks.step_shapes import (
    ALBERT_EMBEDDING, DEBERTA_BUCKETS, NO_TOKEN_TYPES, SIZES, StepBench, modernbert_intermediate,
)

# Dense bf16/fp32 peaks, FLOP/s, from the vendors' data sheets (dense, no sparsity), by the words
# jax's `device_kind` holds ("NVIDIA H100 80GB HBM3" is the SXM card, "TPU v5 lite" a v5e); the
# first entry whose words all occur (any case) names the device, so the specific ones come first.
PUBLISHED_PEAKS = (
    (("H100", "PCIe"), {"bfloat16": 756e12, "float32": 51e12}),
    (("H100", "NVL"), {"bfloat16": 835e12, "float32": 60e12}),
    (("H100",), {"bfloat16": 989e12, "float32": 67e12}),  # SXM
    (("H200", "NVL"), {"bfloat16": 835e12, "float32": 60e12}),
    (("H200",), {"bfloat16": 989e12, "float32": 67e12}),  # SXM
    (("A100",), {"bfloat16": 312e12, "float32": 19.5e12}),
    (("TPU v4",), {"bfloat16": 275e12, "float32": 275e12 / 2}),
    (("TPU v5 lite",), {"bfloat16": 197e12, "float32": 197e12 / 2}),
    (("TPU v5e",), {"bfloat16": 197e12, "float32": 197e12 / 2}),
    (("TPU v5",), {"bfloat16": 459e12, "float32": 459e12 / 2}),  # v5p
    (("TPU v6 lite",), {"bfloat16": 918e12, "float32": 918e12 / 2}),  # v6e (Trillium)
    (("TPU v6e",), {"bfloat16": 918e12, "float32": 918e12 / 2}),
)


def train_flops(bench: StepBench) -> float:
    """Matmul FLOPs of one training step (forward + backward = 3x forward), embeddings excluded:
    6 * tokens * (dense parameters used per token) + 6 * layers * batch * (attention multiply-adds).
    Attention per sequence and layer: scores and values, 2 * seq^2 * hidden multiply-adds; XLNet's
    relative attention adds scores against 2 * seq positions (2 * seq^2 * hidden more) and the
    projection of those positions (2 * seq * hidden^2, counted as 2 * hidden^2 per token). DeBERTa's
    c2p and p2c score every token against 2 * 256 positions (2 * seq * 512 * hidden more), and
    project the table twice per layer (2 * 512 * hidden^2 per batch)."""
    d, layers, _, f = SIZES[bench.size]
    per_token = layers * (4 * d * d + 2 * d * f) + d * d + 2 * d
    attention = 2 * bench.seq_len**2 * d
    if bench.arch == "xlnet":
        per_token += layers * 2 * d * d
        attention *= 2
    if bench.arch == "albert":  # the factorised embeddings' projection to the hidden size
        per_token += ALBERT_EMBEDDING * d
    positions = 0
    if bench.arch == "deberta-v3":
        attention += 2 * bench.seq_len * 2 * DEBERTA_BUCKETS * d
        positions = layers * 2 * 2 * DEBERTA_BUCKETS * d * d
    if bench.arch == "modernbert":  # GeGLU: Wi (d -> 2i) and Wo (i -> d) instead of BERT's 2 * d * f
        per_token += layers * (3 * d * modernbert_intermediate(d) - 2 * d * f)
    if bench.arch == "llama":  # the gated MLP's third matrix
        per_token += layers * d * f
    tokens = bench.batch * bench.seq_len
    return 6 * tokens * per_token + 6 * layers * bench.batch * attention + 6 * positions


@dataclasses.dataclass
class Runner:
    impl: str
    step: str  # "train" or "eval"
    device: str
    run: Callable[[int], None]
    """Runs n steps and waits for them."""


def timed(runners: list[Runner], bench: StepBench) -> list[dict[str, Any]]:
    """First step (compilation included) and warm-up for each runner, then `repeats` rounds in
    which every runner does `steps` timed steps in turn: peers are interleaved, so a machine that
    slows down for a while slows all of them alike. Median and spread of seconds per step."""
    first = {}
    for r in runners:
        t0 = time.perf_counter()
        r.run(1)
        first[id(r)] = time.perf_counter() - t0
        r.run(bench.warmup)
    per_step: dict[int, list[float]] = {id(r): [] for r in runners}
    for _ in range(bench.repeats):
        for r in runners:
            t0 = time.perf_counter()
            r.run(bench.steps)
            per_step[id(r)].append((time.perf_counter() - t0) / bench.steps)
    return [{"impl": r.impl, "step": r.step, "device": r.device, "first_step_s": first[id(r)],
             "step_s_median": statistics.median(per_step[id(r)]), "step_s_min": min(per_step[id(r)]),
             "step_s_max": max(per_step[id(r)])} for r in runners]


def _batch(bench: StepBench, vocab: int) -> dict[str, np.ndarray]:
    rs = np.random.RandomState(0)
    batch = {
        "input_ids": rs.randint(1000, vocab, (bench.batch, bench.seq_len)).astype(np.int32),
        "attention_mask": np.ones((bench.batch, bench.seq_len), np.int32),
        "token_type_ids": np.zeros((bench.batch, bench.seq_len), np.int32),
        "labels": rs.randint(0, 2, (bench.batch,)).astype(np.int32),
    }
    if bench.arch in NO_TOKEN_TYPES:
        del batch["token_type_ids"]
    if bench.padding != "none":
        lengths = np.linspace(bench.seq_len // 4, bench.seq_len, bench.batch).astype(int)
        mask = np.arange(bench.seq_len)[None, :] < lengths[:, None]
        mask = mask if bench.padding == "right" else mask[:, ::-1]
        batch["attention_mask"] = mask.astype(np.int32)
        pad_id = bench.hf_config().get("pad_token_id", 0)
        batch["input_ids"] = np.where(mask, batch["input_ids"], pad_id).astype(np.int32)
    return batch


def flaxheads_runners(bench: StepBench, checkpoint: str | Path | None = None, *, scan: bool = False) -> list[Runner]:
    """flaxheads' jitted train and eval steps; `scan`: with the layers scanned (`--scan_layers`)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from flaxheads import compile_cache, conversion
    from flaxheads.backbones import backbone_config_from_hf, stacking
    from flaxheads.tasks.classification.model import ClassifierConfig, SequenceClassifier
    from flaxheads.tasks.classification.model import from_pretrained
    from flaxheads.training.optim import make_optimizer
    from flaxheads.training.step import TrainState, make_eval_step, make_train_step

    hf = bench.hf_config()
    if checkpoint:
        model = from_pretrained(checkpoint, num_labels=2, dtype=bench.dtype)
    else:
        head = conversion.architecture_table(hf["model_type"]).canonical_head
        config = ClassifierConfig(backbone=backbone_config_from_hf(hf), head=head, num_labels=2)
        model = SequenceClassifier(config, dtype=jnp.dtype(bench.dtype), rngs=nnx.Rngs(0))
    stacking.set_scan_layers(model.backbone, scan)
    graphdef, params = nnx.split(model)
    schedule = optax.constant_schedule(2e-5)
    tx = make_optimizer(schedule, weight_decay=0.01, max_grad_norm=1.0)
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    train_step = compile_cache.train_jit(make_train_step(graphdef, tx, schedule, "single_label_classification"),
                                         graphdef=graphdef, donate_argnums=0)
    eval_step = compile_cache.forward_jit(make_eval_step(graphdef, "single_label_classification"),
                                          graphdef=graphdef)
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
    impl = "flaxheads (scan over layers)" if scan else "flaxheads"
    return [Runner(impl, "train", device, run_train), Runner(impl, "eval", device, run_eval)]


def torch_runners(bench: StepBench, checkpoint: str | Path | None = None) -> list[Runner]:
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        torch.set_num_threads(os.cpu_count())
    # XLNet and DeBERTa have one attention implementation of their own in transformers.
    attn = None if bench.arch in ("xlnet", "deberta-v3") else "sdpa" if cuda else "eager"
    kwargs = {"attn_implementation": attn} if attn else {}
    if checkpoint:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2, **kwargs)
    else:
        hf = dict(bench.hf_config())
        config = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
        model = transformers.AutoModelForSequenceClassification.from_config(config, **kwargs)
    model.to(device)
    opt, optim_name = trainer_default_optimizer(model, learning_rate=2e-5, weight_decay=0.01)
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
    precision = ", bf16 autocast" if bench.dtype == "bfloat16" else ""
    label = (f"transformers {transformers.__version__} PyTorch {torch.__version__} "
             f"({attn or 'own attention'}, {optim_name}{precision})")
    return [Runner(label, "train", name, run_train), Runner(label, "eval", name, run_eval)]


def trainer_default_optimizer(model, *, learning_rate: float, weight_decay: float):
    """(optimizer, its `optim` name): what `transformers.Trainer` builds for `model` when a user
    names none: `TrainingArguments`' default `optim` (adamw_torch_fused where this torch has the
    fused AdamW), weight decay on every parameter but biases and norms (the Trainer's groups)."""
    import tempfile

    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        args = transformers.TrainingArguments(output_dir=tmp, learning_rate=learning_rate,
                                              weight_decay=weight_decay, report_to="none")
    optimizer_cls, kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(args, model)
    # The Trainer's own rule (it reads nothing of the Trainer but the model).
    decay = set(transformers.Trainer.get_decay_parameter_names(None, model))
    groups = [{"params": [p for n, p in model.named_parameters() if n in decay], "weight_decay": weight_decay},
              {"params": [p for n, p in model.named_parameters() if n not in decay], "weight_decay": 0.0}]
    return optimizer_cls(groups, **kwargs), str(getattr(args.optim, "value", args.optim))


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
    flops = {"train": train_flops(bench)}
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
    """The data-sheet peak of `device_kind` (jax's name of the device) for `dtype`; None for a
    device the table does not know (a CPU, say), where no MFU is reported."""
    for words, peaks in PUBLISHED_PEAKS:
        if all(word.lower() in device_kind.lower() for word in words):
            return peaks.get(dtype)
    return None


def run(bench: StepBench, *, torch_peer: bool = True, checkpoint: str | None = None,
        hf_flax_python: str | None = None, scan_layers: bool = False,
        steps: tuple[str, ...] = ("train", "eval")) -> list[dict[str, Any]]:
    """flaxheads (and with `scan_layers` flaxheads with scanned layers too) and transformers PyTorch
    interleaved in this process, then the Flax peer in its own interpreter, then the matmul peak:
    every row of one call comes from the same machine state. `steps`: which of the train and eval
    steps to time (a step not timed is not compiled either)."""
    import jax

    if hf_flax_python:  # refuse before the minutes of timing, not after
        from flaxheads.benchmarks.hf_flax import hf_flax_steps, require_bert

        require_bert(bench)
    runners = flaxheads_runners(bench, checkpoint)
    if scan_layers:
        runners += flaxheads_runners(bench, checkpoint, scan=True)
    if torch_peer:
        runners += torch_runners(bench, checkpoint)
    rows = timed([r for r in runners if r.step in steps], bench)
    del runners
    if hf_flax_python:
        rows += hf_flax_steps(bench, hf_flax_python, checkpoint)
    peak = matmul_peak(bench.dtype)
    device = jax.devices()[0].device_kind
    return summarise(rows, bench, peak, published_peak(device, bench.dtype)) + [
        {"bench": "matmul_peak", "device": device, "dtype": bench.dtype, "tflops": round(peak / 1e12, 3)}
    ]

