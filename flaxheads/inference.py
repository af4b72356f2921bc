"""Evaluation and prediction with a saved classifier: the library functions behind `flaxheads
evaluate | predict`, and the inference paths they and `flaxheads.pipeline` take (`TextScorer` for
sequence classifiers, `TokenScorer` for token classifiers; `pipeline_model` finds the model and
tokenizer a pipeline reads with).

All refuse to answer from weights that were never trained, from a folder without the model's
tokenizer, and with non-finite scores: a confident-looking wrong answer is worse than an error.
"""

from __future__ import annotations

import dataclasses
import math
import os
import unicodedata
from pathlib import Path
from typing import Any, Iterable, Sequence

import datasets
import numpy as np
from flax import nnx

from flaxheads import compile_cache, data, problem
from flaxheads.backbones import backbone_spec
from flaxheads.data.packing import segments_per_row
from flaxheads.data.tokenization import LENGTH, tokenize_texts
from flaxheads.data.word_task import default_stride
from flaxheads.conversion import architecture_table, checkpoint_io
from flaxheads.conversion.hub import resolve_checkpoint
from flaxheads.conversion.table import SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION
from flaxheads.model import FLAXHEADS_CONFIG_KEY, ClassifierConfig, PretrainedModel, SequenceClassifier, require_trained
from flaxheads.token_classifier import TokenClassifier, saved_tags
from flaxheads.tokenizer import (
    check_room_for_text, check_tokenizer_fits, fitting_max_length, for_model, load_tokenizer, model_pad_token_id,
    pad_token_ids, read_tokenizer,
)
from flaxheads.training import metrics as metrics_lib
from flaxheads.training import run_files
from flaxheads.training import entity_metrics, token_scoring
from flaxheads.training.scoring import Evaluator
from flaxheads.training.sharding import Layout


def require_model_folder(model_dir: str | os.PathLike) -> None:
    """ValueError, with the way to the model, when `model_dir` is a training run that has not
    exported yet or one of its checkpoints (neither holds config.json)."""
    reason = run_files.not_a_model(model_dir) if Path(model_dir).is_dir() else None
    if reason:
        raise ValueError(reason)


def load_trained(model_dir: str | os.PathLike, *, pad_token_id: int | None = None,
                 model_class: type[PretrainedModel] = SequenceClassifier, **options):
    """A saved `model_class` model (a `SequenceClassifier` by default) whose every parameter
    comes from the checkpoint.

    Raises UntrainedModel naming the parameters that would be newly initialised (a bare
    pretrained encoder such as `BertModel` has no classifier): fine-tune it first.
    """
    model, info = model_class.from_pretrained(model_dir, pad_token_id=pad_token_id, output_loading_info=True,
                                              **options)
    if model_class is SequenceClassifier:
        fix = f"Fine-tune it first (flaxheads train --model_name_or_path {model_dir}) and use the trained output folder"
    else:
        fix = f"Fine-tune it for {model_class.config_class.task} first and use the trained model's folder"
    require_trained(info, model, model_dir, fix=fix)
    return model


PIPELINE_TASKS: dict[str, str] = {SEQUENCE_CLASSIFICATION: "text-classification",
                                  TOKEN_CLASSIFICATION: "token-classification"}
"""The `flaxheads.pipeline` task that reads each task's models (transformers' pipeline names)."""


def pipeline_model(model, tokenizer, model_class: type[PretrainedModel]) -> tuple[Any, Any, str]:
    """(model, tokenizer, the model as errors name it) for a pipeline over `model_class` models.

    `model` is a `model_class` in memory, which needs `tokenizer` (a transformers tokenizer or
    its folder), or the folder of a trained one, read with its own tokenizer unless `tokenizer`
    is given (`load_tokenizer`: refused when the folder has none or it is not the model's), and
    loaded by `load_trained` (UntrainedModel when its head was never trained).

    Raises ValueError for no model, an in-memory model without a tokenizer, and a model or a
    checkpoint of another task (naming the pipeline task that reads it).
    """
    task = PIPELINE_TASKS[model_class.config_class.task]
    if model is None:
        raise ValueError(f"pipeline({task!r}) needs model=: a {model_class.__name__} or the folder of a trained one")
    if isinstance(model, PretrainedModel):
        if not isinstance(model, model_class):
            raise ValueError(_other_task(f"model= is a {type(model).__name__}", model.config.task, task))
        if tokenizer is None:
            raise ValueError(
                f"pipeline(model=<{model_class.__name__}>) needs tokenizer=: the tokenizer the model was trained "
                "with (a transformers tokenizer or its folder); a model in memory carries none"
            )
        tokenizer = read_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
        return model, tokenizer, "the model"
    require_model_folder(model)
    theirs = checkpoint_task(model)
    if theirs not in (None, model_class.config_class.task):
        raise ValueError(_other_task(f"{model} holds a {theirs} model", theirs, task))
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        tokenizer, pad_token_id = load_tokenizer(model, tokenizer)
    else:
        pad_token_id = model_pad_token_id(model, tokenizer)
    return load_trained(Path(model), pad_token_id=pad_token_id, model_class=model_class), tokenizer, \
        f"the model in {model}"


