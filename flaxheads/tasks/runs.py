"""A run of any task: `Trainer` (what `flaxheads.Trainer` is: the task-free trainer of
`training.trainer`, given the model's task), `Trainer.from_config` (the model, tokenizer and data
a `TrainConfig` names, the model folder opened once) and `train(cfg)`, the function behind
`flaxheads train`.

What a run writes: see `training.trainer`.
"""

from __future__ import annotations

from typing import Any

from flaxheads import data, tasks
from flaxheads.conversion.model_folder import Checkpoint
from flaxheads.inference import open_model_folder
from flaxheads.model import require_trained
from flaxheads.shipped_model import minilm_path
from flaxheads.tasks.sources import load_task
from flaxheads.tokenizer import load_tokenizer
from flaxheads.training import run_dir
from flaxheads.training import trainer as training
from flaxheads.training.config import TrainConfig
from flaxheads.training.distributed import initialize as initialize_distributed
from flaxheads.training.sharding import Layout


class Trainer(training.Trainer):
    __doc__ = training.Trainer.__doc__

    def __init__(self, model=None, args: TrainConfig | None = None, *, train_dataset=None, eval_dataset=None,
                 test_dataset=None, tokenizer, compute_metrics=None, task: data.TaskData | None = None,
                 model_init=None):
        if model is None and model_init is not None:  # transformers' Trainer(model_init=...)
            model = training.call_model_init(model_init, None)
        if model is None:
            raise ValueError("the Trainer needs a model: pass one, or model_init= (a function returning one)")
        kind = tasks.of_model(model)
        if task is not None and task.task != kind.name:
            theirs = tasks.named(task.task)
            raise ValueError(
                f"the data reads as {task.described}, which a {theirs.noun} learns, and the model is a {kind.noun}: "
                f"load it with flaxheads.{theirs.model_class.__name__}.from_pretrained(...) (flaxheads.from_pretrained"
                f"(path, task={theirs.name!r})), or give it {kind.name} data")
        super().__init__(model, args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                         test_dataset=test_dataset, tokenizer=tokenizer, compute_metrics=compute_metrics, task=task,
                         kind=kind, model_init=model_init)

    @classmethod
    def from_config(cls, cfg: TrainConfig, task: data.TaskData | None = None, *,
                    model_folder: Checkpoint | None = None) -> Trainer:
        """The Trainer of `flaxheads train`: the model, tokenizer and data `cfg` names (or `task`,
        data loaded by the caller), the model loaded for the data's task and placed on the mesh as it
        loads. `model_folder`: cfg's model folder opened already (`open_model`), else opened here."""
        src = open_model(cfg) if model_folder is None else model_folder
        if task is None:
            task = load_task(**(cfg.data_source() if cfg.do_train else scoring_source(cfg, src)))
        tokenizer, pad_token_id = load_tokenizer(src, cfg.tokenizer_name)
        model, loading_info = _load_model(cfg, src, task, pad_token_id)
        if not cfg.do_train:
            require_trained(loading_info, model, src, fix="do_train is off: train it (do_train=True) or pass a trained "
                            "model folder as model_name_or_path")
        trainer = cls(model, cfg, task=task, tokenizer=tokenizer)
        trainer.model_name = cfg.model_name_or_path or "shipped all-MiniLM-L6-v2"
        trainer.model_identity = run_dir.model_fingerprint(src.folder)
        trainer.data_identity = None
        trainer.loading_info = loading_info
        return trainer


def _load_model(cfg: TrainConfig, src: Checkpoint, task: data.TaskData, pad_token_id, *, seed: int | None = None):
    """(model, loading info): the model of `task`'s task from `src`, as `cfg` loads it (placed on
    the mesh as it loads); `seed` for its new weights instead of cfg.seed."""
    kind = tasks.named(task.task)
    layout = Layout.create(cfg.mesh)
    return kind.model_class.from_pretrained(
        src, pad_token_id=pad_token_id, **kind.load_settings(task, cfg),
        classifier_dropout=cfg.classifier_dropout, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        seed=cfg.seed if seed is None else seed, ignore_mismatched_sizes=cfg.ignore_mismatched_sizes,
        placement=layout.param_sharding if cfg.parallel == "jit" else None, output_loading_info=True,
    )


