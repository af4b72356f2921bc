"""Fine-tuning: `Trainer`, which trains a model of any task on data held in Python, as
`flaxheads train` does. What differs between tasks (fitting the model's config to the data, the
loss, the scorer, predictions, what the run identity records) is asked of the task's `Task`
(`flaxheads.tasks`), which the Trainer is given as `kind`: this module knows no task.
`flaxheads.Trainer` (`tasks/runs.py`) finds the kind from the model, and `train(cfg)` there loads
the model, tokenizer and data a `TrainConfig` names.

What a run writes. With `args.output_dir` set, a training run owns that folder as `flaxheads
train` does (`run_dir`): it refuses a folder holding another run or a foreign model (unless
`overwrite_output_dir`), holds a lock on it, checkpoints and resumes there, logs to
metrics.jsonl (and TensorBoard, per `report_to`), exports the best and the final model, and
writes results.json, run.json and, with `do_predict`, predict_results.txt. With
`output_dir=None` nothing is written anywhere: the trained model, metrics and predictions are
only returned.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxheads import atomic, data, lora
from flaxheads import thresholds as thresholds_lib
from flaxheads.backbones import stacking
from flaxheads.conversion import peft
from flaxheads.data.packing import segments_per_row
from flaxheads.model import PretrainedModel
from flaxheads.tokenizer import fitting_max_length, for_model
from flaxheads.training import calibration, run_dir, run_files, run_report
from flaxheads.training.checkpoints import RunCheckpoints
from flaxheads.training.config import TrainConfig
from flaxheads.training.loop import NonFiniteLoss, TrainLoop, print0, sync
from flaxheads.training.optim import learning_rate_schedule, make_optimizer, optimizer_values
from flaxheads.training.parallel import PARALLEL, host_copy
from flaxheads.training.run_lock import RunLock
from flaxheads.training.scoring import EvalPrediction, MetricsFunction, PredictionOutput, SplitScorer
from flaxheads.training.sharding import Layout
from flaxheads.training.task_protocol import TaskKind
from flaxheads.training.trainable import split_trainable

__all__ = ["EvalPrediction", "NonFiniteLoss", "PredictionOutput", "TrainOutput", "Trainer"]


class TrainOutput(NamedTuple):
    model: PretrainedModel | None
    """The trained classifier (the given one when do_train is False); None for a finished run found
    in output_dir: its model is exported there (`flaxheads.from_pretrained(output_dir)`)."""
    metrics: dict[str, Any]
    """{"validation": metrics, "test": metrics, "steps": int, "best": {...}, "seconds": float} (validation
    and test where scored); a training run adds "eval_seconds" (of "seconds", those spent scoring)
    and "train_examples" (real examples trained on) of this session."""
    predictions: list | None
    """With do_predict: per test example, its label name (single-label), list of label names
    (multi-label) or score (regression); token classification: per test sentence, its words'
    tags; else None."""


class Trainer:
    """Fine-tunes a model of any task on data held in Python, as `flaxheads train` does.

        trainer = flaxheads.Trainer(model, TrainConfig(output_dir=None, max_steps=100),
                                    train_dataset=(texts, labels), eval_dataset=dev, tokenizer=tokenizer)
        model, metrics, _ = trainer.train()

    Data (`train_dataset`, `eval_dataset`, `test_dataset`): a `datasets.Dataset`, a dict of
    columns, a list of row dicts, a `(texts, labels)` tuple (`(texts, text_pairs, labels)` with
    `args.text_pair_column`), or, for the test split only, a list of texts without labels.
    Columns are found by `args.text_column`, `text_pair_column` and `label_column`; labels are
    read as by `flaxheads train` (class names, problem type, their errors). `task`: a `TaskData`
    (e.g. `flaxheads.data.load_builtin(...)`) instead of the three. Preference pairs for a reward
    model (`num_labels=1`): rows with `args.chosen_column` and `args.rejected_column` texts (and
    no text column, or `problem_type="pairwise_reward"`), or `(chosen_texts, rejected_texts)`
    tuples with that problem type; the metrics are pair accuracy and mean reward margin.
    Another task's data goes in as `task=` (token classification: a `TokenClassifier` with
    `task=flaxheads.data.token_task_data(word_task)`, whose metrics are entity-level and whose
    predictions are per sentence, per word; multiple choice: a `MultipleChoice` with
    `task=flaxheads.data.choice_task(...)`).

    `kind` is the model's task (`flaxheads.tasks.Task`): what differs between tasks is asked of
    it. `flaxheads.Trainer` finds it from the model; this class is the task-free machinery.

    The model's num_labels and problem_type must fit the data (ValueError naming what to change);
    the trained model carries the data's class names. `args.do_train` False only scores and
    predicts; `do_eval` / `eval_strategy` say when the validation split is scored, `do_predict`
    whether the test split is predicted. See the module docstring for what is written.
    `compute_metrics(EvalPrediction(predictions=logits, label_ids)) -> dict` adds entries to every
    evaluation's metrics. `model_init`: a function returning the model (taking no argument, or a
    search's trial), called instead of passing `model`, and again for each trial of
    `hyperparameter_search`.
    """

    def __init__(self, model: PretrainedModel | None, args: TrainConfig | None = None, *, train_dataset=None,
                 eval_dataset=None, test_dataset=None, tokenizer, compute_metrics: MetricsFunction | None = None,
                 task: data.TaskData | None = None, kind: TaskKind, model_init=None):
        if model is None:
            if model_init is None:
                raise ValueError("the Trainer needs a model: pass one, or model_init= (a function returning one)")
            model = call_model_init(model_init, None)
        self.args = args = args if args is not None else TrainConfig(output_dir=None, dataset=None)
        self.kind = kind
        """The model's task (`flaxheads.tasks.Task`): its config fitting, loss, scorer, predictions."""
        self.tokenizer, self.compute_metrics = for_model(tokenizer, model.config.backbone), compute_metrics
        self.data = self._load_data(model.config, task, train_dataset, eval_dataset, test_dataset)
        self.task = task = self.data.task
        """The data (`TaskData`) the run trains and scores on."""
        if args.packing is None:  # decided by the data: on wherever it applies
            self.args = args = dataclasses.replace(args, packing=args.packing_applies(data.examples_of(task)))
        self.model_class = type(model)
        """What the run trains and exports: the given model's class."""
        print0(f"problem type {task.described}")
        imbalance = data.labels.imbalance_warning(task) if args.do_train else None
        if imbalance:
            print0(f"warning: {imbalance}", file=sys.stderr)
        if args.do_train and "train" not in self.data.given:
            raise ValueError("do_train=True needs a train_dataset; to only evaluate or predict, pass "
                             "TrainConfig(do_train=False)")
        # The task refuses what does not apply to it (calibrate on token classification) before
        # anything checks how well its data fits that setting.
        self.max_seq_length = fitting_max_length(model.config.backbone, args.max_seq_length)
        kind.check_settings(args, task, tokenizer=self.tokenizer, max_seq_length=self.max_seq_length)
        check_best_model_settings(args, kind.metric_names(task), task, self.data.given, self.data.unlabelled)
        if args.do_predict and "test" not in self.data.given:
            raise ValueError("do_predict=True predicts the test split, but the data has none: give a test_file (or a "
                             "test_dataset), or leave do_predict out")
        self.global_batch = args.per_device_train_batch_size * jax.device_count() * args.gradient_accumulation_steps
        self.eval_batch = args.per_device_eval_batch_size * jax.device_count()
        data.check_data_shards(args.data_shards, task, self.global_batch, self.eval_batch)
        if args.parallel not in PARALLEL:
            raise ValueError(f"parallel={args.parallel!r}: choose one of {sorted(PARALLEL)}")
        self.layout = Layout.create(args.mesh)
        self.batch_format = data.BatchFormat.for_task(
            task, self.tokenizer, self.max_seq_length, model_pad_token_id=model.config.backbone.pad_token_id,
            pad_to_multiple_of=args.pad_to_multiple_of,
            max_segments=segments_per_row(args.packing, args.max_segments_per_row, self.max_seq_length))
        self.config = kind.fit_config(model.config, task, args)
        self.loss_options = kind.loss_options(args, task)
        self.best_metric = args.metric_for_best_model or kind.default_metric(task)
        """The metric the best weights follow: metric_for_best_model, else the task's default."""
        """The training loss's options (a text classifier's class weights and label smoothing)."""
        check_param_dtype(model, args.param_dtype)
        self.graphdef, self.params = _split_with_config(_prepared(model, args), self.config)
        self.output_dir = Path(args.output_dir) if args.output_dir else None
        self._tokenized_train: data.OwnSplit | None = None
        """The train split, tokenised early when its token counts decide the steps (packing)."""
        self.train_format = self.batch_format
        """The train batches' format: packed, in rows of packed_row_length (`_batches_per_epoch`)."""
        # Packed, the rows (their length, a batch's count) come from the train split's token counts.
        per_epoch = self._batches_per_epoch() if args.do_train and (
            args.max_steps <= 0 or self.batch_format.packed) else 0
        self.total_steps = 0 if not args.do_train else (
            args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * per_epoch))
        self.model_name = args.model_name_or_path or "in-memory model"
        """Names the model in run.json, for people; the identity has its content (`model_identity`)."""
        self.model_identity: str | None = None
        """The model's content fingerprint in the run identity: from_config gives its folder's; an
        in-memory model's parameters are hashed when the identity is first asked for, before training."""
        self.data_identity: dict[str, Any] | None = self._fingerprints()
        """What the run identity records of the data; None: what args say (files, data set names)."""
        self.loading_info = None
        """Printed when a run starts afresh (not when it resumes)."""
        self._exported: list[str] = []
        """The files the final export wrote in output_dir, for run.json."""
        self._recorded_exports: list[str] = []
        """The files earlier exports of this run wrote in output_dir (its run.json's record)."""
        self._folder_existed = False
        self._folder_before: run_dir.FolderBefore | None = None
        """What output_dir held when this run recorded itself there, to put back if it is refused
        before it trains (process 0)."""
        self._training_started = False
        self._scorer: SplitScorer | None = None
        self.programs: dict | None = None
        """Compiled steps to reuse, by what shapes them (`parallel._program`): a search's trials share one."""
        self.on_evaluate = None
        """Called as `on_evaluate(step, metrics)` after each evaluation of the validation split during
        training (a search's pruning); what it raises ends the run."""
        self.model_init = model_init

    # -- data -----------------------------------------------------------------------------------

    def _load_data(self, config, task, train, validation, test) -> data.InMemoryTask:
        if task is not None:
            if any(split is not None for split in (train, validation, test)):
                raise ValueError("pass either task= or train_dataset/eval_dataset/test_dataset, not both")
            return data.InMemoryTask(task, frozenset(self.kind.unlabelled_splits(task)), tuple(task.splits))
        return self.kind.in_memory({"train": train, "validation": validation, "test": test},
                                   self._column_args(config))

    def _column_args(self, config) -> dict[str, Any]:
        args = self.args
        return dict(text_column=args.text_column, text_pair_column=args.text_pair_column,
                    label_column=args.label_column, problem_type=args.problem_type or getattr(config, "problem_type", None),
                    num_labels=args.num_labels, chosen_column=args.chosen_column,
                    rejected_column=args.rejected_column)

    def _fingerprints(self) -> dict[str, Any]:
        """The in-memory data's identity: `datasets`' fingerprint of each given split's content."""
        splits = self.task.splits
        return {"fingerprints": {name: splits[name]._fingerprint for name in self.data.given}}

    def _batches_per_epoch(self) -> int:
        """Global train batches per epoch. Packed, the count of rows depends on the examples'
        token counts, so the train split is tokenised here, before the output folder is claimed
        (in memory, not in its cache), and kept for training."""
        if not self.batch_format.packed and self.kind.one_row_per_example(self.task):
            return data.num_batches(len(self.task.splits["train"]), self.global_batch)
        # An example may give several rows (a token-classification sentence longer than
        # max_seq_length: windows), known once the split is tokenised.
        self._tokenized_train = self._own_splits(["train"], cache=False)["train"]
        if self.batch_format.packed:
            self.train_format = self._packed_train_format(self._tokenized_train.lengths)
            self.global_batch = self._packed_global_batch(self._tokenized_train.lengths)
        return data.batches_per_epoch(self._tokenized_train.lengths, self.train_format,
                                      global_batch_size=self.global_batch, num_shards=self.args.data_shards)

    def _packed_train_format(self, lengths) -> data.BatchFormat:
        """Packed train rows of packed_row_length tokens (default: fitted to the train split's
        longest example, the same on every process), max_segments_per_row examples (default: one
        per 8 tokens of the row)."""
        args = self.args
        row_length = args.packed_row_length or data.fitted_row_length(lengths, self.max_seq_length)
        return self._packed_rows_of(min(row_length, self.max_seq_length))  # the model may hold fewer positions

    def _packed_rows_of(self, row_length: int) -> data.BatchFormat:
        """The packed format in rows of `row_length` tokens, max_segments_per_row examples each
        (default: one per 8 tokens of the row)."""
        return dataclasses.replace(self.batch_format, max_seq_length=row_length,
                                   max_segments=segments_per_row(True, self.args.max_segments_per_row, row_length))

    def _packed_global_batch(self, lengths) -> int:
        """Packed rows a global train batch takes: packed_batch_rows per device per micro-batch, or
        by default the rows that hold the global batch's examples on average, to the nearest
        multiple of what splits evenly over the devices, micro-batches and data shards (at least one)."""
        args = self.args
        parts = jax.device_count() * args.gradient_accumulation_steps
        if args.packed_batch_rows is not None:
            rows = args.packed_batch_rows * parts
            data.check_data_shards(args.data_shards, self.task, rows, self.eval_batch, unit="packed rows")
            return rows
        unit = math.lcm(parts, args.data_shards)
        num_rows = data.packed_num_rows(lengths, self.train_format, num_shards=args.data_shards)
        return unit * data.rows_for_examples(self.global_batch, num_rows, len(lengths), per=unit)

    def _own_splits(self, names, *, cache: bool = True) -> dict[str, data.OwnSplit]:
        early = {"train": self._tokenized_train} if self._tokenized_train is not None else {}
        rest = tuple(name for name in names if name not in early)
        cache_dir = self.output_dir / run_dir.TOKENIZED_DIR if self.output_dir is not None and cache else None
        own = data.tokenize_own_shards(self.task, self.tokenizer, self.max_seq_length,
                                       data_shards=self.args.data_shards, splits=rest, cache_dir=cache_dir
                                       ) if rest else {}
        return {**{name: early[name] for name in names if name in early}, **own}

    def _scorer_for(self, splits: dict[str, data.OwnSplit], unlabelled: frozenset[str], *, source=None) -> SplitScorer:
        """The scorer of `splits` (the task's); `source`: another data source than the run's (data
        given to evaluate, `TaskData.source`)."""
        return self.kind.scorer(self.graphdef, splits, self._packed_eval_format(splits), self.layout,
                                data_task=self.task, config=self.config, args=self.args, source=source,
                                eval_batch=self.eval_batch, data_shards=self.args.data_shards, unlabelled=unlabelled,
                                compute_metrics=self.compute_metrics, tokenizer=self.tokenizer)

    def _packed_eval_format(self, splits: dict[str, data.OwnSplit]) -> data.BatchFormat:
        """Packed evaluation rows as long as the longest example of `splits` needs (one shape for
        them all), as train rows are (`data.fitted_row_length`): on the default job 80 tokens
        instead of 128, ~10% less time per split scored. Unpacked formats as they are."""
        if not self.batch_format.packed:
            return self.batch_format
        lengths = np.concatenate([split.lengths for split in splits.values()])
        return self._packed_rows_of(data.fitted_row_length(lengths, self.max_seq_length))

    def _splits_to_score(self) -> list[str]:
        given = self.data.given
        needed = ["train"] if self.args.do_train else []
        if self.args.do_eval and "validation" in given:
            needed.append("validation")
        if "test" in given:
            needed.append("test")
        return needed

    # -- train ----------------------------------------------------------------------------------

    def train(self) -> TrainOutput:
        """Trains (when args.do_train), scores the validation and test splits, predicts the test
        split (args.do_predict). Re-run on the same output_dir it resumes, or returns the finished
        run's results with "already_complete": True."""
        if self.output_dir is None:
            return self._run()
        run_dir.check_output_dir(self.output_dir)
        self._folder_existed = self.output_dir.is_dir()
        lock = RunLock(self.output_dir) if jax.process_index() == 0 else None
        try:
            if lock is not None:
                lock.acquire()
        except OSError as error:
            if error.errno not in run_dir.UNWRITABLE:
                raise
            return self._unwritable(error)
        try:
            try:
                with self._no_space_said():
                    previous = self._claim_folder() if self.args.do_train else None
                    if previous is not None:
                        return TrainOutput(None, previous, None)
                    output = self._run()
            finally:
                if lock is not None:
                    lock.release()
        except BaseException:
            # Refused before it trained (a bad resume step, data the tokenizer refuses, ctrl-C): the
            # folder is left as it was, so the next run does not take this one's cache for a stranger's.
            if self._folder_before is not None and not self._training_started:
                run_dir.undo_unstarted(self.output_dir, self._folder_before)
            raise
        # Process 0 writes the export and the records alone: the others wait here, not at jax's
        # shutdown barrier, whose deadline a slow disk (or a busy CPU) can pass.
        sync("flaxheads: run written")
        return output

    @contextlib.contextmanager
    def _no_space_said(self):
        """A full device anywhere in the run (checkpoints, export, records, tokenized cache) as one
        sentence naming output_dir and how to go on (`run_dir.no_space_message`)."""
        try:
            yield
            return
        except Exception as error:
            if not atomic.is_no_space(error):
                raise
            message = run_dir.no_space_message(self.output_dir, error)
        raise atomic.NoSpace(message) from None

    def _run(self) -> TrainOutput:
        args = self.args
        splits = self._own_splits(self._splits_to_score())
        self._scorer = scorer = self._scorer_for(splits, self.data.unlabelled)
        if args.do_train:
            loop = self._loop(splits, scorer)
            self._training_started = True
            results = loop.run()
            self.params = loop.params()
            changed = bool(args.load_best_model_at_end and self._take_the_best(loop, results))
            if args.calibrate:
                self._calibrate(results)
            if args.tune_thresholds:
                self._tune_thresholds(results)
            if changed or args.calibrate or args.tune_thresholds:
                self._rescore(results)  # once, after every change to the weights and thresholds
            if self.output_dir is not None:
                if jax.process_index() == 0:  # recorded before they are written: a kill mid-export leaves them ours
                    run_dir.write_run(self.output_dir, self.identity, complete=False, model_name=self.model_name,
                                      exported={*self._recorded_exports, *run_dir.export_names(self.tokenizer)})
                before = run_dir.export_snapshot(self.output_dir)
                scorer.export(self.params, self.output_dir, replaces=self._recorded_exports)
                self._exported = run_dir.exported_since(self.output_dir, before)
                if args.lora and args.lora_export == "both":
                    self._export_adapter(self.output_dir / run_dir.ADAPTER_DIR)
        else:
            results = self._scores_without_training(splits)
        reports = {split: self._scorer.reports[split] for split in ("validation", "test")
                   if split in results and self._scorer.reports.get(split)}
        if reports:
            results["reports"] = reports
        predictions = self._predictions() if args.do_predict and "test" in splits else None
        if args.do_train and self.output_dir is not None and jax.process_index() == 0:
            results["report"] = self._draw_report(results) if args.report_figures else []
            run_dir.write_results(self.output_dir, results)
            run_dir.write_run(self.output_dir, self.identity, complete=True, model_name=self.model_name,
                              exported=self._exported)
        return TrainOutput(self.model, results, predictions)

    def _take_the_best(self, loop: TrainLoop, results: dict[str, Any]) -> bool:
        """With load_best_model_at_end: the weights of the best evaluation become the run's (kept in
        memory since then, or, in a resumed run, read back from best_model/), and the results say
        which step they are. True when the weights changed (the caller re-scores)."""
        best = results["best"]["step"]
        if best is None:
            print0("note: load_best_model_at_end: no evaluation gave a finite metric; the last weights are kept",
                   file=sys.stderr)
            results["exported_step"] = results["steps"]
            return False
        changed = best != results["steps"]
        if changed:
            if loop.best_params is not None:
                self.params = loop.best_params
            else:
                folder = self.output_dir / run_dir.BEST_MODEL_DIR
                export = results["best"].get("export")
                if export is None or run_files.best_export(folder) != export:
                    print0(f"warning: load_best_model_at_end: {folder} does not hold the weights of step {best}, this "
                           "run's best evaluation (it holds those of another evaluation, after the checkpoint this run "
                           "resumed from, or no record says which); the last weights, of step "
                           f"{results['steps']}, are the run's model", file=sys.stderr)
                    results["exported_step"] = results["steps"]
                    return False
                self.params = self._read_best_model(folder)
        results["exported_step"] = best
        print0(f"load_best_model_at_end: the weights of step {best} ({results['best']['metric']} "
               f"{results['best']['value']}) are the run's model")
        return changed

    def _rescore(self, results: dict[str, Any]) -> None:
        """The validation and test scores in `results` again, of the weights (and thresholds) the
        run now gives: the results describe the model it exports."""
        for split in ("validation", "test"):
            if split in results:
                results[split] = self._scorer.scores(split, self.params)

    def _calibrate(self, results: dict[str, Any]) -> None:
        """Fits a temperature on the validation split and folds it into the weights the run exports
        (the caller re-scores): the losses change, the predicted classes do not."""
        out = self._scorer.predict("validation", self.params)
        report = calibration.calibrate(out.predictions, out.label_ids, self.task.problem_type)
        self.params = calibration.folded(self.graphdef, self.params, report["temperature"])
        results["calibration"] = report
        if report["at_bound"]:  # not a result: said as a warning, and so recorded in results.json
            print0(f"warning: calibrate: {report['warning']}", file=sys.stderr)
            return
        before, after = report["before"], report["after"]
        print0(f"calibrate: temperature {report['temperature']:.4g} on the validation split; ECE "
               f"{before['ece']:.4f} -> {after['ece']:.4f}, log-loss {before['log_loss']:.4f} -> {after['log_loss']:.4f}")

    def _draw_report(self, results: dict[str, Any]) -> list[str]:
        """The run report's figures (`run_report`), as paths in output_dir. A figure that cannot be
        drawn costs the run nothing: a warning says so, and `flaxheads report` draws them again."""
        try:
            drawn = run_report.draw(self.output_dir, results)
        except Exception as error:  # noqa: BLE001 (the run itself is done; the pictures are extra)
            print0(f"warning: the run report was not drawn ({type(error).__name__}: {error}); the results are in "
                   f"{run_dir.RESULTS_FILE}; `flaxheads report {self.output_dir}` draws it again", file=sys.stderr)
            return []
        return [str(path.relative_to(self.output_dir)) for path in drawn]

    def _tune_thresholds(self, results: dict[str, Any]) -> None:
        """Chooses each label's decision threshold for F1 on the validation split and records them in
        the model's config, so the export carries them (the caller re-scores with them)."""
        out = self._scorer.predict("validation", self.params)
        tuned = thresholds_lib.tune(out.predictions, out.label_ids, self.config.label_names)
        self.config = dataclasses.replace(self.config, thresholds=tuned["thresholds"])
        self.graphdef, self.params = _split_with_config(nnx.merge(self.graphdef, self.params), self.config)
        self._scorer.graphdef, self._scorer.thresholds = self.graphdef, self.config.thresholds
        results["thresholds"] = {"tuned_on": "validation", "per_label": tuned["per_label"],
                                 **({"warnings": tuned["warnings"]} if tuned["warnings"] else {})}
        untuned = [name for name, row in tuned["per_label"].items() if not row["tuned"]]
        print0("tune_thresholds: " + ", ".join(f"{name} {row['threshold']:.3f}"
                                               for name, row in tuned["per_label"].items())
               + (f" ({', '.join(untuned)}: no positive or no negative validation example, 0.5 kept)" if untuned
                  else ""))
        for warning in tuned["warnings"]:
            print0(f"warning: tune_thresholds: {warning}", file=sys.stderr)

    def _read_best_model(self, folder: Path):
        """The best evaluation's weights from best_model/ (a resumed run no longer has them in
        memory), as the parameters of this run's model."""
        best = self.model_class.from_pretrained(folder, dtype=self.args.dtype, param_dtype=self.args.param_dtype)
        _, state = nnx.split(best)
        if jax.tree.structure(state) != jax.tree.structure(self.params):
            raise ValueError(f"{folder} does not hold this run's model (its parameters differ): cannot load the best "
                             "model; run again with overwrite_output_dir=True")
        return state

    def _loop(self, splits: dict[str, data.OwnSplit], scorer: SplitScorer) -> TrainLoop:
        args, total = self.args, self.total_steps
        schedule = learning_rate_schedule(args.learning_rate, total, args.num_warmup_steps(total),
                                          args.lr_scheduler_type)
        numbers = dict(weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm, adam_b1=args.adam_beta1,
                       adam_b2=args.adam_beta2, adam_eps=args.adam_epsilon)
        tx = make_optimizer(schedule, **numbers)
        trainable, frozen = split_trainable(self.params, freeze_backbone=args.freeze_backbone)
        print0(lora.trainable_summary(trainable, frozen))
        objective = self.kind.objective(self.task, self.loss_options)
        # What shapes the step's program; its numbers (rate, lengths, betas, ...) are arguments.
        program_key = (self.graphdef, repr(objective), schedule.kind, bool(args.max_grad_norm), args.weight_decay != 0,
                       repr(args.mesh), jax.tree.structure(trainable), jax.tree.structure(frozen))
        runner = PARALLEL[args.parallel](self.layout, self.graphdef, tx, schedule, objective, trainable, frozen,
                                         optimizer_values=optimizer_values(**numbers), programs=self.programs,
                                         program_key=program_key)
        state = runner.init(trainable)
        self.params = None  # the weights live in the train state now: one copy in memory, not two
        checkpoints = None
        if self.output_dir is not None:
            checkpoints = RunCheckpoints(self.output_dir / run_dir.CHECKPOINTS_DIR, max_to_keep=args.save_total_limit,
                                         identity=self.identity["trained"], differences=run_dir.trained_differences)
        eval_splits = tuple(name for name in ("validation", "test")
                            if name in splits and name not in self.data.unlabelled)
        return TrainLoop(args, runner, state, splits["train"], self.train_format, scorer, total_steps=total,
                         global_batch=self.global_batch, eval_splits=eval_splits, checkpoints=checkpoints,
                         output_dir=self.output_dir, loading_info=self.loading_info,
                         best_metric=self.best_metric, on_evaluate=self.on_evaluate)

    def _scores_without_training(self, splits: dict[str, data.OwnSplit]) -> dict[str, Any]:
        start = time.perf_counter()
        results: dict[str, Any] = {"steps": 0}
        for name in ("validation", "test"):
            if name in splits and name not in self.data.unlabelled:
                results[name] = self._scorer.scores(name, self.params)
        results["seconds"] = time.perf_counter() - start
        return results

    def _export_adapter(self, directory: Path) -> None:
        """The peft adapter folder of the trained LoRA model (process 0 writes; all gather)."""
        params = host_copy(self.params, self.layout)
        if jax.process_index() == 0:
            peft.save_adapter(nnx.merge(self.graphdef, params), directory,
                              base_model_name_or_path=self.args.model_name_or_path)

    # -- the output folder ----------------------------------------------------------------------

    @property
    def identity(self) -> dict[str, Any]:
        if self.model_identity is None:
            self.model_identity = run_dir.params_fingerprint(self.params)
        return run_dir.run_identity(self.args, self.task, self.config.backbone.to_hf_config(), self.config.head,
                                    self.global_batch, total_steps=self.total_steps, model=self.model_identity,
                                    tokenizer=self._tokenizer_identity, data_identity=self.data_identity,
                                    objective=self.loss_options, problem=self.kind.problem_name(self.task),
                                    task_identity=self.kind.identity(self.task, self.args),
                                    best_metric=self.best_metric)

    @functools.cached_property
    def _tokenizer_identity(self) -> str:
        return data.tokenization.tokenizer_fingerprint(self.tokenizer)

    def _claim_folder(self) -> dict[str, Any] | None:
        """Decides what the output folder allows; returns the results of this run when the folder
        already holds it finished (a re-run of the same command), else None, having recorded the
        run in run.json before anything else is written there (so its tokenized cache and
        checkpoints are never strangers to the next run), and what to put back if it is refused
        before it trains (`_folder_before`)."""
        args, output_dir = self.args, self.output_dir
        explicit_resume = args.resume_from_checkpoint is not None
        record = run_dir.check_folder(output_dir, self.identity, explicit_resume=explicit_resume,
                                      overwrite=args.overwrite_output_dir, exports=run_dir.export_names(self.tokenizer))
        # Every process reads the folder before any writes to it (process 0's tokenized cache
        # would otherwise look like a stranger's files to a process still checking).
        sync("flaxheads: output_dir checked")
        if args.overwrite_output_dir:
            if jax.process_index() == 0:
                removed = run_dir.clear_run(output_dir)
                if removed:
                    print(f"overwrite_output_dir: removed the earlier run's {', '.join(removed)} from {output_dir}",
                          file=sys.stderr)
            sync("flaxheads: output_dir cleared")
            record = None
        else:
            finished = self._finished_results(record)
            if finished is not None:
                return finished
        # The files an earlier export of this run wrote: kept recorded, and removed by the export
        # that replaces them where it does not write them again.
        self._recorded_exports = list((record or {}).get("exported") or ())
        if jax.process_index() == 0:
            self._folder_before = run_dir.folder_before(output_dir, existed=self._folder_existed)
            run_dir.write_run(output_dir, self.identity, complete=False, model_name=self.model_name,
                              exported=self._recorded_exports)
        return None

    def _finished_results(self, record: dict[str, Any] | None) -> dict[str, Any] | None:
        """The results of this run when `record` (the folder's run.json, checked against this run's
        identity) is it finished and the command asks no explicit resume; else None."""
        # Without resume_from_checkpoint, check_folder has compared the whole identity already.
        if not (record and record.get("complete") and self.args.resume_from_checkpoint is None):
            return None
        results = run_dir.read_results(self.output_dir, record)
        if results is None:
            return None
        print0(f"the run in {self.output_dir} is already complete ({results.get('steps')} steps); its results "
               f"are in {run_dir.RESULTS_FILE}. Pass overwrite_output_dir=True to train again")
        return {**results, "already_complete": True}

    def _unwritable(self, error: OSError) -> TrainOutput:
        """An output folder the run cannot write (read-only media): the results of this run when the
        folder holds it finished, for nothing needs writing then; else OSError saying so."""
        record = (run_dir.check_folder(self.output_dir, self.identity, explicit_resume=False)
                  if self.args.do_train and not self.args.overwrite_output_dir else None)
        finished = self._finished_results(record)
        if finished is None:
            raise run_dir.UnwritableFolder(error.errno, (
                f"output_dir {self.output_dir} cannot be written ({error.strerror}), and it does not hold this run "
                "finished: a run writes its checkpoints, results and model there. Make it writable, or choose "
                "another output_dir"))
        return TrainOutput(None, finished, None)

    # -- hyperparameter search ------------------------------------------------------------------

    def hyperparameter_search(self, hp_space=None, compute_objective=None, n_trials: int = 20,
                              direction: str | list[str] = "minimize", backend: str | None = None, hp_name=None,
                              **kwargs):
        """Searches hyperparameters on Optuna, as transformers' `Trainer.hyperparameter_search`;
        returns the best trial's `BestRun(run_id, objective, hyperparameters, run_summary)` (a list
        of them with several `direction`s). See `flaxheads.training.search` for what it writes.

        `hp_space(trial) -> {TrainConfig field: value}` (default: transformers' learning rate,
        epochs, seed and batch size); each trial trains a Trainer made like this one with those
        values, from `model_init(trial)` (or `model_init()`) when the Trainer was given one, else
        from this Trainer's current weights. `compute_objective(metrics) -> float` reads the
        validation split's metrics as transformers names them (`eval_loss`, `eval_accuracy`, ...;
        default: the loss when there is nothing else, else the sum of the metrics), at every
        evaluation (reported to the trial, which the pruner may stop there) and at the end of the
        run (the trial's value). `n_trials`: the trials the study should have finished (complete
        or pruned): a search resumed from its storage runs only those still missing. `hp_name(trial)`
        names a trial's run folder (default `run-<number>`). `kwargs` go to `optuna.create_study`
        (`storage`, `study_name`, `sampler`: default TPE seeded with args.seed, `pruner`: default the
        median pruner, ...) except `timeout` and `catch`, which go to `study.optimize`."""
        from flaxheads.training import search

        if backend not in (None, "optuna"):
            raise ValueError(f"backend={backend!r}: flaxheads searches with Optuna only; pass backend='optuna'")
        if self.args.lora is not None and self.model_init is None:
            raise ValueError("hyperparameter_search with lora= starts each trial from the model before its adapters: "
                             "give the Trainer model_init= (a function returning that model)")
        if self._training_started:
            print0("note: hyperparameter_search: each trial starts from this Trainer's trained weights; give the "
                   "Trainer model_init= to start each from the model it loads", file=sys.stderr)
        return search.run_search(self, hp_space, compute_objective, n_trials, direction, hp_name, **kwargs)

    def for_trial(self, args: TrainConfig, trial, initial_params) -> Trainer:
        """A Trainer like this one (data, tokenizer, task, compute_metrics) that trains with `args`:
        a search's trial. Its model comes from `model_init` (given `trial` when it takes an
        argument), else it is this Trainer's model with `initial_params`."""
        if self.model_init is not None:
            model = call_model_init(self.model_init, trial)
        else:
            model = nnx.merge(self.graphdef, initial_params)
        run = type(self).__new__(type(self))
        Trainer.__init__(run, model, args, task=self.task, tokenizer=self.tokenizer,
                         compute_metrics=self.compute_metrics, kind=self.kind, model_init=self.model_init)
        run.model_name, run.data_identity = self.model_name, self.data_identity
        if self.model_init is None:
            run.model_identity = self.model_identity
        return run

    # -- evaluate and predict -------------------------------------------------------------------

    @property
    def model(self) -> PretrainedModel:
        """The model with the current weights (the trained ones after `train()`)."""
        return nnx.merge(self.graphdef, self.params)

    def evaluate(self, dataset=None) -> dict[str, float]:
        """Metrics (and loss, and compute_metrics' entries) of the current weights on `dataset`
        (any form the constructor takes, or as the task reads data held in Python: token
        classification's sentences with their tags, `data.words_beside`), or on the eval_dataset."""
        if dataset is None:
            return self._scorer_of("validation", None).scores("validation", self.params)
        return self._scorer_of("validation", dataset).scores("validation", self.params)

    def predict(self, dataset=None) -> PredictionOutput:
        """(predictions: logits, label_ids, metrics) of the current weights on `dataset` (texts
        alone are fine: then label_ids is None and metrics {}; token classification: sentences of
        words, with or without tags), or on the test_dataset."""
        return self._scorer_of("test", dataset).predict("test", self.params)

    def predicted_labels(self, logits) -> list:
        """Per row of `logits`: what the model predicts, as the task says (a text classifier: label
        name, list of label names (multi-label) or score; token classification: per sentence, its
        words' tags; multiple choice: the chosen index)."""
        return self.kind.predicted(logits, self.config, self.task)

    def _predictions(self) -> list:
        predicted = self.predicted_labels(self._scorer.predict("test", self.params).predictions)
        if self.output_dir is not None and jax.process_index() == 0:
            self._write_predictions(predicted)
        return predicted

    def _write_predictions(self, predicted: list) -> None:
        written = self.kind.write_predictions(self.output_dir, predicted, self.task, self._scorer,
                                              overwrite=self.args.overwrite_output_dir)
        print(f"predictions for the test split written to {', '.join(map(str, written))}")

    def _scorer_of(self, split: str, dataset) -> SplitScorer:
        if dataset is None:
            if split not in self.data.given:
                what = "eval_dataset" if split == "validation" else "test_dataset"
                raise ValueError(f"no {split} data: pass a dataset, or give the Trainer an {what}")
            if self._scorer is not None and split in self._scorer.splits:
                return self._scorer
            return self._scorer_for(self._own_splits([split]), self.data.unlabelled)
        extra = self.kind.data_for(self.data, split, dataset, self._column_args(self.config))
        if extra.task.id2label != self.task.id2label:
            raise ValueError(f"the data's classes {list(extra.task.id2label.values())} are not the trainer's "
                             f"{list(self.task.id2label.values())}")
        tokenized = data.tokenize_own_shards(extra.task, self.tokenizer, self.max_seq_length,
                                             data_shards=self.args.data_shards, splits=(split,))
        return self._scorer_for(tokenized, extra.unlabelled, source=extra.task.source)


