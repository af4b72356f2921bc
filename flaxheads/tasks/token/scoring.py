"""Scores and predictions of a token classifier over its tokenised splits, at the word level:
what the Trainer's loop asks of its scorer (`Scorer`) for token classification.

A split's rows are sentences, or windows of the long ones (`subwords.tokenize_word_split`);
each row's logits are trimmed to its tokens, merged back to one logit row per word
(`windows.word_predictions`: the word's first subword, in the window where it has the most
context), and the words' tags are scored against the file's with `entity_metrics.entity_report`
(seqeval's numbers). The loss is the mean cross entropy over every scored token of the split, as
the train step's over a batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flaxheads.tasks.token import entity_metrics
from flaxheads.tasks.token import tags as tags_lib
from flaxheads.tasks.token.windows import word_predictions
from flaxheads.tasks.token.word_task import WordLabelling
from flaxheads.training import metrics as metrics_lib
from flaxheads.training.scoring import EvalPrediction, PredictionOutput, SplitScorer, row_outputs


class TokenSplitScorer(SplitScorer):
    """`SplitScorer` for token classification. `predict` gives, per sentence in file order, its
    words' logits (num_words, num_labels) and their tag ids; `scores` entity-level precision,
    recall and F1 (micro, and macro_*), word accuracy and the token loss, and keeps the whole
    `entity_report` (per type, averages with support) and the words' tag confusion
    (`tag_confusion`) in `reports[split]`: what the run report draws."""

    def __init__(self, *args, words: WordLabelling, eval_mode: str = entity_metrics.DEFAULT, **kwargs):
        super().__init__(*args, **kwargs)
        self.words, self.eval_mode = words, eval_mode
        check_eval_mode(eval_mode, words)

    def scores(self, split: str, params, *, max_batches: int | None = None) -> dict[str, float]:
        if max_batches is not None:
            _, loss = self._row_outputs(split, params, max_batches=max_batches)
            return {"loss": loss}
        return self.predict(split, params).metrics

    def predict(self, split: str, params) -> PredictionOutput:
        row_logits, loss = self._row_outputs(split, params)
        rows = self.splits[split].origins
        sentences = self.words.task.splits[split]
        word_logits = word_predictions(row_logits, list(rows["word_ids"]), list(rows["sentence"]),
                                            [len(words) for words in sentences.tokens])
        if split in self.unlabelled:
            return PredictionOutput(word_logits, None, {})
        bad = next((s for s, values in enumerate(word_logits) if not np.isfinite(values).all()), None)
        if bad is not None or not np.isfinite(loss):
            raise metrics_lib.NonFiniteScores(
                f"the {split} split's " + (f"logits of {sentences.where(bad)} are not finite" if bad is not None
                                           else f"loss is {loss}") + "; no metric is reported")
        label_ids = [np.asarray(ids, np.int64) for ids in self.words.task.tag_ids(split)]
        predicted = predicted_tags(word_logits, self.class_names)
        report = self.report(sentences.tags, predicted)
        self.reports[split] = {**report, **tag_confusion(sentences.tags, predicted, self.class_names)}
        metrics = {**flat_metrics(report), "loss": loss}
        if self.compute_metrics is not None:
            metrics.update(self.compute_metrics(EvalPrediction(word_logits, label_ids)))
        return PredictionOutput(word_logits, label_ids, metrics)

    def report(self, true_tags, tags) -> dict[str, Any]:
        """`entity_report` in this run's eval_mode (strict: under the task's scheme)."""
        scheme = self.words.task.scheme if self.eval_mode == entity_metrics.STRICT else None
        return entity_metrics.entity_report(true_tags, tags, mode=self.eval_mode, scheme=scheme)

    def _row_outputs(self, split: str, params, *, max_batches: int | None = None) -> tuple[list, float]:
        own = self.splits[split]
        return row_outputs(self.evaluator, self.layout, params, own.rows, own.lengths, max_batches=max_batches)


def check_eval_mode(eval_mode: str, words: WordLabelling) -> None:
    """ValueError for strict entity metrics on tags without a scheme (POS tags, say)."""
    if eval_mode == entity_metrics.STRICT and words.task.scheme == tags_lib.NO_SCHEME:
        raise ValueError(f"eval_mode='strict' counts the entities well formed under a tag scheme, and the tags "
                         f"have none ({words.task.scheme_reason}): pass tag_scheme='IOB2' (or IOB1, IOBES) if "
                         "they mark entities, or leave eval_mode out")


def flat_metrics(report: dict[str, Any]) -> dict[str, float]:
    """The scalar metrics of an `entity_report` (`metrics.METRIC_NAMES` of token
    classification), those it leaves undefined (None) left out."""
    values = {"f1": report["f1"], "precision": report["precision"], "recall": report["recall"],
              "accuracy": report["accuracy"], "macro_f1": report["macro_avg"]["f1"],
              "macro_precision": report["macro_avg"]["precision"], "macro_recall": report["macro_avg"]["recall"]}
    return {name: float(value) for name, value in values.items() if value is not None}


def tag_confusion(true_tags, predicted_tags, label_names) -> dict[str, Any]:
    """The words' tags, true against predicted, counted over a split (one list of tags per
    sentence): {"confusion_matrix": rows true, columns predicted, in the order of
    "confusion_labels" (`label_names`, then any other tag the split holds, sorted),
    "confusion_of": "words"}. Word accuracy is its trace over its sum. Plain lists: it goes to
    results.json, (tags)² numbers."""
    names = list(label_names)
    names += sorted({tag for sentence in true_tags for tag in sentence} - set(names))
    index = {name: i for i, name in enumerate(names)}
    counts = np.zeros((len(names), len(names)), np.int64)
    for true, predicted in zip(true_tags, predicted_tags):
        np.add.at(counts, ([index[t] for t in true], [index[p] for p in predicted]), 1)
    return {"confusion_matrix": counts.tolist(), "confusion_labels": names, "confusion_of": "words"}


def predicted_tags(word_logits, label_names) -> list[list[str]]:
    """Per sentence, each word's tag: the name of its largest logit."""
    return [[label_names[int(i)] for i in np.argmax(values, axis=-1)] if len(values) else [] for values in word_logits]


def entities(words: list[str], tags: list[str]) -> list[dict[str, Any]]:
    """The entities of one tagged sentence as conlleval's chunking reads the tags (seqeval's
    default mode): {"type", "start", "end" (word offsets, end exclusive), "text" (the words joined
    by spaces)}, in sentence order."""
    found = tags_lib.lenient_entities([tags])
    spans = sorted((start, end, kind) for kind, places in found.items() for start, end in places)
    return [{"type": kind, "start": start, "end": end + 1, "text": " ".join(words[start:end + 1])}
            for start, end, kind in spans]


def has_entities(label_names) -> bool:
    """Whether tags named so mark entities (B-PER, I-LOC, O, ...), not bare classes (POS tags)."""
    return all(name == "O" or tags_lib.split_tag(name) is not None for name in label_names)


def format_word_predictions(tags: list[list[str]]) -> str:
    """predict_results.txt of token classification: a header, then "index<TAB>tags" per sentence,
    its words' tags separated by spaces (the line run_ner.py writes to predictions.txt)."""
    return "\n".join(["index\tprediction", *(f"{i}\t{' '.join(row)}" for i, row in enumerate(tags))]) + "\n"


__all__ = ["TokenSplitScorer", "check_eval_mode", "entities", "flat_metrics", "format_word_predictions", "has_entities",
           "predicted_tags", "row_outputs", "tag_confusion"]
