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
from flaxheads.study import baselines
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
        done = {record["key"]: record for record in existing.records}
        run = StudyRun(results_file, [], [], problems)
        tasks: dict[DataSpec, TaskData] = {}
        identities = {spec: spec.identity() for spec in {cell.data for cell in cells}}  # hashes each file once
        pace = _Pace(log)
        for phase in (lr_search_cells(grid), None):
            if phase is None:  # the study's cells, their learning rates chosen by the search's records
                phase = with_chosen_rates(grid, cells, [*done.values()], identities)
            keyed = [(cell, fields, cell_key(fields))
                     for cell, fields in ((c, cell_key_fields(c, grid.settings, identities[c.data])) for c in phase)]
            pace.left += sum(key not in done for _, _, key in keyed)
            for number, (cell, fields, key) in enumerate(keyed, start=1):
                if key in done:
                    run.skipped.append(key)
                    continue
                if max_cells is not None and len(run.ran) >= max_cells:
                    return run
                if cell.data not in tasks:
                    tasks[cell.data] = load_study_task(cell.data, grid.settings)
                log(f"study cell {number}/{len(phase)}: {describe(cell)}")
                cell_dir = study_dir / CELLS_DIR / cell_dir_name(fields, key)
                try:
                    record = run_cell(cell, grid.settings, tasks[cell.data], cell_dir, fields=fields, key=key,
                                      keep_models=keep_models)
                except NonFiniteLoss as error:
                    # A cell that diverges is a result of the study (recorded, not retried), not a reason to stop it.
                    record = {"key": key, **fields, "error": str(error), "wall_seconds": 0.0, "versions": versions(),
                              "device": device(), "cell_dir": f"{CELLS_DIR}/{cell_dir.name}"}
                results_io.append_record(results_file, record)
                done[key] = record
                run.ran.append(key)
                pace.done(record, len(run.ran))
    return run


class _Pace:
    """Logs each finished cell with the time the cells left should take at this pace."""

    def __init__(self, log: Callable[[str], None]):
        self.log, self.left, self.spent = log, 0, 0.0

    def done(self, record: dict[str, Any], ran: int) -> None:
        self.spent, self.left = self.spent + record["wall_seconds"], self.left - 1
        self.log(f"study cell done in {record['wall_seconds']:.0f} s: {_headline(record)}; {self.left} cell(s) left "
                 f"in this phase, about {self.left * self.spent / ran / 60:.0f} min at this pace")


def describe(cell: Cell) -> str:
    rate = f", learning rate {cell.learning_rate:g}" if cell.learning_rate is not None else ""
    search = " (learning-rate search)" if cell.lr_search else ""
    return f"{cell.checkpoint_name} {cell.head} on {cell.data.name}, seed {cell.seed}, {cell.mode}{rate}{search}"


# -- learning rates chosen on validation --------------------------------------------------------


def lr_search_cells(grid: StudyGrid) -> list[Cell]:
    """One cell per candidate rate and search seed for every fine-tuned (checkpoint, head, data
    set) of `grid`; [] when the settings give no candidates."""
    rates = grid.settings.learning_rates
    arms = dict.fromkeys((c.checkpoint, c.head, c.data) for c in grid.cells() if c.mode == "finetune")
    return [Cell(checkpoint, head, data, seed, "finetune", learning_rate=rate, lr_search=True)
            for checkpoint, head, data in arms for rate in rates for seed in grid.settings.lr_search_seeds]


