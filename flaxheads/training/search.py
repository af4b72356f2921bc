"""Hyperparameter search over a Trainer's runs on Optuna: `Trainer.hyperparameter_search`, with
transformers' signature and result (`BestRun`), its default space and objective.

What a search does. Each trial is a run of the Trainer with the trial's values in its
`TrainConfig` (`hp_space(trial)` names fields of it), trained in a run folder of its own under the
search's `output_dir` (`run-<trial number>`, or `hp_name(trial)`), with its own results.json and
report, as `flaxheads train` writes them; each evaluation of the validation split reports the
trial's objective to Optuna, whose pruner (the median pruner by default) may stop it there. The
trials share one compiled train step where the values they differ in are the step's run-time
arguments (learning rate, warmup, run length, weight decay, Adam's betas and epsilon, the
clipping norm: `optim.optimizer_values`). With an `output_dir` the study lives in an SQLite file
there (`STORAGE_FILE`), so a search killed at any moment resumes where it stopped (a trial cut off
mid-run resumes from its run folder's checkpoint), and other processes given the same `storage`
work on the same study. The best trial's exported model is copied to `output_dir/best_model/`,
and its table and pictures are written beside the runs (`search_report`).

Optuna is imported when a search starts (`pip install 'flaxheads[search]'`).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

from flaxheads import atomic
from flaxheads.training import search_report
from flaxheads.training.config import TrainConfig
from flaxheads.training.loop import print0

STORAGE_FILE = "optuna.db"
"""The study's SQLite file in the search's output_dir (the default storage)."""
STUDY_NAME = "flaxheads-search"
"""The default study name in a storage."""
SPEED_SUFFIXES = ("_runtime", "_per_second", "_seconds")


class BestRun(NamedTuple):
    """The best run of a hyperparameter search (transformers' `BestRun`)."""

    run_id: str
    """The best trial's number; its run folder is `output_dir/run-<run_id>` (or `hp_name`'s name)."""
    objective: float | list[float]
    """Its objective (one per direction for a multi-objective search)."""
    hyperparameters: dict[str, Any]
    """The values it was trained with (Optuna's `trial.params`)."""
    run_summary: Any | None = None
    """{"study": the optuna.Study, "trials": the search's table rows, "compilations": train-step
    programs compiled (or loaded from the compilation cache) in this process, "output_dir",
    "best_model": the best trial's export, "report": the files of the search's report}."""


def default_hp_space_optuna(trial) -> dict[str, Any]:
    """transformers' default space: learning rate, epochs, seed and batch size."""
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-6, 1e-4, log=True),
        "num_train_epochs": trial.suggest_int("num_train_epochs", 1, 5),
        "seed": trial.suggest_int("seed", 1, 40),
        "per_device_train_batch_size": trial.suggest_categorical("per_device_train_batch_size", [4, 8, 16, 32, 64]),
    }


def default_compute_objective(metrics: dict[str, float]) -> float:
    """transformers' default objective: the evaluation loss when `metrics` hold nothing else,
    else the sum of the metrics (speed metrics and the epoch left out)."""
    metrics = dict(metrics)
    loss = metrics.pop("eval_loss", None)
    metrics.pop("epoch", None)
    for name in [name for name in metrics if name.endswith(SPEED_SUFFIXES)]:
        metrics.pop(name)
    return loss if len(metrics) == 0 else sum(metrics.values())


def eval_metrics(scores: dict[str, Any]) -> dict[str, float]:
    """A validation split's scores as transformers' `evaluate()` names them: `eval_<name>`, numbers only."""
    return {f"eval_{name}": float(value) for name, value in scores.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


def import_optuna():
    """optuna; ModuleNotFoundError saying how to install it."""
    try:
        import optuna
    except ModuleNotFoundError:
        raise ModuleNotFoundError("a hyperparameter search needs Optuna: pip install 'flaxheads[search]' "
                                  "(or pip install optuna)") from None
    return optuna


class TrainStepCompilations:
    """Counts the train-step programs XLA compiles (or loads from the persistent compilation cache)
    while installed, by the name jax gives the program (`jit_train_step`, `pmap_train_step`)."""

    def __init__(self):
        self.count = 0

    def __enter__(self) -> TrainStepCompilations:
        import jax

        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        return self

    def __exit__(self, *exc) -> None:
        import jax

        jax.monitoring.unregister_event_duration_listener(self._on_duration)

    def _on_duration(self, event: str, seconds: float, *, fun_name: str = "", **_) -> None:
        if event == "/jax/core/compile/backend_compile_duration" and "train_step" in fun_name:
            self.count += 1


def check_space(values: dict[str, Any]) -> None:
    """ValueError naming each name of `values` that is no TrainConfig field."""
    fields = {field.name for field in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"hp_space gave {', '.join(unknown)}, which TrainConfig has no field for: name TrainConfig "
                         "fields (learning_rate, warmup_ratio, weight_decay, ...)")
    if "output_dir" in values:
        raise ValueError("hp_space gave output_dir: each trial's folder is the search's output_dir/run-<number> "
                         "(name it with hp_name=)")


def _owner() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def retry_abandoned(study) -> list[int]:
    """Trials a killed process of this machine left running: each is marked failed and queued
    again with its values and its run folder, so the next trial resumes that run from its last
    checkpoint. Returns their numbers. (A trial running in a live process, or on another machine,
    is left alone.)"""
    optuna = import_optuna()
    here, retried = socket.gethostname(), []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        owner = trial.user_attrs.get("owner") or {}
        if owner.get("host") != here or _alive(int(owner.get("pid", -1))):
            continue
        study._storage.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={"run_name": trial.user_attrs.get("run_name"),
                                                      "retry_of": trial.number})
        retried.append(trial.number)
    return retried