def _other_task(what: str, theirs: str, asked: str) -> str:
    reader = PIPELINE_TASKS.get(theirs)
    fix = (f"read it with flaxheads.pipeline({reader!r}, model=...)" if reader
           else "flaxheads.pipeline has no task for it")
    return f"{what}, which pipeline({asked!r}) does not read: {fix}"


def checkpoint_task(model_dir: str | os.PathLike) -> str | None:
    """The task of the transformers class config.json's `architectures` name
    (`SEQUENCE_CLASSIFICATION`, `TOKEN_CLASSIFICATION`, ...); None for a bare or pretraining
    checkpoint, whose head any task would start anew."""
    config = checkpoint_io.read_config(resolve_checkpoint(model_dir))
    table = architecture_table(config.get("model_type"))
    return next((task for architecture in config.get("architectures") or ()
                 if (task := table.task_of(architecture)) is not None), None)


def evaluate(model_dir: str | Path, task: data.TaskData, split: str, *, max_seq_length: int = 128,
             batch_size: int = 64, tokenizer_name: str | None = None, packing: bool = False,
             max_segments_per_row: int | None = None, eval_mode: str = entity_metrics.DEFAULT) -> dict[str, float]:
    """Metrics of a saved (trained) classifier on one split of `task`; with `packing`, scored in
    packed rows of `max_seq_length` tokens (`batch_size` rows per batch), with the same metrics.

    Classes are matched by name: the data's labels are renumbered to the model's class ids
    (ValueError when the data has other classes). Raises NonFiniteScores, reporting no metric,
    when the model gives NaN or infinite scores.

    Token classification data (`task.words`) is scored by a saved token classifier at the word
    level (`evaluate_words`), with entity metrics in `eval_mode`."""
    if split not in task.splits:
        raise ValueError(f"the data has no {split!r} split; it has {sorted(task.splits)}")
    if task.words is not None:
        if packing:
            raise ValueError("packing=True (--packing) does not apply to token classification: each sentence (or "
                             "window of one) is a row of its own. Evaluate without packing")
        return evaluate_words(model_dir, task, split, max_seq_length=max_seq_length, batch_size=batch_size,
                              tokenizer_name=tokenizer_name, eval_mode=eval_mode)
    require_model_folder(model_dir)
    tokenizer, pad_token_id = load_tokenizer(model_dir, tokenizer_name)
    model = load_trained(model_dir, num_labels=task.num_labels, problem_type=task.problem_type,
                         pad_token_id=pad_token_id)
    max_seq_length = fitting_max_length(model.config.backbone, max_seq_length)
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
    require_model_folder(model_dir)
    tokenizer, pad_token_id = load_tokenizer(model_dir, tokenizer_name)
    model = load_trained(model_dir, pad_token_id=pad_token_id)
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


