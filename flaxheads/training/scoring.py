"""Scores, predictions and exports of the weights a run holds, over its tokenised splits:
what `TrainLoop` asks of its owner (`Scorer`), and what `Trainer.evaluate / predict` return.
`Evaluator` computes a split's metrics for any weights; `flaxheads evaluate` uses it too.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
from flax import nnx

from flaxheads import compile_cache, data, problem
from flaxheads.model import save_pretrained
from flaxheads.training import class_metrics
from flaxheads.training import metrics as metrics_lib
from flaxheads.training.objective import Objective, objective_of
from flaxheads.training.parallel import host_copy, host_values
from flaxheads.training.sharding import Layout
from flaxheads.training.step import make_eval_step, per_example


class EvalPrediction(NamedTuple):
    """What `compute_metrics` is given, as in transformers: the logits and the label ids of a
    split, in dataset order."""

    predictions: np.ndarray
    """(N, num_labels) float32 logits; (N, 2) rewards (chosen, rejected) of preference pairs; token
    classification: a list, per sentence, of its words' (num_words, num_labels) logits."""
    label_ids: np.ndarray | None
    """(N,) class ids, (N,) scores, (N, num_labels) multi-hot rows or (N,) pair margins; None for
    unlabelled data."""


class PredictionOutput(NamedTuple):
    predictions: np.ndarray
    """(N, num_labels) float32 logits ((N, 2) rewards of preference pairs), in dataset order."""
    label_ids: np.ndarray | None
    """The split's encoded labels; None for data given without labels."""
    metrics: dict[str, float]
    """The split's metrics (and loss), with compute_metrics' entries; {} without labels."""


MetricsFunction = Callable[[EvalPrediction], dict[str, Any]]


class Evaluator:
    """Metrics over a whole split; every process feeds its rows and gets the global result.
    A packed `batch_format` scores packed rows; the metrics count only the examples in them."""

    def __init__(self, graphdef, objective: Objective | str, layout: Layout, batch_format, eval_batch_size: int,
                 num_shards: int = 1, thresholds=None):
        self.objective = objective = objective_of(objective)
        """What the model's logits, loss and metrics are (a problem type's name: its `ProblemObjective`)."""
        self.problem_type = getattr(objective, "problem_type", None)
        """A text classifier's problem type (its per-class report reads it); None for another task's."""
        self.thresholds = thresholds
        """Multi-label decision thresholds per label (None: 0.5)."""
        self.num_shards = num_shards
        self.layout = layout
        self.batch_format = batch_format
        self.batch_size = eval_batch_size
        eval_step = make_eval_step(graphdef, objective)

        def step(params, batch):
            # Labels and masks (and packed rows' example indices) ride along, one entry per
            # example as the logits have them, so that, replicated, every process sees all rows.
            return {**eval_step(params, batch), **per_example(batch)}

        self.step = compile_cache.forward_jit(step, graphdef=graphdef, out_shardings=layout.replicated)

    def batch_size_for(self, lengths: np.ndarray) -> int:
        """The global batch a pass over a split with `lengths` takes (`data.fitted_batch_size`:
        `batch_size`, fewer for a split that fills less than one batch)."""
        unit = math.lcm(self.num_shards, jax.device_count())
        return data.fitted_batch_size(lengths, self.batch_format, global_batch_size=self.batch_size, unit=unit,
                                      num_shards=self.num_shards)

    def __call__(self, params, rows, lengths: np.ndarray | None = None, *,
                 max_batches: int | None = None) -> dict[str, float]:
        """`rows`: the split, or this process's rows of it with `lengths` of the whole split;
        `max_batches`: only the first batches (every process takes the same ones)."""
        acc = metrics_lib.MetricAccumulator(self.problem_type, self.thresholds, metrics=self.objective.metrics)
        lengths = data.example_lengths(rows) if lengths is None else lengths
        batches = data.eval_batches(
            rows, self.batch_format, global_batch_size=self.batch_size_for(lengths),
            process_index=jax.process_index(), process_count=jax.process_count(),
            num_shards=self.num_shards, lengths=lengths,
        )
        for batch in itertools.islice(batches, max_batches):
            out = host_values(self.step(params, self.layout.put_batch(batch)))
            acc.add(out["logits"], out["labels"], out["example_mask"], loss=out["loss"])
        return acc.compute()


