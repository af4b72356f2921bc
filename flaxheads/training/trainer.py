"""Fine-tuning: the library function behind `flaxheads train`.

`train(cfg)` decides what the output folder allows (start, resume, report a finished run, or
refuse: `run_dir`), holds a lock on it, and runs the loop of `_Run`, whose methods are the loop's
parts: step, flush the metrics, save, evaluate, finish. Evaluation and prediction with a saved
model live in `flaxheads.inference`.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import datasets
import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from flaxheads import data, problem
from flaxheads.inference import Evaluator, fitting_max_length, load_tokenizer
from flaxheads.model import from_pretrained, save_pretrained
from flaxheads.shipped_model import minilm_path
from flaxheads.training import metrics as metrics_lib
from flaxheads.training import run_dir
from flaxheads.training.checkpoints import RunCheckpoints
from flaxheads.training.config import TrainConfig
from flaxheads.training.distributed import initialize as initialize_distributed
from flaxheads.training.optim import learning_rate_schedule, make_optimizer
from flaxheads.training.parallel import PARALLEL, host_copy, host_values
from flaxheads.training.run_lock import RunLock
from flaxheads.training.run_log import ProgressBar, RunLogger, format_summary
from flaxheads.training.sharding import Layout


class NonFiniteLoss(FloatingPointError):
    """Training produced a NaN or infinite loss; checkpoints whose weights were never seen to give
    a finite loss are moved aside, so that a re-run resumes from a good one."""


def load_task(cfg: TrainConfig) -> data.TaskData:
    """The data set the config names: local files, a hub data set, or a built-in one."""
    common = dict(
        text_column=cfg.text_column,
        text_pair_column=cfg.text_pair_column,
        label_column=cfg.label_column,
        problem_type=cfg.problem_type,
        num_labels=cfg.num_labels,
    )
    if cfg.train_file:
        return data.load_local_files(
            train_file=cfg.train_file, validation_file=cfg.validation_file, test_file=cfg.test_file, **common
        )
    if cfg.dataset_name:
        return data.load_named_dataset(cfg.dataset_name, **common)
    if cfg.dataset:
        return data.load_builtin(cfg.dataset, seed=cfg.seed)
    raise ValueError("no data: pass --train_file, --dataset_name or --dataset")


def model_path(cfg: TrainConfig) -> Path:
    return Path(cfg.model_name_or_path) if cfg.model_name_or_path else minilm_path()


def _accumulation_view(batch: dict[str, np.ndarray], accum: int) -> dict[str, np.ndarray]:
    """(accum * B, ...) -> (accum, B, ...): micro-batch i is rows [i*B, (i+1)*B)."""
    return {k: v.reshape(accum, v.shape[0] // accum, *v.shape[1:]) for k, v in batch.items()}


def _global_batch(cfg: TrainConfig) -> int:
    """Examples per optimizer step, over every device of every process."""
    return cfg.per_device_train_batch_size * jax.device_count() * cfg.gradient_accumulation_steps


def _check_data_shards(cfg: TrainConfig, task: data.TaskData, train_batch: int, eval_batch: int) -> None:
    """ValueError naming --data_shards unless each process can read only its own shards."""
    shards, processes = cfg.data_shards, jax.process_count()
    if shards % processes:
        raise ValueError(
            f"--data_shards {shards} must be a multiple of the process count {processes}, so that each process "
            f"reads and tokenises only its own shards of the data: set it to {processes} (or a multiple)"
        )
    for name, size in (("train", train_batch), ("eval", eval_batch)):
        if size % shards:
            raise ValueError(
                f"--data_shards {shards} must divide the global {name} batch of {size} examples: each shard "
                "fills an equal part of every batch"
            )
    for name, split in task.splits.items():
        if len(split) < shards:
            raise ValueError(f"--data_shards {shards} is more than the {len(split)} examples of the {name} split")


class _OwnSplit(NamedTuple):
    """A split as this process holds it."""

    rows: datasets.Dataset
    """This process's rows of the split (those of its data shards), tokenised."""
    lengths: np.ndarray
    """Token count of every example of the whole split, the same on every process."""


