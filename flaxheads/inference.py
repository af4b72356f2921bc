"""Evaluation and prediction with a saved classifier: the library functions behind `flaxheads
evaluate | predict`, and the pieces training shares with them (the tokenizer a model reads its
text with, the longest input it can take, the split evaluator).

Both refuse to answer from weights that were never trained, from a folder without the model's
tokenizer, and with non-finite scores: a confident-looking wrong answer is worse than an error.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import Any, Iterable

import jax
import numpy as np
from flax import nnx

from flaxheads import data, problem
from flaxheads.backbones import BackboneConfig, backbone_config_from_hf, backbone_spec
from flaxheads.conversion import checkpoint_io
from flaxheads.model import SequenceClassifier
from flaxheads.model import from_pretrained
from flaxheads.training import metrics as metrics_lib
from flaxheads.training.parallel import host_values
from flaxheads.training.sharding import Layout
from flaxheads.training.step import make_eval_step

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

    The tokenizer comes from `tokenizer_name` when given, else from `model_dir`, which must then
    hold tokenizer files: transformers would otherwise build an empty fallback tokenizer that
    reads every word as unknown. It pads on the side the model's family expects. The pad id is
    the tokenizer's when config.json has none (GPT-2), so the "last_token" head can tell padding
    from text (a text that really ends in eos is then classified from the token before it, as
    transformers' `GPT2ForSequenceClassification` does); else None (keep config.json's).

    Raises ValueError naming `tokenizer_name=` for a folder without tokenizer files, and for a
    tokenizer whose ids do not fit the model's vocabulary (it is not the model's tokenizer).
    """
    import transformers

    model_dir = Path(model_dir)
    hf_config = checkpoint_io.read_config(model_dir)
    source = Path(tokenizer_name) if tokenizer_name else model_dir
    if not tokenizer_name and not any((model_dir / name).is_file() for name in VOCABULARY_FILES):
        raise ValueError(
            f"{model_dir} holds no tokenizer (none of {', '.join(VOCABULARY_FILES)}), and text read with "
            "another tokenizer gives meaningless predictions. Pass the folder of the tokenizer the model was "
            "trained with as tokenizer_name=, or save it next to the model (tokenizer.save_pretrained)"
        )
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot load a tokenizer from {source}: {err}") from None
    backbone = backbone_config_from_hf(hf_config)
    vocab_size = getattr(backbone, "vocab_size", None)
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise ValueError(
            f"the tokenizer from {source} has {len(tokenizer)} tokens and the model in {model_dir} embeds only "
            f"{vocab_size}: it is not this model's tokenizer. Pass the model's own tokenizer as tokenizer_name="
        )
    tokenizer.padding_side = backbone_spec(hf_config.get("model_type")).padding_side
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        # GPT-2 ships without a pad token: pad with end-of-text, transformers' documented practice.
        tokenizer.pad_token = tokenizer.eos_token
    if backbone.pad_token_id is not None or tokenizer.pad_token_id is None:
        return tokenizer, None
    _note(f"{model_dir} sets no pad_token_id; using the tokenizer's {tokenizer.pad_token!r} "
          f"(id {tokenizer.pad_token_id}), saved with the model")
    return tokenizer, tokenizer.pad_token_id


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
    """Metrics over a whole split; every process feeds its rows and gets the global result."""

    def __init__(self, graphdef, problem_type: str, layout: Layout, batch_format, eval_batch_size: int,
                 num_shards: int = 1):
        self.problem_type = problem_type
        self.num_shards = num_shards
        self.layout = layout
        self.batch_format = batch_format
        self.batch_size = eval_batch_size
        eval_step = make_eval_step(graphdef, problem_type)

        def step(params, batch):
            # Labels and masks ride along so that, replicated, every process sees all rows.
            return {**eval_step(params, batch), "labels": batch["labels"], "example_mask": batch["example_mask"]}

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
             batch_size: int = 64, tokenizer_name: str | None = None) -> dict[str, float]:
    """Metrics of a saved (trained) classifier on one split of `task`."""
    if split not in task.splits:
        raise ValueError(f"the data has no {split!r} split; it has {sorted(task.splits)}")
    tokenizer, pad_token_id = load_tokenizer(model_dir, tokenizer_name)
    model = load_trained(model_dir, num_labels=task.num_labels, problem_type=task.problem_type,
                         pad_token_id=pad_token_id)
    max_seq_length = fitting_max_length(model.config.backbone, max_seq_length)
    tokenized = data.tokenize_split(task.splits[split], tokenizer, max_seq_length)
    batch_format = data.BatchFormat.for_task(task, tokenizer, max_seq_length)
    graphdef, params = nnx.split(model)
    evaluator = Evaluator(graphdef, task.problem_type, Layout.create(), batch_format, batch_size)
    return evaluator(params, tokenized)