class SplitScorer:
    """Scores of the tokenised `splits` for given weights; every process passes its own rows and
    gets the global result."""

    def __init__(self, graphdef: nnx.GraphDef, splits: dict[str, data.OwnSplit], batch_format: data.BatchFormat,
                 layout: Layout, *, eval_batch: int, data_shards: int = 1, unlabelled: frozenset[str] = frozenset(),
                 compute_metrics: MetricsFunction | None = None, tokenizer=None,
                 class_names: tuple[str, ...] | None = None, thresholds=None, objective: Objective | None = None):
        self.graphdef, self.splits, self.layout = graphdef, splits, layout
        self.unlabelled, self.compute_metrics, self.tokenizer = unlabelled, compute_metrics, tokenizer
        self.class_names = class_names
        self.evaluator = Evaluator(graphdef, objective or batch_format.problem_type, layout, batch_format, eval_batch,
                                   data_shards, thresholds)
        self.problem_type = self.evaluator.problem_type
        self.reports: dict[str, dict[str, Any]] = {}
        """The per-class report (`class_metrics.report`) of the latest scoring of each split."""

    @property
    def thresholds(self):
        """Multi-label decision thresholds per label (None: 0.5), for every score and report."""
        return self.evaluator.thresholds

    @thresholds.setter
    def thresholds(self, value) -> None:
        self.evaluator.thresholds = value

    def scores(self, split: str, params, *, max_batches: int | None = None) -> dict[str, float]:
        """Metrics and loss of `split` (the first `max_batches` batches: built-in metrics only).
        A whole split also gets its per-class report in `reports` (from the same logits)."""
        if max_batches is not None or (self.compute_metrics is None and self.class_names is None):
            own = self.splits[split]
            return self.evaluator(params, own.rows, own.lengths, max_batches=max_batches)
        prediction = self.predict(split, params)
        if self.class_names is not None:
            self.reports[split] = class_metrics.report(self.problem_type, prediction.predictions,
                                                       prediction.label_ids, self.class_names, self.thresholds)
        return prediction.metrics

    def predict(self, split: str, params) -> PredictionOutput:
        """Logits of every example of `split` in dataset order, its labels and metrics."""
        logits, labels, losses = self._outputs(split, params)
        if split in self.unlabelled:
            return PredictionOutput(logits, None, {})
        metrics = self.evaluator.objective.metrics(logits, labels, self.thresholds)
        metrics["loss"] = float(np.mean(losses))
        if not np.isfinite(metrics["loss"]):
            raise metrics_lib.NonFiniteScores(f"the {split} loss is {metrics['loss']} although every logit is finite "
                                              "(labels the loss cannot take?); no metric is reported")
        if self.compute_metrics is not None:
            metrics.update(self.compute_metrics(EvalPrediction(logits, labels)))
        return PredictionOutput(logits, labels, metrics)

    def _outputs(self, split: str, params) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows, lengths = self.splits[split].rows, self.splits[split].lengths
        evaluator = self.evaluator
        batch_size = evaluator.batch_size_for(lengths)
        batches = data.eval_batches(
            rows, evaluator.batch_format, global_batch_size=batch_size,
            process_index=jax.process_index(), process_count=jax.process_count(),
            num_shards=evaluator.num_shards, lengths=lengths,
        )
        packed = evaluator.batch_format.packed
        kept = {"logits": [], "labels": [], "loss": [], **({"example_index": []} if packed else {})}
        for batch in batches:
            out = host_values(evaluator.step(params, self.layout.put_batch(batch)))
            real = out["example_mask"] != 0
            for name, values in kept.items():
                values.append(np.asarray(out[name])[real])
        # Batches take the data shards side by side (packed: in rows by length): put the rows
        # back in dataset order.
        if packed:
            order = np.concatenate(kept.pop("example_index"))
        else:
            order = data.eval_example_order(len(lengths), evaluator.num_shards, batch_size)
        in_order = {}
        for name, values in kept.items():
            gathered = np.concatenate(values)
            in_order[name] = np.empty_like(gathered)
            in_order[name][order] = gathered
        return in_order["logits"], in_order["labels"], in_order["loss"]

    def export(self, params, directory: Path, *, replaces=()) -> None:
        """A Hugging Face directory (config with id2label, weights, tokenizer) from process 0,
        written as one staged export (`save_pretrained` with the tokenizer; `replaces`: the files
        an earlier export of the run wrote there, removed when this one does not write them).
        Sharded parameters are gathered first, a collective every process takes part in. Raises
        NonFiniteScores, and writes nothing, when a parameter holds NaN or infinity."""
        params = host_copy(params, self.layout)
        bad = [".".join(map(str, path)) for path, value in nnx.to_flat_state(params)
               if jax.numpy.issubdtype(value[...].dtype, jax.numpy.inexact) and not np.isfinite(value[...]).all()]
        if bad:
            raise metrics_lib.NonFiniteScores(f"parameters {bad[:3]} hold NaN or infinity: nothing is exported to "
                                              f"{directory}")
        if jax.process_index() != 0:
            return
        save_pretrained(nnx.merge(self.graphdef, params), directory, tokenizer=self.tokenizer, replaces=replaces)