def with_chosen_rates(grid: StudyGrid, cells: list[Cell], records: list[dict[str, Any]],
                      identities: dict[DataSpec, dict[str, Any]]) -> list[Cell]:
    """`cells` with each fine-tuned cell's learning rate: the candidate whose search cells reached
    the best mean validation metric (their best evaluation; ties: the smaller rate). Unchanged
    without candidates; StudyError when a search cell has no record (run the search first)."""
    if not grid.settings.learning_rates:
        return cells
    by_key = {record["key"]: record for record in records}
    chosen = {}
    for search in lr_search_cells(grid):
        record = by_key.get(cell_key(cell_key_fields(search, grid.settings, identities[search.data])))
        if record is None:
            raise StudyError(f"no record of the learning-rate search cell {describe(search)}: run the study again "
                             "without --max_cells to finish the search")
        value = (record.get("best") or {}).get("value")
        arm = (search.checkpoint, search.head, search.data)
        chosen.setdefault(arm, {}).setdefault(search.learning_rate, []).append(
            -np.inf if value is None or "error" in record else float(value))
    best = {arm: max(sorted(scores), key=lambda rate: np.mean(scores[rate])) for arm, scores in chosen.items()}
    return [dataclasses.replace(c, learning_rate=best[(c.checkpoint, c.head, c.data)]) if c.mode == "finetune" else c
            for c in cells]


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
    from flaxheads.tasks.sources import load_task
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
    """The TrainConfig of `cell`: the study's shared settings, the cell's checkpoint, head, seed,
    mode and learning rate; evaluation every eval_steps (the learning curve); max_epochs with
    early stopping on validation that restores the best weights, or max_steps; one checkpoint."""
    import jax

    from flaxheads.training.config import TrainConfig

    devices = jax.device_count()
    if settings.batch_size % devices:
        raise StudyError(f"batch_size {settings.batch_size} does not split over {devices} devices: choose a multiple "
                         f"of {devices}")
    # Padded batches unless the study's train_options say otherwise: its committed cells were run
    # so, before packing became TrainConfig's default.
    fields = {"packing": False, **dict(settings.train_options)}
    length = (dict(num_train_epochs=settings.max_epochs, max_steps=-1, save_steps=10 ** 9)
              if settings.max_epochs is not None else dict(max_steps=settings.max_steps, save_steps=settings.max_steps))
    stopping = (dict(early_stopping_patience=settings.early_stopping_patience, load_best_model_at_end=True)
                if settings.early_stopping_patience is not None else {})
    fields.update(
        _data_fields(cell.data), model_name_or_path=cell.checkpoint, head=cell.library_head, seed=cell.seed,
        output_dir=str(output_dir), max_seq_length=settings.max_seq_length,
        per_device_train_batch_size=settings.batch_size // devices,
        learning_rate=cell.learning_rate or settings.learning_rate_for(cell.mode),
        warmup_ratio=settings.warmup_ratio, eval_steps=settings.eval_steps, logging_steps=settings.eval_steps,
        save_total_limit=1, report_to="none", disable_tqdm=True, do_train=True, do_eval=True, do_predict=False,
        **length, **stopping,
    )
    if cell.mode == "probe":
        require_freeze_backbone()
        fields[FREEZE_FIELD] = True
    config = TrainConfig(**fields)
    if cell.head == "pooler_reinit":
        source = config.model_folder()
        fresh = baselines.checkpoint_without_pooler(source, output_dir.parent.parent / "checkpoints" /
                                                    f"{source.name}-pooler_reinit")
        config = dataclasses.replace(config, model_name_or_path=str(fresh))
    return config