def predict(model_dir: str | Path, texts: Iterable[str], *, max_seq_length: int = 128, batch_size: int = 64,
            tokenizer_name: str | None = None) -> list[dict[str, Any]]:
    """For each text, in order: {"text", "label", "probabilities": {label name: p}} (single-label),
    {"text", "labels", "probabilities"} (multi-label) or {"text", "score"} (regression).

    Raises UntrainedModel for a classifier that was never trained, FloatingPointError naming the
    texts whose scores are not finite.
    """
    tokenizer, pad_token_id = load_tokenizer(model_dir, tokenizer_name)
    model = load_trained(model_dir, pad_token_id=pad_token_id)
    cfg = model.config
    max_seq_length = fitting_max_length(cfg.backbone, max_seq_length)
    problem_type = cfg.problem_type or (problem.REGRESSION if cfg.num_labels == 1 else problem.SINGLE_LABEL)
    texts = list(texts)
    step = jax.jit(lambda ids, mask, types: model(ids, mask, types))
    buckets = data.bucket_lengths(max_seq_length)
    out = []
    for start in range(0, len(texts), batch_size):
        chunk = texts[start : start + batch_size]
        enc = tokenizer(chunk, truncation=True, max_length=max_seq_length, padding="longest", return_tensors="np")
        bucket = data.bucket_for(enc["input_ids"].shape[1], buckets)
        arrays = {k: _pad_to(enc[k], bucket, tokenizer, k) for k in ("input_ids", "attention_mask")}
        types = _pad_to(enc["token_type_ids"], bucket, tokenizer, "token_type_ids") if "token_type_ids" in enc else None
        logits = np.asarray(step(arrays["input_ids"], arrays["attention_mask"], types))
        bad = np.flatnonzero(~np.isfinite(logits).all(axis=-1))
        if bad.size:
            rows = [start + int(i) for i in bad[:5]]
            raise FloatingPointError(
                f"the model gave non-finite scores for text(s) {rows} (0-based); no prediction is printed for "
                f"weights that produce NaN or infinity. Check the model in {model_dir} (was its training stopped "
                "by a non-finite loss?)"
            )
        out += _describe_predictions(chunk, logits, problem_type, cfg.label_names)
    return out


def _pad_to(array: np.ndarray, length: int, tokenizer, name: str) -> np.ndarray:
    """Pads (batch, T) to (batch, length) on the tokenizer's side, so shapes come from few buckets."""
    value = {"input_ids": tokenizer.pad_token_id or 0, "attention_mask": 0}.get(name, 0)
    width = [(0, 0), (0, length - array.shape[1]) if tokenizer.padding_side == "right" else (length - array.shape[1], 0)]
    return np.pad(array, width, constant_values=value)


def _describe_predictions(texts, logits, problem_type, label_names) -> list[dict[str, Any]]:
    probs = metrics_lib.probabilities(problem_type, logits)
    preds = metrics_lib.predictions(problem_type, logits)
    rows = []
    for text, p, pred in zip(texts, probs, preds):
        if problem_type == problem.REGRESSION:
            rows.append({"text": text, "score": float(pred)})
        elif problem_type == problem.MULTI_LABEL:
            rows.append({"text": text, "labels": [n for n, on in zip(label_names, pred) if on],
                         "probabilities": dict(zip(label_names, map(float, p)))})
        else:
            rows.append({"text": text, "label": label_names[int(pred)],
                         "probabilities": dict(zip(label_names, map(float, p)))})
    return rows
