"""Scores and predictions of a question-answering model over its tokenised splits, over whole
examples: what the Trainer's loop asks of its scorer (`Scorer`) for question answering.

A split's rows are the windows of its examples (`rows.tokenize_examples`); each row's start and
end logits are put back at the row's full width, the windows of an example are read together by
run_qa.py's post-processing (`postprocess.postprocess_qa_predictions`: the best spans over all
windows, SQuAD v2's null answer), and the answers are scored against the examples' gold answers
with the official SQuAD scripts' numbers (`metrics.squad`, `metrics.squad_v2`). The loss is the
mean over the split's windows of transformers' span loss, as the train step's over a batch.
"""

from __future__ import annotations

import numpy as np

from flaxheads.tasks.qa import metrics as squad_metrics
from flaxheads.tasks.qa.postprocess import QAPredictions, postprocess_qa_predictions
from flaxheads.tasks.qa.rows import QASource, features_of
from flaxheads.training import metrics as metrics_lib
from flaxheads.training.scoring import PredictionOutput, SplitScorer, row_outputs

LOSS_WEIGHT = "scored_positions"
"""The eval output that counts what a row's loss scored (`objective.SpanObjective.eval_outputs`)."""


class SpanSplitScorer(SplitScorer):
    """`SplitScorer` for a span head. `predict` gives, per example in file order, its answer text
    (`PredictionOutput.predictions`) and keeps the whole `QAPredictions` (n-best lists, null odds)
    in `answers[split]`; `scores` SQuAD's exact match and F1 (v1.1), or v2.0's breakdown, and the
    loss."""

    def __init__(self, *args, qa: QASource, **kwargs):
        super().__init__(*args, **kwargs)
        self.qa = qa
        self.answers: dict[str, QAPredictions] = {}

    def scores(self, split: str, params, *, max_batches: int | None = None) -> dict[str, float]:
        if max_batches is not None:
            _, loss = self._row_outputs(split, params, max_batches=max_batches)
            return {"loss": loss}
        return self.predict(split, params).metrics

    def predict(self, split: str, params) -> PredictionOutput:
        row_logits, loss = self._row_outputs(split, params)
        examples = self.qa.examples[split]
        own = self.splits[split]
        bad = next((i for i, values in enumerate(row_logits) if not np.isfinite(values).all()), None)
        if bad is not None or (split not in self.unlabelled and not np.isfinite(loss)):
            where = f"logits of a window of example {examples[own.origins['example_index'][bad]].id!r}" \
                if bad is not None else "loss"
            raise metrics_lib.NonFiniteScores(f"the {split} split's {where} are not finite; no metric is reported")
        answers = answer_examples(row_logits, own.origins, examples, self.qa)
        self.answers[split] = answers
        texts = [answers.answers[example.id] for example in examples]
        if split in self.unlabelled:
            return PredictionOutput(texts, None, {})
        metrics = {**squad_scores(answers, examples, self.qa.version_2_with_negative), "loss": loss}
        return PredictionOutput(texts, [example.answers for example in examples], metrics)

    def _row_outputs(self, split: str, params, *, max_batches: int | None = None) -> tuple[list, float]:
        own = self.splits[split]
        return row_outputs(self.evaluator, self.layout, params, own.rows, own.lengths, max_batches=max_batches,
                           weight=LOSS_WEIGHT)


def answer_examples(row_logits: list[np.ndarray], origins, examples, qa: QASource) -> QAPredictions:
    """The answers of `examples` from their windows' logits ((tokens, 2) per row, in the order of
    `origins`), as run_qa.py post-processes them with `qa`'s options."""
    features = features_of(origins, examples)
    width = max(len(feature["offset_mapping"]) for feature in features)
    start = np.full((len(features), width), -1e4, np.float32)  # padding: outside the context, never a span
    end = np.full_like(start, -1e4)
    for i, logits in enumerate(row_logits):
        start[i, :len(logits)], end[i, :len(logits)] = logits[:, 0], logits[:, 1]
        features[i]["offset_mapping"] = features[i]["offset_mapping"] + [None] * (width - len(logits))
    rows = [{"id": example.id, "context": example.context} for example in examples]
    return postprocess_qa_predictions(rows, features, (start, end), **qa.postprocess_options())


def squad_scores(answers: QAPredictions, examples, version_2_with_negative: bool) -> dict[str, float]:
    """SQuAD's metrics of `answers` against the examples' gold answers: exact_match and f1 (v1.1),
    or v2.0's exact, f1, HasAns_* / NoAns_* and best_* (percentages, as `evaluate` reports them)."""
    references = [{"id": example.id, "answers": example.answers} for example in examples]
    if not version_2_with_negative:
        return {name: float(value) for name, value in squad_metrics.squad(answers.for_metric(), references).items()}
    scores = squad_metrics.squad_v2(answers.for_metric(), references)  # no-answer probabilities 0, as run_qa.py
    return {name: float(value) for name, value in scores.items() if isinstance(value, (int, float)) and
            not name.endswith("total")}


def format_answers(answers: list[str], examples) -> str:
    """predict_results.txt of question answering: a header, then "index<TAB>id<TAB>answer" per
    example (tabs and line ends in the answer as spaces)."""
    lines = ["index\tid\tprediction"]
    lines += [f"{i}\t{example.id}\t{' '.join(text.split())}" for i, (text, example) in enumerate(zip(answers,
                                                                                                     examples))]
    return "\n".join(lines) + "\n"


__all__ = ["LOSS_WEIGHT", "SpanSplitScorer", "answer_examples", "format_answers", "squad_scores"]

