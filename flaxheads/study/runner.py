"""Runs a head study: every cell of a `StudyGrid` trained with `flaxheads.Trainer`, one JSON line
per finished cell in `<study_dir>/results.jsonl`.

Resumable: a cell whose key the results file holds is skipped, so the same command after a kill
runs only the missing cells (the one killed mid-way starts again, in its own folder). Each cell
trains in `<study_dir>/cells/<head>-<data>-s<seed>-<mode>-<key>/`, a `flaxheads train` run folder;
once its line is written, its checkpoints and exported weights are deleted (`keep_models=True`
keeps them) and its run.json, results.json and metrics.jsonl stay. Nothing else is written.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from flaxheads.data.task import TaskData
from flaxheads.study import results as results_io
from flaxheads.study.grid import Cell, DataSpec, StudyGrid, StudySettings, cell_dir_name, cell_key, cell_key_fields

RESULTS_FILE = "results.jsonl"
CELLS_DIR = "cells"
FREEZE_FIELD = "freeze_backbone"


class StudyError(ValueError):
    """The study cannot run as asked; the message says what to change."""


@dataclasses.dataclass
class StudyRun:
    """What `run_study` did."""

    results_file: Path
    ran: list[str]
    """Keys of the cells trained now."""
    skipped: list[str]
    """Keys of the cells the results file already held."""
    problems: list[str]
    """Sentences about the results file (e.g. a half-written last line that was ignored)."""


def run_study(grid: StudyGrid, study_dir: str | os.PathLike, *, keep_models: bool = False,
              max_cells: int | None = None, log: Callable[[str], None] = print) -> StudyRun:
    """Trains the cells of `grid` that `<study_dir>/results.jsonl` lacks, appending a line per cell.

    `max_cells`: stop after training this many (None: all). Raises StudyError for a results file
    that is not a study's, or a linear probe on a flaxheads whose TrainConfig has no
    freeze_backbone; the Trainer's errors (bad data, a diverging cell) stop the study, and the
    same call again continues it.
    """
    from flaxheads.training.loop import NonFiniteLoss
    from flaxheads.training.run_lock import RunLock

    study_dir = Path(study_dir)
    results_file = study_dir / RESULTS_FILE
    cells = grid.cells()
    if any(cell.mode == "probe" for cell in cells):
        require_freeze_backbone()
    with RunLock(study_dir):
        existing = results_io.read_results(results_file)
        if existing.bad_lines:
            raise StudyError(f"{results_file} holds lines that are no study record ({existing.bad_lines[:5]}): it is "
                             "not a study's results file. Choose another study directory")
        problems = existing.problems(results_file)
        for line in problems:
            log(line)
        results_io.cut_half_written_tail(results_file, existing)
        done = {record["key"] for record in existing.records}
        run = StudyRun(results_file, [], [], problems)
        tasks: dict[DataSpec, TaskData] = {}
        spent = 0.0
        identities = {spec: spec.identity() for spec in {cell.data for cell in cells}}  # hashes each file once
        keyed = [(cell, fields, cell_key(fields))
                 for cell, fields in ((c, cell_key_fields(c, grid.settings, identities[c.data])) for c in cells)]
        left = sum(key not in done for _, _, key in keyed)
        for number, (cell, fields, key) in enumerate(keyed, start=1):
            if key in done:
                run.skipped.append(key)
                continue
            if max_cells is not None and len(run.ran) >= max_cells:
                break
            if cell.data not in tasks:
                tasks[cell.data] = load_study_task(cell.data, grid.settings)
            log(f"study cell {number}/{len(cells)}: {describe(cell)}")
            cell_dir = study_dir / CELLS_DIR / cell_dir_name(fields, key)
            try:
                record = run_cell(cell, grid.settings, tasks[cell.data], cell_dir, fields=fields, key=key,
                                  keep_models=keep_models)
            except NonFiniteLoss as error:
                # A cell that diverges is a result of the study (recorded, not retried), not a reason to stop it.
                record = {"key": key, **fields, "error": str(error), "wall_seconds": 0.0, "versions": versions(),
                          "device": device(), "cell_dir": f"{CELLS_DIR}/{cell_dir.name}"}
            results_io.append_record(results_file, record)
            run.ran.append(key)
            spent, left = spent + record["wall_seconds"], left - 1
            log(f"study cell {number}/{len(cells)} done in {record['wall_seconds']:.0f} s: {_headline(record)}; "
                f"{left} cell(s) left, about {left * spent / len(run.ran) / 60:.0f} min at this pace")
    return run


def describe(cell: Cell) -> str:
    return f"{cell.checkpoint_name} {cell.head} on {cell.data.name}, seed {cell.seed}, {cell.mode}"


def _headline(record: dict[str, Any]) -> str:
    if "error" in record:
        return f"failed: {record['error']}"
    test = record.get("test") or record.get("validation") or {}
    return ", ".join(f"{name} {value:.4f}" for name, value in test.items()
                     if name != "loss" and isinstance(value, float))


def require_freeze_backbone() -> None:
    """StudyError unless TrainConfig has the freeze_backbone field a linear probe needs."""
    from flaxheads.training.config import TrainConfig

    if FREEZE_FIELD not in {field.name for field in dataclasses.fields(TrainConfig)}:
        raise StudyError(f"the linear probe (mode 'probe') trains with TrainConfig({FREEZE_FIELD}=True), which this "
                         "flaxheads does not have yet; leave mode 'probe' out of the grid (flaxheads study run: --probe_heads "
                         "with no heads)")


# -- data -------------------------------------------------------------------------------------


def load_study_task(spec: DataSpec, settings: StudySettings) -> TaskData:
    """`spec`'s data, split with `settings.split_seed` (built-in sets), then cut to the fixed
    random subsets of its splits that settings ask for."""
    from flaxheads.data import load_task
    from flaxheads.training.config import TrainConfig

    task = load_task(**TrainConfig(output_dir=None, seed=settings.split_seed, **_data_fields(spec)).data_source())
    splits = dict(task.splits)
    sizes = {"train": settings.train_examples, "validation": settings.validation_examples,
             "test": settings.test_examples}
    for split, size in sizes.items():
        if split in splits:
            splits[split] = fixed_subset(splits[split], size, settings.split_seed)
    return dataclasses.replace(task, splits=datasets.DatasetDict(splits))


def fixed_subset(split: datasets.Dataset, size: int | None, seed: int) -> datasets.Dataset:
    """`size` rows of `split` drawn at random with `seed` (in their original order); all of it
    when `size` is None or not smaller."""
    if size is None or size >= len(split):
        return split
    rows = np.random.default_rng(seed).permutation(len(split))[:size]
    return split.select(np.sort(rows))


def _data_fields(spec: DataSpec) -> dict[str, Any]:
    """TrainConfig's data fields for `spec`."""
    return dict(dataset=spec.name if spec.builtin else None, dataset_name=spec.dataset_name,
                train_file=spec.train_file, validation_file=spec.validation_file, test_file=spec.test_file,
                text_column=spec.text_column, text_pair_column=spec.text_pair_column, label_column=spec.label_column)