def call_model_init(model_init, trial) -> PretrainedModel:
    """`model_init(trial)`, or `model_init()` for a function of no argument (transformers' rule)."""
    arguments = len(inspect.signature(model_init).parameters)
    if arguments == 0:
        model = model_init()
    elif arguments == 1:
        model = model_init(trial)
    else:
        raise ValueError("model_init should take no argument or one (the search's trial)")
    if model is None:
        raise ValueError("model_init returned None: it should return the model to train")
    return model


def check_best_model_settings(args: TrainConfig, metric_names, task: data.TaskData, given,
                              unlabelled=frozenset()) -> None:
    """ValueError naming the setting when metric_for_best_model is not one of `metric_names` (the
    metrics the task reports) or "loss", or load_best_model_at_end / early stopping / calibrate /
    tune_thresholds have no (labelled) validation data to follow, or calibrate / tune_thresholds
    are asked of a run that trains nothing. Whether calibrate / tune_thresholds fit the data is
    the task's to say (`Task.check_settings`)."""
    reported = (*metric_names, "loss")
    if args.metric_for_best_model is not None and args.metric_for_best_model not in reported:
        raise ValueError(f"metric_for_best_model={args.metric_for_best_model!r} is not a metric of "
                         f"{task.problem_type or task.task}: choose one of {', '.join(reported)}")
    following = [name for name, on in (("load_best_model_at_end=True", args.load_best_model_at_end),
                                       ("early_stopping_patience", args.early_stopping_patience is not None)) if on]
    if following and args.do_train and "validation" not in given:
        raise ValueError(f"{' and '.join(following)} follow the validation split, and the data has none: give a "
                         "validation_file (an eval_dataset), or leave them out")
    if args.tune_thresholds:
        if not args.do_train:
            raise ValueError("tune_thresholds=True tunes the thresholds of the model a run trains and exports, and "
                             "do_train=False trains none: leave tune_thresholds out, or train")
        if "validation" not in given or "validation" in unlabelled:
            raise ValueError("tune_thresholds=True tunes on the labelled validation split, and the data has none: "
                             "give a validation_file (an eval_dataset) with labels, or leave tune_thresholds out")
        thresholds_lib.check_tunable(data.task.column_array(task.splits["validation"], data.task.LABEL),
                                     [task.id2label[i] for i in range(task.num_labels)])
    if args.calibrate:
        if not args.do_train:
            raise ValueError("calibrate=True calibrates the model a run trains and exports, and do_train=False "
                             "trains none: leave calibrate out, or train")
        if "validation" not in given or "validation" in unlabelled:
            raise ValueError("calibrate=True fits its temperature on the labelled validation split, and the data "
                             "has none: give a validation_file (an eval_dataset) with labels, or leave calibrate out")
        calibration.check_fittable(data.task.column_array(task.splits["validation"], data.task.LABEL),
                                   task.problem_type, task.id2label)


