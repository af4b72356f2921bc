"""Evaluation and prediction with a saved classifier: the library functions behind `flaxheads
evaluate | predict`, the one inference path they and `flaxheads.pipeline` take (`TextScorer`),
and the pieces training shares with them (the tokenizer a model reads its text with, the
longest input it can take, the split evaluator).

All refuse to answer from weights that were never trained, from a folder without the model's
tokenizer, and with non-finite scores: a confident-looking wrong answer is worse than an error.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

import jax
import numpy as np
from flax import nnx

from flaxheads import data, problem
from flaxheads.backbones import BackboneConfig, backbone_config_from_hf, backbone_spec
from flaxheads.conversion import checkpoint_io
from flaxheads.conversion.hub import resolve_checkpoint
from flaxheads.data.tokenization import pad_token_ids, tokenize_texts
from flaxheads.model import SequenceClassifier, from_pretrained
from flaxheads.training import metrics as metrics_lib
from flaxheads.training.parallel import host_values
from flaxheads.training.sharding import Layout
from flaxheads.data.packing import segments_per_row
from flaxheads.training.step import make_eval_step, per_example

VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                    "tokenizer.model")
"""Files that carry a tokenizer's vocabulary; a folder with none of them has no tokenizer."""


class UntrainedModel(ValueError):
    """A classifier whose head (or part of it) would be newly initialised: its answers are noise."""


def _note(message: str) -> None:
    if jax.process_index() == 0:
        print(f"note: {message}", file=sys.stderr)


def load_tokenizer(model_dir: str | os.PathLike, tokenizer_name: str | os.PathLike | None = None):
    """(tokenizer, pad_token_id to load the model with) for the model in `model_dir`.

    The tokenizer comes from `tokenizer_name` when given, else from `model_dir`; either folder
    must hold tokenizer files: transformers would otherwise build an empty fallback tokenizer that
    reads every word as unknown. It pads on the side the model's family expects, and with the
    model's pad id (`model_pad_token_id`): a tokenizer without a pad token (GPT-2) gets the
    model's, so the tokenizer saved with a trained model pads in transformers as flaxheads does.

    Raises ValueError naming `tokenizer_name=` for a folder without tokenizer files, and for a
    tokenizer whose ids do not fit the model's vocabulary (it is not the model's tokenizer).
    """
    model_dir = resolve_checkpoint(model_dir)  # a folder, or a hub id in the huggingface_hub cache
    backbone = backbone_config_from_hf(checkpoint_io.read_config(model_dir))
    if tokenizer_name:
        tokenizer = read_tokenizer(tokenizer_name)
    elif not _has_vocabulary(model_dir):
        raise ValueError(
            f"{model_dir} holds no tokenizer (none of {', '.join(VOCABULARY_FILES)}), and text read with "
            "another tokenizer gives meaningless predictions. Pass the folder of the tokenizer the model was "
            "trained with as tokenizer_name=, or save it next to the model (tokenizer.save_pretrained)"
        )
    else:
        tokenizer = read_tokenizer(model_dir)
    check_tokenizer_fits(tokenizer, backbone, f"the model in {model_dir}")
    tokenizer.padding_side = backbone_spec(backbone.model_type).padding_side
    pad_token_id = pad_token_ids(tokenizer, backbone.pad_token_id).model
    pad_token = None if pad_token_id is None else tokenizer.convert_ids_to_tokens(pad_token_id)
    if tokenizer.pad_token_id is None and pad_token is not None:
        tokenizer.pad_token = pad_token
    if backbone.pad_token_id is None and pad_token_id is not None:
        _note(f"{model_dir} sets no pad_token_id; using the tokenizer's {tokenizer.pad_token!r} "
              f"(id {pad_token_id}), saved with the model")
    return tokenizer, pad_token_id


def read_tokenizer(folder: str | os.PathLike):
    """The transformers tokenizer saved in `folder`; ValueError if it holds none."""
    import transformers

    folder = resolve_checkpoint(folder)
    if not _has_vocabulary(folder):
        raise ValueError(f"{folder} holds no tokenizer (none of {', '.join(VOCABULARY_FILES)}); pass the folder "
                         "of the tokenizer the model was trained with")
    try:
        return transformers.AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot load a tokenizer from {folder}: {err}") from None


