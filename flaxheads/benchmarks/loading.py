"""Loading at scale: a random checkpoint of an LLM's size in bfloat16 shards, loaded by
`from_pretrained(..., param_dtype=bfloat16)` in a fresh process; load seconds and peak RSS.

    flaxheads bench load                                   # BERT-shaped, 2048 wide, 24 layers: 1.3B
    flaxheads bench load --load_shape '{"model_type": "llama", "hidden_size": 2048, ...}'

The shape is a Hugging Face config.json dict (any model_type flaxheads has a table for), so a
Llama-shaped checkpoint is one `--load_shape` away once that family is registered. The checkpoint
is written shard by shard without building the model (names and shapes come from the conversion
table over an abstract model), so writing it costs one shard of memory.

Peak RSS is measured in its own interpreter (VmHWM minus the RSS after imports). On a CPU the
"devices" are host memory, so the loaded parameters themselves count: a loader that holds one
tensor at a time peaks near 1.0x the checkpoint; one that first reads the whole state peaks near
2x. On an accelerator only the transient host tensor counts.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

BERT_1B = {"model_type": "bert", "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
           "intermediate_size": 8192, "vocab_size": 30522, "max_position_embeddings": 512}
"""A BERT-shaped 1.3B-parameter model (BERT-large's layout at 2048 wide and 24 layers)."""

SHARD_BYTES = 1 << 30
"""At most this many bytes of tensors per shard, about what the hub's 2-5 GB shards hold per GB."""

_MEASURE = r"""
import json, sys, time
import jax, jax.numpy as jnp
import flaxheads
from flaxheads.conversion.loading import flat_variables
from flaxheads.training.sharding import Layout
def status_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
placement = Layout.create(sys.argv[2]).param_sharding if sys.argv[2] else None
base = status_mib("VmRSS")
t0 = time.perf_counter()
model = flaxheads.from_pretrained(sys.argv[1], param_dtype=jnp.bfloat16, placement=placement)
arrays = [v[...] for _, v in flat_variables(model).values()]
jax.block_until_ready(arrays)
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "peak_extra_mib": status_mib("VmHWM") - base,
                  "after_mib": status_mib("VmRSS") - base, "parameters": sum(a.size for a in arrays),
                  "dtypes": sorted({str(a.dtype) for a in arrays}), "devices": jax.device_count(),
                  "platform": jax.devices()[0].platform}))
"""


def checkpoint_tensors(shape: dict[str, Any], head: str | None = None) -> tuple[dict[str, Any], list[tuple[str, tuple]]]:
    """(config.json, [(Hugging Face tensor name, shape)]) of a classifier (num_labels=1) of `shape`,
    from an abstract model: nothing is allocated."""
    from flax import nnx

    from flaxheads import conversion
    from flaxheads.conversion import rules
    from flaxheads.conversion.loading import flat_variables
    from flaxheads.tasks.classification.model import ClassifierConfig, SequenceClassifier

    table = conversion.architecture_table(shape["model_type"])
    config = ClassifierConfig.from_hf_config({**shape, "num_labels": 1}, default_head=head or table.canonical_head)
    abstract = nnx.eval_shape(lambda: SequenceClassifier(config, rngs=nnx.Rngs(0)))
    shapes = {key: tuple(var.shape) for key, (_, var) in flat_variables(abstract).items()}
    base = f"{table.base_prefix}."
    head_paths = [k[len("head."):] for k in shapes if k.startswith("head.")]
    model_rules = rules.backbone_rules(table, config.backbone, base, shapes)
    model_rules += rules.head_rules(table, config.head, head_paths, base)
    architecture = table.classification_architecture if table.is_canonical(config.head) else table.base_architecture
    hf_config = {**config.to_hf_config(architecture), "dtype": "bfloat16"}
    return hf_config, [(rule.hf, rule.transform.hf_shape(shapes[rule.flax])) for rule in model_rules]


def write_random_checkpoint(directory: str | Path, shape: dict[str, Any] = BERT_1B, *, seed: int = 0,
                            shard_bytes: int = SHARD_BYTES) -> Path:
    """A random bfloat16 checkpoint of `shape` in Hugging Face's sharded layout
    (`model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`), one shard in memory at a time."""
    import ml_dtypes

    from flaxheads import atomic
    from flaxheads.conversion import checkpoint_io

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf_config, tensors = checkpoint_tensors(shape)
    itemsize = np.dtype(ml_dtypes.bfloat16).itemsize
    shards, current, size = [], [], 0
    for name, tensor_shape in tensors:
        nbytes = math.prod(tensor_shape) * itemsize
        if current and size + nbytes > shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((name, tensor_shape))
        size += nbytes
    shards.append(current)
    rng = np.random.default_rng(seed)
    weight_map = {}
    for index, shard in enumerate(shards, 1):
        file_name = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        arrays = {name: (rng.standard_normal(s, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16) for name, s in shard}
        checkpoint_io.write_safetensors(directory / file_name, arrays, metadata={"format": "pt"})
        weight_map.update({name: file_name for name in arrays})
        del arrays
    total = sum(math.prod(s) * itemsize for _, s in tensors)
    atomic.write_json(directory / checkpoint_io.SAFETENSORS_INDEX_NAME,
                             {"metadata": {"total_size": total}, "weight_map": weight_map})
    atomic.write_json(directory / checkpoint_io.CONFIG_NAME, hf_config)
    return directory


def measure(shape: dict[str, Any] = BERT_1B, *, mesh: str | None = None, directory: str | Path | None = None) -> dict:
    """Writes a random checkpoint of `shape` (into `directory`, else a temporary folder) and loads it
    once in a fresh process (on `mesh`, e.g. "fsdp=4", when given): seconds, peak RSS, both sizes."""
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        folder = write_random_checkpoint(Path(tmp) / "checkpoint", shape)
        files = list(folder.glob("*.safetensors"))
        checkpoint_mib = sum(f.stat().st_size for f in files) / 2**20
        largest_mib = max(f.stat().st_size for f in files) / 2**20
        out = subprocess.run([sys.executable, "-c", _MEASURE, str(folder), mesh or ""], capture_output=True,
                             text=True, check=True)
    run = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "bench": "load",
        "model_type": shape["model_type"],
        "parameters_b": round(run["parameters"] / 1e9, 3),
        "dtypes": ",".join(run["dtypes"]),
        "platform": f"{run['platform']} x{run['devices']}" + (f" ({mesh})" if mesh else ""),
        "shards": len(files),
        "checkpoint_mib": round(checkpoint_mib, 1),
        "largest_shard_mib": round(largest_mib, 1),
        "load_s": round(run["seconds"], 2),
        "peak_extra_mib": round(run["peak_extra_mib"], 1),
        "peak_over_checkpoint": round(run["peak_extra_mib"] / checkpoint_mib, 3),
        "after_load_mib": round(run["after_mib"], 1),
        # What the loader held beyond the loaded parameters at its peak: the transient host copy.
        "peak_above_loaded_mib": round(run["peak_extra_mib"] - run["after_mib"], 1),
    }
