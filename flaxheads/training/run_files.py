"""The names a training run writes in its output folder, and its records (run.json, and a scoring
run's `SCORING_RECORD`): a light module (no Orbax, no TensorBoard), so that `predict`, `evaluate`
and the pipeline can tell a run folder from a model folder without importing what training needs.

What flaxheads wrote is known by content, never by a file's name: every record it decides from
(what to clear, replace or redraw) carries a mark, `{"flaxheads": {"record": KIND, "sha256": ...}}`,
the SHA-256 of the rest of its content (`write_record`), and is read only when the mark proves it
(`read_record`). A run.json another program wrote, or one edited since, is refused, naming the
file and why. Records of earlier versions have no mark; they are read when their content has
exactly the shape those versions wrote (`_LEGACY_SHAPES`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from flaxheads import atomic
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
BEST_RECORD = ".flaxheads-best.json"
"""In best_model/: which best evaluation its weights are (`record_best`), so that a run never
exports another trajectory's best as its own."""
SCORING_RECORD = ".flaxheads-outputs.json"
"""Where a run that only scores (do_train=False) records the files it wrote in a folder without run.json."""

RUN_OUTPUTS = (RUN_FILE, RESULTS_FILE, METRICS_FILENAME, CHECKPOINTS_DIR, SET_ASIDE_DIR, BEST_MODEL_DIR,
               TENSORBOARD_DIRNAME, TOKENIZED_DIR, PREDICTIONS_FILE, ADAPTER_DIR, REPORT_DIR)
"""Every name a run may create in its output folder besides its export (config.json, weights,
tokenizer files). A run claims them all when it starts, so it must find none it did not write."""


class RunConflict(ValueError):
    """The output folder holds something this run must not write over."""


MARK = "flaxheads"
"""The key of a record's mark: {"record": its kind, "sha256": the digest of the rest of it}."""