def _tokenize_own_shards(task: data.TaskData, tokenizer, cfg: TrainConfig, max_seq_length: int,
                         cache_dir: Path) -> dict[str, _OwnSplit]:
    """Every split of `task`, of which this process tokenises only the rows of its data shards."""
    index, count = jax.process_index(), jax.process_count()
    shards = data.process_shards(cfg.data_shards, index, count)
    own, counts = {}, []
    for name, split in task.splits.items():
        rows = data.process_rows(len(split), cfg.data_shards, index, count)
        # The whole split is not re-selected, so that it keeps its tokenisation cache.
        selected = split if len(rows) == len(split) else split.select(rows)
        tokenized = data.tokenize_split(selected, tokenizer, max_seq_length, cache_dir=cache_dir)
        lengths = _gather_lengths(data.example_lengths(tokenized), len(split), cfg.data_shards)
        own[name] = _OwnSplit(tokenized, lengths)
        counts.append(f"{len(rows)} of {len(split)} {name}")
    print(f"process {index}/{count} tokenized {', '.join(counts)} examples "
          f"(shards {shards.start}-{shards.stop - 1} of {cfg.data_shards})")
    return own


def _gather_lengths(own_lengths: np.ndarray, num_examples: int, num_shards: int) -> np.ndarray:
    """Token counts of every example of a split, from each process's counts of its own rows: a
    collective every process takes part in (a single process holds every row already)."""
    count = jax.process_count()
    if count == 1:
        return own_lengths
    rows_by_process = [data.process_rows(num_examples, num_shards, p, count) for p in range(count)]
    # process_allgather stacks arrays of one shape: each process pads its counts to the longest.
    padded = np.zeros(max(map(len, rows_by_process)), np.int32)
    padded[: len(own_lengths)] = own_lengths
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    lengths = np.empty(num_examples, np.int64)
    for p, rows in enumerate(rows_by_process):
        lengths[rows.start : rows.stop] = gathered[p, : len(rows)]
    return lengths



def _best_metric_name(cfg: TrainConfig, problem_type: str) -> str:
    return cfg.metric_for_best_model or ("mse" if problem_type == problem.REGRESSION else "accuracy")


def _print0(message: str, *, file=None) -> None:
    if jax.process_index() == 0:
        print(message, file=file)