def row_outputs(evaluator: Evaluator, layout: Layout, params, rows, lengths, *, max_batches: int | None = None,
                weight: str = "scored_tokens") -> tuple[list, float]:
    """(per row of a tokenised split, its logits (tokens, C) without padding (None past
    `max_batches`); the mean loss over what the loss scores, 0.0 without labels: the eval
    outputs' "loss" summed over the eval outputs' `weight`, its denominators (token
    classification's scored tokens). `rows`: this process's rows of the split, `lengths` those of
    the whole split; every process takes part and gets every row's logits (the eval step's
    outputs are replicated)."""
    batch_size = evaluator.batch_size_for(lengths)
    batches = data.eval_batches(rows, evaluator.batch_format, global_batch_size=batch_size,
                                process_index=jax.process_index(), process_count=jax.process_count(),
                                num_shards=evaluator.num_shards, lengths=lengths)
    order = iter(data.eval_example_order(len(lengths), evaluator.num_shards, batch_size))
    right = evaluator.batch_format.padding_side == "right"
    per_row: list = [None] * len(lengths)
    loss_sum = scored = 0.0
    for batch in itertools.islice(batches, max_batches):
        out = host_values(evaluator.step(params, layout.put_batch(batch)))
        real = np.asarray(out["example_mask"]) != 0
        for logits in np.asarray(out["logits"])[real]:
            index = next(order)
            length = int(lengths[index])
            per_row[index] = logits[:length] if right else logits[logits.shape[0] - length:]
        if "loss" in out:
            loss_sum += float(np.sum(np.asarray(out["loss"])[real]))
            scored += float(np.sum(np.asarray(out[weight])[real]))
    return per_row, loss_sum / max(scored, 1.0)


def describe_predictions(problem_type: str, logits: np.ndarray, label_names, thresholds=None) -> list:
    """Per example: its label name (single-label), the list of its label names (multi-label,
    decided by `thresholds`; None: 0.5), its score (regression), or a preference pair's reward
    margin `r_chosen - r_rejected`."""
    predicted = metrics_lib.predictions(problem_type, logits, thresholds)
    if problem_type in (data.REGRESSION, problem.PAIRWISE_REWARD):
        return [float(p) for p in np.reshape(predicted, -1)]
    if problem_type == data.MULTI_LABEL:
        return [[name for name, on in zip(label_names, row) if on] for row in predicted]
    return [label_names[int(p)] for p in predicted]


def format_predictions(predicted: list) -> str:
    """run_glue's predict_results.txt: a header, then "index<TAB>prediction" per example
    (multi-label: the names joined by commas; regression: the score to 3 decimals)."""
    lines = ["index\tprediction"]
    for index, value in enumerate(predicted):
        if isinstance(value, float):
            text = f"{value:.3f}"
        elif isinstance(value, list):
            text = ",".join(value)
        else:
            text = str(value)
        lines.append(f"{index}\t{text}")
    return "\n".join(lines) + "\n"


def format_choice_predictions(chosen: list[int], choices: list[list[str]]) -> str:
    """predict_results.txt of multiple choice: a header, then "index<TAB>prediction<TAB>choice" per
    example: the chosen index and the text read as that choice (tabs and line ends as spaces)."""
    lines = ["index\tprediction\tchoice"]
    for index, (choice, texts) in enumerate(zip(chosen, choices)):
        lines.append(f"{index}\t{choice}\t{' '.join(texts[choice].split())}")
    return "\n".join(lines) + "\n"