def sampler_seed(seed: int, study, shared: bool) -> int:
    """The TPE sampler's seed: `seed` for a new study, so one search is reproduced by the same
    command; plus the trials the study holds already, so a resumed search does not draw its first
    trials' values again; and, in a storage given to share (several workers), a number of this
    process, so workers started together do not draw the same values."""
    offset = len(study.get_trials(deepcopy=False))
    if shared:
        offset += 7919 * (os.getpid() % 10007)
    return seed + offset


def finished_count(study) -> int:
    optuna = import_optuna()
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


def default_storage(output_dir: Path | None) -> str | None:
    """SQLite in the search's output_dir, else None (Optuna's memory)."""
    return None if output_dir is None else f"sqlite:///{(output_dir / STORAGE_FILE).resolve()}"


def storage_of(storage):
    """An Optuna storage from what `storage` names: an RDB URL (sqlite:///..., postgresql://...: its
    RDBStorage, see `_database`), a journal file (`journal:PATH`, or a path ending in .log: Optuna's
    JournalStorage, which several processes may share through the file), or a storage object as it is."""
    if not isinstance(storage, (str, os.PathLike)):
        return storage
    text = str(storage)
    if text.startswith("journal:") or text.endswith(".log"):
        optuna = import_optuna()
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(text.removeprefix("journal:")))
    if "://" not in text:
        raise ValueError(f"storage={text!r} is neither a database URL nor a journal file: pass sqlite:///PATH, "
                         "postgresql://..., or journal:PATH")
    return _database(text)


def _database(url: str, tries: int = 6):
    """Optuna's RDBStorage of `url`, opened so that processes opening a new database at the same
    moment (the workers of one search, or a dashboard watching it start) all get it. Each checks
    for the tables, then creates the missing ones: the one that checked before the other's creation
    fails ('table studies already exists', or the version row's unique key); opened again it finds
    the tables made (measured: two processes opening a new SQLite file at once, one failed in 8 of
    8 tries). Any other error of the database is raised at once."""
    optuna = import_optuna()
    from sqlalchemy.exc import IntegrityError, OperationalError

    for attempt in range(tries):
        try:
            return optuna.storages.RDBStorage(url)
        except (OperationalError, IntegrityError) as error:
            lost_the_race = isinstance(error, IntegrityError) or "already exists" in str(error) \
                or "locked" in str(error)
            if not lost_the_race or attempt == tries - 1:
                raise
            time.sleep(0.05 * 2 ** attempt)