def evaluate_words(model_dir: str | Path, task: data.TaskData, split: str, *, max_seq_length: int = 128,
                   batch_size: int = 64, tokenizer_name: str | None = None, eval_mode: str = entity_metrics.DEFAULT
                   ) -> dict[str, Any]:
    """A saved (trained) token classifier's scores on a split of token-classification data
    (`data.token_task_data`): {"f1", "precision", "recall", "accuracy", "macro_*", "loss",
    "report": the whole `entity_report`}, as `flaxheads train` reports them. The data's tags are
    read as the model's (ValueError naming the file, sentence and word of a tag it lacks)."""
    require_model_folder(model_dir)
    tokenizer, pad_token_id = load_tokenizer(model_dir, tokenizer_name)
    model = load_trained(model_dir, pad_token_id=pad_token_id, model_class=TokenClassifier)
    words = task.words
    relabelled = data.word_task({split: words.task.splits[split], "train": words.task.splits["train"]},
                                label_names=model.config.label_names, scheme=words.task.scheme)
    task = data.token_task_data(relabelled, label_all_tokens=words.label_all_tokens, stride=words.stride)
    max_seq_length = fitting_max_length(model.config.backbone, max_seq_length)
    rows = data.tokenize_word_split(task, split, tokenizer, max_seq_length)
    batch_format = data.BatchFormat.for_task(task, tokenizer, max_seq_length,
                                             model_pad_token_id=model.config.backbone.pad_token_id)
    model.eval()
    graphdef, params = nnx.split(model)
    scorer = token_scoring.TokenSplitScorer(
        graphdef, {split: data.OwnSplit(rows, data.example_lengths(rows), rows)}, batch_format, Layout.create(),
        eval_batch=batch_size, class_names=model.config.label_names, tokenizer=tokenizer, words=task.words,
        eval_mode=eval_mode)
    metrics = scorer.scores(split, params)
    return {**metrics, "report": scorer.reports[split]}


def is_token_classifier(model_dir: str | os.PathLike) -> bool:
    """Whether `model_dir` holds a token classifier (config.json names a `*ForTokenClassification`)."""
    return saved_tags(model_dir) is not None


def predict_words(model_dir: str | Path, sentences: Iterable[Sequence[str]], *, max_seq_length: int = 128,
                  batch_size: int = 64, tokenizer_name: str | None = None, stride: int | None = None
                  ) -> list[dict[str, Any]]:
    """For each sentence (a list of words), in order: {"words", "tags"} and, when the model's
    tags mark entities (B-PER, I-LOC, O, ...), "entities" (`token_scoring.entities`). A sentence
    longer than `max_seq_length` tokens is read in windows sharing up to `stride` tokens (default
    max_seq_length // 4), never truncated. Raises UntrainedModel for a model never trained, and
    FloatingPointError naming the sentence whose scores are not finite."""
    require_model_folder(model_dir)
    tokenizer, pad_token_id = load_tokenizer(model_dir, tokenizer_name)
    model = load_trained(model_dir, pad_token_id=pad_token_id, model_class=TokenClassifier)
    sentences = [list(words) for words in sentences]
    present = [i for i, words in enumerate(sentences) if words]  # an empty line has no word to tag
    max_seq_length = fitting_max_length(model.config.backbone, max_seq_length)
    special = tokenizer.num_special_tokens_to_add(pair=False)
    columns = data.tokenize_words(tokenizer, [sentences[i] for i in present], max_seq_length,
                                  stride=default_stride(max_seq_length, special) if stride is None else stride)
    columns["word_ids"] = [[-1 if w is None else w for w in ids] for ids in columns["word_ids"]]
    rows = datasets.Dataset.from_dict(columns)
    names = model.config.label_names
    batch_format = data.BatchFormat(
        max_seq_length, pad_token_ids(tokenizer, model.config.backbone.pad_token_id).input_ids,
        getattr(tokenizer, "pad_token_type_id", 0), tokenizer.padding_side, data.TOKEN_CLASSIFICATION, len(names))
    model.eval()
    graphdef, params = nnx.split(model)
    evaluator = Evaluator(graphdef, data.TOKEN_CLASSIFICATION, Layout.create(), batch_format,
                          min(batch_size, 1 << max(len(rows) - 1, 0).bit_length()))  # fewer rows: a power of two
    row_logits, _ = token_scoring.row_outputs(evaluator, Layout.create(), params, rows, data.example_lengths(rows)) \
        if len(rows) else ([], 0.0)
    word_logits = data.word_predictions(row_logits, columns["word_ids"], columns["sentence"],
                                        [len(sentences[i]) for i in present])
    tags = dict(zip(present, token_scoring.predicted_tags(word_logits, names)))
    bad = next((present[k] for k, values in enumerate(word_logits) if not np.isfinite(values).all()), None)
    if bad is not None:
        raise FloatingPointError(f"the model in {model_dir} gives non-finite scores for sentence {bad + 1}; no tag is "
                                 "reported")
    with_entities = token_scoring.has_entities(names)
    results = []
    for i, words in enumerate(sentences):
        row = {"words": words, "tags": tags.get(i, [])}
        if with_entities:
            row["entities"] = token_scoring.entities(words, row["tags"])
        results.append(row)
    return results