def _sync(name: str) -> None:
    """Every process waits here until all have arrived (after process 0 changed the folder)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


class _Run:
    """One training run: its data, state and bookkeeping; `run()` is the loop."""

    def __init__(self, cfg: TrainConfig, src: Path):
        self.cfg = cfg
        self.start_time = time.perf_counter()
        self.output_dir = Path(cfg.output_dir)
        self.task = task = load_task(cfg)
        _print0(f"problem type {task.problem_type_reason or task.problem_type}")
        self.global_batch = _global_batch(cfg)
        self.eval_batch = cfg.per_device_eval_batch_size * jax.device_count()
        _check_data_shards(cfg, task, self.global_batch, self.eval_batch)
        if cfg.parallel not in PARALLEL:
            raise ValueError(f"--parallel {cfg.parallel!r}: choose one of {sorted(PARALLEL)}")
        self.tokenizer, pad_token_id = load_tokenizer(src, cfg.tokenizer_name)
        self.layout = Layout.create(cfg.mesh)
        model, self.loading_info = from_pretrained(
            src,
            pad_token_id=pad_token_id,
            num_labels=task.num_labels,
            head=cfg.head,
            problem_type=task.problem_type,
            id2label=[task.id2label[i] for i in range(task.num_labels)],
            classifier_dropout=cfg.classifier_dropout,
            dtype=cfg.dtype,
            seed=cfg.seed,
            ignore_mismatched_sizes=cfg.ignore_mismatched_sizes,
            placement=self.layout.param_sharding if cfg.parallel == "jit" else None,
            output_loading_info=True,
        )
        self.max_seq_length = fitting_max_length(model.config.backbone, cfg.max_seq_length)
        self.identity = run_dir.run_identity(cfg, task, model.config.backbone.to_hf_config(), model.config.head,
                                             self.global_batch)
        self.graphdef, params = nnx.split(model)
        del model
        self.previous = self._claim_folder()
        if self.previous is not None:
            return  # the folder holds this very run, finished: nothing to train
        self.tokenized = _tokenize_own_shards(task, self.tokenizer, cfg, self.max_seq_length,
                                              self.output_dir / "tokenized")
        self.batch_format = data.BatchFormat.for_task(task, self.tokenizer, self.max_seq_length,
                                                      model_pad_token_id=pad_token_id)
        batches_per_epoch = data.num_batches(len(self.tokenized["train"].lengths), self.global_batch)
        self.total_steps = (cfg.max_steps if cfg.max_steps > 0
                            else math.ceil(cfg.num_train_epochs * batches_per_epoch))
        schedule = learning_rate_schedule(
            cfg.learning_rate, self.total_steps, math.ceil(cfg.warmup_ratio * self.total_steps),
            cfg.lr_scheduler_type,
        )
        tx = make_optimizer(
            schedule, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
            adam_b1=cfg.adam_beta1, adam_b2=cfg.adam_beta2, adam_eps=cfg.adam_epsilon,
        )
        self.runner = PARALLEL[cfg.parallel](self.layout, self.graphdef, tx, schedule, task.problem_type, params)
        self.state = self.runner.init(params)
        del params
        self.checkpoints = RunCheckpoints(self.output_dir / run_dir.CHECKPOINTS_DIR,
                                          max_to_keep=cfg.save_total_limit, identity=self.identity["trained"])
        self.evaluate = Evaluator(self.graphdef, task.problem_type, self.layout, self.batch_format,
                                  self.eval_batch, cfg.data_shards)
        self.best = {"metric": _best_metric_name(cfg, task.problem_type), "value": None, "step": None}
        self.step = 0
        self.earlier_seconds = 0.0
        self.unconfirmed: list[int] = []
        """Checkpoints saved whose weights have not yet given a finite loss."""
        self.pending: list[tuple[int, dict]] = []
        """Metrics of steps run since the last flush, still on device (no sync per step)."""
        self.last_eval: dict[str, Any] = {}
        position = self._restore()
        self.train_batches = data.TrainBatches(
            self.tokenized["train"].rows, self.batch_format, global_batch_size=self.global_batch, seed=cfg.seed,
            start=position, process_index=jax.process_index(), process_count=jax.process_count(),
            group_by_length=cfg.group_by_length, num_shards=cfg.data_shards,
            lengths=self.tokenized["train"].lengths,
        )
        if jax.process_index() == 0:
            run_dir.write_run(self.output_dir, self.identity, complete=False)

    def _claim_folder(self) -> dict[str, Any] | None:
        """Decides what the output folder allows; returns the results of this run when the folder
        already holds it finished (a re-run of the same command), else None."""
        cfg = self.cfg
        if cfg.overwrite_output_dir:
            if jax.process_index() == 0:
                removed = run_dir.clear_run(self.output_dir)
                if removed:
                    print(f"--overwrite_output_dir: removed the earlier run's {', '.join(removed)} "
                          f"from {self.output_dir}", file=sys.stderr)
            _sync("flaxheads: output_dir cleared")
            return None
        record = run_dir.check_folder(self.output_dir, self.identity,
                                      explicit_resume=cfg.resume_from_checkpoint is not None)
        # Without resume_from_checkpoint, check_folder has compared the whole identity already.
        if record and record.get("complete") and cfg.resume_from_checkpoint is None:
            results = run_dir.read_results(self.output_dir)
            if results is not None:
                _print0(f"the run in {self.output_dir} is already complete ({results.get('steps')} steps); its "
                        f"results are in {run_dir.RESULTS_FILE}. Pass --overwrite_output_dir to train again")
                return {**results, "already_complete": True}
        return None

    def _restore(self) -> data.DataPosition:
        """Continues from a checkpoint when there is one to continue; returns the data position."""
        cfg, checkpoints = self.cfg, self.checkpoints
        if cfg.resume_from_checkpoint is not None:
            steps = [checkpoints.resolve_resume(cfg.resume_from_checkpoint)]
            later = [s for s in checkpoints.all_steps() if s > steps[0]]
            if later and jax.process_index() == 0:
                moved = checkpoints.set_aside(later, "after-resume-point")
                print(f"note: checkpoints {later} come after step {steps[0]}; moved to {moved}", file=sys.stderr)
            _sync("flaxheads: later checkpoints set aside")
        elif checkpoints.latest_step() is not None:
            steps = None
        else:
            _print0(str(self.loading_info))
            return data.DataPosition()
        target = self.runner.restore_target(self.state)
        restored, meta, self.step = checkpoints.restore_newest_intact(target, steps=steps)
        self.state = self.runner.from_restored(restored)
        self.best = meta["best"]
        self.earlier_seconds = float(meta.get("train_seconds", 0.0))
        if self.step not in checkpoints.confirmed_steps():
            self.unconfirmed.append(self.step)
        print(f"resuming from step {self.step} of {self.total_steps} in {checkpoints.directory}")
        return data.DataPosition.from_dict(meta["data_position"])

    # -- the loop's parts ---------------------------------------------------------------------

    def flush_pending(self) -> dict[str, float] | None:
        """Fetches the metrics of the steps run since the last flush and confirms the checkpoints
        whose weights they were computed from; raises NonFiniteLoss on a non-finite loss."""
        if not self.pending:
            return None
        fetched = host_values([m for _, m in self.pending])
        for (step, _), m in zip(self.pending, fetched):
            if not np.isfinite(m["loss"]):
                self._stop(f"loss became {m['loss']} at step {step}")
        # The loss of step t comes from the weights after step t - 1.
        self._confirm_before(self.pending[-1][0])
        self.pending.clear()
        return {"loss": float(np.mean([m["loss"] for m in fetched])),
                "learning_rate": float(fetched[-1]["learning_rate"]),
                "grad_norm": float(fetched[-1]["grad_norm"]),
                "examples": sum(float(m["examples"]) for m in fetched)}

    def _confirm_before(self, step: int) -> None:
        for saved in [s for s in self.unconfirmed if s < step]:
            if jax.process_index() == 0:
                self.checkpoints.confirm(saved)
            self.unconfirmed.remove(saved)

    def _stop(self, what: str) -> None:
        """Sets aside the checkpoints no finite loss vouches for, then raises NonFiniteLoss."""
        moved = self.checkpoints.set_aside_unconfirmed() if jax.process_index() == 0 else []
        _sync("flaxheads: unconfirmed checkpoints set aside")
        good = self.checkpoints.latest_good_step()
        lines = [f"{what}."]
        if moved:
            lines.append(f"Checkpoint(s) {moved}, saved after the last finite loss, were moved to "
                         f"{self.checkpoints.set_aside_directory} (kept, not deleted).")
        if good is None:
            lines.append("No checkpoint of this run has weights that gave a finite loss, so a re-run starts from "
                         "the pretrained weights.")
        else:
            lines.append(f"The newest checkpoint whose weights gave a finite loss is step {good}: continue from it "
                         f"with --resume_from_checkpoint {good}.")
        advice = "Lower --learning_rate"
        if self.cfg.max_grad_norm <= 0:
            advice += ", set --max_grad_norm (e.g. 1.0)"
        if self.cfg.dtype != "float32":
            advice += ", or use --dtype float32"
        lines.append(advice + ".")
        raise NonFiniteLoss(" ".join(lines))

    def save(self) -> None:
        self.flush_pending()  # never checkpoint a state whose loss went non-finite
        seconds = self.earlier_seconds + time.perf_counter() - self.start_time
        self.checkpoints.save(self.runner.checkpointable(self.state), self.step, {
            "data_position": self.train_batches.position.to_dict(), "best": self.best, "seed": self.cfg.seed,
            "total_steps": self.total_steps, "train_seconds": seconds,
        })
        self.unconfirmed.append(self.step)

    def run_eval(self, log: RunLogger, bar: ProgressBar) -> dict[str, float] | None:
        if "validation" not in self.tokenized:
            return None
        if self.last_eval.get("step") == self.step:
            return self.last_eval["result"]
        result = self.evaluate(self.runner.params(self.state), *self.tokenized["validation"])
        self.last_eval.update(step=self.step, result=result)
        log.log(self.step, "eval", result)
        bar.write(format_summary("eval", self.step, result))
        value, best = result.get(self.best["metric"]), self.best
        if value is not None and np.isfinite(value) and (
            best["value"] is None
            or (value > best["value"] if metrics_lib.higher_is_better(best["metric"]) else value < best["value"])
        ):
            best.update(value=float(value), step=self.step)
            self._export(self.output_dir / run_dir.BEST_MODEL_DIR)
        return result

    def _export(self, directory: Path) -> None:
        """A Hugging Face directory (config with id2label, weights, tokenizer) from process 0.
        Sharded parameters are gathered first, a collective every process takes part in."""
        params = host_copy(self.runner.params(self.state), self.layout)
        if jax.process_index() != 0:
            return
        save_pretrained(nnx.merge(self.graphdef, params), directory)
        self.tokenizer.save_pretrained(str(directory))

    def _confirm_final(self, results: dict[str, Any]) -> None:
        """The last checkpoint's weights have given no training loss: an evaluation loss vouches
        for them (one batch of the training data when there is no evaluation split)."""
        losses = [results[split]["loss"] for split in ("validation", "test") if split in results]
        if not losses:
            losses = [self.evaluate(self.runner.params(self.state), *self.tokenized["train"], max_batches=1)["loss"]]
        if not all(np.isfinite(losses)):
            self._stop(f"the final weights (step {self.step}) give an evaluation loss of {losses}")
        self._confirm_before(self.step + 1)

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        accum = cfg.gradient_accumulation_steps
        rng = jax.random.key(cfg.seed)
        log = RunLogger(self.output_dir, start_step=self.step)
        bar = ProgressBar(self.total_steps, initial=self.step, disable=cfg.disable_tqdm)
        last_log = time.perf_counter()
        results: dict[str, Any] = {}
        try:
            while self.step < self.total_steps:
                batch = _accumulation_view(next(self.train_batches), accum)
                self.state, step_metrics = self.runner.step(self.state, batch, rng)
                self.step += 1
                self.pending.append((self.step, step_metrics))
                end_of_epoch = self.train_batches.position.batch_in_epoch == 0
                summary = {}
                if self.step % cfg.logging_steps == 0 or self.step == self.total_steps:
                    summary = self.flush_pending()
                    now = time.perf_counter()
                    summary["examples_per_second"] = summary.pop("examples") / max(now - last_log, 1e-9)
                    last_log = now
                    log.log(self.step, "train", summary)
                bar.update(1, examples=int(batch["example_mask"].sum()), loss=summary.get("loss"),
                           learning_rate=summary.get("learning_rate"))
                if (cfg.eval_steps and self.step % cfg.eval_steps == 0) or (not cfg.eval_steps and end_of_epoch):
                    self.run_eval(log, bar)
                if self.step % cfg.save_steps == 0 or self.step == self.total_steps:
                    self.save()
            if self.checkpoints.latest_step() != self.step:
                self.save()
            results["steps"] = self.step
            if "validation" in self.tokenized:
                results["validation"] = self.run_eval(log, bar)
            if "test" in self.tokenized:
                results["test"] = self.evaluate(self.runner.params(self.state), *self.tokenized["test"])
                log.log(self.step, "test", results["test"])
                bar.write(format_summary("test", self.step, results["test"]))
            self._confirm_final(results)
            self._export(self.output_dir)
        finally:
            bar.close()
            log.close()
            self.checkpoints.close()
        results["best"] = self.best
        results["seconds"] = self.earlier_seconds + time.perf_counter() - self.start_time
        if jax.process_index() == 0:
            run_dir.write_results(self.output_dir, results)
            run_dir.write_run(self.output_dir, self.identity, complete=True)
        return results


def train(cfg: TrainConfig = TrainConfig()) -> dict[str, Any]:
    """Fine-tunes, checkpoints and exports into `cfg.output_dir`.

    The same command again resumes from the newest checkpoint (a damaged one is set aside with a
    warning), or returns the recorded results of the finished run with "already_complete": True.
    Returns {"validation": metrics, "test": metrics, "steps": int, "best": {...}, "seconds": float}.

    Raises ValueError for bad data or settings; RunConflict for an output_dir that is (inside)
    the model folder or holds a model no run wrote there; CheckpointMismatch, naming each
    differing setting, for an output_dir of another run; RunLocked while another run uses it;
    NonFiniteLoss (naming the step and the checkpoint to continue from) when the loss stops
    being finite.
    """
    initialize_distributed(cfg.coordinator_address, cfg.num_processes, cfg.process_id, auto=cfg.distributed)
    src = model_path(cfg)
    run_dir.refuse_output_inside_model(cfg.output_dir, src)
    lock = RunLock(cfg.output_dir) if jax.process_index() == 0 else contextlib.nullcontext()
    with lock:
        run = _Run(cfg, src)
        if run.previous is not None:
            return run.previous
        return run.run()
