"""The settings of the tiny training runs tests share, and how they compare runs' exports: a test
that reruns or resumes a run builds its config here, so it states the same command.

`four_step_config` is conftest's `finished_run`; `two_epoch_config` is test_training.py's
uninterrupted run, which test_param_dtype.py repeats with bfloat16 parameters. `cpu_devices_env` is
the environment of a subprocess that sees several CPU devices.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np


@contextlib.contextmanager
def stopped_after_saving(step: int | None = None):
    """A run inside the block stops as if the user pressed ctrl-C right after its checkpoint of
    `step` (None: its first) was written; the block expects that KeyboardInterrupt, and the real
    save is back after it."""
    import pytest

    from flaxheads.training import checkpoints

    real_save = checkpoints.RunCheckpoints.save

    def save_then_stop(self, state, saved_step, meta):
        real_save(self, state, saved_step, meta)
        if step is None or saved_step == step:
            raise KeyboardInterrupt

    checkpoints.RunCheckpoints.save = save_then_stop
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        checkpoints.RunCheckpoints.save = real_save


def cpu_devices_env(devices: int, **extra: str) -> dict[str, str]:
    """This process's environment for a subprocess on the CPU with `devices` devices: the count is
    appended to XLA_FLAGS (jax reads it at start), keeping the suite's other flags (conftest)."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags, **extra}


def four_step_config(model: Path, data: dict[str, Path], output_dir: Path, **overrides):
    """A TrainConfig of 4 steps of 16 examples on `data` ({"train": csv, "validation": csv} with
    sentence,label columns), a checkpoint every 2 steps, seed 3, no report figures (the run report's
    own tests draw them); `overrides` change any field."""
    from flaxheads.training.config import TrainConfig

    settings = dict(
        model_name_or_path=str(model), train_file=str(data["train"]), validation_file=str(data["validation"]),
        text_column="sentence", output_dir=str(output_dir), max_seq_length=32, per_device_train_batch_size=16,
        per_device_eval_batch_size=32, learning_rate=1e-3, max_steps=4, logging_steps=1, save_steps=2,
        disable_tqdm=True, seed=3, report_figures=False,
    )
    settings.update(overrides)
    return TrainConfig(**settings)


def two_epoch_config(model: Path, data: dict[str, Path], output_dir: Path, **overrides):
    """A TrainConfig of 2 epochs of 8 examples a step on `data`, 10% warmup, a log every 4 steps
    and a checkpoint every 8, seed 3, no report figures; `overrides` change any field."""
    from flaxheads.training.config import TrainConfig

    settings = dict(
        model_name_or_path=str(model), train_file=str(data["train"]), validation_file=str(data["validation"]),
        text_column="sentence", output_dir=str(output_dir), max_seq_length=32, per_device_train_batch_size=8,
        per_device_eval_batch_size=16, learning_rate=1e-3, num_train_epochs=2, warmup_ratio=0.1,
        logging_steps=4, save_steps=8, disable_tqdm=True, seed=3, report_figures=False,
    )
    settings.update(overrides)
    return TrainConfig(**settings)


def exported_weights(directory: Path) -> dict[str, np.ndarray]:
    """The tensors of the model.safetensors a run (or an export) wrote in `directory`."""
    from safetensors.numpy import load_file

    return load_file(str(directory / "model.safetensors"))


def assert_weights_identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