def open_model(cfg: TrainConfig) -> Checkpoint:
    """The model folder `cfg` names (`model_name_or_path`, else the shipped MiniLM), opened once
    (`inference.open_model_folder`): what a command reads of it comes from this object."""
    return open_model_folder(cfg.model_name_or_path or minilm_path())


def scoring_source(cfg: TrainConfig, model_folder: Checkpoint) -> dict[str, Any]:
    """`cfg.data_source()` for scoring a trained model without training it (`flaxheads evaluate`,
    do_train off): without a train_file, the labels come from the trained model's config.json (a
    token classifier's tags, a sequence classifier's classes and problem type: the task the
    folder's model serves says which, `Task.scoring_source`), so validation or test files are
    read alone."""
    source = cfg.data_source()
    if cfg.train_file:
        return source
    kind = tasks.of_checkpoint(model_folder)
    return source if kind is None else kind.scoring_source(model_folder, source)


def train(cfg: TrainConfig = TrainConfig()) -> dict[str, Any]:
    """Fine-tunes, checkpoints and exports into `cfg.output_dir`.

    The same command again resumes from the newest checkpoint (a damaged one is set aside with a
    warning), or returns the recorded results of the finished run with "already_complete": True.
    Returns {"validation": metrics, "test": metrics, "steps": int, "best": {...}, "seconds": float}.

    Raises ValueError for bad data or settings; RunConflict for an output_dir that is (inside)
    the model folder or holds a model no run wrote there; CheckpointMismatch, naming each
    differing setting, for an output_dir of another run; RunLocked while another run uses it;
    NonFiniteLoss (naming the step and the checkpoint to continue from) when the loss stops
    being finite; UntrainedModel when do_train is off and the model has no trained classifier.
    """
    initialize_distributed(cfg.coordinator_address, cfg.num_processes, cfg.process_id, auto=cfg.distributed)
    if cfg.output_dir is None:
        raise ValueError("train() needs output_dir=: it writes its checkpoints and model there (flaxheads.Trainer "
                         "trains in memory with output_dir=None)")
    run_dir.check_output_dir(cfg.output_dir)
    model_folder = open_model(cfg)
    run_dir.refuse_output_inside_model(cfg.output_dir, model_folder.folder)
    output = Trainer.from_config(cfg, model_folder=model_folder).train()
    return output.metrics


def search(cfg: TrainConfig, space: dict, *, n_trials: int = 20, direction: str | None = None,
           storage: str | None = None, study_name: str | None = None, timeout: float | None = None):
    """The hyperparameter search behind `flaxheads search`: trials of `train(cfg)` with the values
    `space` gives (`training.search_space`: {field: Range or Choice}), each in a run folder under
    `cfg.output_dir`, scored by metric_for_best_model (with or without `eval_`; default the task's
    own metric) in its direction unless `direction` says otherwise. The model is loaded from its
    folder for each trial, as `train` loads it. Returns the best trial's `BestRun`
    (`Trainer.hyperparameter_search`)."""
    from flaxheads.training import search_space
    from flaxheads.training.metrics import higher_is_better

    initialize_distributed(cfg.coordinator_address, cfg.num_processes, cfg.process_id, auto=cfg.distributed)
    if cfg.output_dir is None:
        raise ValueError("search() needs output_dir=: each trial is a run folder in it, beside the study's storage")
    search_space.check(space, cfg)
    run_dir.check_output_dir(cfg.output_dir)
    model_folder = open_model(cfg)
    run_dir.refuse_output_inside_model(cfg.output_dir, model_folder.folder)
    trainer = Trainer.from_config(cfg, model_folder=model_folder)
    pad_token_id = load_tokenizer(model_folder, cfg.tokenizer_name)[1]
    # Each trial's model as `train` would load it (its seed too, when searched): from the folder.
    trainer.model_init = lambda trial: _load_model(cfg, model_folder, trainer.task, pad_token_id,
                                                   seed=(trial.params if trial else {}).get("seed"))[0]
    metric = trainer.best_metric
    if direction is None:
        direction = "maximize" if higher_is_better(metric) else "minimize"
    best = trainer.hyperparameter_search(
        hp_space=search_space.hp_space(space), compute_objective=lambda metrics: metrics[f"eval_{metric}"],
        n_trials=n_trials, direction=direction, storage=storage, study_name=study_name, timeout=timeout)
    return best


__all__ = ["Trainer", "open_model", "scoring_source", "search", "train"]