def check_param_dtype(model: PretrainedModel, param_dtype: str) -> None:
    """ValueError unless every floating parameter of `model` (LoRA adapters aside: float32 by
    design) is stored in `param_dtype`, the dtype the run identity records and resumes with."""
    params = nnx.to_flat_state(nnx.state(model, nnx.Param))
    found = sorted({str(v[...].dtype) for _, v in params
                    if not isinstance(v, nnx.LoRAParam) and jnp.issubdtype(v[...].dtype, jnp.floating)})
    if found and found != [param_dtype]:
        raise ValueError(
            f"the model's parameters are {' and '.join(found)} but TrainConfig(param_dtype={param_dtype!r}) "
            f"(--param_dtype): load the model with from_pretrained(..., dtype={param_dtype!r}, "
            f"param_dtype={param_dtype!r}), or pass the param_dtype its parameters have"
        )


def _prepared(model: PretrainedModel, args: TrainConfig) -> PretrainedModel:
    """`model` as `args` train it: with LoRA adapters (`args.lora`), per-layer rematerialisation
    (`args.gradient_checkpointing`) and scanned layers (`args.scan_layers`); a new module tree over
    the same weights when any is asked for, so the caller's model is left as it is."""
    if args.lora is not None:
        model = model.with_lora(args.lora, seed=args.seed)
    if args.gradient_checkpointing or args.scan_layers:
        if args.lora is None:
            graphdef, state = nnx.split(model)
            model = nnx.merge(graphdef, state)
        stacking.set_gradient_checkpointing(model.backbone, args.gradient_checkpointing)
        stacking.set_scan_layers(model.backbone, args.scan_layers)
    return model


def _split_with_config(model: PretrainedModel, config):
    """(graphdef, params) of `model` with `config` in place of its own; `model` is left as it is."""
    graphdef, params = nnx.split(model)
    if config == model.config:
        return graphdef, params
    copy = nnx.merge(graphdef, params)
    copy.config = config
    return nnx.split(copy)