def run_search(trainer, hp_space: Callable | None, compute_objective: Callable | None, n_trials: int,
               direction: str | list[str], hp_name: Callable | None, **kwargs) -> BestRun | list[BestRun]:
    """`Trainer.hyperparameter_search` (see there)."""
    optuna = import_optuna()
    hp_space = hp_space or default_hp_space_optuna
    compute_objective = compute_objective or default_compute_objective
    if "validation" not in trainer.data.given or "validation" in trainer.data.unlabelled:
        raise ValueError("a hyperparameter search scores each trial on the labelled validation split, and the data "
                         "has none: give an eval_dataset (a validation_file)")
    output_dir = trainer.output_dir
    directions = direction if isinstance(direction, (list, tuple)) else None
    timeout, catch = kwargs.pop("timeout", None), kwargs.pop("catch", ())
    kwargs.pop("n_jobs", None)  # one trial at a time per process: several workers share a storage instead
    shared = kwargs.get("storage") is not None
    if output_dir is not None:
        atomic.require_folder(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
    kwargs["storage"] = storage_of(kwargs.get("storage") or default_storage(output_dir))
    if kwargs.get("study_name") is None and kwargs["storage"] is not None:
        kwargs["study_name"] = STUDY_NAME
    sampler = kwargs.pop("sampler", None)
    if directions is None:
        kwargs.setdefault("pruner", optuna.pruners.MedianPruner())
    study = optuna.create_study(direction=None if directions else direction, directions=directions,
                                load_if_exists=kwargs["storage"] is not None, **kwargs)
    study.sampler = sampler or optuna.samplers.TPESampler(seed=sampler_seed(trainer.args.seed, study, shared))
    retried = retry_abandoned(study)
    if retried:
        print0(f"search: trial(s) {retried} were cut off (their process is gone); queued again to resume from their "
               "run folders")
    initial = trainer.params
    programs: dict = {}
    objective = _TrialObjective(trainer, initial, hp_space, compute_objective, hp_name, programs, directions)
    remaining = max(n_trials - finished_count(study), 0)
    with TrainStepCompilations() as compilations:
        if remaining:
            states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
            study.optimize(objective, n_trials=remaining, timeout=timeout, catch=catch, gc_after_trial=True,
                           callbacks=[optuna.study.MaxTrialsCallback(n_trials, states=states)])
        else:
            print0(f"search: the study already has {n_trials} finished trials; nothing to run (raise n_trials to "
                   "run more)")
    del objective, programs
    summary: dict[str, Any] = {"study": study, "compilations": compilations.count, "output_dir": output_dir}
    if output_dir is not None:
        summary.update(search_report.write(study, output_dir, compilations=compilations.count))
    if not any(trial.state == optuna.trial.TrialState.COMPLETE for trial in study.get_trials(deepcopy=False)):
        raise ValueError(f"no trial of the search finished ({n_trials} asked; pruned or failed, see "
                         f"{'the table in ' + str(output_dir) if output_dir else 'the log'}): run more trials "
                         "(n_trials=), or a gentler pruner (pruner=optuna.pruners.NopPruner())")
    if directions is not None:
        return [BestRun(str(best.number), best.values, best.params, summary) for best in study.best_trials]
    best = study.best_trial
    return BestRun(str(best.number), best.value, best.params, summary)


class _TrialObjective:
    """Optuna's objective: one trial is one run of a Trainer made like `trainer` with the trial's values."""

    def __init__(self, trainer, initial, hp_space, compute_objective, hp_name, programs, directions):
        self.trainer, self.initial, self.hp_space = trainer, initial, hp_space
        self.compute_objective, self.hp_name, self.programs = compute_objective, hp_name, programs
        self.multi = directions is not None

    def __call__(self, trial) -> float | list[float]:
        optuna = import_optuna()
        values = self.hp_space(trial)
        check_space(values)
        run_name = trial.user_attrs.get("run_name") or (self.hp_name(trial) if self.hp_name else f"run-{trial.number}")
        trial.set_user_attr("run_name", run_name)
        trial.set_user_attr("owner", _owner())
        base = self.trainer
        folder = None if base.output_dir is None else base.output_dir / run_name
        args = dataclasses.replace(base.args, **values, output_dir=None if folder is None else str(folder))
        run = base.for_trial(args, trial, self.initial)
        run.programs = self.programs
        reported = {"step": 0, "objective": None}
        run.on_evaluate = self._pruning(trial, run.total_steps, reported)
        print0(f"search: trial {trial.number} ({run_name}): {json.dumps(values, default=str)}")
        start, pruned = time.perf_counter(), None
        try:
            output = run.train()
        except optuna.TrialPruned as error:
            pruned = str(error)
        # A pruned trial's arrays (train state, batches) go with its Trainer and the traceback: freed here.
        del run
        trial.set_user_attr("seconds", time.perf_counter() - start)
        if pruned is not None:
            trial.set_user_attr("steps", reported["step"])
            gc.collect()
            raise optuna.TrialPruned(pruned)
        results = output.metrics
        trial.set_user_attr("steps", int(results.get("steps", 0)))
        if folder is not None:
            trial.set_user_attr("run_dir", str(folder))
        value = self.compute_objective(eval_metrics(results["validation"]))
        return list(value) if self.multi else float(value)

    def _pruning(self, trial, total_steps: int, reported: dict):
        optuna = import_optuna()

        def on_evaluate(step: int, scores: dict[str, Any]) -> None:
            reported["step"] = step
            if self.multi:  # Optuna prunes single-objective studies only
                return
            value = float(self.compute_objective(eval_metrics(scores)))
            trial.report(value, step)
            # The last evaluation ends the run anyway: it finishes, exports and counts.
            if step < total_steps and trial.should_prune():
                raise optuna.TrialPruned(f"pruned at step {step} of {total_steps} (objective {value:.6g})")

        return on_evaluate
