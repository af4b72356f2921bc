"""Evaluation and prediction with a saved token classifier: what `flaxheads evaluate | predict` do
with word data and token classifiers, and `TokenScorer`, the inference path of
`flaxheads.pipeline("token-classification")`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import datasets
import numpy as np
from flax import nnx

from flaxheads import data
from flaxheads.data.tokenization import LENGTH
from flaxheads.inference import (
    UNBOUNDED_START, check_batch_size, compiled_forward, open_trained, padding, refuse_non_finite, rows_per_batch,
)
from flaxheads.names import PAD_TO_MULTIPLE_OF
from flaxheads.tasks.token import entity_metrics
from flaxheads.tasks.token import scoring as token_scoring
from flaxheads.tasks.token.model import TokenClassifier, saved_tags
from flaxheads.tasks.token.objective import OBJECTIVE
from flaxheads.tasks.token.subwords import tokenize_word_split, tokenize_words
from flaxheads.tasks.token.windows import word_predictions
from flaxheads.tasks.token.word_task import TOKEN_EXAMPLES, default_stride, token_task_data, word_task
from flaxheads.tokenizer import check_tokenizer_fits, fitting_max_length, for_model
from flaxheads.training.scoring import Evaluator
from flaxheads.training.sharding import Layout


def evaluate_words(model_dir: str | Path, task: data.TaskData, split: str, *, max_seq_length: int = 128,
                   batch_size: int = 64, tokenizer_name: str | None = None, eval_mode: str = entity_metrics.DEFAULT
                   ) -> dict[str, Any]:
    """A saved (trained) token classifier's scores on a split of token-classification data
    (`word_task.token_task_data`): {"f1", "precision", "recall", "accuracy", "macro_*", "loss",
    "report": the whole `entity_report`}, as `flaxheads train` reports them. The data's tags are
    read as the model's (ValueError naming the file, sentence and word of a tag it lacks)."""
    model, tokenizer, max_seq_length = open_trained(model_dir, TokenClassifier, max_seq_length=max_seq_length,
                                                    tokenizer_name=tokenizer_name)
    words = task.source
    relabelled = word_task({split: words.task.splits[split], "train": words.task.splits["train"]},
                           label_names=model.config.label_names, scheme=words.task.scheme)
    task = token_task_data(relabelled, label_all_tokens=words.label_all_tokens, stride=words.stride)
    rows = tokenize_word_split(task, split, tokenizer, max_seq_length)
    batch_format = data.BatchFormat.for_task(task, tokenizer, max_seq_length,
                                             model_pad_token_id=model.config.backbone.pad_token_id)
    model.eval()
    graphdef, params = nnx.split(model)
    scorer = token_scoring.TokenSplitScorer(
        graphdef, {split: data.OwnSplit(rows, data.example_lengths(rows), rows)}, batch_format, Layout.create(),
        eval_batch=batch_size, class_names=model.config.label_names, tokenizer=tokenizer, words=task.source,
        eval_mode=eval_mode, objective=OBJECTIVE)
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
    model, tokenizer, max_seq_length = open_trained(model_dir, TokenClassifier, max_seq_length=max_seq_length,
                                                    tokenizer_name=tokenizer_name)
    sentences = [list(words) for words in sentences]
    present = [i for i, words in enumerate(sentences) if words]  # an empty line has no word to tag
    special = tokenizer.num_special_tokens_to_add(pair=False)
    columns = tokenize_words(tokenizer, [sentences[i] for i in present], max_seq_length,
                                  stride=default_stride(max_seq_length, special) if stride is None else stride)
    columns["word_ids"] = [[-1 if w is None else w for w in ids] for ids in columns["word_ids"]]
    rows = datasets.Dataset.from_dict(columns)
    names = model.config.label_names
    batch_format = data.BatchFormat(max_seq_length, **padding(tokenizer, model.config.backbone), problem_type=None,
                                    num_labels=len(names), example_format=TOKEN_EXAMPLES)
    model.eval()
    graphdef, params = nnx.split(model)
    evaluator = Evaluator(graphdef, OBJECTIVE, Layout.create(), batch_format,
                          min(batch_size, 1 << max(len(rows) - 1, 0).bit_length()))  # fewer rows: a power of two
    row_logits, _ = token_scoring.row_outputs(evaluator, Layout.create(), params, rows, data.example_lengths(rows)) \
        if len(rows) else ([], 0.0)
    word_logits = word_predictions(row_logits, columns["word_ids"], columns["sentence"],
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


class TokenScorer:
    """Per-token logits of tokenised sequences from an in-memory `TokenClassifier`: the inference
    path of `flaxheads.pipeline("token-classification")`.

    Sequences are batched as `TextScorer` batches texts (`eval_batches`): padded on the model
    family's side with the pad id `pad_token_ids` decides, to a length bucket, `batch_size` rows
    at most (fewer for fewer sequences, a power of two), so the forward pass compiles once per
    (bucket, batch size; `pad_to_multiple_of` rounds the buckets, 0: powers of two);
    `max_seq_length=None` (a model whose positions set no limit): the
    buckets grow with the longest sequence. The model runs in eval mode from a copy, over every
    local device (`inference.data_parallel`).
    """

    def __init__(self, model: TokenClassifier, tokenizer, *, max_seq_length: int | None, batch_size: int = 64,
                 source: str = "the model", pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF):
        check_batch_size(batch_size)
        self.pad_to_multiple_of = pad_to_multiple_of
        backbone = model.config.backbone
        check_tokenizer_fits(tokenizer, backbone, source)
        self.tokenizer, self.batch_size, self.source = for_model(tokenizer, backbone), batch_size, source
        self.max_seq_length = None if max_seq_length is None else fitting_max_length(backbone, max_seq_length)
        self._format = padding(tokenizer, backbone)
        self._params, self._forward = compiled_forward(model, lambda model, *arrays: model(*arrays))

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
        batch_format = data.BatchFormat(max_seq_length=limit, pad_to_multiple_of=self.pad_to_multiple_of,
                                        **self._format)
        out = []
        for batch in data.eval_batches(table, batch_format,
                                       global_batch_size=rows_per_batch(len(lengths), self.batch_size)):
            logits = np.asarray(self._forward(self._params, batch["input_ids"], batch["attention_mask"],
                                              batch.get("token_type_ids")))
            real = batch["example_mask"] > 0
            # The padding side is the family's: the attention mask finds each row's tokens.
            out.extend(row[mask > 0] for row, mask in zip(logits[real], batch["attention_mask"][real]))
        refuse_non_finite(np.array([np.isfinite(row).all() for row in out]), self.source, "sequence(s)")
        return out


__all__ = ["TokenScorer", "evaluate_words", "is_token_classifier", "predict_words"]
