"""Evaluation and prediction with a saved text classifier: the library functions behind
`flaxheads evaluate | predict` on sequence classifiers, and `TextScorer`, the inference path they
and `flaxheads.pipeline("text-classification")` take."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from flax import nnx

from flaxheads import data, problem
from flaxheads.conversion import architecture_table
from flaxheads.data.packing import segments_per_row
from flaxheads.data.tokenization import tokenize_texts
from flaxheads.inference import (
    UNBOUNDED, UNBOUNDED_START, check_batch_size, compiled_forward, open_trained, padding, refuse_non_finite,
    open_model_folder, readable_texts, rows_per_batch,
)
from flaxheads.model import FLAXHEADS_CONFIG_KEY
from flaxheads.names import PAD_TO_MULTIPLE_OF
from flaxheads.tasks.classification.model import ClassifierConfig, SequenceClassifier
from flaxheads.tokenizer import check_room_for_text, check_tokenizer_fits, fitting_max_length, for_model
from flaxheads.training import metrics as metrics_lib
from flaxheads.training.scoring import Evaluator
from flaxheads.training.sharding import Layout


def evaluate(model_dir: str | Path, task: data.TaskData, split: str, *, max_seq_length: int = 128,
             batch_size: int = 64, tokenizer_name: str | None = None, packing: bool = False,
             max_segments_per_row: int | None = None) -> dict[str, float]:
    """Metrics of a saved (trained) classifier on one split of `task`; with `packing`, scored in
    packed rows of `max_seq_length` tokens (`batch_size` rows per batch), with the same metrics.

    Classes are matched by name: the data's labels are renumbered to the model's class ids
    (ValueError when the data has other classes). Raises NonFiniteScores, reporting no metric,
    when the model gives NaN or infinite scores."""
    if split not in task.splits:
        raise ValueError(f"the data has no {split!r} split; it has {sorted(task.splits)}")
    model, tokenizer, max_seq_length = open_trained(model_dir, SequenceClassifier, max_seq_length=max_seq_length,
                                                    tokenizer_name=tokenizer_name, num_labels=task.num_labels,
                                                    problem_type=task.problem_type)
    rows = task.splits[split]
    if model.config.labels is not None:  # the model knows its classes by name: match the data's to them
        rows = data.labels.relabelled(task, split, model.config.label_names)
    tokenized = data.tokenize_split(rows, tokenizer, max_seq_length)
    batch_format = data.BatchFormat.for_task(
        task, tokenizer, max_seq_length, model_pad_token_id=model.config.backbone.pad_token_id,
        max_segments=segments_per_row(packing, max_segments_per_row, max_seq_length))
    model.eval()
    graphdef, params = nnx.split(model)
    evaluator = Evaluator(graphdef, task.problem_type, Layout.create(), batch_format, batch_size,
                          thresholds=model.config.thresholds)
    return evaluator(params, tokenized)


def predict(model_dir: str | Path, texts: Iterable[str], *, text_pairs: Iterable[str] | None = None,
            max_seq_length: int = 128, batch_size: int = 64, tokenizer_name: str | None = None, packing: bool = False,
            max_segments_per_row: int | None = None) -> list[dict[str, Any]]:
    """For each text, in order: {"text", "label", "probabilities": {label name: p}} (single-label),
    {"text", "labels", "probabilities"} (multi-label: the labels whose probability is above their
    decision threshold, config.json's tuned ones or else 0.5; `decision_thresholds` says which)
    or {"text", "score"} (regression, and the reward of a pairwise reward model); with
    `text_pairs` (one per text) "text_pair" too.

    Raises UntrainedModel for a classifier that was never trained; ValueError for lone texts
    given to a model trained on pairs, a count of text_pairs other than of texts, and a text that
    is blank or no str (`readable_texts`); FloatingPointError naming the texts whose scores are
    not finite. `packing`: score the texts in packed rows (`TextScorer`).
    """
    texts = readable_texts(texts)
    text_pairs = None if text_pairs is None else readable_texts(text_pairs, "text_pairs")
    model, tokenizer, _ = open_trained(model_dir, SequenceClassifier, tokenizer_name=tokenizer_name)
    scorer = TextScorer(model, tokenizer, max_seq_length=max_seq_length, batch_size=batch_size,
                        source=f"the model in {model_dir}", packing=packing,
                        max_segments_per_row=max_segments_per_row)
    texts = list(texts)
    pairs = None if text_pairs is None else list(text_pairs)
    if pairs is not None and len(pairs) != len(texts):
        raise ValueError(f"{len(texts)} text(s) but {len(pairs)} text_pairs: give one text_pair per text")
    rows = _describe_predictions(texts, scorer.logits(texts, pairs), problem_type_of(model.config),
                                 model.config.label_names, model.config.thresholds)
    if pairs is not None:
        rows = [{"text": row.pop("text"), "text_pair": pair, **row} for row, pair in zip(rows, pairs)]
    return rows


def reads_text_pairs(model_dir: str | os.PathLike) -> bool:
    """Whether the classifier saved in `model_dir` was trained on text pairs (config.json's
    "flaxheads" section says so)."""
    config = open_model_folder(model_dir).config
    return bool((config.get(FLAXHEADS_CONFIG_KEY) or {}).get("text_pair"))


def decision_thresholds(model_dir: str | os.PathLike) -> tuple[dict[str, float], bool] | None:
    """For a multi-label classifier saved in `model_dir`: ({label name: threshold}, whether they
    were tuned) as predict applies them (config.json's "flaxheads" section, else 0.5 each); None
    for other problem types."""
    hf = open_model_folder(model_dir).config
    config = ClassifierConfig.from_hf_config(hf, default_head=architecture_table(hf.get("model_type")).canonical_head)
    thresholds = config.decision_thresholds()
    return None if thresholds is None else (thresholds, config.thresholds is not None)


def problem_type_of(config) -> str:
    """The problem type a classifier's scores mean; one unset at training is read as transformers
    trains it: one label is a regression, several are single-label."""
    return problem.resolved_problem_type(config.problem_type, config.num_labels)


class TextScorer:
    """Logits of texts from an in-memory classifier: the one inference path of `predict` and
    `flaxheads.pipeline`.

    Texts are tokenised and batched by `flaxheads.data` (`tokenize_texts`, `eval_batches`) as
    evaluation batches them: padded on the model family's side with the pad id `pad_token_ids`
    decides, to a length bucket, in batches of `batch_size` rows (fewer for fewer texts, a power
    of two), so the forward pass compiles once per (bucket, batch size). With `packing`, batches
    are packed rows of max_seq_length tokens, each holding up to `max_segments_per_row` texts
    (default `default_max_segments`): one shape; the logits still come in the texts' order.
    `max_seq_length=None`: texts are not cut at all (for a model whose positions set no limit);
    the buckets then grow with the longest text. `pad_to_multiple_of` rounds the buckets (0:
    powers of two, the fewest shapes: what `flaxheads serve` compiles ahead). `row_counts`: the
    rows a batch may have, ascending up to `batch_size` (None: powers of two; `flaxheads serve`
    packs into rows of every count up to 16, so that a few short texts pad no row). The model runs in
    eval mode (dropout off) from a copy (the caller's model keeps its mode), over every local
    device (`inference.data_parallel`: rows split between them).

    A model trained on text pairs (`ClassifierConfig.text_pair`) needs a second text for every
    text: a lone text is refused, not answered.
    """

    def __init__(self, model: SequenceClassifier, tokenizer, *, max_seq_length: int | None = 128, batch_size: int = 64,
                 source: str = "the model", packing: bool = False, max_segments_per_row: int | None = None,
                 pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF, row_counts: Sequence[int] | None = None):
        check_batch_size(batch_size)
        if row_counts is not None and (list(row_counts) != sorted(set(row_counts)) or row_counts[0] < 1
                                       or row_counts[-1] != batch_size):
            raise ValueError(f"row_counts={tuple(row_counts)} must rise from 1 or more to batch_size={batch_size} "
                             f"(e.g. row_counts=(1, 2, 3, 4, 8, {batch_size})), or be None for powers of two")
        self.row_counts = None if row_counts is None else tuple(row_counts)
        backbone = model.config.backbone
        check_tokenizer_fits(tokenizer, backbone, source)
        if max_seq_length is None and packing:
            raise ValueError("packing needs a max_seq_length: packed rows are max_seq_length tokens long")
        self.tokenizer, self.batch_size, self.source = for_model(tokenizer, backbone), batch_size, source
        self.num_labels = model.config.num_labels
        self.text_pair = model.config.text_pair
        self.max_seq_length = None if max_seq_length is None else fitting_max_length(backbone, max_seq_length)
        if self.max_seq_length is not None:
            check_room_for_text(self.tokenizer, self.max_seq_length, pairs=self.text_pair)
        self._format = padding(tokenizer, backbone)
        segments = segments_per_row(packing, max_segments_per_row, self.max_seq_length) if packing else 0
        self.batch_format = data.BatchFormat(max_seq_length=self.max_seq_length or UNBOUNDED_START,
                                             max_segments=segments, pad_to_multiple_of=pad_to_multiple_of,
                                             **self._format)

        def forward(model, input_ids, attention_mask, token_type_ids, segment_ids):
            if segment_ids is None:
                return model(input_ids, attention_mask, token_type_ids)
            # (B, S, C) -> (B * S, C): one row per slot, as `example_index` is flattened.
            logits = model(input_ids, attention_mask, token_type_ids, segment_ids=segment_ids, num_segments=segments)
            return logits.reshape(-1, logits.shape[-1])

        self._params, self._forward = compiled_forward(model, forward)

    def logits(self, texts: Sequence[str], text_pairs: Sequence[str] | None = None) -> np.ndarray:
        """(len(texts), num_labels) float32 logits, in order.

        Raises ValueError for lone texts given to a model trained on pairs, texts (or text_pairs)
        that are blank or no str (`readable_texts`), or texts that give no tokens;
        FloatingPointError naming the (0-based) texts whose scores are not finite.
        """
        texts = readable_texts(texts)
        text_pairs = None if text_pairs is None else readable_texts(text_pairs, "text_pairs")
        if not texts:
            return np.zeros((0, self.num_labels), np.float32)
        if self.text_pair and text_pairs is None:
            raise ValueError(
                f"{self.source} was trained on text pairs: give each text its second text (text_pair), as in "
                "training; a lone text would be scored as something the model never saw"
            )
        batch_format = self.batch_format
        if self.max_seq_length is None:  # no limit: tokenise whole, and pad to a bucket the longest text fits
            tokenized = tokenize_texts(texts, self.tokenizer, min(UNBOUNDED, self.tokenizer.model_max_length), text_pairs)
            longest = int(max(data.example_lengths(tokenized)))
            batch_format = dataclasses.replace(batch_format, max_seq_length=max(
                UNBOUNDED_START, 1 << (longest - 1).bit_length()))
        else:
            tokenized = tokenize_texts(texts, self.tokenizer, self.max_seq_length, text_pairs)
        # As many rows as one batch needs (packed: rows of several texts), up to batch_size. The
        # lengths are read once (each read copies the dataset's format: ~1 ms of a served pass).
        lengths = data.example_lengths(tokenized)
        needed = data.batches_per_epoch(lengths, batch_format, global_batch_size=1)
        rows = rows_per_batch(needed, self.batch_size) if self.row_counts is None else next(
            count for count in self.row_counts if count >= min(needed, self.batch_size))
        out, order = [], []
        for batch in data.eval_batches(tokenized, batch_format, global_batch_size=rows, lengths=lengths):
            logits = self._forward(self._params, batch["input_ids"], batch["attention_mask"],
                                   batch.get("token_type_ids"), batch.get("segment_ids"))
            real = batch["example_mask"].reshape(-1) > 0
            out.append(np.asarray(logits)[real])
            if batch_format.packed:
                order.append(batch["example_index"].reshape(-1)[real])
        logits = np.concatenate(out)
        if order:  # packed rows hold the texts by length: put them back in the texts' order
            in_order = np.empty_like(logits)
            in_order[np.concatenate(order)] = logits
            logits = in_order
        refuse_non_finite(np.isfinite(logits).all(axis=-1), self.source, "text(s)")
        return logits


def _describe_predictions(texts, logits, problem_type, label_names, thresholds=None) -> list[dict[str, Any]]:
    probs = metrics_lib.probabilities(problem_type, logits)
    preds = metrics_lib.predictions(problem_type, logits, thresholds)
    rows = []
    for text, p, pred in zip(texts, probs, preds):
        if problem_type in (problem.REGRESSION, problem.PAIRWISE_REWARD):  # a reward model scores single texts
            rows.append({"text": text, "score": float(pred)})
        elif problem_type == problem.MULTI_LABEL:
            rows.append({"text": text, "labels": [n for n, on in zip(label_names, pred) if on],
                         "probabilities": dict(zip(label_names, map(float, p)))})
        else:
            rows.append({"text": text, "label": label_names[int(pred)],
                         "probabilities": dict(zip(label_names, map(float, p)))})
    return rows


__all__ = ["TextScorer", "decision_thresholds", "evaluate", "predict", "problem_type_of", "reads_text_pairs"]