def _digest(content: dict[str, Any]) -> str:
    """The SHA-256 of `content` as JSON with sorted keys: the same for the value written and the
    value read back (tuples read back as lists, numpy scalars as floats: normalised first)."""
    normal = json.loads(json.dumps(content, default=float))
    return hashlib.sha256(json.dumps(normal, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_record(file: str | os.PathLike, kind: str, content: dict[str, Any]) -> Path:
    """`content` as the JSON record `file`, marked as flaxheads' record of `kind` (atomically)."""
    content = {k: v for k, v in content.items() if k != MARK}
    return atomic.write_json(file, {**content, MARK: {"record": kind, "sha256": _digest(content)}})


def read_record(file: str | os.PathLike, kind: str, *, legacy: Callable[[dict[str, Any]], bool], what: str
                ) -> dict[str, Any] | None:
    """The record `file` (without its mark) when flaxheads can prove it wrote it: its mark names
    `kind` and its content still has the digest the mark records, or it has no mark and
    `legacy(content)` holds (a record of an earlier version). None when there is no such file.
    RunConflict naming the file and why otherwise: damaged, edited since, or not flaxheads'.
    `what` says what flaxheads cannot tell without it (for the message)."""
    file = Path(file)
    if not file.is_file():
        return None
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RunConflict(f"{file} is damaged, so flaxheads cannot tell {what}. {_FIX}") from None
    mark = record.get(MARK) if isinstance(record, dict) else None
    if isinstance(mark, dict) and mark.get("record") == kind:
        content = {k: v for k, v in record.items() if k != MARK}
        if mark.get("sha256") == _digest(content):
            return content
        raise RunConflict(f"{file} was changed after flaxheads wrote it (its content no longer has the SHA-256 "
                          f"flaxheads recorded in it), so flaxheads cannot tell {what}. {_FIX}")
    if isinstance(record, dict) and mark is None and legacy(record):
        return record
    raise RunConflict(f"{file} was not written by flaxheads (it lacks the mark flaxheads' records carry), so "
                      f"flaxheads cannot tell {what}, and touches none of them. Move {file.name} out of the folder, or "
                      "choose another output_dir")


_FIX = "Delete it and the run's files by hand to start over there, or choose another output_dir"

_LEGACY_RUN_KEYS = {"identity", "complete", "model_name", "outputs", "exported", "command"}


def _legacy_run(record: dict[str, Any]) -> bool:
    """Whether `record` has the shape of an unmarked run.json an earlier flaxheads wrote: only the
    keys it wrote, whether the run finished, and an identity of what was trained (the model's
    backbone config, head, label names) and the training settings."""
    identity = record.get("identity")
    trained = identity.get("trained") if isinstance(identity, dict) else None
    return (set(record) <= _LEGACY_RUN_KEYS and isinstance(record.get("complete"), bool)
            and isinstance(identity, dict) and set(identity) == {"trained", "settings"}
            and isinstance(identity["settings"], dict) and isinstance(trained, dict)
            and isinstance(trained.get("backbone"), dict) and isinstance(trained.get("label_names"), list)
            and "head" in trained)


def _legacy_scoring(record: dict[str, Any]) -> bool:
    """The one unmarked scoring record earlier versions wrote."""
    return record == {"outputs": [PREDICTIONS_FILE]}


def read_run(output_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The folder's run.json record; None when it has none. RunConflict when flaxheads cannot
    prove it wrote it (`read_record`): damaged, edited since, or another program's run.json."""
    return read_record(Path(output_dir) / RUN_FILE, "run", legacy=_legacy_run,
                       what="which run the folder holds, nor which of its files the run wrote")


def write_run_record(output_dir: str | os.PathLike, record: dict[str, Any]) -> Path:
    """`record` as the folder's run.json, marked (`write_record`)."""
    return write_record(Path(output_dir) / RUN_FILE, "run", record)


def read_scoring_record(output_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The folder's `SCORING_RECORD`; None when it has none, or when flaxheads cannot prove it
    wrote it (then it records nothing: the files it names are not taken for flaxheads')."""
    try:
        return read_record(Path(output_dir) / SCORING_RECORD, "scoring", legacy=_legacy_scoring,
                           what="which files a scoring run wrote")
    except RunConflict:
        return None


def forget_best(folder: str | os.PathLike) -> None:
    """Removes best_model/'s record before new weights go in: killed between the two, the folder
    holds weights no record vouches for, never weights a record mistakes for others."""
    (Path(folder) / BEST_RECORD).unlink(missing_ok=True)


def record_best(folder: str | os.PathLike, export: str) -> None:
    """Records in best_model/ that its weights are the best evaluation `export` (an id the
    training loop gives each export, carried in its checkpoints)."""
    write_record(Path(folder) / BEST_RECORD, "best", {"export": export})


def best_export(folder: str | os.PathLike) -> str | None:
    """The id of the best evaluation whose weights best_model/ holds; None when no record flaxheads
    can prove it wrote says so."""
    try:
        record = read_record(Path(folder) / BEST_RECORD, "best", legacy=lambda record: False,
                             what="which evaluation's weights the folder holds")
    except RunConflict:
        return None
    return record.get("export") if record else None


def results_sha256(output_dir: str | os.PathLike) -> str | None:
    """The SHA-256 of the folder's results.json as it is on disk; None when there is none."""
    try:
        return hashlib.sha256((Path(output_dir) / RESULTS_FILE).read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def read_results(output_dir: str | os.PathLike, record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The folder's results.json, when the run `record` (its run.json) proves the run wrote it: a
    finished run records the file's SHA-256; a run of an earlier version, which did not, wrote a
    JSON object with its "steps". None when there is no results.json; RunConflict naming the file
    when it is not the run's, or is damaged."""
    file = Path(output_dir) / RESULTS_FILE
    digest = results_sha256(output_dir)
    if digest is None:
        return None
    expected = (record or {}).get("results_sha256")
    if expected is not None and digest != expected:
        raise RunConflict(f"{file} is not the one the run wrote (its SHA-256 differs from what {RUN_FILE} records), so "
                          "it is not read. Run the training command again with overwrite_output_dir=True to rewrite "
                          "it, or move it out of the folder")
    try:
        results = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RunConflict(f"{file} is damaged ({error}); run the training command again to rewrite it") from None
    if expected is None and not (isinstance(results, dict) and "steps" in results):
        raise RunConflict(f"{file} was not written by a flaxheads run (it records no training steps), so it is not "
                          "read: move it out of the folder")
    return results


def recorded_outputs(record: dict[str, Any] | None, output_dir: str | os.PathLike | None = None) -> set[str]:
    """The names an earlier run recorded writing: its `RUN_OUTPUTS` and its export's files (a run
    recorded before the list existed wrote at most `RUN_OUTPUTS`: its export was replaced, not
    removed), and in `output_dir` the files a scoring-only run recorded (`SCORING_RECORD`)."""
    names: set[str] = set()
    if record is not None:
        names = set(RUN_OUTPUTS) if "outputs" not in record else (
            set(record.get("outputs") or ()) | set(record.get("exported") or ()))
    if output_dir is not None:
        scoring = read_scoring_record(output_dir)
        outputs = scoring.get("outputs") if scoring else None
        if isinstance(outputs, list):
            names |= {name for name in outputs if isinstance(name, str)}
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