def reads_text_pairs(model_dir: str | os.PathLike) -> bool:
    """Whether the classifier saved in `model_dir` was trained on text pairs (config.json's
    "flaxheads" section says so)."""
    require_model_folder(model_dir)
    config = checkpoint_io.read_config(resolve_checkpoint(model_dir))
    return bool((config.get(FLAXHEADS_CONFIG_KEY) or {}).get("text_pair"))


def decision_thresholds(model_dir: str | os.PathLike) -> tuple[dict[str, float], bool] | None:
    """For a multi-label classifier saved in `model_dir`: ({label name: threshold}, whether they
    were tuned) as predict applies them (config.json's "flaxheads" section, else 0.5 each); None
    for other problem types."""
    require_model_folder(model_dir)
    hf = checkpoint_io.read_config(resolve_checkpoint(model_dir))
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
    the buckets then grow with the longest text. The model runs in eval mode (dropout off) from
    a copy: the caller's model keeps its mode.

    A model trained on text pairs (`ClassifierConfig.text_pair`) needs a second text for every
    text: a lone text is refused, not answered.
    """

    def __init__(self, model: SequenceClassifier, tokenizer, *, max_seq_length: int | None = 128, batch_size: int = 64,
                 source: str = "the model", packing: bool = False, max_segments_per_row: int | None = None):
        _check_batch_size(batch_size)
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
        self._format = _padding(tokenizer, backbone)
        segments = segments_per_row(packing, max_segments_per_row, self.max_seq_length) if packing else 0
        self.batch_format = data.BatchFormat(max_seq_length=self.max_seq_length or UNBOUNDED_START,
                                             max_segments=segments, **self._format)
        graphdef, self._params = _eval_copy(model)

        def forward(params, input_ids, attention_mask, token_type_ids, segment_ids):
            model = nnx.merge(graphdef, params)
            if segment_ids is None:
                return model(input_ids, attention_mask, token_type_ids)
            # (B, S, C) -> (B * S, C): one row per slot, as `example_index` is flattened.
            logits = model(input_ids, attention_mask, token_type_ids, segment_ids=segment_ids, num_segments=segments)
            return logits.reshape(-1, logits.shape[-1])

        self._forward = compile_cache.forward_jit(forward, graphdef=graphdef)

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
        # As many rows as one batch needs (packed: rows of several texts), up to batch_size.
        needed = data.batches_per_epoch(data.example_lengths(tokenized), batch_format, global_batch_size=1)
        rows = _rows_per_batch(needed, self.batch_size)
        out, order = [], []
        for batch in data.eval_batches(tokenized, batch_format, global_batch_size=rows):
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
        _refuse_non_finite(np.isfinite(logits).all(axis=-1), self.source, "text(s)")
        return logits


class TokenScorer:
    """Per-token logits of tokenised sequences from an in-memory `TokenClassifier`: the inference
    path of `flaxheads.pipeline("token-classification")`.

    Sequences are batched as `TextScorer` batches texts (`eval_batches`): padded on the model
    family's side with the pad id `pad_token_ids` decides, to a length bucket, `batch_size` rows
    at most (fewer for fewer sequences, a power of two), so the forward pass compiles once per
    (bucket, batch size); `max_seq_length=None` (a model whose positions set no limit): the
    buckets grow with the longest sequence. The model runs in eval mode from a copy.
    """

    def __init__(self, model: TokenClassifier, tokenizer, *, max_seq_length: int | None, batch_size: int = 64,
                 source: str = "the model"):
        _check_batch_size(batch_size)
        backbone = model.config.backbone
        check_tokenizer_fits(tokenizer, backbone, source)
        self.tokenizer, self.batch_size, self.source = for_model(tokenizer, backbone), batch_size, source
        self.max_seq_length = None if max_seq_length is None else fitting_max_length(backbone, max_seq_length)
        self._format = _padding(tokenizer, backbone)
        graphdef, self._params = _eval_copy(model)

        def forward(params, input_ids, attention_mask, token_type_ids):
            return nnx.merge(graphdef, params)(input_ids, attention_mask, token_type_ids)

        self._forward = compile_cache.forward_jit(forward, graphdef=graphdef)

    def logits(self, sequences: dict[str, Sequence[Sequence[int]]]) -> list[np.ndarray]:
        """Per sequence, in order, its (length, num_labels) float32 logits: `sequences` holds the
        columns `input_ids`, `attention_mask` and, where the model reads them, `token_type_ids`,
        one unpadded sequence per entry, as the tokenizer gives them.

        Raises ValueError for a sequence longer than `max_seq_length`; FloatingPointError naming
        the (0-based) sequences whose scores are not finite.
        """
        lengths = [len(ids) for ids in sequences["input_ids"]]
        if not lengths:
            return []
        longest = max(lengths)
        limit = self.max_seq_length or max(UNBOUNDED_START, 1 << (longest - 1).bit_length())
        if longest > limit:
            raise ValueError(f"a sequence of {longest} tokens is longer than the {limit} {self.source} reads")
        names = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in sequences]
        table = datasets.Dataset.from_dict({**{name: [list(s) for s in sequences[name]] for name in names},
                                           LENGTH: lengths})
        batch_format = data.BatchFormat(max_seq_length=limit, **self._format)
        out = []
        for batch in data.eval_batches(table, batch_format,
                                       global_batch_size=_rows_per_batch(len(lengths), self.batch_size)):
            logits = np.asarray(self._forward(self._params, batch["input_ids"], batch["attention_mask"],
                                              batch.get("token_type_ids")))
            real = batch["example_mask"] > 0
            # The padding side is the family's: the attention mask finds each row's tokens.
            out.extend(row[mask > 0] for row, mask in zip(logits[real], batch["attention_mask"][real]))
        _refuse_non_finite(np.array([np.isfinite(row).all() for row in out]), self.source, "sequence(s)")
        return out


def _check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")


def _padding(tokenizer, backbone) -> dict[str, Any]:
    """`BatchFormat`'s padding fields for `backbone`'s batches read with `tokenizer`."""
    return dict(
        pad_token_id=pad_token_ids(tokenizer, backbone.pad_token_id).input_ids,
        pad_token_type_id=getattr(tokenizer, "pad_token_type_id", 0),
        padding_side=backbone_spec(backbone.model_type).padding_side,
    )


def _eval_copy(model) -> tuple[Any, Any]:
    """(graphdef, params) of an eval-mode copy of `model`: the caller's model keeps its mode."""
    runnable = nnx.merge(*nnx.split(model))
    runnable.eval()
    return nnx.split(runnable)


