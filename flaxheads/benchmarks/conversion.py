"""Conversion speed and memory: Hugging Face safetensors -> flaxheads, in a fresh process each.

Each measurement runs in its own interpreter so peak RSS belongs to that conversion alone;
the reported extra memory is the peak RSS minus the RSS after imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

_MEASURE = r"""
import json, sys, time
t0 = time.perf_counter()
from flaxheads.convert import convert
import_seconds = time.perf_counter() - t0
def status_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
# VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over exec from the forked copy of
# the parent, so a big parent (one that just built the BERT-base checkpoint) inflated it.
rss_mib = lambda: status_mib("VmRSS")
peak_mib = lambda: status_mib("VmHWM")
base = rss_mib()
t0 = time.perf_counter()
info, _ = convert(sys.argv[1], sys.argv[2], to="flax")
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "import_seconds": import_seconds, "peak_extra_mib": peak_mib() - base,
                  "torch_imported": "torch" in sys.modules}))
"""


def checkpoint_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors")) / 2**20


def measure(src: str | Path, repeats: int = 3) -> dict:
    """Median seconds and peak extra RSS of `convert(src, tmp, to="flax")` over fresh processes."""
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as dst:
            out = subprocess.run([sys.executable, "-c", _MEASURE, str(src), dst], capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    seconds = sorted(r["seconds"] for r in runs)
    size = checkpoint_mib(Path(src))
    peak = max(r["peak_extra_mib"] for r in runs)
    return {
        "bench": "conversion",
        "checkpoint": str(src),
        "checkpoint_mib": round(size, 1),
        "seconds_median": round(seconds[len(seconds) // 2], 3),
        "seconds_min": round(seconds[0], 3),
        "seconds_max": round(seconds[-1], 3),
        "peak_extra_mib": round(peak, 1),
        "peak_extra_over_checkpoint": round(peak / size, 2),
        "torch_imported": any(r["torch_imported"] for r in runs),
        "repeats": repeats,
    }


def random_bert_base(directory: str | Path) -> Path:
    """A BERT-base-size (12 x 768) random checkpoint in Hugging Face layout, written without torch."""
    import jax.numpy as jnp
    from flax import nnx

    from flaxheads.backbones import EncoderConfig
    from flaxheads.tasks.classification.model import ClassifierConfig, SequenceClassifier

    config = ClassifierConfig(backbone=EncoderConfig(), head="pooler", num_labels=2)
    model = SequenceClassifier(config, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    model.save_pretrained(directory)
    return Path(directory)
