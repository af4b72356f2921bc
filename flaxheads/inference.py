"""Evaluation and prediction with a saved classifier: the library functions behind `flaxheads
evaluate | predict`, and the one inference path they and `flaxheads.pipeline` take (`TextScorer`).

All refuse to answer from weights that were never trained, from a folder without the model's
tokenizer, and with non-finite scores: a confident-looking wrong answer is worse than an error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import jax
import numpy as np
from flax import nnx

from flaxheads import data, problem
from flaxheads.backbones import backbone_spec
from flaxheads.data.packing import segments_per_row
from flaxheads.data.tokenization import tokenize_texts
from flaxheads.model import SequenceClassifier, from_pretrained, require_trained
from flaxheads.tokenizer import check_tokenizer_fits, fitting_max_length, load_tokenizer, pad_token_ids
from flaxheads.training import metrics as metrics_lib
from flaxheads.training.scoring import Evaluator
from flaxheads.training.sharding import Layout


def load_trained(model_dir: str | os.PathLike, *, pad_token_id: int | None = None, **options) -> SequenceClassifier:
    """A saved classifier whose every parameter comes from the checkpoint.

    Raises UntrainedModel naming the parameters that would be newly initialised (a bare
    pretrained encoder such as `BertModel` has no classifier): fine-tune it first.
    """
    model, info = from_pretrained(model_dir, pad_token_id=pad_token_id, output_loading_info=True, **options)
    require_trained(info, model, model_dir, fix=f"Fine-tune it first (flaxheads train --model_name_or_path {model_dir}) "
                    "and use the trained output folder")
    return model


def evaluate(model_dir: str | Path, task: data.TaskData, split: str, *, max_seq_length: int = 128,
             batch_size: int = 64, tokenizer_name: str | None = None, packing: bool = False,
             max_segments_per_row: int | None = None) -> dict[str, float]:
    """Metrics of a saved (trained) classifier on one split of `task`; with `packing`, scored in
    packed rows of `max_seq_length` tokens (`batch_size` rows per batch), with the same metrics."""
    if split not in task.splits:
        raise ValueError(f"the data has no {split!r} split; it has {sorted(task.splits)}")
    tokenizer, pad_token_id = load_tokenizer(model_dir, tokenizer_name)
    model = load_trained(model_dir, num_labels=task.num_labels, problem_type=task.problem_type,
                         pad_token_id=pad_token_id)
    max_seq_length = fitting_max_length(model.config.backbone, max_seq_length)
    tokenized = data.tokenize_split(task.splits[split], tokenizer, max_seq_length)
    batch_format = data.BatchFormat.for_task(
        task, tokenizer, max_seq_length, model_pad_token_id=model.config.backbone.pad_token_id,
        max_segments=segments_per_row(packing, max_segments_per_row, max_seq_length))
    model.eval()
    graphdef, params = nnx.split(model)
    evaluator = Evaluator(graphdef, task.problem_type, Layout.create(), batch_format, batch_size)
    return evaluator(params, tokenized)


def predict(model_dir: str | Path, texts: Iterable[str], *, max_seq_length: int = 128, batch_size: int = 64,
            tokenizer_name: str | None = None, packing: bool = False,
            max_segments_per_row: int | None = None) -> list[dict[str, Any]]:
    """For each text, in order: {"text", "label", "probabilities": {label name: p}} (single-label),
    {"text", "labels", "probabilities"} (multi-label) or {"text", "score"} (regression, and the
    reward of a pairwise reward model).

    Raises UntrainedModel for a classifier that was never trained, FloatingPointError naming the
    texts whose scores are not finite. `packing`: score the texts in packed rows (`TextScorer`).
    """
    tokenizer, pad_token_id = load_tokenizer(model_dir, tokenizer_name)
    model = load_trained(model_dir, pad_token_id=pad_token_id)
    scorer = TextScorer(model, tokenizer, max_seq_length=max_seq_length, batch_size=batch_size,
                        source=f"the model in {model_dir}", packing=packing,
                        max_segments_per_row=max_segments_per_row)
    texts = list(texts)
    return _describe_predictions(texts, scorer.logits(texts), problem_type_of(model.config),
                                 model.config.label_names)


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
    The model runs in eval mode (dropout off) from a copy: the caller's model keeps its mode.
    """

    def __init__(self, model: SequenceClassifier, tokenizer, *, max_seq_length: int = 128, batch_size: int = 64,
                 source: str = "the model", packing: bool = False, max_segments_per_row: int | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        backbone = model.config.backbone
        check_tokenizer_fits(tokenizer, backbone, source)
        self.tokenizer, self.batch_size, self.source = tokenizer, batch_size, source
        self.num_labels = model.config.num_labels
        self.max_seq_length = fitting_max_length(backbone, max_seq_length)
        self.batch_format = data.BatchFormat(
            max_seq_length=self.max_seq_length,
            pad_token_id=pad_token_ids(tokenizer, backbone.pad_token_id).input_ids,
            pad_token_type_id=getattr(tokenizer, "pad_token_type_id", 0),
            padding_side=backbone_spec(backbone.model_type).padding_side,
            max_segments=segments_per_row(packing, max_segments_per_row, self.max_seq_length),
        )
        runnable = nnx.merge(*nnx.split(model))
        runnable.eval()
        graphdef, self._params = nnx.split(runnable)
        segments = self.batch_format.max_segments

        def forward(params, input_ids, attention_mask, token_type_ids, segment_ids):
            model = nnx.merge(graphdef, params)
            if segment_ids is None:
                return model(input_ids, attention_mask, token_type_ids)
            # (B, S, C) -> (B * S, C): one row per slot, as `example_index` is flattened.
            logits = model(input_ids, attention_mask, token_type_ids, segment_ids=segment_ids, num_segments=segments)
            return logits.reshape(-1, logits.shape[-1])

        self._forward = jax.jit(forward)

    def logits(self, texts: Sequence[str], text_pairs: Sequence[str] | None = None) -> np.ndarray:
        """(len(texts), num_labels) float32 logits, in order.

        Raises FloatingPointError naming the (0-based) texts whose scores are not finite.
        """
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.num_labels), np.float32)
        tokenized = tokenize_texts(texts, self.tokenizer, self.max_seq_length, text_pairs)
        # As many rows as one batch needs (packed: rows of several texts), up to batch_size.
        needed = data.batches_per_epoch(data.example_lengths(tokenized), self.batch_format, global_batch_size=1)
        rows = min(self.batch_size, 1 << (needed - 1).bit_length())
        out, order = [], []
        for batch in data.eval_batches(tokenized, self.batch_format, global_batch_size=rows):
            logits = self._forward(self._params, batch["input_ids"], batch["attention_mask"],
                                   batch.get("token_type_ids"), batch.get("segment_ids"))
            real = batch["example_mask"].reshape(-1) > 0
            out.append(np.asarray(logits)[real])
            if self.batch_format.packed:
                order.append(batch["example_index"].reshape(-1)[real])
        logits = np.concatenate(out)
        if order:  # packed rows hold the texts by length: put them back in the texts' order
            in_order = np.empty_like(logits)
            in_order[np.concatenate(order)] = logits
            logits = in_order
        self._check_finite(logits)
        return logits

    def _check_finite(self, logits: np.ndarray) -> None:
        bad = np.flatnonzero(~np.isfinite(logits).all(axis=-1))
        if bad.size:
            raise FloatingPointError(
                f"{self.source} gave non-finite scores for text(s) {bad[:5].tolist()} (0-based); no prediction "
                f"is given from weights that produce NaN or infinity. Check {self.source} (was its training "
                "stopped by a non-finite loss?)"
            )


def _describe_predictions(texts, logits, problem_type, label_names) -> list[dict[str, Any]]:
    probs = metrics_lib.probabilities(problem_type, logits)
    preds = metrics_lib.predictions(problem_type, logits)
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