def _has_vocabulary(folder: Path) -> bool:
    return any((folder / name).is_file() for name in VOCABULARY_FILES)


def check_tokenizer_fits(tokenizer, backbone: BackboneConfig, model: str) -> None:
    """ValueError if `tokenizer` has ids past the vocabulary of `model` (described in words):
    it is not that model's tokenizer, and its ids would index past the embeddings."""
    vocab_size = getattr(backbone, "vocab_size", None)
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise ValueError(
            f"the tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has {len(tokenizer)} tokens and {model} "
            f"embeds only {vocab_size}: it is not this model's tokenizer. Pass the model's own tokenizer as "
            "tokenizer_name="
        )


def model_pad_token_id(model_dir: str | os.PathLike, tokenizer) -> int | None:
    """The pad_token_id to load the model in `model_dir` with, to read `tokenizer`'s batches."""
    backbone = backbone_config_from_hf(checkpoint_io.read_config(resolve_checkpoint(model_dir)))
    return pad_token_ids(tokenizer, backbone.pad_token_id).model


def fitting_max_length(backbone: BackboneConfig, requested: int) -> int:
    """`requested` tokens, or the model's position limit (with a printed note) when it is shorter:
    positions past the learned embeddings have no meaning (transformers fails on them; an
    unchecked gather would silently clamp them)."""
    limit = backbone.max_sequence_length
    if limit is None or requested <= limit:
        return requested
    _note(f"max_seq_length {requested} is longer than the {limit} positions the model's embeddings cover; "
          f"texts are truncated to {limit} tokens")
    return limit


def load_trained(model_dir: str | os.PathLike, *, pad_token_id: int | None = None, **options) -> SequenceClassifier:
    """A saved classifier whose every parameter comes from the checkpoint.

    Raises UntrainedModel naming the parameters that would be newly initialised (a bare
    pretrained encoder such as `BertModel` has no classifier): fine-tune it first.
    """
    model, info = from_pretrained(model_dir, pad_token_id=pad_token_id, output_loading_info=True, **options)
    new = list(info.newly_initialized) + [name for name, *_ in info.mismatched]
    if new:
        raise UntrainedModel(
            f"{model_dir} has no trained {model.config.head!r} classifier: {len(new)} parameter(s) would start "
            f"from random values ({', '.join(new[:4])}{', ...' if len(new) > 4 else ''}), so its answers would "
            f"be noise. Fine-tune it first (flaxheads train --model_name_or_path {model_dir}) and use the "
            "trained output folder"
        )
    return model


class Evaluator:
    """Metrics over a whole split; every process feeds its rows and gets the global result.
    A packed `batch_format` scores packed rows; the metrics count only the examples in them."""

    def __init__(self, graphdef, problem_type: str, layout: Layout, batch_format, eval_batch_size: int,
                 num_shards: int = 1):
        self.problem_type = problem_type
        self.num_shards = num_shards
        self.layout = layout
        self.batch_format = batch_format
        self.batch_size = eval_batch_size
        eval_step = make_eval_step(graphdef, problem_type)

        def step(params, batch):
            # Labels and masks (and packed rows' example indices) ride along, one entry per
            # example as the logits have them, so that, replicated, every process sees all rows.
            return {**eval_step(params, batch), **per_example(batch)}

        self.step = jax.jit(step, out_shardings=layout.replicated)

    def __call__(self, params, rows, lengths: np.ndarray | None = None, *,
                 max_batches: int | None = None) -> dict[str, float]:
        """`rows`: the split, or this process's rows of it with `lengths` of the whole split;
        `max_batches`: only the first batches (every process takes the same ones)."""
        acc = metrics_lib.MetricAccumulator(self.problem_type)
        batches = data.eval_batches(
            rows, self.batch_format, global_batch_size=self.batch_size,
            process_index=jax.process_index(), process_count=jax.process_count(),
            num_shards=self.num_shards, lengths=lengths,
        )
        for batch in itertools.islice(batches, max_batches):
            out = host_values(self.step(params, self.layout.put_batch(batch)))
            acc.add(out["logits"], out["labels"], out["example_mask"], loss=out["loss"])
        return acc.compute()


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