def _rows_per_batch(needed: int, batch_size: int) -> int:
    """As many rows as `needed`, as a power of two (fewer shapes to compile), up to `batch_size`."""
    return min(batch_size, 1 << (needed - 1).bit_length())


def _refuse_non_finite(finite: np.ndarray, source: str, what: str) -> None:
    bad = np.flatnonzero(~finite)
    if bad.size:
        raise FloatingPointError(
            f"{source} gave non-finite scores for {what} {bad[:5].tolist()} (0-based); no prediction "
            f"is given from weights that produce NaN or infinity. Check {source} (was its training "
            "stopped by a non-finite loss?)"
        )


def readable_texts(texts: Iterable[str], name: str = "texts") -> list[str]:
    """`texts` as a list, each a str the model can read: ValueError naming the index of the first
    that is missing (None, NaN), no str, or blank (white space, or characters that print nothing:
    the model would read no word of it, and any label would be made up, so none is given), and
    for one str given where a list of them goes. Every text path (`predict`, `TextScorer`, the
    pipeline) checks its texts here."""
    if isinstance(texts, (str, bytes)):
        raise ValueError(f"{name} is one {type(texts).__name__}, not a list of texts: pass [{_short(texts)}] "
                         "(a str would be read one character at a time)")
    try:
        texts = list(texts)
    except TypeError:
        raise ValueError(f"{name} is {type(texts).__name__} {_short(texts)}, not a list of texts") from None
    for index, text in enumerate(texts):
        if isinstance(text, str) and not _blank(text):
            continue
        if text is None or (isinstance(text, float) and math.isnan(text)):
            problem = f"is missing ({text!r})"
        elif not isinstance(text, str):
            problem = f"is {type(text).__name__} {_short(text)}, not a str"
        else:
            problem = f"is blank ({_short(text)}): the model would read no word of it, and a label for it would be " \
                      "made up"
        raise ValueError(f"the text at index {index} of {name} {problem}. Give every text its words, or leave it out")
    return texts


def _blank(text: str) -> bool:
    """Only white space and characters that print nothing (zero-width spaces, controls)."""
    return all(ch.isspace() or unicodedata.category(ch) in ("Cf", "Cc") for ch in text)


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


UNBOUNDED = 1 << 30
"""The max_length given to the tokenizer when texts are not to be cut."""
UNBOUNDED_START = 128
"""The smallest bucket when texts are not cut: longer texts get the next power of two."""


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