# -- one cell ---------------------------------------------------------------------------------


def cell_train_config(cell: Cell, settings: StudySettings, output_dir: Path):
    """The TrainConfig of `cell`: the study's shared settings, the cell's checkpoint, head, seed
    and mode; evaluation every eval_steps (the learning curve); one checkpoint, at the end."""
    import jax

    from flaxheads.training.config import TrainConfig

    devices = jax.device_count()
    if settings.batch_size % devices:
        raise StudyError(f"batch_size {settings.batch_size} does not split over {devices} devices: choose a multiple "
                         f"of {devices}")
    fields = dict(settings.train_options)
    fields.update(
        _data_fields(cell.data), model_name_or_path=cell.checkpoint, head=cell.head, seed=cell.seed,
        output_dir=str(output_dir), max_seq_length=settings.max_seq_length,
        per_device_train_batch_size=settings.batch_size // devices, learning_rate=settings.learning_rate_for(cell.mode),
        max_steps=settings.max_steps, warmup_ratio=settings.warmup_ratio, eval_steps=settings.eval_steps,
        logging_steps=settings.eval_steps, save_steps=settings.max_steps, save_total_limit=1, report_to="none",
        disable_tqdm=True, do_train=True, do_eval=True, do_predict=False,
    )
    if cell.mode == "probe":
        require_freeze_backbone()
        fields[FREEZE_FIELD] = True
    return TrainConfig(**fields)


def run_cell(cell: Cell, settings: StudySettings, task: TaskData, cell_dir: Path, *, fields: dict[str, Any],
             key: str, keep_models: bool = False) -> dict[str, Any]:
    """Trains `cell` in `cell_dir` and returns its record (a finished run found there is read,
    not trained again)."""
    from flaxheads.training.trainer import Trainer

    start = time.perf_counter()
    cfg = cell_train_config(cell, settings, cell_dir)
    output = Trainer.from_config(cfg, task=task).train()
    wall = time.perf_counter() - start
    results = output.metrics
    if results.get("already_complete"):
        wall = results.get("seconds", wall)  # trained earlier: what this call took says nothing
    record = {
        "key": key, **fields,
        "problem_type": task.problem_type,
        "split_sizes": {name: len(split) for name, split in task.splits.items()},
        "validation": results.get("validation"), "test": results.get("test"), "best": results.get("best"),
        "curve": learning_curve(cell_dir), "steps": results.get("steps"),
        "train_seconds": results.get("seconds"), "wall_seconds": wall,
        "versions": versions(), "device": device(),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cell_dir": f"{CELLS_DIR}/{cell_dir.name}",
    }
    if not keep_models:
        remove_weights(cell_dir)
    return record


def learning_curve(run_dir: Path) -> list[dict[str, Any]]:
    """The validation metrics a run logged, one {"step": n, metric: value, ...} per evaluation."""
    import json

    from flaxheads.training.run_files import METRICS_FILENAME

    curve = []
    path = run_dir / METRICS_FILENAME
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if record.pop("split", None) == "eval":
                curve.append(record)
    return sorted(curve, key=lambda point: point["step"])


def remove_weights(run_dir: Path) -> None:
    """Deletes what a finished cell no longer needs (its checkpoints, exported and best models,
    tokenised data); keeps its run.json, results.json and metrics.jsonl."""
    from flaxheads.conversion.formats import checkpoint_files
    from flaxheads.training import run_dir as run_dir_lib

    for name in (run_dir_lib.CHECKPOINTS_DIR, run_dir_lib.BEST_MODEL_DIR, "tokenized"):
        shutil.rmtree(run_dir / name, ignore_errors=True)
    for name in checkpoint_files(run_dir):
        (run_dir / name).unlink()


# -- provenance -------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    import flax
    import jax
    import transformers

    from flaxheads.version import __version__

    return {"flaxheads": __version__, "jax": jax.__version__, "flax": flax.__version__,
            "transformers": transformers.__version__, "numpy": np.__version__,
            "python": platform.python_version()}


def device() -> dict[str, Any]:
    import jax

    first = jax.devices()[0]
    return {"platform": first.platform, "kind": first.device_kind, "count": jax.device_count(),
            "cpu_count": os.cpu_count(), "machine": platform.machine(), "system": sys.platform}
