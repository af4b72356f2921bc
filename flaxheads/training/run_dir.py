"""What a training run may do with its output folder: start, resume, report itself complete,
or refuse. One home for the decision, so that a folder holding another run, another model, the
user's own files or the pretrained checkpoint itself is never written over without a flag.

A run records who it is in `<output_dir>/run.json`: its identity (everything that decides what
the trained weights mean: the model and tokenizer by content, head, labels in order, data files by
content, batch, sequence length, optimiser and schedule settings, seed, steps, compute and
parameter dtypes, what trains), whether it finished, and every name it writes in the folder
(`RUN_OUTPUTS`, and the files of its export). The same command again resumes, or reports the
finished run; any other command is refused with each differing setting named.

Files flaxheads did not write are never replaced or deleted: a name in `RUN_OUTPUTS` that no
run recorded writing (the user's own `results.json`, `checkpoints/`, `adapter/`) makes the run
refuse the folder, `overwrite_output_dir=True` included, which removes only what the earlier
run recorded. Messages name Python arguments (`overwrite_output_dir=True`); the command line
turns them into its flags.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Iterable, NamedTuple

import numpy as np

from flaxheads import atomic, data
from flaxheads.conversion import checkpoint_io, loading
from flaxheads.conversion.formats import PYTORCH, TOKENIZER_FILES, checkpoint_files
from flaxheads.data.packing import segments_per_row
from flaxheads.training import metrics as metrics_lib
from flaxheads.training.checkpoints import CheckpointMismatch
from flaxheads.training.config import TrainConfig
from flaxheads.training.run_files import (  # noqa: F401 (re-exported: the names of a run folder belong to run_dir too)
    ADAPTER_DIR, BEST_MODEL_DIR, CHECKPOINTS_DIR, PREDICTIONS_FILE, RESULTS_FILE, RUN_FILE, RUN_OUTPUTS, SCORING_RECORD,
    SET_ASIDE_DIR, TOKENIZED_DIR, RunConflict, not_a_model, read_run, read_scoring_record, recorded_outputs,
    results_sha256, write_record, write_run_record,
)
from flaxheads.training import run_files

TRAINING_SETTINGS = (
    "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
    "num_train_epochs", "max_steps", "warmup_ratio", "lr_scheduler_type", "seed", "dtype", "classifier_dropout",
)
"""Settings that change how the weights are trained, not what is trained: an explicit
`resume_from_checkpoint` may continue a run with other values (e.g. a lower learning rate
after a non-finite loss); an implicit resume must match them too."""

UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
"""The errors of a folder a run cannot write: read-only media, or no permission."""


class UnwritableFolder(OSError):
    """An output folder the run cannot write; the message, all of `str()`, says what to do."""

    def __str__(self) -> str:
        return self.strerror


FINGERPRINT = "sha256:"
"""How a content fingerprint starts; an identity recorded before fingerprints named the model by its path."""


# ---------------------------------------------------------------------------------------------
# Identity


def _sha256(file: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def model_fingerprint(folder: str | os.PathLike) -> str:
    """The content of a checkpoint folder's config.json and weight files, whatever path names it:
    the same model given by a relative and an absolute path, or copied elsewhere, is the same."""
    folder = Path(folder)
    names = [name for name in checkpoint_files(folder) if name not in TOKENIZER_FILES]
    digest = hashlib.sha256()
    for name in names:
        digest.update(f"{name}\0{_sha256(folder / name)}\0".encode())
    return FINGERPRINT + digest.hexdigest()


def params_fingerprint(params) -> str:
    """The content of an in-memory model's parameters (an `nnx.State`)."""
    from flax import nnx

    digest = hashlib.sha256()
    for path, variable in nnx.to_flat_state(params):
        value = np.asarray(variable[...])
        digest.update(f"{'.'.join(map(str, path))}\0{value.dtype}\0{value.shape}\0".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    return FINGERPRINT + digest.hexdigest()


def _data_identity(cfg: TrainConfig) -> dict[str, Any]:
    columns = {"text_column": cfg.text_column, "text_pair_column": cfg.text_pair_column,
               "label_column": cfg.label_column}
    # Multiple-choice columns, recorded only when set (detected ones follow from the files' content).
    columns.update({name: list(value) if isinstance(value, tuple) else value
                    for name in ("context_column", "question_column", "choice_columns")
                    if (value := getattr(cfg, name)) is not None})
    if cfg.train_file:
        files = {"train": cfg.train_file, "validation": cfg.validation_file, "test": cfg.test_file}
        return {"files": {split: {"sha256": _sha256(f)} for split, f in files.items() if f}, **columns}
    if cfg.dataset_name:
        return {"dataset_name": cfg.dataset_name, **columns}
    # The built-in splits' rows come in a seeded random order since 2026-11-24 (not the file's):
    # recorded, so a run of the earlier order is never resumed with the new one.
    return {"dataset": cfg.dataset, "order": "shuffled by seed"}


def run_identity(cfg: TrainConfig, task: data.TaskData, backbone_config: dict[str, Any], head: str,
                 global_batch_size: int, *, total_steps: int, model: str, tokenizer: str,
                 data_identity: dict[str, Any] | None = None, objective: dict[str, Any] | None = None,
                 problem: str | None = None, task_identity: dict[str, dict[str, Any]] | None = None,
                 best_metric: str) -> dict[str, Any]:
    """{"trained": what is trained, "settings": how}: both decide whether a folder's run resumes.

    `model` and `tokenizer` are content fingerprints (`model_fingerprint`, `params_fingerprint`,
    `data.tokenization.tokenizer_fingerprint`); `data_identity` defaults to what cfg says of the data (files by
    the hash of their content, a data set's name); `objective` is the loss's options (class weights,
    label smoothing) when any is set; `problem` what the labels are (default: the data's problem
    type); `task_identity` the task's own entries ({"trained": ..., "settings": ...},
    `Task.identity`); `best_metric` the metric the best weights follow (metric_for_best_model,
    else the task's default)."""
    trained = {
        "model": model,
        "tokenizer": tokenizer,
        "backbone": backbone_config,
        "head": head,
        "problem_type": task.problem_type if problem is None else problem,
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
    trained.update((task_identity or {}).get("trained", {}))
    if objective:  # the loss's class weights (resolved) and label smoothing (recorded only when set)
        trained["objective"] = {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(objective.items())}
    if "validation" in task.splits:  # which evaluation is the best, and when the run stops (`_selection`)
        trained["selection"] = _selection(cfg, best_metric)
    settings = {name: getattr(cfg, name) for name in TRAINING_SETTINGS}
    settings["warmup_steps"] = cfg.num_warmup_steps(total_steps)
    if cfg.calibrate:  # what the export is (recorded only when set, so earlier runs' identities hold)
        settings["calibrate"] = True
    if cfg.tune_thresholds:
        settings["tune_thresholds"] = True
    settings.update((task_identity or {}).get("settings", {}))
    return {"trained": trained, "settings": settings}


def _selection(cfg: TrainConfig, metric: str) -> dict[str, Any]:
    """What picks the weights the run keeps as its best (best_model/, and its export with
    load_best_model_at_end) and when it stops: the metric and its direction, resolved,
    load_best_model_at_end, early stopping, and, where the best evaluation's weights are exported
    or decide the end, the evaluations' schedule.

    In the trained identity, so that neither a re-run nor an explicit resume_from_checkpoint may
    change it: the best value a checkpoint carries was measured by the folder's metric on the
    folder's schedule, and best_model/ holds the weights it picked; compared with another metric,
    it would keep the old metric's choice (or export it). calibrate and tune_thresholds are not
    here: they act once on the final weights, after training, so an explicit resume may change
    them (a re-run may not: they are settings). `metric`: metric_for_best_model, resolved (else the
    task's default)."""
    greater = cfg.greater_is_better if cfg.greater_is_better is not None else metrics_lib.higher_is_better(metric)
    selection: dict[str, Any] = {"metric_for_best_model": metric, "greater_is_better": greater,
                                 "load_best_model_at_end": cfg.load_best_model_at_end}
    if cfg.early_stopping_patience is not None:
        selection["early_stopping"] = {"patience": cfg.early_stopping_patience,
                                       "threshold": cfg.early_stopping_threshold}
    if cfg.load_best_model_at_end or cfg.early_stopping_patience is not None:
        selection["evaluations"] = {"eval_strategy": cfg.eval_strategy, "eval_steps": cfg.eval_steps}
    return selection


def _implied_trained(saved: dict[str, Any] | None, current: dict[str, Any]) -> dict[str, Any]:
    """`saved` (a trained identity) read as this version records it: a run recorded before
    content fingerprints named its model by path and had no tokenizer entry, named its data
    files too, and had no selection; those entries take the current values, so a re-run of the
    same command still resumes it."""
    saved = dict(saved or {})
    if not str(saved.get("model", "")).startswith(FINGERPRINT):
        saved["model"] = current.get("model")
    saved.setdefault("tokenizer", current.get("tokenizer"))
    if "selection" in current and "selection" not in saved:  # recorded since 2026-11-28; before, unknown
        saved["selection"] = current["selection"]
    files = (saved.get("data") or {}).get("files")
    if isinstance(files, dict):
        stripped = {split: {k: v for k, v in entry.items() if k != "name"} if isinstance(entry, dict) else entry
                    for split, entry in files.items()}
        saved["data"] = {**saved["data"], "files": stripped}
    return saved


def _implied(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """A saved run identity read as this version records it (`_implied_trained`); a run recorded
    before warmup_steps existed lacks it and gets the current count: its warmup followed
    warmup_ratio, which is compared on its own."""
    settings = dict(saved.get("settings") or {})
    if settings and "warmup_steps" not in settings:
        settings["warmup_steps"] = current["settings"]["warmup_steps"]
    return {**saved, "trained": _implied_trained(saved.get("trained"), current["trained"]), "settings": settings}


def trained_differences(saved: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """Each way the trained identity `saved` (from run.json or a checkpoint) differs from
    `current`, as "field: value in the folder, value now"; [] for the same run."""
    return _differences(_implied_trained(saved, current), current)


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


# ---------------------------------------------------------------------------------------------
# The folder


def check_output_dir(output_dir: str | os.PathLike) -> None:
    """NotADirectoryError, before anything is loaded, when output_dir (or a folder it lies in) is a
    file: a run writes its checkpoints, results and model into a folder."""
    atomic.require_folder(output_dir, argument="output_dir",
                          fix="a run writes its checkpoints, results and model into a folder. Choose another "
                              "output_dir (a new folder, or the folder of an earlier run)")


def no_space_message(output_dir: str | os.PathLike, error: BaseException) -> str:
    """What a run says when its device fills up (`atomic.is_no_space(error)`): where, and that the
    same command resumes once there is room."""
    what = str(error) if isinstance(error, atomic.NoSpace) else (
        f"no space left on the device of {output_dir}" + (f" (writing {error.filename})"
                                                          if getattr(error, "filename", None) else ""))
    return (f"{what}. Free space there (or choose an output_dir on another device), then run the same command "
            "again: it resumes from its newest checkpoint")


def refuse_output_inside_model(output_dir: str | os.PathLike, model_dir: str | os.PathLike) -> None:
    """RunConflict when the output folder is the model folder or inside it: the export would
    write over the pretrained checkpoint a run starts from."""
    out, model = Path(output_dir).resolve(), Path(model_dir).resolve()
    if out == model or model in out.parents:
        raise RunConflict(
            f"output_dir {output_dir} is {'the model folder' if out == model else 'inside the model folder'} "
            f"{model_dir}; the run would write over the checkpoint it starts from. Choose an output_dir outside it"
        )


def write_run(output_dir: str | os.PathLike, identity: dict[str, Any], *, complete: bool, model_name: str,
              exported: Iterable[str] = ()) -> None:
    """run.json, marked as flaxheads' (`run_files.write_record`): the identity, whether the run
    finished, every name it writes in the folder, the command that started it (quoted back to
    whoever finds the run unfinished) and, finished, the SHA-256 of its results.json."""
    record = {
        "identity": identity, "complete": complete, "model_name": model_name,
        "outputs": list(RUN_OUTPUTS), "exported": sorted(exported),
        "command": " ".join(shlex.quote(arg) for arg in sys.argv),
    }
    if complete:
        record["results_sha256"] = results_sha256(output_dir)
    write_run_record(output_dir, record)


def _strangers(output_dir: Path, record: dict[str, Any] | None, names: Iterable[str] = RUN_OUTPUTS) -> list[str]:
    """Which of `names` exist in the folder although no run recorded writing them."""
    ours = recorded_outputs(record, output_dir)
    return [name for name in names if os.path.lexists(output_dir / name) and name not in ours]


def export_names(tokenizer) -> set[str]:
    """The files a run's export writes in its output folder: config.json, model.safetensors and
    what `tokenizer.save_pretrained` writes."""
    return {checkpoint_io.CONFIG_NAME, PYTORCH.written_as, *loading.saved_tokenizer_files(tokenizer)}


def _stale_files(output_dir: Path, record: dict[str, Any] | None, exports: Iterable[str] | None) -> list[str]:
    """Files a loader reads (config, weights, tokenizer files) that the run's export, writing
    `exports` (None: config.json, model.safetensors and any tokenizer file), would leave beside
    its own and that no run recorded writing (those the export removes): another format's weights,
    a .bin or sharded index, another tokenizer's special_tokens_map.json."""
    ours = recorded_outputs(record, output_dir)
    keep = set(exports) if exports is not None else {checkpoint_io.CONFIG_NAME, PYTORCH.written_as, *TOKENIZER_FILES}
    return [name for name in checkpoint_files(output_dir) if name not in keep and name not in ours]


def check_folder(output_dir: str | os.PathLike, identity: dict[str, Any], *, explicit_resume: bool,
                 overwrite: bool = False, exports: Iterable[str] | None = None) -> dict | None:
    """The folder's run record when this run may continue it (None for a fresh folder, or with
    `overwrite`, where `clear_run` then removes the earlier run's files). Reads only; the caller
    writes.

    Raises RunConflict for a folder holding files with the names a run writes that no run
    recorded writing (with `overwrite` too), files a loader reads that the export (writing
    `exports`, `export_names`) would leave beside its own and no run recorded writing (with
    `overwrite` too), or (without `overwrite`) a model no flaxheads run wrote there; and
    CheckpointMismatch naming every setting that differs from the folder's run."""
    output_dir = Path(output_dir)
    record = read_run(output_dir)
    strangers = _strangers(output_dir, record)
    if strangers:
        raise RunConflict(
            f"output_dir {output_dir} holds {', '.join(strangers)}, which no flaxheads run recorded writing there, "
            "and this run would write over them. Move them out of the folder, or choose another output_dir "
            "(overwrite_output_dir=True removes only what an earlier run recorded writing)"
        )
    stale = _stale_files(output_dir, record, exports)
    beside = (f"the run's export (config.json, {PYTORCH.written_as}, its tokenizer's files) would leave them beside "
              "its own, so a loader (transformers, flaxheads predict) could read them with the new model")
    foreign = checkpoint_files(output_dir) if record is None and not overwrite else []
    if foreign:
        also = f" (having moved out {', '.join(stale)}: {beside})" if stale else ""
        raise RunConflict(
            f"output_dir {output_dir} already holds a model that no flaxheads run wrote there "
            f"({', '.join(foreign)}). Pass overwrite_output_dir=True to replace it{also}, or choose another output_dir"
        )
    if stale:
        raise RunConflict(
            f"output_dir {output_dir} holds {', '.join(stale)}, which no flaxheads run recorded writing, and {beside}. "
            "Move them out of the folder, or choose another output_dir"
        )
    if overwrite or record is None:
        return None
    saved = _implied(record.get("identity") or {}, identity)
    trained = _differences(saved.get("trained") or {}, identity["trained"])
    settings = [] if explicit_resume else _differences(saved.get("settings") or {}, identity["settings"])
    if trained or settings:
        resume = ("; to continue that run's checkpoints with these training settings pass "
                  "resume_from_checkpoint=STEP" if not trained else "")
        if "packing" in identity["trained"] and any(line.startswith("global_batch_size:") for line in trained):
            resume += ("\n(Packed, a batch's rows are the nearest multiple of the device count to the rows that "
                       "hold the examples of a batch: on another device count, set packed_batch_rows so that "
                       "it times the device count and gradient_accumulation_steps gives the folder's batch)")
        raise CheckpointMismatch(
            f"output_dir {output_dir} holds a different run:\n  " + "\n  ".join(trained + settings) + "\nPass "
            "overwrite_output_dir=True to start over there, or choose another output_dir" + resume
        )
    return record


def clear_run(output_dir: str | os.PathLike) -> list[str]:
    """Removes what the folder's earlier run recorded writing (never the user's other files);
    returns the names removed. RunConflict, removing nothing, when the folder's run.json is not a
    record flaxheads can prove it wrote (`read_run`)."""
    output_dir = Path(output_dir)
    record = read_run(output_dir)
    records = [name for name, found in ((RUN_FILE, record), (SCORING_RECORD, read_scoring_record(output_dir)))
               if found is not None]
    removed = []
    for name in sorted(recorded_outputs(record, output_dir) - set(records)) + records:
        target = output_dir / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif os.path.lexists(target):
            target.unlink()
        else:
            continue
        removed.append(name)
    return removed


class FolderBefore(NamedTuple):
    """What an output folder held before a run claimed it (`folder_before`)."""

    existed: bool
    names: frozenset[str]
    run_record: bytes | None
    """run.json's bytes, to put back when the run is refused after rewriting it."""


def folder_before(output_dir: str | os.PathLike, *, existed: bool) -> FolderBefore:
    """What the folder holds now, which a run about to write there may have to put back; `existed`:
    whether the folder was there before the run (its lock) created it."""
    output_dir = Path(output_dir)
    record = output_dir / RUN_FILE
    return FolderBefore(existed, frozenset(os.listdir(output_dir)), record.read_bytes() if record.is_file() else None)


def undo_unstarted(output_dir: str | os.PathLike, before: FolderBefore) -> list[str]:
    """Undoes what a run refused before it trained wrote in its folder: the names of `RUN_OUTPUTS`
    it created there (its tokenized cache, an empty checkpoints/, its run.json) are removed, a
    run.json it rewrote gets its earlier content back, and a folder the run created is removed
    once empty. Files the folder held before, and everything else, stay. Returns the names removed."""
    output_dir = Path(output_dir)
    removed = []
    for name in RUN_OUTPUTS:
        target = output_dir / name
        if name in before.names or not os.path.lexists(target):
            continue
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
        removed.append(name)
    if before.run_record is not None and (output_dir / RUN_FILE).read_bytes() != before.run_record:
        # A run.json the refused run rewrote (an explicit resume of a finished run): as it was.
        atomic.write_file(output_dir / RUN_FILE, lambda tmp: Path(tmp).write_bytes(before.run_record))
    if not before.existed:
        atomic.remove_empty([output_dir])
    return removed


def export_snapshot(output_dir: str | os.PathLike) -> dict[str, int]:
    """{checkpoint file: inode} before an export, to tell afterwards which files it wrote."""
    folder = Path(output_dir)
    return {name: (folder / name).stat().st_ino for name in checkpoint_files(folder)}


def exported_since(output_dir: str | os.PathLike, before: dict[str, int]) -> list[str]:
    """The checkpoint files an export wrote since `before` (new, or replaced: a new inode)."""
    folder = Path(output_dir)
    return [name for name, inode in export_snapshot(folder).items() if before.get(name) != inode]


def read_results(output_dir: str | os.PathLike, record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The finished run's results.json, when its run.json `record` proves the run wrote it
    (`run_files.read_results`: RunConflict otherwise); None when there is none."""
    return run_files.read_results(output_dir, record)


def write_results(output_dir: str | os.PathLike, results: dict[str, Any]) -> None:
    atomic.write_json(Path(output_dir) / RESULTS_FILE, results)


def write_predictions(output_dir: str | os.PathLike, text: str, *, overwrite: bool = False) -> Path:
    """`text` as <output_dir>/predict_results.txt, written atomically; returns the path. RunConflict
    when the file exists and no run recorded writing it, or (without `overwrite`) when a finished
    run or an earlier scoring run wrote it. A folder without run.json records the file in
    `SCORING_RECORD`, so the same scoring command may replace it with `overwrite`."""
    output_dir = Path(output_dir)
    record = read_run(output_dir)
    file = output_dir / PREDICTIONS_FILE
    if _strangers(output_dir, record, [PREDICTIONS_FILE]):
        raise RunConflict(f"{file} exists and no flaxheads run recorded writing it: move it away, or choose another "
                          "output_dir")
    if file.exists() and not overwrite and not (record and record.get("complete") is False):
        raise RunConflict(f"{file} exists; pass overwrite_output_dir=True to replace it, or choose another output_dir")
    output_dir.mkdir(parents=True, exist_ok=True)
    if record is None:
        write_record(output_dir / SCORING_RECORD, "scoring", {"outputs": [PREDICTIONS_FILE]})
    return atomic.write_text(file, text)