def run_cell(cell: Cell, settings: StudySettings, task: TaskData, cell_dir: Path, *, fields: dict[str, Any],
             key: str, keep_models: bool = False) -> dict[str, Any]:
    """Runs `cell` in `cell_dir` and returns its record: the Trainer's metrics, the learning curve
    from step 0 and the per-example test predictions (a finished run found there is read, not
    trained again); the lbfgs and majority cells fit their models here."""
    start = time.perf_counter()
    record: dict[str, Any] = {"key": key, **fields, "problem_type": task.problem_type,
                              "split_sizes": {name: len(split) for name, split in task.splits.items()}}
    if cell.trains:
        record.update(_trained_cell(cell, settings, task, cell_dir, keep_models))
    else:
        record.update(_fitted_cell(cell, settings, task, cell_dir))
    record.setdefault("wall_seconds", time.perf_counter() - start)
    record.update({"versions": versions(), "device": device(),
                   "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "cell_dir": f"{CELLS_DIR}/{cell_dir.name}"})
    return record


def _trained_cell(cell: Cell, settings: StudySettings, task: TaskData, cell_dir: Path,
                  keep_models: bool) -> dict[str, Any]:
    from flaxheads.tasks.classification.model import from_pretrained
    from flaxheads.tokenizer import load_tokenizer
    from flaxheads.tasks.runs import Trainer

    start = time.perf_counter()
    cfg = cell_train_config(cell, settings, cell_dir)
    trainer = Trainer.from_config(cfg, task=task)
    initial = _predictions(trainer.model, trainer.tokenizer, task, settings, "validation")
    output = trainer.train()
    wall = time.perf_counter() - start
    results = output.metrics
    if results.get("already_complete"):
        wall = results.get("seconds", wall)  # trained earlier: what this call took says nothing
        trained, tokenizer = from_pretrained(cell_dir), load_tokenizer(cell_dir)[0]
    else:
        trained, tokenizer = output.model, trainer.tokenizer
    start_point = {"step": 0, **baselines.split_metrics(initial, task)["validation"]}
    record = {
        "validation": results.get("validation"), "test": results.get("test"), "best": results.get("best"),
        "curve": [start_point, *learning_curve(cell_dir)], "steps": results.get("steps"),
        "exported_step": results.get("exported_step"), "train_seconds": results.get("seconds"),
        "learning_rate": cfg.learning_rate, "wall_seconds": wall,
        **_example_fields(_predictions(trained, tokenizer, task, settings, "test"), task),
    }
    if not keep_models:
        remove_weights(cell_dir)
    return record


def _fitted_cell(cell: Cell, settings: StudySettings, task: TaskData, cell_dir: Path) -> dict[str, Any]:
    """The record of a majority or lbfgs cell."""
    if task.problem_type not in ("single_label_classification", "regression"):
        raise StudyError(f"mode {cell.mode!r} fits single-label classification and regression; {cell.data.name} is "
                         f"{task.problem_type}: leave it out of the {cell.mode} cells")
    if cell.mode == "majority":
        predictions, extra = baselines.majority_predictions(task), {}
    else:
        model, tokenizer = _initial_model(cell, settings, task, cell_dir)
        features = baselines.head_features(model, tokenizer, task, max_seq_length=settings.max_seq_length)
        predictions, strength = baselines.linear_probe_predictions(features, task)
        extra = {"probe_strength": strength, "features": int(features["train"].shape[1])}
    metrics = baselines.split_metrics(predictions, task)
    return {**metrics, **extra, **_example_fields(predictions.get("test"), task)}


def _initial_model(cell: Cell, settings: StudySettings, task: TaskData, cell_dir: Path):
    """(model, tokenizer) as the cell's Trainer would start from them, in eval mode."""
    from flaxheads.tasks.classification.model import from_pretrained
    from flaxheads.tokenizer import load_tokenizer

    folder = cell_train_config(dataclasses.replace(cell, mode="finetune"), settings, cell_dir).model_folder()
    tokenizer, pad_token_id = load_tokenizer(folder)
    model = from_pretrained(folder, head=cell.library_head, num_labels=task.num_labels, seed=cell.seed,
                                      problem_type=task.problem_type, pad_token_id=pad_token_id)
    model.eval()
    return model, tokenizer


def _predictions(model, tokenizer, task: TaskData, settings: StudySettings, split: str) -> dict[str, np.ndarray]:
    """{split: predicted class ids, or scores for regression} of `model` on the task's `split`
    ({} when the task has no such split or is multi-label)."""
    from flaxheads.tasks.classification.inference import TextScorer

    if split not in task.splits or task.problem_type not in ("single_label_classification", "regression"):
        return {}
    rows = task.splits[split]
    scorer = TextScorer(model, tokenizer, max_seq_length=settings.max_seq_length, source="the study's cell")
    logits = scorer.logits(rows["text"], rows["text_pair"] if "text_pair" in rows.column_names else None)
    return {split: logits[:, 0] if task.problem_type == "regression" else logits.argmax(axis=-1)}


def _example_fields(predictions: dict[str, np.ndarray] | np.ndarray | None, task: TaskData) -> dict[str, Any]:
    """The per-example test fields of a record (the report's bootstrap over test examples)."""
    if isinstance(predictions, dict):
        predictions = predictions.get("test")
    if predictions is None or "test" not in task.splits:
        return {}
    return {"test_predictions": np.asarray(predictions).tolist(), "test_labels": list(task.splits["test"]["label"])}


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
