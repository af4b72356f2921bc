"""The training loop: `TrainLoop`, whose methods are the loop's parts (state and resume, step,
log, evaluate, save, finish). What is trained and where it is written is decided by the caller
(`flaxheads.training.trainer.Trainer`); the loop only runs it.

Without a checkpoints folder (an in-memory run) the loop saves and logs nothing to disk; its
summaries still go to the progress bar.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import jax
import numpy as np
from jax.experimental import multihost_utils

from flaxheads import data, notes
from flaxheads.conversion.formats import checkpoint_files
from flaxheads.training import metrics as metrics_lib
from flaxheads.training import run_files
from flaxheads.training.checkpoints import RunCheckpoints
from flaxheads.training.config import TrainConfig
from flaxheads.training.parallel import host_values
from flaxheads.training.run_log import ProgressBar, RunLogger, format_summary


class NonFiniteLoss(FloatingPointError):
    """Training produced a NaN or infinite loss; checkpoints whose weights were never seen to give
    a finite loss are moved aside, so that a re-run resumes from a good one."""


def print0(message: str, *, file=None) -> None:
    if jax.process_index() == 0:
        print(notes.worded(message), file=file)


def sync(name: str) -> None:
    """Every process waits here until all have arrived (after process 0 changed the folder)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


class Scorer(Protocol):
    """What the loop asks of its owner: scores of a split, and an export of weights."""

    def scores(self, split: str, params, *, max_batches: int | None = None) -> dict[str, float]: ...

    def export(self, params, directory: Path, *, replaces=()) -> None: ...


