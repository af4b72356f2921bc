"""What a training run may do with its output folder: start, resume, report itself complete,
or refuse. One home for the decision, so that a folder holding another run, another model or the
pretrained checkpoint itself is never written over without `--overwrite_output_dir`.

A run records who it is in `<output_dir>/run.json`: its identity (everything that changes the
trained weights: model, head, labels, data files and a hash of their content, batch, sequence
length, optimiser and schedule settings, seed, steps, compute and parameter dtypes) and whether
it finished. The same command again resumes, or reports the finished run; any other command is
refused with each differing setting named.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from flaxheads import atomic, data
from flaxheads.conversion.formats import checkpoint_files
from flaxheads.data.packing import segments_per_row
from flaxheads.training.checkpoints import CheckpointMismatch
from flaxheads.training.config import TrainConfig

RUN_FILE = "run.json"
RESULTS_FILE = "results.json"
CHECKPOINTS_DIR = "checkpoints"
BEST_MODEL_DIR = "best_model"
PREDICTIONS_FILE = "predict_results.txt"

# What a run creates in its output folder, and so what --overwrite_output_dir may remove. The
# exported model's files (conversion.formats.checkpoint_files) are replaced by the export itself;
# everything else is the user's.
_RUN_ARTIFACTS = (RUN_FILE, RESULTS_FILE, "metrics.jsonl", CHECKPOINTS_DIR, BEST_MODEL_DIR, "tensorboard",
                  "tokenized", PREDICTIONS_FILE)

TRAINING_SETTINGS = (
    "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
    "num_train_epochs", "max_steps", "warmup_ratio", "lr_scheduler_type", "seed", "dtype", "classifier_dropout",
)
"""Settings that change how the weights are trained, not what is trained: an explicit
`--resume_from_checkpoint` may continue a run with other values (e.g. a lower learning rate
after a non-finite loss); an implicit resume must match them too."""


class RunConflict(ValueError):
    """The output folder holds something this run must not write over."""


def _sha256(file: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _data_identity(cfg: TrainConfig) -> dict[str, Any]:
    columns = {"text_column": cfg.text_column, "text_pair_column": cfg.text_pair_column,
               "label_column": cfg.label_column}
    if cfg.train_file:
        files = {"train": cfg.train_file, "validation": cfg.validation_file, "test": cfg.test_file}
        return {"files": {split: {"name": Path(f).name, "sha256": _sha256(f)} for split, f in files.items() if f},
                **columns}
    if cfg.dataset_name:
        return {"dataset_name": cfg.dataset_name, **columns}
    return {"dataset": cfg.dataset}


def run_identity(cfg: TrainConfig, task: data.TaskData, backbone_config: dict[str, Any], head: str,
                 global_batch_size: int, *, total_steps: int, model_name: str | None = None,
                 data_identity: dict[str, Any] | None = None) -> dict[str, Any]:
    """{"trained": what is trained, "settings": how}: both decide whether a folder's run resumes.

    `model_name` defaults to cfg.model_name_or_path (or the shipped MiniLM), `data_identity` to
    what cfg says of the data (files and their hashes, a data set's name)."""
    trained = {
        "model": model_name or cfg.model_name_or_path or "shipped all-MiniLM-L6-v2",
        "backbone": backbone_config,
        "head": head,
        "problem_type": task.problem_type,
        "label_names": [task.id2label[i] for i in range(task.num_labels)],
        "data": _data_identity(cfg) if data_identity is None else data_identity,
        "max_seq_length": cfg.max_seq_length,
        "global_batch_size": global_batch_size,
        "group_by_length": cfg.group_by_length,
        "data_shards": cfg.data_shards,
    }
    if cfg.sampling != ("group_by_length" if cfg.group_by_length else "random"):
        # Recorded only where group_by_length does not say it, so earlier runs' identities hold.
        trained["sampling"] = cfg.sampling
    if cfg.packing:  # recorded only when set, as sampling: packed and padded batches differ
        trained["packing"] = {"max_segments_per_row": segments_per_row(True, cfg.max_segments_per_row,
                                                                       cfg.max_seq_length)}
    if cfg.param_dtype != "float32":  # the dtype the weights live in (recorded only when set, as sampling)
        trained["param_dtype"] = cfg.param_dtype
    if cfg.freeze_backbone or cfg.lora:  # what trains (recorded only when set, as sampling)
        lora = cfg.lora and {"r": cfg.lora.r, "alpha": cfg.lora.alpha, "dropout": cfg.lora.dropout,
                             "target_modules": list(cfg.lora.target_modules)}  # as JSON reads it back
        trained["trainable"] = {"freeze_backbone": cfg.freeze_backbone, "lora": lora or None}
    settings = {name: getattr(cfg, name) for name in TRAINING_SETTINGS}
    settings["warmup_steps"] = cfg.num_warmup_steps(total_steps)
    return {"trained": trained, "settings": settings}


def _implied(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """`saved`, where a run recorded before warmup_steps existed lacks it, with the current
    count: such a run's warmup followed warmup_ratio, which is compared on its own, so a re-run of
    the same command still resumes it."""
    settings = dict(saved.get("settings") or {})
    if settings and "warmup_steps" not in settings:
        settings["warmup_steps"] = current["settings"]["warmup_steps"]
    return {**saved, "settings": settings}


def refuse_output_inside_model(output_dir: str | os.PathLike, model_dir: str | os.PathLike) -> None:
    """RunConflict when the output folder is the model folder or inside it: the export would
    write over the pretrained checkpoint a run starts from."""
    out, model = Path(output_dir).resolve(), Path(model_dir).resolve()
    if out == model or model in out.parents:
        raise RunConflict(
            f"--output_dir {output_dir} is {'the model folder' if out == model else 'inside the model folder'} "
            f"{model_dir}; the run would write over the checkpoint it starts from. Choose an --output_dir outside it"
        )


def _differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    lines = []
    for key in sorted(set(saved) | set(current), key=str):
        old, new = saved.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            lines += _differences(old, new, f"{prefix}{key}.")
        elif old != new:
            lines.append(f"{prefix}{key}: {_short(old)} in the folder, {_short(new)} now")
    return lines


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def read_run(output_dir: str | os.PathLike) -> dict[str, Any] | None:
    file = Path(output_dir) / RUN_FILE
    if not file.is_file():
        return None
    try:
        record = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RunConflict(
            f"{file} is damaged, so flaxheads cannot tell which run the folder holds. Pass "
            "--overwrite_output_dir to start over there, or choose another --output_dir"
        ) from None
    return record if isinstance(record, dict) else None


def write_run(output_dir: str | os.PathLike, identity: dict[str, Any], *, complete: bool) -> None:
    atomic.write_json(Path(output_dir) / RUN_FILE, {"identity": identity, "complete": complete})


def check_folder(output_dir: str | os.PathLike, identity: dict[str, Any], *, explicit_resume: bool) -> dict | None:
    """The folder's run record when this run may continue it (None for a fresh folder).

    Raises CheckpointMismatch naming every setting that differs (with both values), and
    RunConflict for a folder holding a model or checkpoints flaxheads did not write for a run.
    """
    output_dir = Path(output_dir)
    record = read_run(output_dir)
    if record is None:
        foreign = checkpoint_files(output_dir)
        if foreign:
            raise RunConflict(
                f"--output_dir {output_dir} already holds a model that no flaxheads run wrote there "
                f"({', '.join(foreign)}). Pass --overwrite_output_dir to replace it, or choose another --output_dir"
            )
        return None  # a legacy run's checkpoints are checked against their own saved identity
    saved = _implied(record.get("identity") or {}, identity)
    differing = _differences(saved.get("trained") or {}, identity["trained"])
    if not explicit_resume:
        differing += _differences(saved.get("settings") or {}, identity["settings"])
    if differing:
        raise CheckpointMismatch(
            f"--output_dir {output_dir} holds a different run:\n  " + "\n  ".join(differing) + "\nPass "
            "--overwrite_output_dir to start over there, or choose another --output_dir"
            + ("" if explicit_resume else "; to continue that run's checkpoints with new training settings "
               "pass --resume_from_checkpoint STEP")
        )
    return record


def clear_run(output_dir: str | os.PathLike) -> list[str]:
    """Removes what an earlier run created in `output_dir` (never the user's other files);
    returns the names removed."""
    removed = []
    for name in _RUN_ARTIFACTS:
        target = Path(output_dir) / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        else:
            continue
        removed.append(name)
    return removed


def read_results(output_dir: str | os.PathLike) -> dict[str, Any] | None:
    file = Path(output_dir) / RESULTS_FILE
    try:
        return json.loads(file.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def write_results(output_dir: str | os.PathLike, results: dict[str, Any]) -> None:
    atomic.write_json(Path(output_dir) / RESULTS_FILE, results)


def write_predictions(output_dir: str | os.PathLike, text: str) -> Path:
    """`text` as <output_dir>/predict_results.txt, written atomically; returns the path."""
    return atomic.write_text(Path(output_dir) / PREDICTIONS_FILE, text)
