"""The third peer of the step benchmark: Hugging Face Flax (transformers 4.57), in its own Python.

transformers v5 removed every Flax model, so the peer runs in a second environment built by
`scripts/make_hf_flax_env.sh DIR` (transformers 4.57 on the main environment's jax and flax) as the
standalone program `hf_flax_peer.py`, on the same config, batch and timing protocol as
`flaxheads.benchmarks.steps`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from flaxheads.benchmarks.step_shapes import StepBench

PEER = Path(__file__).with_name("hf_flax_peer.py")
MAKE_ENV = "bash scripts/make_hf_flax_env.sh DIR"
ROW_KEYS = {"first_step_s", "step_s_median", "step_s_min", "step_s_max", "impl", "step", "device"}
_CHECK = (
    "import transformers, jax; from transformers import FlaxBertForSequenceClassification; "
    "assert transformers.__version__.startswith('4.57.'), transformers.__version__; "
    "print(transformers.__version__, jax.__version__)"
)


def _check_python(python: str, env: dict[str, str]) -> None:
    """Fails with the command that builds a suitable environment unless `python` runs and has
    transformers 4.57 with its Flax models."""
    fix = f"pass --hf-flax-python DIR/bin/python after building DIR with `{MAKE_ENV}`"
    if shutil.which(python) is None:
        raise FileNotFoundError(f"--hf-flax-python {python}: no such executable; {fix}")
    probe = subprocess.run([python, "-c", _CHECK], env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        raise RuntimeError(
            f"--hf-flax-python {python} lacks transformers 4.57 with Flax models; {fix}\n{probe.stderr.strip()}"
        )


def require_bert(bench: StepBench) -> None:
    """The peer is `FlaxBertForSequenceClassification`; ValueError for any other architecture."""
    if bench.arch != "bert":
        raise ValueError(f"--hf-flax-python: the Hugging Face Flax peer runs BERT only, not {bench.arch!r}")


def hf_flax_steps(bench: StepBench, python: str, checkpoint: str | Path | None = None) -> list[dict[str, Any]]:
    """Train- and eval-step timings of `FlaxBertForSequenceClassification` run by `python`: rows with
    the keys of `steps.timed`'s rows. `checkpoint` is a Hugging Face BERT folder with
    PyTorch safetensors, or None for a random model of `bench.hf_config()`. Raises with the peer's
    stderr if it fails, and if the peer's jax ran on another device than this process's."""
    require_bert(bench)
    # The same XLA_FLAGS and platform as this process. Without preallocation, so that on a GPU the
    # peer still finds memory when this process's jax already holds its share.
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false")}
    _check_python(python, env)
    config = {**dataclasses.asdict(bench), "hf_config": bench.hf_config(),
              "checkpoint": str(checkpoint) if checkpoint else None}
    done = subprocess.run([python, str(PEER), json.dumps(config)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the Hugging Face Flax peer ({python} {PEER.name}) failed:\n{done.stderr.strip()}")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if sorted(r.get("step") for r in rows) != ["eval", "train"] or any(set(r) != ROW_KEYS for r in rows):
        raise RuntimeError(f"the Hugging Face Flax peer printed no train and eval rows:\n{done.stdout}\n{done.stderr}")
    _check_same_device(rows[0]["device"], python)
    return rows


def _check_same_device(peer_device: str, python: str) -> None:
    """A CPU-only jax in the second environment would quietly time the CPU against a GPU."""
    import jax

    ours = jax.devices()[0].device_kind
    if peer_device != ours:
        raise RuntimeError(
            f"the Hugging Face Flax peer ran on {peer_device!r}, this process on {ours!r}: give {python}'s "
            f"environment this accelerator's jax (e.g. JAX_EXTRA=cuda12 {MAKE_ENV})"
        )