class TrainLoop:
    """One training run of `runner` from `state`: `run()` steps to `total_steps` and returns the
    results (final metrics of the validation and test splits, steps, best, seconds)."""

    def __init__(self, cfg: TrainConfig, runner, state, train: data.OwnSplit, batch_format: data.BatchFormat,
                 scorer: Scorer, *, total_steps: int, global_batch: int, eval_splits: tuple[str, ...],
                 checkpoints: RunCheckpoints | None = None, output_dir: Path | None = None, loading_info=None,
                 best_metric: str, on_evaluate=None):
        self.cfg, self.runner, self.state, self.scorer = cfg, runner, state, scorer
        self.on_evaluate = on_evaluate
        """Called as `on_evaluate(step, metrics)` once per validation evaluation (a search's pruning)."""
        self.total_steps, self.eval_splits = total_steps, eval_splits
        self.checkpoints, self.output_dir = checkpoints, output_dir
        self.start_time = time.perf_counter()
        self.best = {"metric": best_metric, "value": None, "step": None,
                     "evaluations_without_improvement": 0}
        """The best validation evaluation so far, and the early-stopping count (saved with every
        checkpoint, so a resumed run stops exactly where an uninterrupted one would)."""
        self.stopped_early: int | None = None
        """The step at which early stopping ended the run."""
        self.best_params = None
        """Host copies of the best evaluation's weights, with load_best_model_at_end."""
        self.session = _session_id()
        """Names this session's best_model exports (`_export_best`)."""
        self.step = 0
        self.earlier_seconds = 0.0
        self.unconfirmed: list[int] = []
        """Checkpoints saved whose weights have not yet given a finite loss."""
        self.pending: list[tuple[int, dict]] = []
        """Metrics of steps run since the last flush, still on device (no sync per step)."""
        self.last_eval: dict[str, Any] = {}
        self.eval_seconds = 0.0
        """Seconds this session spent scoring splits (during training and at the end)."""
        self.examples_trained = 0.0
        """Real examples this session trained on (all processes)."""
        self.unshown: tuple[dict, bool] | None = None
        """The newest step's metrics (on device) and whether its time was all training; the bar
        shows it once the next step is dispatched (see `_show_unshown`)."""
        self.shapes: set[tuple[int, ...]] = set()
        """Batch shapes stepped so far: a new one compiles (or loads from the cache) first."""
        position = self._restore(loading_info)
        self.train_batches = data.TrainBatches(
            train.rows, batch_format, global_batch_size=global_batch, seed=cfg.seed, start=position,
            process_index=jax.process_index(), process_count=jax.process_count(), sampling=cfg.sampling,
            num_shards=cfg.data_shards, lengths=train.lengths,
        )
        self.log = (RunLogger(output_dir, start_step=self.step, tensorboard=cfg.tensorboard)
                    if output_dir is not None else None)
        self.bar = ProgressBar(total_steps, initial=self.step, disable=cfg.disable_tqdm)
        self.last_log = time.perf_counter()

    # -- state ----------------------------------------------------------------------------------

    def _restore(self, loading_info) -> data.DataPosition:
        """Continues from a checkpoint when there is one to continue; returns the data position."""
        steps = self._resume_steps()
        if steps == []:
            if loading_info is not None:
                print0(str(loading_info))
            return data.DataPosition()
        checkpoints = self.checkpoints
        target = self.runner.restore_target(self.state)
        restored, meta, self.step = checkpoints.restore_newest_intact(target, steps=steps)
        self.state = self.runner.from_restored(restored)
        self.best = {"evaluations_without_improvement": 0, **meta["best"]}
        self.earlier_seconds = float(meta.get("train_seconds", 0.0))
        if self.step not in checkpoints.confirmed_steps():
            self.unconfirmed.append(self.step)
        print(f"resuming from step {self.step} of {self.total_steps} in {checkpoints.directory}")
        return data.DataPosition.from_dict(meta["data_position"])

    def _resume_steps(self) -> list[int] | None:
        """The checkpoint steps to resume from: [] none (a fresh start), None the newest intact."""
        cfg, checkpoints = self.cfg, self.checkpoints
        if checkpoints is None:
            return []
        if cfg.resume_from_checkpoint is None:
            return None if checkpoints.latest_step() is not None else []
        step = checkpoints.resolve_resume(cfg.resume_from_checkpoint)
        later = [s for s in checkpoints.all_steps() if s > step]
        if later and jax.process_index() == 0:
            moved = checkpoints.set_aside(later, "after-resume-point")
            print(f"note: checkpoints {later} come after step {step}; moved to {moved}", file=sys.stderr)
        sync("flaxheads: later checkpoints set aside")
        return [step]

    def params(self):
        return self.runner.params(self.state)

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        finished = False
        try:
            rng = jax.random.key(self.cfg.seed)
            while self.step < self.total_steps and self.stopped_early is None:
                self.train_step(rng)
            results = self.finish()
            finished = True
            return results
        finally:
            # An error raised on one process alone (a file it writes) leaves the others in the run's
            # next collective: a collective here would pair with theirs, abort every process and hide it.
            self.close(collective=finished)

    def train_step(self, rng: jax.Array) -> None:
        """One optimizer step, then whatever falls due after it: a log line, an evaluation, a save."""
        cfg = self.cfg
        batch = data.accumulation_view(next(self.train_batches), cfg.gradient_accumulation_steps)
        compiles = batch["input_ids"].shape not in self.shapes
        self.shapes.add(batch["input_ids"].shape)
        self.state, step_metrics = self.runner.step(self.state, batch, rng)
        self.step += 1
        self.pending.append((self.step, step_metrics))
        self._show_unshown()
        self.unshown = (step_metrics, not compiles)
        last = self.step == self.total_steps
        if self.step % cfg.logging_steps == 0 or last:
            self.log_train()
        if self._evaluation_due():
            self.evaluate()
            self._untimed()
        if self.step % cfg.save_steps == 0 or last:
            self.save()
            self._untimed()

    def _untimed(self) -> None:
        """The time just spent (evaluating, saving) is not training: the step still to be shown
        is not timed, and when it was shown already, the throughput clock restarts."""
        if self.unshown is not None:
            self.unshown = (self.unshown[0], False)
        else:
            self.bar.restart_clock()

    def _show_unshown(self) -> None:
        """Advances the bar over the step before the newest, whose metrics are ready (or nearly)
        while the newest runs: reading them never waits for the step just dispatched, so one step
        stays queued and the bar still moves, with the running loss, every step."""
        if self.unshown is None:
            return
        metrics, timed = self.unshown
        self.unshown = None
        values = host_values({name: metrics[name] for name in ("loss", "learning_rate", "examples")})
        self.bar.update(1, loss=float(values["loss"]), learning_rate=float(values["learning_rate"]),
                        examples=float(values["examples"]), timed=timed)

    def _evaluation_due(self) -> bool:
        strategy = self.cfg.evaluation
        if strategy == "steps":
            return self.step % self.cfg.evaluation_interval == 0
        return strategy == "epoch" and self.train_batches.position.batch_in_epoch == 0

    # -- log ------------------------------------------------------------------------------------

    def log_train(self) -> dict[str, float]:
        """Flushes the pending steps' metrics into one train record, with the throughput since the last."""
        summary = self.flush_pending()
        self._show_unshown()  # the flush waited for every pending step: the newest is done too
        now = time.perf_counter()
        summary["examples_per_second"] = summary.pop("examples") / max(now - self.last_log, 1e-9)
        self.last_log = now
        self._record("train", summary)
        self.bar.log(summary["loss"])
        return summary

    def _record(self, split: str, metrics: dict[str, float], *, show: bool = False) -> None:
        if self.log is not None:
            self.log.log(self.step, split, metrics)
        if show:
            self.bar.write(format_summary(split, self.step, metrics))

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
        self.examples_trained += sum(float(m["examples"]) for m in fetched)
        return {"loss": float(np.mean([m["loss"] for m in fetched])),
                "learning_rate": float(fetched[-1]["learning_rate"]),
                "grad_norm": float(fetched[-1]["grad_norm"]),
                "examples": sum(float(m["examples"]) for m in fetched)}

    # -- evaluate -------------------------------------------------------------------------------

    def evaluate(self) -> dict[str, float] | None:
        """Scores the validation split (once per step), tracks the best and exports it."""
        if "validation" not in self.eval_splits:
            return None
        if self.last_eval.get("step") == self.step:
            return self.last_eval["result"]
        result = self._timed_scores("validation")
        self.last_eval.update(step=self.step, result=result)
        self._record("eval", result, show=True)
        if self.on_evaluate is not None:
            self.on_evaluate(self.step, result)
        value = result.get(self.best["metric"])
        patience = self.cfg.early_stopping_patience
        if patience is not None:
            significant = self._improves_best(value, by=self.cfg.early_stopping_threshold)
            self.best["evaluations_without_improvement"] = (
                0 if significant else self.best.get("evaluations_without_improvement", 0) + 1)
        if self._improves_best(value):
            self.best.update(value=float(value), step=self.step)
            if self.output_dir is not None:
                self._export_best(self.output_dir / "best_model")
            if self.cfg.load_best_model_at_end:
                self.best_params = self.runner.host_params(self.state)
        if patience is not None and self.best["evaluations_without_improvement"] >= patience:
            self.stopped_early = self.step
            self.bar.write(f"early stopping at step {self.step}: {self.best['metric']} has not improved by more than "
                           f"{self.cfg.early_stopping_threshold} in {patience} evaluation(s); best "
                           f"{self.best['value']} at step {self.best['step']}")
        return result

    def _export_best(self, folder: Path) -> None:
        """The weights of the best evaluation so far into best_model/ (the run's own folder: every
        file in it an earlier best's), recorded there and in `best` (and so in the checkpoints) by
        an id of this session and step: a resumed run reads the folder back only when it holds the
        best of its own trajectory (`run_files.best_export`)."""
        export = f"{self.session}-{self.step}"
        if jax.process_index() == 0:
            run_files.forget_best(folder)
        self.scorer.export(self.params(), folder, replaces=checkpoint_files(folder))
        if jax.process_index() == 0:
            run_files.record_best(folder, export)
        self.best["export"] = export

    def _timed_scores(self, split: str) -> dict[str, float]:
        """The split's scores; NaN or infinite ones stop the run as a non-finite loss does: such
        weights are never scored, kept as the best model, or exported."""
        start = time.perf_counter()
        try:
            scores = self.scorer.scores(split, self.params())
        except metrics_lib.NonFiniteScores as err:
            self._stop(f"the weights after step {self.step} give non-finite {split} scores: {err}")
        self.eval_seconds += time.perf_counter() - start
        return scores

    def _improves_best(self, value, *, by: float = 0.0) -> bool:
        """Whether `value` beats the best so far (by more than `by`) in the metric's direction."""
        best = self.best
        if value is None or not np.isfinite(value):
            return False
        if best["value"] is None:
            return True
        greater = self.cfg.greater_is_better
        if greater is None:
            greater = metrics_lib.higher_is_better(best["metric"])
        return value - best["value"] > by if greater else best["value"] - value > by

    # -- save -----------------------------------------------------------------------------------

    def save(self) -> None:
        if self.checkpoints is None:
            return
        self.flush_pending()  # never checkpoint a state whose loss went non-finite
        self.checkpoints.save(self.runner.checkpointable(self.state), self.step, {
            "data_position": self.train_batches.position.to_dict(), "best": self.best, "seed": self.cfg.seed,
            "total_steps": self.total_steps, "train_seconds": self.seconds(),
        })
        self.unconfirmed.append(self.step)

    def seconds(self) -> float:
        """Training time so far, earlier sessions of a resumed run included."""
        return self.earlier_seconds + time.perf_counter() - self.start_time

    def _confirm_before(self, step: int) -> None:
        for saved in [s for s in self.unconfirmed if s < step]:
            if jax.process_index() == 0:
                self.checkpoints.confirm(saved)
            self.unconfirmed.remove(saved)

    def _stop(self, what: str) -> None:
        """Sets aside the checkpoints no finite loss vouches for, then raises NonFiniteLoss."""
        lines = [f"{what}."]
        if self.checkpoints is not None:
            lines += self._set_aside_unconfirmed()
        advice = f"Lower learning_rate={self.cfg.learning_rate}"
        if self.cfg.max_grad_norm <= 0:
            advice += ", set max_grad_norm=1.0"
        if self.cfg.param_dtype != "float32":
            advice += ", or use param_dtype='float32' and dtype='float32'"
        elif self.cfg.dtype != "float32":
            advice += ", or use dtype='float32'"
        lines.append(advice + ".")
        raise NonFiniteLoss(" ".join(lines))

    def _set_aside_unconfirmed(self) -> list[str]:
        checkpoints = self.checkpoints
        moved = checkpoints.set_aside_unconfirmed() if jax.process_index() == 0 else []
        sync("flaxheads: unconfirmed checkpoints set aside")
        good = checkpoints.latest_good_step()
        lines = []
        if moved:
            lines.append(f"Checkpoint(s) {moved}, saved after the last finite loss, were moved to "
                         f"{checkpoints.set_aside_directory} (kept, not deleted).")
        if good is None:
            lines.append("No checkpoint of this run has weights that gave a finite loss, so a re-run starts from "
                         "the pretrained weights.")
        else:
            lines.append(f"The newest checkpoint whose weights gave a finite loss is step {good}: continue from it "
                         f"with resume_from_checkpoint={good}.")
        return lines

    # -- finish ---------------------------------------------------------------------------------

    def finish(self) -> dict[str, Any]:
        """The last save, the final scores, and a finite loss that vouches for the final weights."""
        self.flush_pending()
        self._show_unshown()
        if self.checkpoints is not None and self.checkpoints.latest_step() != self.step:
            self.save()
        results: dict[str, Any] = {"steps": self.step}
        if "validation" in self.eval_splits:
            results["validation"] = self.evaluate()
        if "test" in self.eval_splits:
            results["test"] = self._timed_scores("test")
            self._record("test", results["test"], show=True)
        self._confirm_final(results)
        results["best"] = self.best
        if self.stopped_early is not None:
            results["stopped_early"] = {"step": self.stopped_early, "patience": self.cfg.early_stopping_patience}
        results["seconds"] = self.seconds()
        results["eval_seconds"] = self.eval_seconds
        results["train_examples"] = self.examples_trained
        return results

    def _confirm_final(self, results: dict[str, Any]) -> None:
        """The last checkpoint's weights have given no training loss: an evaluation loss vouches
        for them (one batch of the training data when there is no scored split)."""
        losses = [results[split]["loss"] for split in ("validation", "test") if split in results]
        if not losses:
            try:
                losses = [self.scorer.scores("train", self.params(), max_batches=1)["loss"]]
            except metrics_lib.NonFiniteScores as err:
                self._stop(f"the final weights (step {self.step}) give non-finite scores on the training data: {err}")
        if not all(np.isfinite(losses)):
            self._stop(f"the final weights (step {self.step}) give an evaluation loss of {losses}")
        if self.checkpoints is not None:
            self._confirm_before(self.step + 1)

    def close(self, *, collective: bool = True) -> None:
        self.bar.close()
        if self.log is not None:
            self.log.close()
        if self.checkpoints is not None:
            self.checkpoints.close(collective=collective)


def _session_id() -> str:
    """A random id of this training session, the same on every process."""
    nonce = np.frombuffer(os.urandom(8), np.uint64)
    if jax.process_count() > 1:
        nonce = multihost_utils.broadcast_one_to_all(nonce)
    return f"{int(np.asarray(nonce)[0]):016x}"
