"""The names a training run writes in its output folder, and reading its run.json record: a light
module (no Orbax, no TensorBoard), so that `predict`, `evaluate` and the pipeline can tell a run
folder from a model folder without importing what training needs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from flaxheads.conversion import checkpoint_io

RUN_FILE = "run.json"
RESULTS_FILE = "results.json"
METRICS_FILENAME = "metrics.jsonl"
TENSORBOARD_DIRNAME = "tensorboard"
CHECKPOINTS_DIR = "checkpoints"
SET_ASIDE_DIR = CHECKPOINTS_DIR + "_set_aside"
BEST_MODEL_DIR = "best_model"
PREDICTIONS_FILE = "predict_results.txt"
ADAPTER_DIR = "adapter"
"""Where a LoRA run with lora_export="both" writes its peft adapter folder, inside output_dir."""
TOKENIZED_DIR = "tokenized"
REPORT_DIR = "report"
"""The run report's figures (`flaxheads.training.run_report`)."""
SCORING_RECORD = ".flaxheads-outputs.json"
"""Where a run that only scores (do_train=False) records the files it wrote in a folder without run.json."""

RUN_OUTPUTS = (RUN_FILE, RESULTS_FILE, METRICS_FILENAME, CHECKPOINTS_DIR, SET_ASIDE_DIR, BEST_MODEL_DIR,
               TENSORBOARD_DIRNAME, TOKENIZED_DIR, PREDICTIONS_FILE, ADAPTER_DIR, REPORT_DIR)
"""Every name a run may create in its output folder besides its export (config.json, weights,
tokenizer files). A run claims them all when it starts, so it must find none it did not write."""


class RunConflict(ValueError):
    """The output folder holds something this run must not write over."""


def read_run(output_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The folder's run.json record; None when it has none. RunConflict when it is damaged."""
    file = Path(output_dir) / RUN_FILE
    if not file.is_file():
        return None
    try:
        record = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RunConflict(
            f"{file} is damaged, so flaxheads cannot tell which run the folder holds, nor which of its files "
            "the run wrote. Delete it and the run's files by hand to start over there, or choose another output_dir"
        ) from None
    return record if isinstance(record, dict) else None


def recorded_outputs(record: dict[str, Any] | None, output_dir: str | os.PathLike | None = None) -> set[str]:
    """The names an earlier run recorded writing: its `RUN_OUTPUTS` and its export's files (a run
    recorded before the list existed wrote at most `RUN_OUTPUTS`: its export was replaced, not
    removed), and in `output_dir` the files a scoring-only run recorded (`SCORING_RECORD`)."""
    names: set[str] = set()
    if record is not None:
        names = set(RUN_OUTPUTS) if "outputs" not in record else (
            set(record.get("outputs") or ()) | set(record.get("exported") or ()))
    if output_dir is not None:
        try:
            names |= set(json.loads((Path(output_dir) / SCORING_RECORD).read_text()).get("outputs", ()))
        except (OSError, ValueError, AttributeError, TypeError):
            pass
    return names


def not_a_model(folder: str | os.PathLike) -> str | None:
    """Why `folder` is a training run's folder or checkpoint rather than a model, with how to get
    the model; None when it is neither (or when it holds an exported model)."""
    folder = Path(folder)
    if (folder / checkpoint_io.CONFIG_NAME).is_file():
        return None
    run, step = folder, None
    if folder.parent.name == CHECKPOINTS_DIR and folder.name.isdigit():
        run, step = folder.parent.parent, int(folder.name)
    elif folder.name == CHECKPOINTS_DIR:
        run = folder.parent
    try:
        record = read_run(run)
    except RunConflict:
        record = None
    if record is None:
        return None
    command = record.get("command")
    again = (f"re-run its command, which resumes from the newest checkpoint and exports: {command}" if command
             else "re-run the flaxheads train command that started it: it resumes from the newest checkpoint and exports")
    if step is not None:
        return (f"{folder} is checkpoint step {step} of the training run in {run}, not a model folder (a checkpoint holds "
                f"the train state, not config.json and weights). The run exports its model into {run} when it finishes; "
                f"to get it, {again}")
    return (f"{run} is a training run that has not exported its model yet (it stopped before it finished). To export "
            f"it, {again}")
